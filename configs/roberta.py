"""RoBERTa (Liu et al., 2019): `--config=configs/roberta.py:{base,large,tiny}`.

BERT's post-norm encoder (`model.family='roberta'`, `models/roberta.py`) with positions offset
past the padding id (pad_id=1, max_len 514 = 512 + 2), one token type, LayerNorm eps 1e-5,
exact GELU, MLM head tied to the token embedding, no pooler and no next-sentence prediction;
byte-level BPE vocab 50265. `reference.params` is the Hugging Face `RobertaForMaskedLM` count
(`num_parameters()`, the tied decoder counted once), compared with
`scaling.count_params(...)['total']`.

Pre-training recipe from the paper (Table 9, the 500K-step runs): batch 8K x 512 tokens,
Adam lr 6e-4 (base) / 4e-4 (large), b2 0.98, eps 1e-6, weight decay 0.01, 24k warmup steps
(base; 30k large) then linear decay, dropout 0.1, dynamic masking of 15% of the tokens (the
'mlm' task re-draws every batch's masks from (seed, step, row)).

`tiny`: character-level MLM on the bundled tiny Shakespeare, trains on a laptop CPU in about
two minutes: vocab 65 characters + [MASK] (65, appended by the data pipeline) + <pad> (66,
never in the data, RoBERTa's position offset), so max_len = seq_len + pad_id + 1.
"""

from configs import common

# name: (num_layers, d_model, num_heads, mlp_dim, HF RobertaForMaskedLM num_parameters())
SIZES = {
    "base": (12, 768, 12, 3072, 124_697_433),
    "large": (24, 1024, 16, 4096, 355_412_057),
    "tiny": (2, 64, 4, 256, None),
}
TINY_SEQ_LEN, TINY_PAD_ID = 64, 66


def get_config(arg=None):
  name, (num_layers, d_model, num_heads, mlp_dim, params) = common.select("roberta", arg, SIZES)
  if name == "tiny":
    model = common.model(
        "roberta", "roberta-tiny", vocab_size=TINY_PAD_ID + 1, d_model=d_model,
        num_layers=num_layers, num_heads=num_heads, mlp_dim=mlp_dim, pad_id=TINY_PAD_ID,
        max_len=TINY_SEQ_LEN + TINY_PAD_ID + 1, dropout_rate=0.0, attention_dropout_rate=0.0)
    return common.config(
        model=model,
        data=common.data("tinyshakespeare", "char", TINY_SEQ_LEN, mask_rate=0.15,
                         eval_batches=10),
        train=common.train(400, 32, eval_every=100, log_every=20, checkpoint_every=200),
        optim=common.optim(2e-3, warmup_steps=60, b2=0.98, weight_decay=0.01,
                           min_lr_ratio=0.1))
  model = common.model(
      "roberta", f"roberta-{name}", vocab_size=50265, d_model=d_model, num_layers=num_layers,
      num_heads=num_heads, mlp_dim=mlp_dim, max_len=514, type_vocab_size=1, pad_id=1,
      norm_eps=1e-5, activation="gelu_exact", dropout_rate=0.1, attention_dropout_rate=0.1,
      dtype="bfloat16")
  return common.config(
      model=model,
      data=common.data("openwebtext", "roberta-base", 512, mask_rate=0.15),
      train=common.train(500_000, 8192, eval_every=10_000, log_every=100,
                         checkpoint_every=10_000),
      optim=common.optim(6e-4 if name == "base" else 4e-4, schedule="linear",
                         warmup_steps=24_000 if name == "base" else 30_000, weight_decay=0.01,
                         b2=0.98, eps=1e-6, min_lr_ratio=0.0),
      reference=common.reference(params, source=f"Hugging Face RobertaForMaskedLM "
                                 f"(roberta-{name})", params_key="total"))
