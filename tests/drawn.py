"""Parameters drawn on the host at a module's init shapes, for tests of what a model computes
rather than of its init: `jax.eval_shape` traces the init without compiling it (a compiled
init of a tiny model costs more CPU than the programs such a test is about)."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np


def like(abstract, seed: int = 0, std: float = 0.2):
  """Host arrays at `abstract`'s shapes and dtypes: floats N(0, std^2) (norm scales 1 +
  that, so no layer starts dead), integers zero."""
  rng = np.random.default_rng(seed)

  def draw(path, s):
    if not jax.numpy.issubdtype(s.dtype, jax.numpy.floating):
      return np.zeros(s.shape, s.dtype)
    scale = "scale" in jax.tree_util.keystr(path)
    return (std * rng.normal(size=s.shape) + scale).astype(s.dtype)
  return jax.tree_util.tree_map_with_path(draw, abstract)


def state(init, std: float = 0.2) -> dict:
  """The train state `init()` returns (boxed or not), drawn from its shapes without compiling
  it: params as `like`, everything else (optimizer moments, the step) zeros."""
  abstract = nn.unbox(jax.eval_shape(init))
  rest = {k: v for k, v in abstract.items() if k != "params"}
  return dict(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), rest),
              params=like(abstract["params"], std=std))


def params(module: nn.Module, *args, seed: int = 0, **kwargs):
  """`module`'s params (unboxed, as JAX arrays) drawn at the shapes
  `module.init(key, *args, **kwargs)` would give."""
  abstract = jax.eval_shape(module.init, jax.random.key(0), *args, **kwargs)
  return jax.tree.map(jax.numpy.asarray, like(nn.unbox(abstract)["params"], seed))
