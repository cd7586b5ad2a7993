"""Width-scaling tools for μP (`model.parametrization="mup"`, layers/parametrization.py).

    cfg = mup.with_width(config.model, 256)        # the same model shape at d_model=256
    check = mup.coordinate_check(config, widths=(32, 64, 128, 256, 512), steps=4)
    check.slopes()                                 # d log|x| / d log width, per layer and step

The coordinate check (Yang et al. 2022, "Tensor Programs V", Section 6 / the `mup` package's
coord check) trains each width for a few steps on one fixed batch and records the mean
absolute value of every layer's output. Under μP those coordinate sizes stay flat in width
after any number of updates; under the standard parametrization some grow with width
(the logits and hidden outputs after a step grow like width^1 with Adam), which is why the
optimal learning rate of a standard model shifts with its width. A slope is the least-squares
exponent p of size ~ width^p over the widths.

`with_width` needs no JAX; `coordinate_check` builds and trains models (imports JAX).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def with_width(model_config: Any, d_model: int) -> Any:
  """A copy of `model_config` (ConfigDict or dict) at width `d_model`: mlp_dim in proportion;
  with `head_dim` unset the heads stay and grow wider, with `head_dim` set the heads (and kv
  heads) grow in number. Depth, vocabulary and everything else are kept (μP's width
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


def coordinate_check(config: Any, widths: Sequence[int], *, steps: int = 4,
                     batch_size: int = 8, seq_len: int | None = None, seed: int = 0,
                     tokens: np.ndarray | None = None) -> CoordCheck:
  """Train `config` (a full training config of a decoder LM) at each width for `steps`
  steps on one fixed batch with its own optimizer (`config.optim`, LR groups included) and
  record every layer's mean |output| before the first and after each update.

  `tokens`: a [batch, seq_len + 1] int array of real text (default: uniform random ids from
  `seed`); inputs are tokens[:, :-1], targets tokens[:, 1:]. Layers are named by module
  path (e.g. decoder/layers_0/block/ffn/wo); the model's logits are "logits".
  """
  import jax
  import jax.numpy as jnp
  from flax import linen as nn

  from jaxformer import compilation
  from jaxformer.train import state as state_lib, step as step_lib, tasks

  if sorted(set(widths)) != list(widths) or len(widths) < 2:
    raise ValueError(f"widths {list(widths)} must be >= 2 distinct increasing ints")
  if tasks.task_for(config.model).name != "lm":
    raise ValueError("coordinate_check trains decoder language models (model.family="
                     f"{config.model.get('family')!r} is not one)")
  seq_len = seq_len or config.data.seq_len
  if tokens is None:
    tokens = np.random.default_rng(seed).integers(0, config.model.vocab_size,
                                                  (batch_size, seq_len + 1))
  tokens = np.asarray(tokens, np.int32)
  batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:])}
  sizes = {}
  for width in widths:
    cfg = copy.deepcopy(config)
    cfg.model = with_width(config.model, width)
    cfg.train.steps = steps + 1
    module, tx, init_boxed = state_lib.train_state_fns(cfg)
    train_step = step_lib.make_train_step(module, tx, tasks.task_for(cfg.model))

    def measure(params):
      _, mutated = module.apply({"params": params}, batch["inputs"],
                                capture_intermediates=True, mutable=["intermediates"])
      return _coordinate_sizes(mutated["intermediates"])

    def run():
      def body(state, _):
        sizes = measure(state["params"])
        return train_step(state, batch, jax.random.key(seed))[0], sizes
      # steps + 1 measurements; the last iteration's update is thrown away (cheaper to run
      # than a second forward graph is to compile)
      return jax.lax.scan(body, nn.unbox(init_boxed()), length=steps + 1)[1]

    # one program per width, run once: compiled without LLVM's optimisation on the CPU
    measured = jax.jit(run, compiler_options=compilation.run_once_options())()
    sizes[width] = {name: np.asarray(v, np.float64).tolist() for name, v in measured.items()}
  return CoordCheck(tuple(widths), steps, config.model.get("parametrization", "standard"),
                    sizes)


def _coordinate_sizes(intermediates) -> dict:
  """{layer path: mean |x|} of every array a module returned ([B, T, features] outputs)."""
  import jax
  import jax.numpy as jnp

  out = {}
  for path, value in jax.tree_util.tree_leaves_with_path(intermediates):
    names = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
    # a module's outputs are a tuple (one per call): keep modules called once that return
    # one [B, T, F] array (a scanned-layer body returns (x, None): its block has x)
    if "__call__" not in names or names[names.index("__call__"):] != ["__call__", "0"]:
      continue
    if value.ndim != 3 or names[names.index("__call__") - 1].startswith("Dropout"):
      continue                      # dropout repeats its input (and is off here)
    module_path = "/".join(names[:names.index("__call__")])
    out[module_path or "logits"] = jnp.mean(jnp.abs(value.astype(jnp.float32)))
  return out

