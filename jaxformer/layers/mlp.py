"""Feed-forward blocks: a two-layer Mlp and the gated SwiGLU (Shazeer, 2020)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers.dense import default_kernel_init, dense

ACTIVATIONS: dict[str, Callable] = {
    "relu": nn.relu,
    "gelu": functools.partial(nn.gelu, approximate=True),         # GPT-2's tanh approximation
    "gelu_exact": functools.partial(nn.gelu, approximate=False),  # BERT / ViT
    "silu": nn.silu,
}


def activation_fn(name: str) -> Callable:
  if name not in ACTIVATIONS:
    raise ValueError(f"activation={name!r} is not one of {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


class Mlp(nn.Module):
  """out(drop(act(x W_in + b_in))) W_out + b_out, hidden width `hidden_dim`."""
  hidden_dim: int
  out_dim: int | None = None          # default: input width
  activation: str = "gelu"
  use_bias: bool = True
  dropout_rate: float = 0.0           # on the hidden activations
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init   # (in_axis, out_axis) -> initializer

  @nn.compact
  def __call__(self, x, *, deterministic: bool = True):
    act = activation_fn(self.activation)
    kw = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
              kernel_init=self.kernel_init)
    h = dense(self.hidden_dim, ("embed", "mlp"), name="wi", **kw)(x)
    h = nn.with_logical_constraint(act(h), ("batch", "length", "mlp"))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return dense(self.out_dim or x.shape[-1], ("mlp", "embed"), name="wo", **kw)(h)


class SwiGLU(nn.Module):
  """(act(x W_gate) * (x W_up)) W_out: the gated FFN of PaLM / Llama (act=silu)."""
  hidden_dim: int
  out_dim: int | None = None
  activation: str = "silu"
  use_bias: bool = False
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init   # (in_axis, out_axis) -> initializer

  @nn.compact
  def __call__(self, x, *, deterministic: bool = True):
    act = activation_fn(self.activation)
    kw = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
              kernel_init=self.kernel_init)
    gate = dense(self.hidden_dim, ("embed", "mlp"), name="wi_gate", **kw)(x)
    up = dense(self.hidden_dim, ("embed", "mlp"), name="wi_up", **kw)(x)
    h = nn.with_logical_constraint(act(gate) * up, ("batch", "length", "mlp"))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return dense(self.out_dim or x.shape[-1], ("mlp", "embed"), name="wo", **kw)(h)
