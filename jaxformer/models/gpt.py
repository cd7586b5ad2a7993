"""Decoder-only language models: GPT-2/GPT-3 and Llama/Mistral/Mixtral by configuration.

One code path; the families differ only in fields: positions ("learned" for GPT, "rope" for
Llama), norm ("layernorm" / "rmsnorm"), ffn ("mlp" + gelu / "swiglu"), biases, GQA
(num_kv_heads), tied or untied output head and sliding window. num_experts > 0 swaps every FFN
for a mixture of experts (layers/moe.py); the `moe_*` fields choose its routing, and the two
aux-loss weights live here so the objective travels with the model (the train step reads them
through `jaxformer.layers.moe.collect_moe`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, LearnedPositionEmbedding, make_norm
from jaxformer.layers.dense import dense
from jaxformer.layers.moe import validate_moe
from jaxformer.models.stack import BlockStack
from jaxformer.ops import positions as pos_ops


class DecoderLM(nn.Module):
  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  num_kv_heads: int | None = None
  head_dim: int | None = None
  max_len: int = 1024                 # size of the learned position table
  positions: str = "learned"          # "learned" | "rope" | "alibi" | "sinusoidal" | "none"
  rope_theta: float = 10_000.0
  norm: str = "layernorm"
  norm_eps: float = 1e-5
  ffn: str = "mlp"
  activation: str | None = None
  use_bias: bool = True
  qkv_bias: bool | None = None        # None: same as use_bias
  tie_embeddings: bool = True
  window: int | None = None           # sliding-window attention (Mistral)
  num_experts: int = 0                # > 0: mixture-of-experts FFN (Mixtral)
  experts_per_token: int = 2
  moe_dispatch: str = "dropless"      # "dropless" (Mixtral) | "capacity" (GShard/Switch)
  moe_capacity_factor: float = 1.25   # capacity dispatch: expert slots = ceil(cf * T * k / E)
  moe_router_jitter: float = 0.0      # training noise on the router input (Switch: 0.01)
  moe_renormalize: bool = True        # top-k gates sum to 1 (Mixtral); False: Switch
  moe_gated: bool = True              # SwiGLU-style experts; False: act(x W_in) W_out
  moe_load_balance_weight: float = 0.01   # aux-loss weights, see collect_moe
  moe_z_loss_weight: float = 0.001
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  attention_impl: str = "auto"
  attention_block_sizes: tuple[int, int] | None = None   # (block_q, block_k), see ops.attention
  scan_layers: bool = False
  remat_policy: str = "none"
  decode: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.num_experts:
      validate_moe(num_experts=self.num_experts, experts_per_token=self.experts_per_token,
                   dispatch=self.moe_dispatch, capacity_factor=self.moe_capacity_factor,
                   router_jitter=self.moe_router_jitter, field=_moe_field)
      for name in ("moe_load_balance_weight", "moe_z_loss_weight"):
        if getattr(self, name) < 0:
          raise ValueError(f"model.{name}={getattr(self, name)} must be >= 0")
    super().__post_init__()

  def block_fields(self) -> dict:
    ffn = "moe" if self.num_experts else self.ffn
    extra = dict(num_experts=self.num_experts, experts_per_token=self.experts_per_token,
                 moe_dispatch=self.moe_dispatch, moe_capacity_factor=self.moe_capacity_factor,
                 moe_router_jitter=self.moe_router_jitter,
                 moe_renormalize=self.moe_renormalize, moe_gated=self.moe_gated) if (
        self.num_experts) else {}
    return dict(num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                head_dim=self.head_dim, mlp_dim=self.mlp_dim, pre_norm=True, norm=self.norm,
                norm_eps=self.norm_eps, ffn=ffn, activation=self.activation,
                use_bias=self.use_bias,
                qkv_bias=self.use_bias if self.qkv_bias is None else self.qkv_bias,
                causal=True, window=self.window,
                positions=self.positions if self.positions in ("rope", "alibi") else "none",
                rope_theta=self.rope_theta, dropout_rate=self.dropout_rate,
                attention_dropout_rate=self.attention_dropout_rate, impl=self.attention_impl,
                attention_block_sizes=self.attention_block_sizes,
                decode=self.decode, dtype=self.dtype, param_dtype=self.param_dtype, **extra)

  @nn.compact
  def __call__(self, tokens, *, segment_ids=None, positions=None, deterministic: bool = True):
    """tokens [B, T] int -> logits [B, T, vocab] (float32)."""
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, length]; got shape {tokens.shape}")
    embed = Embed(self.vocab_size, self.d_model, dtype=self.dtype,
                  param_dtype=self.param_dtype, name="embed")
    x = embed(tokens)
    if positions is None:
      positions = jnp.arange(tokens.shape[1])[None]
      if self.decode and self.positions in ("learned", "sinusoidal"):
        raise ValueError("decode=True with absolute positions needs explicit `positions`")
    if self.positions == "learned":
      x = x + LearnedPositionEmbedding(self.max_len, self.d_model, dtype=self.dtype,
                                       param_dtype=self.param_dtype, name="pos_embed")(positions)
    elif self.positions == "sinusoidal":
      x = x + pos_ops.sinusoidal(positions, self.d_model, dtype=self.dtype)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = BlockStack(self.num_layers, self.block_fields(), scan=self.scan_layers,
                   remat_policy=self.remat_policy, name="decoder")(
        x, segment_ids=segment_ids, positions=positions, deterministic=deterministic)
    x = make_norm(self.norm, epsilon=self.norm_eps, dtype=self.dtype,
                  param_dtype=self.param_dtype, name="final_norm")(x)
    if self.tie_embeddings:
      logits = embed.attend(x)
    else:
      logits = dense(self.vocab_size, ("embed", "vocab"), name="lm_head", dtype=self.dtype,
                     param_dtype=self.param_dtype)(x)
    return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))


def _moe_field(name: str) -> str:
  """The DecoderLM config key of a MoE layer field (for error messages)."""
  return f"model.{name}" if name in ("num_experts", "experts_per_token") else f"model.moe_{name}"
