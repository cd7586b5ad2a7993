"""LayerNorm and RMSNorm, computed in float32 and selectable by name."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp


class LayerNorm(nn.Module):
  """Layer normalisation over the last axis (with learned scale and bias)."""
  epsilon: float = 1e-5
  use_bias: bool = True
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    features = x.shape[-1]
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jnp.reciprocal(jnp.sqrt(var + self.epsilon))
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                       (features,), self.param_dtype)
    y = y * scale.astype(jnp.float32)
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                        (features,), self.param_dtype)
      y = y + bias.astype(jnp.float32)
    return y.astype(self.dtype)


class RMSNorm(nn.Module):
  """Root-mean-square normalisation (Zhang & Sennrich, 2019): no centring, no bias."""
  epsilon: float = 1e-6
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jnp.reciprocal(jnp.sqrt(jnp.square(x32).mean(-1, keepdims=True) + self.epsilon))
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                       (x.shape[-1],), self.param_dtype)
    return (y * scale.astype(jnp.float32)).astype(self.dtype)


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def make_norm(kind: str, *, epsilon: float, dtype=jnp.float32, param_dtype=jnp.float32,
              **kwargs) -> nn.Module:
  """The norm of the given kind ("layernorm" | "rmsnorm"); kwargs (e.g. name) go to it."""
  if kind not in NORMS:
    raise ValueError(f"norm={kind!r} is not one of {sorted(NORMS)}")
  return NORMS[kind](epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, **kwargs)
