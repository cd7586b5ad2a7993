"""Width-scaling tools for μP (`model.parametrization="mup"`, layers/parametrization.py).

    cfg = mup.with_width(config.model, 256)        # the same model shape at d_model=256
    check = coord_check.coordinate_check(config, widths=(32, 64, 128, 256, 512), steps=4)
    check.slopes()                                 # d log|x| / d log width, per layer and step

(`coord_check` is `jaxformer.train.coord_check`: it trains, so it lives with training; this
module holds what needs no training and never imports `train`.)

The coordinate check (Yang et al. 2022, "Tensor Programs V", Section 6 / the `mup` package's
coord check) trains each width for a few steps on one fixed batch and records the mean
absolute value of every layer's output. Under μP those coordinate sizes stay flat in width
after any number of updates; under the standard parametrization some grow with width
(the logits and hidden outputs after a step grow like width^1 with Adam), which is why the
optimal learning rate of a standard model shifts with its width. A slope is the least-squares
exponent p of size ~ width^p over the widths.

Nothing here imports JAX.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import numpy as np


def with_width(model_config: Any, d_model: int) -> Any:
  """A copy of `model_config` (ConfigDict, dict or `models.ModelSettings`) at width
  `d_model`: mlp_dim in proportion; with `head_dim` unset the heads stay and grow wider,
  with `head_dim` set the heads (and kv heads) grow in number. Depth, vocabulary and everything else are kept (μP's width
  scaling; `mup_base_width` stays the base). ValueError if a size does not scale evenly."""
  cfg = copy.deepcopy(model_config)
  old = cfg["d_model"]
  if not isinstance(d_model, int) or d_model <= 0:
    raise ValueError(f"width {d_model!r} must be an int > 0")

  def scaled(key):
    value = cfg[key]
    if (value * d_model) % old:
      raise ValueError(f"model.{key}={value} does not scale evenly from d_model={old} to "
                       f"{d_model}: pick a width that is a multiple of "
                       f"{old // math.gcd(old, value)}")
    return value * d_model // old

  updates = {"d_model": d_model, "mlp_dim": scaled("mlp_dim")}
  if cfg.get("head_dim"):
    updates["num_heads"] = scaled("num_heads")
    if cfg.get("num_kv_heads"):
      updates["num_kv_heads"] = scaled("num_kv_heads")
  elif d_model % cfg["num_heads"]:
    raise ValueError(f"width {d_model} is not divisible by model.num_heads={cfg['num_heads']}")
  if dataclasses.is_dataclass(cfg):         # the run's typed (frozen) model settings
    return dataclasses.replace(cfg, **updates)
  for key, value in updates.items():
    cfg[key] = value
  return cfg


@dataclasses.dataclass
class CoordCheck:
  """Mean |activation| per (width, layer, step): `sizes[width][layer][t]` after t updates."""
  widths: tuple[int, ...]
  steps: int
  parametrization: str
  sizes: dict[int, dict[str, list[float]]]

  @property
  def layers(self) -> list[str]:
    return [name for name in self.sizes[self.widths[0]]
            if all(name in self.sizes[w] for w in self.widths)]

  def slopes(self) -> dict[str, list[float]]:
    """Per layer and step: the exponent p of size ~ width^p (least squares in log-log)."""
    x = np.log(np.asarray(self.widths, np.float64))
    out = {}
    for name in self.layers:
      y = np.log(np.array([self.sizes[w][name] for w in self.widths], np.float64))  # [W, T]
      out[name] = [float(np.polyfit(x, y[:, t], 1)[0]) for t in range(self.steps + 1)]
    return out

  def max_growth(self, first_step: int = 1) -> tuple[str, int, float]:
    """(layer, step, slope) of the steepest growth in width at steps >= first_step."""
    return max(((name, t, s[t]) for name, s in self.slopes().items()
                for t in range(first_step, self.steps + 1)), key=lambda r: r[2])

  def to_json(self) -> dict:
    return {"widths": list(self.widths), "steps": self.steps,
            "parametrization": self.parametrization,
            "sizes": {str(w): v for w, v in self.sizes.items()}, "slopes": self.slopes()}
