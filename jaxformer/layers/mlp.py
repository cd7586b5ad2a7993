"""Feed-forward blocks: a two-layer Mlp, optionally gated (SwiGLU and friends)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
from jax.ad_checkpoint import checkpoint_name
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
  """Two-layer feed-forward block: drop(act(x W_in + b)) W_out + b, hidden width hidden_dim.

  gated=True gives the GLU family: (act(x W_gate) * (x W_up)) W_out (Shazeer, 2020).
  """
  hidden_dim: int
  out_dim: int | None = None          # default: input width
  activation: str = "gelu"
  use_bias: bool = True
  gated: bool = False
  dropout_rate: float = 0.0           # on the hidden activations
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init   # (in_axis, out_axis) -> initializer

  @nn.compact
  def __call__(self, x, *, deterministic: bool = True):
    act = activation_fn(self.activation)
    kw = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
              kernel_init=self.kernel_init)
    # "mlp_in" / "mlp_out": names for the remat policies that keep them (layers/block_settings.py)
    wi = lambda name: checkpoint_name(dense(self.hidden_dim, ("embed", "mlp"), name=name,
                                            **kw)(x), "mlp_in")
    if self.gated:
      h = act(wi("wi_gate")) * wi("wi_up")
    else:
      h = act(wi("wi"))
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return checkpoint_name(dense(self.out_dim or x.shape[-1], ("mlp", "embed"), name="wo",
                                 **kw)(h), "mlp_out")


class SwiGLU(Mlp):
  """The gated SiLU FFN of PaLM / Llama: (silu(x W_gate) * (x W_up)) W_out, no biases."""
  activation: str = "silu"
  use_bias: bool = False
  gated: bool = True


FFNS = {"mlp": Mlp, "swiglu": SwiGLU}     # the `model.ffn` kinds (experts replace them: moe.py)
