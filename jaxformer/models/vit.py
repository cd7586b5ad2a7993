"""Vision Transformer (Dosovitskiy et al., 2021) and position-embedding interpolation."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.layers import LearnedPositionEmbedding, PatchEmbed, make_norm
from jaxformer.layers.dense import dense
from jaxformer.layers.parametrization import scale_output
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models.family import Family, image_inputs
from jaxformer.models.stack import BlockStack

POOLS = ("cls", "gap")


class ViT(nn.Module):
  num_classes: int
  patch_size: int
  image_size: int
  d_model: int
  num_layers: int
  block: BlockSettings                # pre-norm, gelu_exact, eps 1e-6: see FAMILY
  channels: int = 3
  pool: str = "cls"                   # "cls" token or "gap" (global average pooling)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @nn.compact
  def __call__(self, images, *, deterministic: bool = True):
    """images [B, H, W, C] float -> class logits [B, num_classes]."""
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
    x = nn.Dropout(self.block.dropout_rate)(x, deterministic=deterministic)
    x = BlockStack(self.num_layers, self.block, kw, name="encoder")(
        x, deterministic=deterministic)
    x = make_norm(self.block.norm, epsilon=self.block.norm_eps, name="final_norm", **kw)(x)
    x = x[:, 0] if self.pool == "cls" else x.mean(axis=1)
    logits = dense(self.num_classes, ("embed", None), use_bias=True, name="head",
                   kernel_init=lambda *_, **__: nn.initializers.zeros, **kw)(x)
    return scale_output(logits, self.block, self.d_model).astype(jnp.float32)


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


def _tokens(c: dict) -> int:
  """Patches plus the class token (with pool="cls")."""
  return (c["image_size"] // c["patch_size"]) ** 2 + (1 if c["pool"] == "cls" else 0)


def _validate(c: dict):
  if c["pool"] not in POOLS:
    raise ValueError(f"model.pool={c['pool']!r} is not one of {list(POOLS)}")
  if c["image_size"] % c["patch_size"]:
    raise ValueError(f"model.patch_size={c['patch_size']} does not divide model.image_size="
                     f"{c['image_size']}")


FAMILY = Family(
    name="vit", module=ViT, task="classification", example_inputs=image_inputs,
    embeddings=("pos_embed",), heads=("head",),
    block_defaults=dict(qkv_bias=True, norm_eps=1e-6, activation="gelu_exact"),
    embedding_lookups=0, tokens_per_example=_tokens, validate=_validate,
    hf_converter="jaxformer.convert.hf.vit")
