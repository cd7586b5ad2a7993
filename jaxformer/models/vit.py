"""Vision Transformer (Dosovitskiy et al., 2021) and position-embedding interpolation."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.layers import LearnedPositionEmbedding, PatchEmbed, make_norm
from jaxformer.layers.dense import dense
from jaxformer.models.stack import BlockStack


class ViT(nn.Module):
  num_classes: int
  patch_size: int
  image_size: int
  d_model: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  channels: int = 3
  pool: str = "cls"                   # "cls" token or "gap" (global average pooling)
  norm_eps: float = 1e-6
  activation: str = "gelu_exact"
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  attention_impl: str = "auto"
  attention_block_sizes: tuple[int, int] | None = None   # (block_q, block_k), see ops.attention
  scan_layers: bool = False
  remat_policy: str = "none"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @nn.compact
  def __call__(self, images, *, deterministic: bool = True):
    """images [B, H, W, C] float -> class logits [B, num_classes]."""
    if self.pool not in ("cls", "gap"):
      raise ValueError(f"pool={self.pool!r} must be 'cls' or 'gap'")
    if images.shape[1:3] != (self.image_size, self.image_size):
      raise ValueError(f"images are {images.shape[1]}x{images.shape[2]} but image_size="
                       f"{self.image_size}; build the model for the new size and resize the "
                       "position embeddings with vit.resize_pos_embed")
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    x = PatchEmbed(self.patch_size, self.d_model, name="patch_embed", **kw)(images)
    if self.pool == "cls":
      cls = self.param("cls", nn.with_logical_partitioning(nn.initializers.zeros,
                                                           (None, None, "embed")),
                       (1, 1, self.d_model), self.param_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, self.d_model)).astype(x.dtype),
                           x], axis=1)
    x = x + LearnedPositionEmbedding(x.shape[1], self.d_model, name="pos_embed", **kw)(
        jnp.arange(x.shape[1])[None])
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = BlockStack(self.num_layers, dict(
        num_heads=self.num_heads, mlp_dim=self.mlp_dim, pre_norm=True, norm="layernorm",
        norm_eps=self.norm_eps, ffn="mlp", activation=self.activation, use_bias=True,
        qkv_bias=True, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate, impl=self.attention_impl,
        attention_block_sizes=self.attention_block_sizes, **kw),
        scan=self.scan_layers, remat_policy=self.remat_policy, name="encoder")(
            x, deterministic=deterministic)
    x = make_norm("layernorm", epsilon=self.norm_eps, name="final_norm", **kw)(x)
    x = x[:, 0] if self.pool == "cls" else x.mean(axis=1)
    return dense(self.num_classes, ("embed", None), use_bias=True, name="head",
                 kernel_init=lambda *_, **__: nn.initializers.zeros, **kw)(x).astype(jnp.float32)


def resize_pos_embed(table: jax.Array, new_grid: int, *, has_cls: bool = True) -> jax.Array:
  """Bilinearly resize a [(1 +) g*g, E] position table to [(1 +) new_grid^2, E] (fine-tuning
  at a new resolution, ViT section 3.2); the cls row is kept as is."""
  cls, grid = (table[:1], table[1:]) if has_cls else (table[:0], table)
  g = math.isqrt(grid.shape[0])
  if g * g != grid.shape[0]:
    raise ValueError(f"position table of {grid.shape[0]} patch rows is not a square grid")
  grid = jax.image.resize(grid.reshape(g, g, -1), (new_grid, new_grid, grid.shape[-1]),
                          method="bilinear")
  return jnp.concatenate([cls, grid.reshape(new_grid * new_grid, -1)], axis=0)
