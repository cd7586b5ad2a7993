"""Token, learned-position and patch embeddings."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp


class Embed(nn.Module):
  """Token embedding table [num_embeddings, features]; `attend` is the tied output head.

  Out-of-range ids cannot be checked under jit; they come back as NaN rows (jnp.take's
  fill), so a bad tokenizer/vocab pairing shows up as a NaN loss rather than silent garbage.
  """
  num_embeddings: int
  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  embedding_init: Callable = nn.initializers.normal(stddev=0.02)
  # logical axes of the table: a small one (token types) is not split over "vocab"
  axes: tuple[str | None, str | None] = ("vocab", "embed")

  def setup(self):
    self.embedding = self.param(
        "embedding", nn.with_logical_partitioning(self.embedding_init, self.axes),
        (self.num_embeddings, self.features), self.param_dtype)

  def __call__(self, ids):
    if not jnp.issubdtype(ids.dtype, jnp.integer):
      raise ValueError(f"token ids must be integers; got dtype {ids.dtype}")
    return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

  def attend(self, x):
    """Logits x @ embedding^T [..., num_embeddings] (weight tying, as in GPT-2)."""
    return jnp.einsum("...d,vd->...v", x.astype(self.dtype), self.embedding.astype(self.dtype))


class LearnedPositionEmbedding(nn.Module):
  """A learned table [max_length, features] looked up at integer positions ([B, T] or [T]).

  Positions >= max_length cannot be checked under jit and come back as NaN rows (jnp.take's
  fill), e.g. when decoding past the table; `jaxformer.inference.generate` checks lengths up
  front.
  """
  max_length: int
  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  embedding_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, positions):
    table = self.param("embedding",
                       nn.with_logical_partitioning(self.embedding_init, (None, "embed")),
                       (self.max_length, self.features), self.param_dtype)
    if positions.shape[-1] > self.max_length:
      raise ValueError(f"sequence length {positions.shape[-1]} exceeds max_length="
                       f"{self.max_length} of the learned position embedding")
    return jnp.take(table, positions, axis=0).astype(self.dtype)


class PatchEmbed(nn.Module):
  """Image [B, H, W, C] -> patch tokens [B, (H/p)(W/p), features] via a strided conv (ViT)."""
  patch_size: int | tuple[int, int]
  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.lecun_normal()   # fan-in = ph * pw * C

  @nn.compact
  def __call__(self, images):
    ph, pw = ((self.patch_size,) * 2 if isinstance(self.patch_size, int)
              else tuple(self.patch_size))
    if images.ndim != 4:
      raise ValueError(f"images must be [batch, height, width, channels]; got {images.shape}")
    _, h, w, _ = images.shape
    if h % ph or w % pw:
      raise ValueError(f"image size {h}x{w} is not divisible by patch_size {ph}x{pw}")
    x = nn.Conv(self.features, (ph, pw), strides=(ph, pw), padding="VALID", dtype=self.dtype,
                param_dtype=self.param_dtype,
                kernel_init=nn.with_logical_partitioning(self.kernel_init,
                                                         (None, None, None, "embed")),
                bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                name="proj")(images)
    return x.reshape(x.shape[0], -1, self.features)
