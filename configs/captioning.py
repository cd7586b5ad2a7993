"""Captioning composites of MNIST digits (`jaxformer.data.images.captions`):
`--config=configs/captioning.py:{encoder}_{decoder}[_pooled]`, e.g. `cnn_lstm`, `vit_transformer`,
`cnn_lstm_pooled`; encoder `cnn` | `vit`, decoder `lstm` | `gru` | `transformer`.

Images are a 3x3 grid of 16-pixel cells holding 2 to 6 digits (48x48 pixels), captions name
the digits in reading order with "left of" / "above" between them (at most 17 tokens). The
data comes from `--config.data.source=mnist:/path/to/mnist` (or $MNIST_DIR); evaluation
composites use MNIST's test digits only. `_pooled` is the no-attention baseline: the decoder
gets one mean-pooled image vector instead of re-reading the feature grid for every word.
Same data, batch, steps and seed for every model, so the comparison isolates the decoder's
view of the image. Sized for a few CPU-minutes per model (see experiments/captioning.py).
"""

from __future__ import annotations

import os

from configs import common
from jaxformer.data.images import captions

ENCODERS = {
    "cnn": dict(encoder="cnn", cnn_features=(16, 32, 64)),       # 6x6 grid
    "vit": dict(encoder="vit", patch_size=8, encoder_layers=2),     # 6x6 patches
}
DECODERS = {
    "lstm": dict(decoder="lstm", hidden_dim=128, embed_dim=32, attention_dim=64),
    "gru": dict(decoder="gru", hidden_dim=128, embed_dim=32, attention_dim=64),
    "transformer": dict(decoder="transformer", decoder_layers=2),
}
LABELS = {"cnn": "CNN grid", "vit": "ViT patch grid", "lstm": "LSTM + additive attention",
          "gru": "GRU + additive attention", "transformer": "Transformer + cross-attention"}
NAMES = {"lstm": "LSTM", "gru": "GRU", "transformer": "Transformer"}
STEPS, BATCH = 2000, 64
DATA = dict(grid=3, digit_size=14, jitter=2, min_digits=2, max_digits=6, num_eval=500)


def parse(arg: str | None) -> tuple[str, str, bool]:
  """'cnn_lstm_pooled' -> ('cnn', 'lstm', False); a ValueError lists the valid names."""
  arg = arg or "cnn_lstm"
  parts = arg.split("_")
  pooled = parts[-1] == "pooled"
  parts = parts[:-1] if pooled else parts
  if len(parts) != 2 or parts[0] not in ENCODERS or parts[1] not in DECODERS:
    raise ValueError(f"unknown captioning config {arg!r}; valid names: "
                     f"{{{'|'.join(ENCODERS)}}}_{{{'|'.join(DECODERS)}}}[_pooled], e.g. "
                     "cnn_lstm, vit_transformer_pooled")
  return parts[0], parts[1], not pooled


def label(arg: str | None) -> str:
  encoder, decoder, attention = parse(arg)
  if attention:
    return f"{LABELS[encoder]}, {LABELS[decoder]}"
  return f"{LABELS[encoder]}, {NAMES[decoder]} on one pooled vector (no attention)"


def get_config(arg=None):
  encoder, decoder, attention = parse(arg)
  source = "mnist:" + os.environ.get("MNIST_DIR", "")     # "mnist:" alone: a clear error
  data = common.data(source, None, None, **DATA)
  model = common.model(
      "captioner", f"captioner-{arg or 'cnn_lstm'}", vocab_size=captions.VOCAB_SIZE,
      max_len=captions.caption_length(data), image_size=captions.image_size(data), channels=1,
      attention=attention, d_model=128, num_heads=4, mlp_dim=256, dropout_rate=0.0,
      **ENCODERS[encoder], **DECODERS[decoder])
  return common.config(
      model=model, data=data,
      train=common.train(STEPS, BATCH, eval_every=500, log_every=100, checkpoint_every=500,
                         best_metric="eval_accuracy", eval_batch_size=250,
                         attention_maps=False),
      optim=common.optim(1e-3, warmup_steps=100, weight_decay=0.0, b2=0.98, min_lr_ratio=0.1))
