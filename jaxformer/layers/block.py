"""TransformerBlock: (pre- or post-norm) self-attention, optional cross-attention, FFN."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers.attention import MultiHeadAttention
from jaxformer.layers.mlp import Mlp, SwiGLU
from jaxformer.layers.moe import MoE
from jaxformer.layers.norms import make_norm

FFNS = {"mlp": Mlp, "swiglu": SwiGLU, "moe": MoE}


class TransformerBlock(nn.Module):
  """One Transformer layer on [B, T, E].

  pre_norm=True (GPT-2, Llama, ViT):  x += drop(attn(norm(x))); x += drop(ffn(norm(x)))
  pre_norm=False (Vaswani, BERT):     x = norm(x + drop(attn(x))); x = norm(x + drop(ffn(x)))
  With cross_attention=True a cross-attention sub-layer over `context` sits between the two.
  """
  num_heads: int
  mlp_dim: int
  head_dim: int | None = None
  num_kv_heads: int | None = None
  pre_norm: bool = True
  norm: str = "layernorm"
  norm_eps: float = 1e-5
  ffn: str = "mlp"                    # a key of FFNS
  num_experts: int = 0                # ffn="moe": experts and top-k
  experts_per_token: int = 2
  moe_dispatch: str = "dropless"      # ffn="moe": see layers/moe.py for these five
  moe_capacity_factor: float = 1.25
  moe_router_jitter: float = 0.0
  moe_renormalize: bool = True
  moe_gated: bool = True
  activation: str | None = None       # None: the FFN's default (gelu for mlp, silu for swiglu)
  use_bias: bool = True               # attention output, FFN and norm biases
  qkv_bias: bool = False
  causal: bool = False
  window: int | tuple[int | None, int | None] | None = None
  positions: str = "none"             # "none" | "rope" | "alibi"
  rope_theta: float = 10_000.0
  cross_attention: bool = False
  dropout_rate: float = 0.0           # residual dropout
  attention_dropout_rate: float = 0.0
  impl: str = "auto"
  attention_block_sizes: tuple[int, int] | None = None   # (block_q, block_k): pallas/blocked
  decode: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def _norm(self, name):
    kwargs = {"use_bias": self.use_bias} if self.norm == "layernorm" else {}
    return make_norm(self.norm, epsilon=self.norm_eps, dtype=self.dtype,
                     param_dtype=self.param_dtype, name=name, **kwargs)

  def _attention(self, name, *, cross):
    return MultiHeadAttention(
        num_heads=self.num_heads, head_dim=self.head_dim, num_kv_heads=self.num_kv_heads,
        qkv_bias=self.qkv_bias, out_bias=self.use_bias, causal=self.causal and not cross,
        window=None if cross else self.window, positions="none" if cross else self.positions,
        rope_theta=self.rope_theta, dropout_rate=self.attention_dropout_rate, impl=self.impl,
        block_sizes=self.attention_block_sizes, decode=self.decode and not cross,
        dtype=self.dtype, param_dtype=self.param_dtype,
        name=name)

  def _ffn(self):
    if self.ffn not in FFNS:
      raise ValueError(f"ffn={self.ffn!r} is not one of {sorted(FFNS)}")
    kwargs = {} if self.activation is None else {"activation": self.activation}
    if self.ffn == "moe":
      kwargs.update(num_experts=self.num_experts, experts_per_token=self.experts_per_token,
                    dispatch=self.moe_dispatch, capacity_factor=self.moe_capacity_factor,
                    router_jitter=self.moe_router_jitter, renormalize=self.moe_renormalize,
                    gated=self.moe_gated)
    return FFNS[self.ffn](hidden_dim=self.mlp_dim, use_bias=self.use_bias, dtype=self.dtype,
                          param_dtype=self.param_dtype, name="ffn", **kwargs)

  @nn.compact
  def __call__(self, x, context=None, *, mask=None, context_mask=None, segment_ids=None,
               positions=None, deterministic: bool = True):
    """x [B, T, E]; context [B, S, E'] (needs cross_attention=True); mask / context_mask
    bool broadcastable to [B, H, T, T] / [B, H, T, S]; segment_ids [B, T] for packing."""
    if self.cross_attention != (context is not None):
      raise ValueError("pass context exactly when cross_attention=True "
                       f"(cross_attention={self.cross_attention}, context given: "
                       f"{context is not None})")
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    drop = nn.Dropout(self.dropout_rate)
    sublayers = [("self_attention", lambda h: self._attention("self_attention", cross=False)(
        h, mask=mask, segment_ids=segment_ids, positions=positions,
        deterministic=deterministic))]
    if self.cross_attention:
      sublayers.append(("cross_attention", lambda h: self._attention("cross_attention",
                                                                     cross=True)(
          h, context, mask=context_mask, deterministic=deterministic)))
    sublayers.append(("ffn", lambda h: self._ffn()(h, deterministic=deterministic)))
    for name, sublayer in sublayers:
      if self.pre_norm:
        x = x + drop(sublayer(self._norm(f"{name}_norm")(x)), deterministic=deterministic)
      else:
        x = self._norm(f"{name}_norm")(x + drop(sublayer(x), deterministic=deterministic))
      x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    return x
