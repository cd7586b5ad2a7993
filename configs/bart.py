"""BART (Lewis et al., 2020): `--config=configs/bart.py:{base,large,tiny}`.

Encoder-decoder (family 'bart'): learned positions with BART's offset of 2 (tables of 1026
rows), a LayerNorm on the embeddings of each stack, post-LN blocks with biases, exact GELU,
one token embedding shared by encoder, decoder and the output projection, GPT-2's byte-level
BPE vocabulary of 50265 tokens. base: 6 + 6 layers, d_model 768, 12 heads, FFN 3072; large:
12 + 12 layers, 1024, 16 heads, 4096. `reference.params` is Hugging Face's
`BartForConditionalGeneration(config).num_parameters()` for these configurations (the shared
embedding counted once, the `final_logits_bias` buffer not at all; checked exactly in
tests/unit/models/test_family_bart.py): base 139,420,416, large 406,291,456.

Pre-training (section 2.2 and 5.1 of the paper): text infilling (30 % of the tokens, Poisson(3)
span lengths, one mask per span) + sentence permutation, documents of up to 512 tokens; large
trains 500k steps at batch 8000 on RoBERTa's 160 GB of text. The paper gives no learning rate or
schedule: the optimizer settings below are assumptions (RoBERTa-style AdamW, b2 0.98,
polynomial-decay-like linear schedule), not published values, and the pretraining corpus is not
bundled.

`tiny`: the same objective on character-level tiny Shakespeare (65 characters + mask, decoder
start and padding = 68 ids), 64-character windows, a 2 + 2 layer model of width 64 that trains
on a laptop CPU in about two minutes (see docs/models.md for the numbers).
"""

from configs import common

# name: (layers per stack, d_model, num_heads, mlp_dim, HF num_parameters())
SIZES = {
    "base": (6, 768, 12, 3072, 139_420_416),
    "large": (12, 1024, 16, 4096, 406_291_456),
    "tiny": (2, 64, 4, 256, None),
}


def get_config(arg=None):
  name, (layers, d_model, num_heads, mlp_dim, params) = common.select("bart", arg, SIZES)
  tiny = name == "tiny"
  model = common.model(
      "bart", f"bart-{name}", vocab_size=68 if tiny else 50265, d_model=d_model,
      num_encoder_layers=layers, num_decoder_layers=layers, num_heads=num_heads,
      mlp_dim=mlp_dim, max_len=64 if tiny else 1024, scale_embedding=False,
      activation="gelu_exact", norm_eps=1e-5, dropout_rate=0.0 if tiny else 0.1,
      attention_dropout_rate=0.0 if tiny else 0.1, dtype="float32" if tiny else "bfloat16")
  noise = dict(mask_ratio=0.3, poisson_lambda=3.0, permute_sentences=True,
               sentence_delimiters=".!?")
  if tiny:
    return common.config(
        model=model,
        data=common.data("tinyshakespeare", "char", 64, eval_batches=8, **noise),
        train=common.train(600, 32, eval_every=100, log_every=20, checkpoint_every=300),
        optim=common.optim(2e-3, schedule="cosine", warmup_steps=50, weight_decay=0.01,
                           b2=0.98, min_lr_ratio=0.1))
  return common.config(
      model=model,
      data=common.data("wikipedia", "gpt2", 512, **noise),
      train=common.train(500_000, 8000, eval_every=10_000, log_every=100,
                         checkpoint_every=10_000),
      optim=common.optim(4e-4 if name == "base" else 3e-4, schedule="linear",
                         warmup_steps=10_000, weight_decay=0.01, b2=0.98, eps=1e-6,
                         min_lr_ratio=0.0),
      reference=common.reference(params, source=f"Hugging Face BartForConditionalGeneration "
                                 f"(facebook/bart-{name}) num_parameters()",
                                 params_key="total"))
