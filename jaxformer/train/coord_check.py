"""The μP coordinate check (Yang et al. 2022, "Tensor Programs V", Section 6): each width of a
decoder LM trained a few steps on one fixed batch, every layer's mean |output| recorded (see
`jaxformer.scaling.mup` for what the slopes mean). It runs training steps, so it lives with
training; its result, `mup.CoordCheck`, needs no JAX."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxformer import compilation, run_settings, tasks
from jaxformer.scaling import mup
from jaxformer.state import train_state as state_lib
from jaxformer.train import step as step_lib


def coordinate_check(config: Any, widths: Sequence[int], *, steps: int = 4,
                     batch_size: int = 8, seq_len: int | None = None, seed: int = 0,
                     tokens: np.ndarray | None = None) -> mup.CoordCheck:
  """Train `config` (a full training config of a decoder LM) at each width for `steps`
  steps on one fixed batch with its own optimizer (`config.optim`, LR groups included) and
  record every layer's mean |output| before the first and after each update.

  `tokens`: a [batch, seq_len + 1] int array of real text (default: uniform random ids from
  `seed`); inputs are tokens[:, :-1], targets tokens[:, 1:]. Layers are named by module
  path (e.g. decoder/layers_0/block/ffn/wo); the model's logits are "logits".
  """
  if sorted(set(widths)) != list(widths) or len(widths) < 2:
    raise ValueError(f"widths {list(widths)} must be >= 2 distinct increasing ints")
  settings = run_settings.parse(config)
  if tasks.task_for(settings.model).name != "lm":
    raise ValueError("coordinate_check trains decoder language models (model.family="
                     f"{settings.model.family!r} is not one)")
  seq_len = seq_len or settings.data.seq_len
  if tokens is None:
    tokens = np.random.default_rng(seed).integers(0, settings.model.vocab_size,
                                                  (batch_size, seq_len + 1))
  tokens = np.asarray(tokens, np.int32)
  batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:])}
  sizes = {}
  for width in widths:
    model = mup.with_width(settings.model, width)
    train = dataclasses.replace(settings.train, steps=steps + 1)
    module, tx, init_boxed = state_lib.train_state_fns(
        config, dataclasses.replace(settings, train=train, model=model))
    train_step = step_lib.make_train_step(module, tx, tasks.task_for(model))

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
  return mup.CoordCheck(tuple(widths), steps, settings.model.parametrization,
                    sizes)


def _coordinate_sizes(intermediates) -> dict:
  """{layer path: mean |x|} of every array a module returned ([B, T, features] outputs)."""
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

