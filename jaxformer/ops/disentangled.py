"""DeBERTa's disentangled attention (He et al., 2021, arXiv 2006.03654; v2/v3 layout): pure
functions for the relative-position part.

Scores of query i and key j with contents q_i, k_j and the shared relative-position table P
(rows indexed by the relative position delta(i, j), projected with the layer's own query and
key projections: Q_r = P W_q, K_r = P W_k):

    content-to-content  q_i . k_j
    content-to-position q_i . K_r[delta(i, j)]                      (c2p)
    position-to-content k_j . Q_r[delta(i, j)]                      (p2c)

all three scaled by 1 / sqrt(d * 3) (scale_factor = 1 + the number of position terms). The
paper writes p2c with delta(j, i) under its own sign convention; the v2 code gathers the p2c
table at -bucket(j - i) = bucket(i - j), the same row as c2p, so one index array serves both
(`relative_index`).

delta(i, j) = clip(bucket(i - j) + span, 0, 2 span - 1), with `log_buckets` (v2/v3):
distances below buckets/2 keep their value, longer ones share logarithmically wider buckets
up to max_position, and the table has 2 span rows (span = buckets, or max_position without
bucketing).

The attention layer (`layers.attention.MultiHeadAttention`, positions="disentangled") adds
c2p + p2c as a `bias` to `ops.attention.dot_product_attention`; nothing here has parameters.
The model hands it the table rows of the 2T - 1 relative positions (`relative_rows`), so the
scores are two [B, H, T, 2T - 1] products and a relative shift, with no gather.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def log_buckets(relative: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
  """DeBERTa-v2's log-bucketed relative positions (int64 NumPy; shapes are static).

  |r| < buckets // 2 keeps r; longer distances map to sign(r) * (mid + ceil(log(|r| / mid)
  / log((max_position - 1) / mid) * (mid - 1))) with mid = buckets // 2. Computed in float32,
  the precision of the reference implementations (float64 gives the same buckets for the
  lengths tested: up to 1024 with buckets 256, max_position 512).
  """
  r = np.asarray(relative, np.int64)
  mid = buckets // 2
  if mid < 1 or max_position - 1 <= mid:
    raise ValueError(f"log buckets need buckets >= 2 and max_position - 1 > buckets // 2; "
                     f"got buckets={buckets}, max_position={max_position}")
  near = (r < mid) & (r > -mid)
  far = np.where(near, mid, np.abs(r)).astype(np.float32)      # near ones: value unused
  ratio = np.log(far / np.float32(mid)) / np.log(np.float32((max_position - 1) / mid))
  logged = np.ceil(ratio * np.float32(mid - 1)).astype(np.float32) + np.float32(mid)
  return np.where(np.abs(r) <= mid, r, (logged * np.sign(r)).astype(np.int64))


def relative_index(q_len: int, k_len: int, *, span: int, buckets: int | None = None,
                   max_position: int | None = None) -> np.ndarray:
  """int32 [q_len, k_len]: the row of the 2 * span relative table for each (query, key):
  clip(bucket(i - j) + span, 0, 2 span - 1); `buckets=None`: no log bucketing."""
  return _rows(np.arange(q_len)[:, None] - np.arange(k_len)[None, :], span, buckets,
               max_position)


def relative_rows(length: int, *, span: int, buckets: int | None = None,
                  max_position: int | None = None) -> np.ndarray:
  """int32 [2 length - 1]: the table row of relative position i - j = m - (length - 1) for
  m = 0 .. 2 length - 2 (`relative_index` has it on every diagonal)."""
  return _rows(np.arange(2 * length - 1) - (length - 1), span, buckets, max_position)


def _rows(r, span, buckets, max_position):
  if buckets is not None:
    r = log_buckets(r, buckets, max_position)
  return np.clip(r + span, 0, 2 * span - 1).astype(np.int32)


def _skew(y):
  """y [..., T, 2T - 1] -> [..., T, T] with out[a, b] = y[a, T - 1 - a + b], by a flat
  reshape and slice (no gather: cheap forward and backward on every backend)."""
  *lead, t, width = y.shape
  if t == 1:
    return y
  flat = y.reshape(*lead, t * width)[..., t - 1:t - 1 + t * (width - 1)]
  return flat.reshape(*lead, t, width - 1)[..., :t]


def disentangled_scores(q, k, pos_q, pos_k):
  """Unscaled c2p + p2c scores of self-attention, float32 [B, H, T, T].

  q, k [B, T, H, D]: the layer's queries and keys; pos_q, pos_k [2T - 1, H, D]: the relative
  table rows of the relative positions i - j = -(T-1) .. T-1 (`relative_rows`), projected by
  the layer's query and key projections. c2p[i, j] = q_i . pos_k[i - j + T - 1] and
  p2c[i, j] = k_j . pos_q[i - j + T - 1] come from [B, H, T, 2T - 1] products shifted per
  row (`_skew`, the Transformer-XL relative shift) rather than gathers.
  """
  t = q.shape[1]
  if k.shape[1] != t or pos_q.shape[0] != 2 * t - 1 or pos_k.shape[0] != 2 * t - 1:
    raise ValueError(f"disentangled scores need self-attention and 2T - 1 relative rows; got "
                     f"q {q.shape}, k {k.shape}, pos_q {pos_q.shape}, pos_k {pos_k.shape}")
  # c2p[i, j] = z[i, i - j + T - 1] with z = q . pos_k; reversing pos_k makes it a skew.
  c2p = _skew(jnp.einsum("bqhd,rhd->bhqr", q, pos_k[::-1],
                         preferred_element_type=jnp.float32))
  # p2c^T[j, i] = k_j . pos_q[i - j + T - 1] = skew(k . pos_q)[j, i].
  p2c = _skew(jnp.einsum("bkhd,rhd->bhkr", k, pos_q, preferred_element_type=jnp.float32))
  return c2p + jnp.swapaxes(p2c, -1, -2)
