"""TransformerBlock: (pre- or post-norm) self-attention, optional cross-attention, FFN."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import parametrization
from jaxformer.layers.attention import MultiHeadAttention
from jaxformer.layers.mlp import FFNS
from jaxformer.layers.moe import MoE
from jaxformer.layers.norms import make_norm
from jaxformer.layers.block_settings import BlockSettings

class TransformerBlock(nn.Module):
  """One Transformer layer on [B, T, E], configured by `settings` (layers/block_settings.py).

  pre_norm=True (GPT-2, Llama, ViT):  x += drop(attn(norm(x))); x += drop(ffn(norm(x)))
  pre_norm=False (Vaswani, BERT):     x = norm(x + drop(attn(x))); x = norm(x + drop(ffn(x)))
  With cross_attention=True a cross-attention sub-layer over `context` sits between the two.
  The other fields are the model's wiring: causal masking, rotary/ALiBi positions in
  self-attention, KV-cache decoding, dtypes.
  """
  settings: BlockSettings
  causal: bool = False
  cross_attention: bool = False
  positions: str = "none"             # attention.POSITIONS (self-attention)
  rope_theta: float = 10_000.0
  decode: bool = False
  kv_cache: Any = None                # decode only: a compressed cache (layers/kv_cache.py)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def _norm(self, name):
    s = self.settings
    kwargs = {"use_bias": s.use_bias} if s.norm == "layernorm" else {}
    return make_norm(s.norm, epsilon=s.norm_eps, dtype=self.dtype, param_dtype=self.param_dtype,
                     name=name, **kwargs)

  def _attention(self, name, *, cross, width):
    s = self.settings
    scale, query_init = parametrization.attention_scale(s, width), 1.0
    if s.attention_scale is not None:   # a fixed logit scale (T5: 1); q's init makes up for it
      scale = s.attention_scale
      query_init = (s.head_dim or width // s.num_heads) ** -0.5 / scale
    return MultiHeadAttention(
        num_heads=s.num_heads, head_dim=s.head_dim, num_kv_heads=s.num_kv_heads,
        qkv_bias=s.qkv_bias_or_default, out_bias=s.use_bias, causal=self.causal and not cross,
        window=None if cross else s.window, positions="none" if cross else self.positions,
        rope_theta=self.rope_theta, dropout_rate=s.attention_dropout_rate,
        impl=s.attention_impl, block_sizes=s.attention_block_sizes,
        scale=scale, query_init_scale=query_init, decode=self.decode and not cross,
        kv_cache=None if cross else self.kv_cache,
        head_gates=s.head_gates, variant="softmax" if cross else s.attention_variant,
        routing_slots=s.routing_slots,
        dtype=self.dtype, param_dtype=self.param_dtype, name=name)

  def _ffn(self, width):
    s = self.settings
    kwargs = {} if s.activation is None else {"activation": s.activation}
    if s.moe is not None:
      ffn, kwargs["settings"] = MoE, s.moe
      kwargs["router_multiplier"] = parametrization.output_multiplier(s, width)
    else:
      ffn = FFNS[s.ffn]
    return ffn(hidden_dim=s.mlp_dim, use_bias=s.use_bias, dtype=self.dtype,
               param_dtype=self.param_dtype, name="ffn", **kwargs)

  @nn.compact
  def __call__(self, x, context=None, *, mask=None, context_mask=None, segment_ids=None,
               positions=None, bias=None, rel_embeddings=None, kv_inputs=None,
               deterministic: bool = True):
    """x [B, T, E]; context [B, S, E'] (needs cross_attention=True); mask / context_mask
    bool broadcastable to [B, H, T, T] / [B, H, T, S]; segment_ids [B, T] for packing;
    bias float broadcastable to [B, H, T, T], added to the self-attention logits;
    rel_embeddings: DeBERTa's shared relative table for positions="disentangled";
    kv_inputs [B, T, E]: self-attention takes its keys and values from kv_inputs (through the
    same pre-norm, if any) while x is the query and residual stream (DeBERTa's enhanced mask
    decoder); cross-attention and the FFN are unchanged."""
    if self.cross_attention != (context is not None):
      raise ValueError("pass context exactly when cross_attention=True "
                       f"(cross_attention={self.cross_attention}, context given: "
                       f"{context is not None})")
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    drop = nn.Dropout(self.settings.dropout_rate)
    width = x.shape[-1]
    # each sublayer: (its input, the (normed) kv_inputs for self-attention, else None)
    sublayers = [("self_attention", lambda h, kv: self._attention(
        "self_attention", cross=False, width=width)(
            h, mask=mask, segment_ids=segment_ids, positions=positions, bias=bias,
            rel_embeddings=rel_embeddings, kv_inputs=kv, deterministic=deterministic))]
    if self.cross_attention:
      sublayers.append(("cross_attention", lambda h, kv: self._attention(
          "cross_attention", cross=True, width=width)(
              h, context, mask=context_mask, deterministic=deterministic)))
    sublayers.append(("ffn", lambda h, kv: self._ffn(width)(h, deterministic=deterministic)))
    for name, sublayer in sublayers:
      kv = kv_inputs if name == "self_attention" else None
      if self.settings.pre_norm:
        norm = self._norm(f"{name}_norm")
        h = sublayer(norm(x), None if kv is None else norm(kv))
        x = x + drop(h, deterministic=deterministic)
      else:
        x = self._norm(f"{name}_norm")(x + drop(sublayer(x, kv), deterministic=deterministic))
      x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    return x
