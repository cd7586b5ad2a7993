"""BERT (Devlin et al., 2019): `--config=configs/bert.py:{base,large,tiny}`.

Post-norm encoder, learned positions (512), token-type embeddings (2), LayerNorm eps 1e-12,
exact (erf) GELU, pooler, MLM head tied to the token embedding; WordPiece vocab 30522
(uncased). `reference.params` is the Hugging Face `BertModel` count (embeddings + encoder +
pooler, no MLM head), compared with `scaling.count_params(...)['backbone']`;
`reference.pretraining_params` is `BertForPreTraining`'s, the `total` of the same model with
`--config.model.nsp=True` (BERT's next-sentence head; trained on sentence pairs, see
configs/bert_nsp_shakespeare.py).

Pre-training recipe from the paper: batch 256 x 512 tokens (we use the 128-token phase's
length as the default `seq_len`), 1M steps, Adam lr 1e-4, b1 0.9, b2 0.999, weight decay
0.01, 10k warmup steps then linear decay, dropout 0.1, masking 15% of the tokens.

`tiny`: character-level MLM on tiny Shakespeare (vocab 65 + [MASK]/[CLS]/[SEP]/[PAD] = 69).
"""

from configs import common

# name: (num_layers, d_model, num_heads, mlp_dim, HF BertModel count)
SIZES = {
    "base": (12, 768, 12, 3072, 109_482_240),
    "large": (24, 1024, 16, 4096, 335_141_888),
    "tiny": (2, 64, 4, 256, None),
}
# HF BertForPreTraining num_parameters(): the model with --config.model.nsp=True (pooler, MLM
# and next-sentence heads), compared with count_params(...)['total'].
PRETRAINING_PARAMS = {"base": 110_106_428, "large": 336_226_108}


def get_config(arg=None):
  name, (num_layers, d_model, num_heads, mlp_dim, params) = common.select("bert", arg, SIZES)
  tiny = name == "tiny"
  model = common.model(
      "bert", f"bert-{name}", vocab_size=69 if tiny else 30522, d_model=d_model,
      num_layers=num_layers, num_heads=num_heads, mlp_dim=mlp_dim,
      max_len=128 if tiny else 512, type_vocab_size=2, norm_eps=1e-12,
      activation="gelu_exact", dropout_rate=0.0 if tiny else 0.1,
      attention_dropout_rate=0.0 if tiny else 0.1, dtype="float32" if tiny else "bfloat16")
  if tiny:
    return common.config(
        model=model, data=common.data("tinyshakespeare", "char", 128, mask_rate=0.15),
        train=common.train(2000, 32, eval_every=200, log_every=20, checkpoint_every=500),
        optim=common.optim(1e-3, schedule="linear", warmup_steps=100, weight_decay=0.01,
                           b2=0.999, min_lr_ratio=0.0))
  return common.config(
      model=model,
      data=common.data("wikipedia", "bert-base-uncased", 128, mask_rate=0.15),
      train=common.train(1_000_000, 256, eval_every=10_000, log_every=100,
                         checkpoint_every=10_000),
      optim=common.optim(1e-4, schedule="linear", warmup_steps=10_000, weight_decay=0.01,
                         b2=0.999, eps=1e-6, min_lr_ratio=0.0),
      reference=common.reference(params, source=f"Hugging Face BertModel (bert-{name}-uncased,"
                                 " with pooler)", params_key="backbone",
                                 pretraining_params=PRETRAINING_PARAMS[name]))
