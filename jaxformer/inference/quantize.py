"""Weight-only int8 for a decoder's dense kernels: per-output-channel symmetric scales.

`quantize_params(model_config, params)` converts a restored params tree: every kernel of a
`layers.dense.DenseGeneral` (attention q/k/v/out, the MLP, an untied `lm_head`) becomes an
`Int8Kernel` (int8 values `q` of the kernel's shape and float32 `scale` with the contracted
axes kept as size 1), everything else (embedding tables, norms, biases, MoE experts) stays
float. Output channel c of a kernel W has scale s_c = max_k |W[k, c]| / 127 (k over the
contracted axes; s_c = 1 for an all-zero channel) and q = round(W / s_c) in [-127, 127], so
|W - q s_c| <= s_c / 2 element-wise, and for any input x, |x.W - x.(q s)|_c <= s_c/2 ||x||_1.

The model code is unchanged: a layer reads its kernel through `kernel.astype(dtype)`
(`layers.gather.gathered`), and `Int8Kernel.astype` dequantizes there (q * s in the compute
dtype), inside the compiled program. The params held in memory are int8 (4x smaller kernels);
the matmuls themselves still run in the compute dtype. `param_bytes` counts a tree's bytes.

Why not Qwix (docs/design/serving.md): Qwix 0.1.8's weight-only PTQ wraps a kernel in
objects whose `astype` works only on Flax-boxed params, while its `quantize_params` takes
only unboxed ones, so this codebase's layers (which cast kernels with `.astype`) fail under
it; and its embedding interception breaks `jnp.take`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import models
from jaxformer.layers.dense import DenseGeneral


@flax.struct.dataclass
class Int8Kernel:
  """A kernel stored as int8 `q` with float32 per-output-channel `scale` (q.shape with the
  contracted axes of size 1); `astype(dtype)` is the dequantized kernel q * scale."""
  q: jax.Array
  scale: jax.Array

  @property
  def shape(self):
    return self.q.shape

  @property
  def ndim(self):
    return self.q.ndim

  @property
  def dtype(self):
    return self.scale.dtype

  def astype(self, dtype):
    return self.q.astype(dtype) * self.scale.astype(dtype)


def quantize_kernel(kernel, contract_axes) -> Int8Kernel:
  """Symmetric int8 with one scale per output channel (every axis not in `contract_axes`)."""
  w = jnp.asarray(kernel, jnp.float32)
  amax = jnp.max(jnp.abs(w), axis=tuple(contract_axes), keepdims=True)
  scale = jnp.where(amax > 0, amax / 127.0, 1.0)
  q = jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8)
  return Int8Kernel(q=q, scale=scale.astype(jnp.float32))


def _dense_layouts(model_config) -> dict[tuple[str, ...], tuple[int, int]]:
  """Params path of each DenseGeneral kernel -> (num_in, rank of the kernel inside the
  module): read off one abstract init of the model with its method calls intercepted."""
  model = models.build(model_config)
  found = {}

  def record(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, DenseGeneral) and context.method_name == "__call__":
      found[tuple(module.path) + ("kernel",)] = (module.num_in,
                                                 module.num_in + len(module.features))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
  return found


def quantize_params(model_config: Any, params) -> dict:
  """The params of a decoder LM with every dense kernel as an `Int8Kernel` (module
  docstring); a stacked (scanned) kernel [layers, ...] gets per-layer scales. A ValueError
  for a non-decoder config or params that do not fit it."""
  cfg = models.config_as_dict(model_config)
  if cfg.get("family") != "decoder":
    raise ValueError(f"model.family={cfg.get('family')!r}: int8 weights are for decoder LMs "
                     "(family='decoder')")
  if isinstance(params, Mapping) and "params" in params:
    params = params["params"]
  params = nn.unbox(params)
  layouts = _dense_layouts(cfg)
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params))
  missing = sorted("/".join(p) for p in layouts if p not in flat)
  if missing:
    raise ValueError(f"params do not fit model_config: no {missing[0]} (a different model?)")
  out = {}
  for path, value in flat.items():
    if path in layouts:
      num_in, rank = layouts[path]
      lead = np.ndim(value) - rank                 # stacked layers (scan) in front
      if lead < 0:
        raise ValueError(f"params {'/'.join(path)} has shape {np.shape(value)}, not a "
                         f"rank-{rank} kernel")
      value = quantize_kernel(value, range(lead, lead + num_in))
    out[path] = value
  return flax.traverse_util.unflatten_dict(out)


def param_bytes(params) -> int:
  """Bytes held by a params tree's arrays (an Int8Kernel counts its int8 values and scales)."""
  return int(sum(np.asarray(x).nbytes if not hasattr(x, "nbytes") else x.nbytes
                 for x in jax.tree.leaves(nn.unbox(params))))


__all__ = ["Int8Kernel", "quantize_kernel", "quantize_params", "param_bytes"]
