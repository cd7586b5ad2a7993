"""Mixture-of-experts FFN: softmax router, top-k experts, dropless grouped matmuls.

Tokens are sorted by their assigned expert and the experts run as one grouped matmul
(`jax.lax.ragged_dot`), so no token is dropped and no [tokens, experts, capacity] dispatch
tensor is built. The top-k router weights are renormalised to sum to 1 (Mixtral).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.layers.dense import default_kernel_init, dense
from jaxformer.layers.mlp import activation_fn


class MoE(nn.Module):
  num_experts: int
  experts_per_token: int
  hidden_dim: int
  activation: str = "silu"
  gated: bool = True                  # SwiGLU experts (Mixtral); False: act(x W_in) W_out
  use_bias: bool = False              # accepted for FFN-interface parity; experts have none
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init   # (in_axis, out_axis, batch_axis) -> init

  def _expert_weights(self, name, shape, axes):
    """Stacked expert kernels [experts, in, out], initialised per expert."""
    init = self.kernel_init(1, 2, batch_axis=0)
    return self.param(name, nn.with_logical_partitioning(init, axes), shape,
                      self.param_dtype).astype(self.dtype)

  @nn.compact
  def __call__(self, x, *, deterministic: bool = True):
    if not 0 < self.experts_per_token <= self.num_experts:
      raise ValueError(f"experts_per_token={self.experts_per_token} must be in "
                       f"[1, num_experts={self.num_experts}]")
    act = activation_fn(self.activation)
    shape, e = x.shape, x.shape[-1]
    tokens = x.reshape(-1, e)
    logits = dense(self.num_experts, ("embed", None), name="router", dtype=jnp.float32,
                   param_dtype=self.param_dtype)(tokens.astype(jnp.float32))
    weights, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), self.experts_per_token)
    weights = weights / weights.sum(-1, keepdims=True)                 # [N, k]

    flat_experts = experts.reshape(-1)                                  # [N * k]
    order = jnp.argsort(flat_experts, stable=True)
    group_sizes = jnp.bincount(flat_experts, length=self.num_experts).astype(jnp.int32)
    xs = tokens[order // self.experts_per_token].astype(self.dtype)     # sorted by expert
    x_axes = ("expert", "embed", "mlp")
    if self.gated:
      h = act(jax.lax.ragged_dot(xs, self._expert_weights(
          "wi_gate", (self.num_experts, e, self.hidden_dim), x_axes), group_sizes))
      h = h * jax.lax.ragged_dot(xs, self._expert_weights(
          "wi_up", (self.num_experts, e, self.hidden_dim), x_axes), group_sizes)
    else:
      h = act(jax.lax.ragged_dot(xs, self._expert_weights(
          "wi", (self.num_experts, e, self.hidden_dim), x_axes), group_sizes))
    ys = jax.lax.ragged_dot(h, self._expert_weights(
        "wo", (self.num_experts, self.hidden_dim, e), ("expert", "mlp", "embed")),
        group_sizes)
    ys = jnp.zeros_like(ys).at[order].set(ys).reshape(-1, self.experts_per_token, e)
    out = jnp.einsum("nke,nk->ne", ys.astype(jnp.float32), weights)
    return out.reshape(shape).astype(self.dtype)

