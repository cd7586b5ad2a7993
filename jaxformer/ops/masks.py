"""Mask and softmax helpers shared by every attention implementation.

Masks are built from *positions* rather than materialised [T, T] arrays so that the blocked
paths can make the mask of one key block on the fly (O(T) memory).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# (left, right) key offsets a query may see; None on a side means unbounded.
Window = tuple[int | None, int | None]


def normalize_window(window) -> Window | None:
  """int `left` -> (left, 0); (left, right) with ints >= 0 or None (unbounded); None stays."""
  if window is None:
    return None
  if isinstance(window, (int, np.integer)) and not isinstance(window, bool):
    window = (int(window), 0)
  if not (isinstance(window, (tuple, list)) and len(window) == 2):
    raise ValueError(f"window must be an int `left`, a (left, right) pair or None; got {window!r}")
  for side in window:
    if side is not None and (not isinstance(side, (int, np.integer)) or side < 0):
      raise ValueError(f"window sides must be ints >= 0 or None; got window={window!r}")
  return tuple(None if s is None else int(s) for s in window)


def structural_mask(q_pos: jax.Array, k_pos: jax.Array, *, causal: bool,
                    window: Window | None) -> jax.Array | None:
  """Causal / sliding-window visibility from absolute positions.

  q_pos [..., Tq] and k_pos [..., Tk] are integer positions; the result broadcasts to
  [..., Tq, Tk] (True = attend) or is None when neither constraint applies.
  Key j is visible from query i iff (not causal or j <= i) and i - left <= j <= i + right.
  """
  if not causal and window is None:
    return None
  qp, kp = q_pos[..., :, None], k_pos[..., None, :]
  visible = jnp.ones(jnp.broadcast_shapes(qp.shape, kp.shape), bool)
  if causal:
    visible &= kp <= qp
  if window is not None:
    left, right = window
    if left is not None:
      visible &= kp >= qp - left
    if right is not None:
      visible &= kp <= qp + right
  return visible


def segment_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array) -> jax.Array:
  """[B, Tq] x [B, Tk] segment ids -> [B, 1, Tq, Tk]: attend only within the same segment."""
  return (q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
  """Logical AND of the masks that are not None (None if all are None)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = jnp.logical_and(out, m)
  return out


def masked_softmax(logits: jax.Array, mask: jax.Array | None = None, axis: int = -1) -> jax.Array:
  """Float32 softmax where masked entries get exactly 0 and rows with nothing visible are all 0.

  Unlike a large-negative-fill softmax, an empty row yields zeros (not a uniform average over
  padding) and neither values nor gradients ever become NaN, even with -inf logits.
  """
  logits = logits.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, -jnp.inf)
  row_max = jnp.max(logits, axis=axis, keepdims=True)
  row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  unnormalized = jnp.exp(logits - row_max)
  denom = jnp.sum(unnormalized, axis=axis, keepdims=True)
  return unnormalized / jnp.where(denom == 0, 1.0, denom)


def split_heads(x: jax.Array | None, num_kv_heads: int) -> jax.Array | None:
  """[b, h, Tq, Tk] (h in {1, H}) -> [b, h_kv, g, Tq, Tk] matching grouped queries.

  Query head n belongs to kv head n // (H // num_kv_heads), so a per-head array is split
  as [num_kv_heads, group]; a head-broadcast array keeps size-1 dims.
  """
  if x is None:
    return None
  b, h, tq, tk = x.shape
  if h == 1:
    return x.reshape(b, 1, 1, tq, tk)
  return x.reshape(b, num_kv_heads, h // num_kv_heads, tq, tk)


def sum_to_shape(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Sum x over the axes that `shape` broadcasts (size 1 in shape), keeping dims: the
  cotangent of a broadcast."""
  axes = tuple(i for i, (n, s) in enumerate(zip(x.shape, shape)) if s == 1 and n != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x
