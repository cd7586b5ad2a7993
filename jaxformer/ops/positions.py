"""Position encodings: sinusoidal tables, rotary embeddings (RoPE) and ALiBi biases."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def sinusoidal(positions, dim: int, *, max_timescale: float = 10_000.0, dtype=jnp.float32):
  """Vaswani et al. (2017) encodings for integer `positions` [...] -> [..., dim].

  PE[p, 2i] = sin(p / max_timescale^(2i/dim)), PE[p, 2i+1] = cos(same): sin/cos interleaved
  as in the paper. `sinusoidal(jnp.arange(T), dim)` is the [T, dim] table.
  """
  if dim % 2:
    raise ValueError(f"sinusoidal encodings need an even dim; got dim={dim}")
  inv_freq = 1.0 / max_timescale ** (np.arange(0, dim, 2) / dim)
  angles = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq.astype(np.float32)
  table = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)   # [..., dim/2, 2]
  return table.reshape(table.shape[:-2] + (dim,)).astype(dtype)


def rope_inv_frequencies(head_dim: int, theta: float = 10_000.0) -> np.ndarray:
  """Inverse frequencies theta^(-2i/head_dim), i < head_dim/2, of rotary embeddings."""
  if head_dim % 2:
    raise ValueError(f"RoPE needs an even head_dim; got head_dim={head_dim}")
  return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def apply_rope(x, positions, *, theta: float = 10_000.0):
  """Rotate x [B, T, H, D] by its positions ([B, T] or [T]) with rotary embeddings.

  "Rotate-half" layout (GPT-NeoX / Hugging Face Llama): feature i pairs with i + D/2, so
  <rope(q, m), rope(k, n)> depends on m - n only. Computed in float32, returned in x's dtype.
  """
  if x.ndim != 4:
    raise ValueError(f"apply_rope expects x [batch, length, heads, head_dim]; got {x.shape}")
  d = x.shape[-1]
  inv_freq = rope_inv_frequencies(d, theta).astype(np.float32)
  positions = jnp.asarray(positions)
  if positions.ndim == 1:
    positions = positions[None]
  if positions.shape[-1] != x.shape[1]:
    raise ValueError(f"positions {positions.shape} must be [B, T] or [T] with T={x.shape[1]}")
  angles = positions.astype(jnp.float32)[:, :, None, None] * inv_freq   # [B, T, 1, D/2]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Per-head ALiBi slopes (Press et al., 2022), float32 [num_heads].

  For a power of two n: 2^(-8/n), 2^(-16/n), ...; otherwise the slopes of the closest lower
  power of two followed by every other slope of twice that power (the paper's recipe).
  """
  if num_heads < 1:
    raise ValueError(f"num_heads must be >= 1; got {num_heads}")

  def power_of_two(n):
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]

  if math.log2(num_heads).is_integer():
    slopes = power_of_two(num_heads)
  else:
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][:num_heads - closest]
  return np.asarray(slopes, np.float32)


def alibi_bias(num_heads: int, q_positions, k_positions) -> jax.Array:
  """ALiBi bias -slope_h * |q_pos - k_pos| as [b, H, Tq, Tk] (b = 1 for 1-D positions).

  For causal attention this is the paper's slope * (k - q) on every visible key; the
  symmetric |.| form also serves bidirectional encoders.
  """
  q_positions, k_positions = jnp.asarray(q_positions), jnp.asarray(k_positions)
  if q_positions.ndim == 1:
    q_positions = q_positions[None]
  if k_positions.ndim == 1:
    k_positions = k_positions[None]
  dist = jnp.abs(q_positions[:, :, None] - k_positions[:, None, :]).astype(jnp.float32)
  return -alibi_slopes(num_heads)[None, :, None, None] * dist[:, None]


def relative_position_buckets(q_positions, k_positions, *, bidirectional: bool,
                              num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
  """T5's relative-position buckets (Raffel et al., 2020, Sec. 2.1) as int32 [..., Tq, Tk].

  The relative position is r = k_pos - q_pos. Bidirectional (encoder): half of the buckets
  are for keys after the query (r > 0), half for the rest, each half indexed by |r|;
  unidirectional (causal decoder): every bucket is for r <= 0, indexed by -r (keys after
  the query share bucket 0 with r = 0, and a causal mask hides them). Within a half of n
  buckets, distances below n/2 get one bucket each and the rest log-spaced buckets up to
  `max_distance`, beyond which all distances share the last bucket:
  bucket(d) = n/2 + floor(log(d / (n/2)) / log(max_distance / (n/2)) * (n - n/2)).
  The log is taken in float32, as the reference implementations do.
  """
  if num_buckets < 2 or (bidirectional and num_buckets < 4):
    raise ValueError(f"num_buckets={num_buckets} is too small: needs >= 2 (>= 4 "
                     "bidirectional, two halves of >= 2)")
  q_positions, k_positions = jnp.asarray(q_positions), jnp.asarray(k_positions)
  rel = k_positions[..., None, :].astype(jnp.int32) - q_positions[..., :, None].astype(jnp.int32)
  n = num_buckets
  offset = jnp.zeros_like(rel)
  if bidirectional:
    n //= 2
    offset = jnp.where(rel > 0, n, 0)
    distance = jnp.abs(rel)
  else:
    distance = jnp.maximum(-rel, 0)
  exact = n // 2
  if max_distance <= exact:
    raise ValueError(f"max_distance={max_distance} must exceed the {exact} exactly-bucketed "
                     f"distances of num_buckets={num_buckets}")
  ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / np.float32(exact))
  far = exact + (ratio / np.float32(math.log(max_distance / exact))
                 * np.float32(n - exact)).astype(jnp.int32)
  far = jnp.minimum(far, n - 1)
  return (offset + jnp.where(distance < exact, distance, far)).astype(jnp.int32)
