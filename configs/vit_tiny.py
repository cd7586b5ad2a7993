"""Tiny ViTs on small grey-scale digits: `--config=configs/vit_tiny.py:{mnist,digits}`.

`mnist` (default): MNIST from a directory of IDX files the user gives
(`--config.data.source=mnist:/path/to/mnist`, or $MNIST_DIR) or a prepared TFDS copy
(`--config.data.source=tfds:mnist`); with neither, training stops with how to get either.
28x28 images cut into 7x7 patches (16 patches + [CLS]), a 4-layer, 128-wide pre-norm
encoder, AdamW with cosine decay and small random shifts as augmentation: >= 98% test
accuracy in a few minutes on a 2-core CPU (see docs/design/performance.md).

`digits`: scikit-learn's bundled 8x8 digits (1,797 images, no download): 2x2 patches, for
demos and tests that must not depend on a data directory.
"""

import os

from configs import common

SIZES = {
    "mnist": dict(image_size=28, patch_size=7, d_model=128, num_layers=4, num_heads=4,
                  mlp_dim=256, steps=1800, batch_size=128, lr=2e-3, warmup=100,
                  eval_every=300),
    "digits": dict(image_size=8, patch_size=2, d_model=64, num_layers=2, num_heads=4,
                   mlp_dim=128, steps=600, batch_size=64, lr=1e-3, warmup=50, eval_every=100),
}


def get_config(arg=None):
  name, size = common.select("vit_tiny", arg, SIZES, default="mnist")
  model = common.model(
      "vit", f"vit-tiny-{name}", num_classes=10, patch_size=size["patch_size"],
      image_size=size["image_size"], channels=1, d_model=size["d_model"],
      num_layers=size["num_layers"], num_heads=size["num_heads"], mlp_dim=size["mlp_dim"],
      pool="cls", norm_eps=1e-6, activation="gelu_exact", dropout_rate=0.0)
  if name == "mnist":
    source = "mnist:" + os.environ.get("MNIST_DIR", "")     # "mnist:" alone: a clear error
    data = common.data(source, None, None, augment="shift", shift_pixels=2)
  else:
    data = common.data("digits", None, None, augment="none")
  return common.config(
      model=model, data=data,
      train=common.train(size["steps"], size["batch_size"], eval_every=size["eval_every"],
                         log_every=50, checkpoint_every=600, best_metric="eval_accuracy",
                         eval_batch_size=500 if name == "mnist" else 120),
      optim=common.optim(size["lr"], warmup_steps=size["warmup"], weight_decay=0.05,
                         b2=0.999, min_lr_ratio=0.01))
