"""Learning rate x width on character-level Shakespeare: the smallest useful 2-D sweep.

`configs/sweeps/lr_width.py` sweeps the `tiny` config (60 steps, ~10 s a point on a 2-core
CPU, 6 points); `:nanogpt_cpu` sweeps the README's 2000-step CPU model instead (minutes a point).
mlp_dim follows the width (4x), so each point is a consistently shaped model.
"""

from __future__ import annotations

from configs import shakespeare_char

WIDTHS = (32, 64)
LEARNING_RATES = (3e-4, 1e-3, 3e-3)


def get_sweep(arg=None):
  size = arg or "tiny"
  if size not in shakespeare_char.SIZES:
    raise ValueError(f"lr_width sweep arg {arg!r} must name a shakespeare_char size: "
                     f"{', '.join(shakespeare_char.SIZES)}")
  return dict(
      base=f"configs/shakespeare_char.py:{size}",
      product={"optim.lr": list(LEARNING_RATES)},
      zip={"model.d_model": list(WIDTHS), "model.mlp_dim": [4 * w for w in WIDTHS]},
      name="d{model.d_model}_lr{optim.lr:g}",
  )
