"""The original encoder-decoder Transformer (Vaswani et al., 2017).

Post-norm blocks, sinusoidal positions, one embedding shared by source, target and the
output softmax (embeddings scaled by sqrt(d_model)), causal decoder self-attention and
cross-attention to the encoder output.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, make_norm
from jaxformer.models.stack import BlockStack
from jaxformer.ops import positions as pos_ops


class EncoderDecoder(nn.Module):
  vocab_size: int
  d_model: int
  num_encoder_layers: int
  num_decoder_layers: int
  num_heads: int
  mlp_dim: int
  pre_norm: bool = False              # the paper is post-norm; pre-norm adds final norms
  norm_eps: float = 1e-6
  activation: str = "relu"
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  attention_impl: str = "auto"
  attention_block_sizes: tuple[int, int] | None = None   # (block_q, block_k), see ops.attention
  scan_layers: bool = False
  remat_policy: str = "none"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    self.dropout = nn.Dropout(self.dropout_rate)
    block = dict(num_heads=self.num_heads, mlp_dim=self.mlp_dim, pre_norm=self.pre_norm,
                 norm="layernorm", norm_eps=self.norm_eps, ffn="mlp",
                 activation=self.activation, use_bias=True, qkv_bias=True,
                 dropout_rate=self.dropout_rate,
                 attention_dropout_rate=self.attention_dropout_rate, impl=self.attention_impl,
                 attention_block_sizes=self.attention_block_sizes, **kw)
    stack = dict(scan=self.scan_layers, remat_policy=self.remat_policy)
    self.embed = Embed(self.vocab_size, self.d_model, name="embed",
                       embedding_init=nn.initializers.normal(self.d_model ** -0.5), **kw)
    self.encoder = BlockStack(self.num_encoder_layers, block, name="encoder", **stack)
    self.decoder = BlockStack(self.num_decoder_layers, dict(block, causal=True,
                                                            cross_attention=True),
                              name="decoder", **stack)
    if self.pre_norm:
      self.encoder_norm = make_norm("layernorm", epsilon=self.norm_eps, name="encoder_norm",
                                    **kw)
      self.decoder_norm = make_norm("layernorm", epsilon=self.norm_eps, name="decoder_norm",
                                    **kw)

  def _embed(self, tokens, deterministic):
    x = self.embed(tokens) * math.sqrt(self.d_model)
    x = x + pos_ops.sinusoidal(jnp.arange(tokens.shape[1]), self.d_model, dtype=x.dtype)
    return self.dropout(x, deterministic=deterministic)

  def encode(self, src_tokens, *, src_mask=None, deterministic: bool = True):
    mask = None if src_mask is None else src_mask.astype(bool)[:, None, None, :]
    x = self.encoder(self._embed(src_tokens, deterministic), mask=mask,
                     deterministic=deterministic)
    return self.encoder_norm(x) if self.pre_norm else x

  def decode(self, encoded, tgt_tokens, *, src_mask=None, deterministic: bool = True):
    context_mask = None if src_mask is None else src_mask.astype(bool)[:, None, None, :]
    x = self.decoder(self._embed(tgt_tokens, deterministic), encoded,
                     context_mask=context_mask, deterministic=deterministic)
    if self.pre_norm:
      x = self.decoder_norm(x)
    return self.embed.attend(x).astype(jnp.float32)

  def __call__(self, src_tokens, tgt_tokens, *, src_mask=None, deterministic: bool = True):
    """src [B, S], tgt [B, T] (teacher forcing), src_mask [B, S] (1 = real) -> [B, T, vocab]."""
    for name, t in (("src_tokens", src_tokens), ("tgt_tokens", tgt_tokens)):
      if t.ndim != 2:
        raise ValueError(f"{name} must be [batch, length]; got shape {t.shape}")
    encoded = self.encode(src_tokens, src_mask=src_mask, deterministic=deterministic)
    return self.decode(encoded, tgt_tokens, src_mask=src_mask, deterministic=deterministic)
