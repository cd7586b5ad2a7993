"""The original Transformer (Vaswani et al., 2017):
`--config=configs/transformer.py:{base,big,tiny}`.

Encoder-decoder (family 'seq2seq'), post-norm, sinusoidal positions, ReLU FFN, one embedding
matrix shared by source, target and the pre-softmax projection (scaled by sqrt(d_model)),
shared BPE vocabulary of ~37000 tokens (WMT14 En-De). Table 3: base d 512, 6+6 layers,
8 heads, d_ff 2048, dropout 0.1 (65M params); big d 1024, 16 heads, d_ff 4096, dropout 0.3
(213M params).

The paper's parameter counts are approximate: they are rounded, and the vocabulary size is
only given as "about 37000" (and the WMT14 En-Fr models use 32000 word-pieces), so a few
percent difference from `reference.params` is expected; experiments/published_configs.py reports it.

Training (section 5): Adam b1 0.9, b2 0.98, eps 1e-9, lr = d^-0.5 * min(step^-0.5,
step * 4000^-1.5) ("rsqrt" schedule with 4000 warmup steps; its peak is `lr`), batches of
~25000 source + 25000 target tokens, 100k steps (base) / 300k (big), label smoothing 0.1,
no weight decay, no clipping.

`tiny`: the synthetic reversal task (66 symbols + PAD/BOS/EOS = the 69-token vocabulary) for
CPU tests. The WMT14 settings are reference numbers: the data pipelines do not read
translation datasets yet (seq2seq trains on `synthetic:*` tasks).
"""

from configs import common

# name: (d_model, layers (enc = dec), num_heads, mlp_dim, dropout, steps, paper params)
SIZES = {
    "base": (512, 6, 8, 2048, 0.1, 100_000, 65e6),
    "big": (1024, 6, 16, 4096, 0.3, 300_000, 213e6),
    "tiny": (64, 2, 4, 256, 0.0, 2000, None),
}


def get_config(arg=None):
  name, (d_model, layers, heads, mlp_dim, dropout, steps, params) = common.select(
      "transformer", arg, SIZES)
  tiny = name == "tiny"
  model = common.model(
      "seq2seq", f"transformer-{name}", vocab_size=69 if tiny else 37000, d_model=d_model,
      num_encoder_layers=layers, num_decoder_layers=layers, num_heads=heads, mlp_dim=mlp_dim,
      pre_norm=False, norm_eps=1e-6, activation="relu", dropout_rate=dropout,
      attention_dropout_rate=0.0, dtype="float32" if tiny else "bfloat16")
  warmup = 100 if tiny else 4000
  peak_lr = 1e-3 if tiny else d_model ** -0.5 * warmup ** -0.5
  if tiny:
    return common.config(
        model=model, data=common.data("synthetic:reverse", None, None, vocab_size=66,
                                      min_len=5, max_len=32),
        train=common.train(steps, 32, eval_every=200, log_every=20, checkpoint_every=500,
                           label_smoothing=0.0),
        optim=common.optim(peak_lr, schedule="rsqrt", warmup_steps=warmup, weight_decay=0.0,
                           clip=1.0, b2=0.98, eps=1e-9))
  return common.config(
      model=model,
      data=common.data("wmt14_translate/de-en", "bpe37000", 256),
      train=common.train(steps, 128, eval_every=2000, log_every=100, checkpoint_every=5000,
                         label_smoothing=0.1),
      optim=common.optim(peak_lr, schedule="rsqrt", warmup_steps=warmup, weight_decay=0.0,
                         clip=0.0, b2=0.98, eps=1e-9),
      reference=common.reference(round(params), source="Vaswani et al. 2017, Table 3 "
                                 "(approximate)", params_key="total",
                                 batch_tokens=25_000, source_lang="en", target_lang="de"))
