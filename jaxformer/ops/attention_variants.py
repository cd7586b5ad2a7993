"""The math of the attention variants other than softmax over the sequence
(`model.attention_variant`, layers/attention.py): pure functions, no parameters.

  linear         causal (or bidirectional) linear attention (Katharopoulos et al., 2020):
                 out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) over the keys j
                 visible from i, phi(x) = elu(x) + 1 (> 0, so the denominator is > 0 wherever
                 a key is visible; a 0 from float32 underflow gives a zero row, not NaN).
                 Causal self-attention runs as running sums of phi(k_j) v_j^T [D, D] and
                 phi(k_j) [D] (O(T D^2) work; a recurrent decoder would carry O(D^2) state
                 per head); with a mask (the KV-cache decode path, padding) it runs in the
                 equal quadratic form phi(Q) phi(K)^T masked, row-normalised, times V.
  routing_cache  each query attends (softmax) over a fixed set of M learned (key, value) slots,
                 the same for every position and every sequence: out_i = softmax(q_i K^T *
                 scale) V with K, V [M, H, D] parameters. O(M) per token and no information
                 from any other token: a token-wise map (the literal "softmax over a single
                 learned 16-entry cache").
  routing_prefix the same read (softmax of q_i over M slots), but the slots are written from
                 the sequence: slot m at position i holds the softmax-weighted average of the
                 keys and of the values j visible from i, weighted by a learned write query u_m
                 [H, D]: w_mj = softmax_j(u_m.k_j * scale), slot_k = sum_j w_mj k_j, slot_v =
                 sum_j w_mj v_j (a learned-query compression of the prefix, as in Perceiver /
                 Set Transformer's inducing points, made causal). O(M D) state per token, and
                 cross-token information through it.

Shapes follow `dot_product_attention`: q [B, Tq, H, D], k/v [B, Tk, Hkv, D] with H % Hkv == 0.
Outputs are [B, Tq, H, D] in q's dtype, computed in float32; a query row with no visible key
gives zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.ops import masks

# model.attention_variant: "softmax" is `ops.attention.dot_product_attention` (with model.window for
# sliding-window attention); the others are here.
VARIANTS = ("softmax", "routing_cache", "routing_prefix", "linear")


def feature_map(x):
  """phi(x) = elu(x) + 1 in float32, written as x + 1 (x > 0) / exp(x) (x <= 0): the same
  function, but elu(x) + 1 rounds to 0 below x ~ -17 while exp(x) stays > 0 down to ~ -87."""
  x = x.astype(jnp.float32)
  return jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0)))


def _repeat_kv(x, num_heads):
  """[B, T, Hkv, D] -> [B, T, H, D] (query head n uses kv head n // (H // Hkv))."""
  if x.shape[2] == num_heads:
    return x
  if num_heads % x.shape[2]:
    raise ValueError(f"num_kv_heads={x.shape[2]} must divide num_heads={num_heads}")
  return jnp.repeat(x, num_heads // x.shape[2], axis=2)


def linear_attention(q, k, v, *, causal: bool = False, mask=None):
  """Linear attention with phi = elu + 1 (module docstring).

  causal: query i sees keys j <= i + (Tk - Tq); mask: bool broadcastable to [B, H, Tq, Tk]
  (True = attend). Without a mask and with Tq == Tk and causal, the running-sum form;
  otherwise the quadratic form (the same function)."""
  if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[0] != k.shape[0]:
    raise ValueError(f"q must be [B, Tq, H, D] and k, v [B, Tk, Hkv, D]; got {q.shape}, "
                     f"{k.shape}, {v.shape}")
  h, tq, tk = q.shape[2], q.shape[1], k.shape[1]
  fq, fk = feature_map(q), feature_map(_repeat_kv(k, h))
  v32 = _repeat_kv(v, h).astype(jnp.float32)
  if causal and mask is None and tq == tk:
    state = jnp.cumsum(jnp.einsum("bthd,bthe->bthde", fk, v32), axis=1)   # sum_j<=t k_j v_j^T
    norm = jnp.cumsum(fk, axis=1)                                          # sum_j<=t k_j
    num = jnp.einsum("bthd,bthde->bthe", fq, state)
    den = jnp.einsum("bthd,bthd->bth", fq, norm)[..., None]
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0).astype(q.dtype)
  scores = jnp.einsum("bqhd,bkhd->bhqk", fq, fk)
  visible = masks.combine_masks(
      mask, masks.structural_mask(jnp.arange(tq) + (tk - tq), jnp.arange(tk), causal=causal,
                                  window=None))
  if visible is not None:
    scores = jnp.where(visible, scores, 0.0)
  den = jnp.sum(scores, axis=-1)                                           # [B, H, Tq]
  num = jnp.einsum("bhqk,bkhd->bqhd", scores, v32)
  den = jnp.swapaxes(den, 1, 2)[..., None]                                 # [B, Tq, H, 1]
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0).astype(q.dtype)


def routing_cache_attention(q, keys, values, *, scale: float | None = None):
  """softmax(q K^T * scale) V over M learned slots: q [B, T, H, D]; keys, values [M, H, D]
  (the same for every batch row and position); scale default 1/sqrt(D)."""
  if q.ndim != 4 or keys.ndim != 3 or keys.shape != values.shape or keys.shape[1:] != q.shape[2:]:
    raise ValueError(f"q must be [B, T, H, D] and keys, values [M, H, D]; got {q.shape}, "
                     f"{keys.shape}, {values.shape}")
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  logits = jnp.einsum("bthd,mhd->bhtm", q.astype(jnp.float32), keys.astype(jnp.float32))
  weights = jax.nn.softmax(logits * scale, axis=-1)
  return jnp.einsum("bhtm,mhd->bthd", weights, values.astype(jnp.float32)).astype(q.dtype)


def routing_prefix_attention(q, k, v, write_queries, *, causal: bool = False, mask=None,
                             scale: float | None = None):
  """Softmax over M slots written from the visible keys/values (module docstring): q
  [B, Tq, H, D], k/v [B, Tk, Hkv, D], write_queries [M, H, D]; causal/mask as in
  `linear_attention`. Without a mask and with Tq == Tk and causal, a running log-sum-exp
  (`lax.associative_scan` of (max, sum exp, sum exp k, sum exp v) over positions: O(T M D)
  memory); otherwise the quadratic form, O(Tq Tk M) memory (decoding: Tq = 1). A query with
  no visible key gives zeros."""
  if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[0] != k.shape[0]:
    raise ValueError(f"q must be [B, Tq, H, D] and k, v [B, Tk, Hkv, D]; got {q.shape}, "
                     f"{k.shape}, {v.shape}")
  if write_queries.ndim != 3 or write_queries.shape[1:] != q.shape[2:]:
    raise ValueError(f"write_queries must be [M, H, D] with q's heads and head dim; got "
                     f"{write_queries.shape} for q {q.shape}")
  h, tq, tk = q.shape[2], q.shape[1], k.shape[1]
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  k32 = _repeat_kv(k, h).astype(jnp.float32)
  v32 = _repeat_kv(v, h).astype(jnp.float32)
  logits = jnp.einsum("mhd,bkhd->bkhm", write_queries.astype(jnp.float32), k32) * scale
  if causal and mask is None and tq == tk:
    # running (max, sum exp, sum exp k, sum exp v) over j <= t: exact and causal
    def combine(a, b):
      m = jnp.maximum(a[0], b[0])
      wa, wb = jnp.exp(a[0] - m), jnp.exp(b[0] - m)
      return (m, a[1] * wa + b[1] * wb, a[2] * wa[..., None] + b[2] * wb[..., None],
              a[3] * wa[..., None] + b[3] * wb[..., None])
    ones = jnp.ones_like(logits)
    kk = jnp.broadcast_to(k32[..., None, :], logits.shape + (k32.shape[-1],))
    vv = jnp.broadcast_to(v32[..., None, :], logits.shape + (v32.shape[-1],))
    _, den, num_k, num_v = jax.lax.associative_scan(combine, (logits, ones, kk, vv), axis=1)
    den = den[..., None]                                                  # [B, T, H, M, 1]
  else:
    visible = masks.combine_masks(
        mask, masks.structural_mask(jnp.arange(tq) + (tk - tq), jnp.arange(tk), causal=causal,
                                    window=None))
    vis = jnp.broadcast_to(True if visible is None else visible, (q.shape[0], h, tq, tk))
    # per (query, slot) the max over its visible keys, so every row is shifted by its own
    wl = jnp.where(vis[:, :, :, :, None], jnp.einsum("bkhm->bhkm", logits)[:, :, None], -jnp.inf)
    shift = jax.lax.stop_gradient(jnp.max(wl, axis=3, keepdims=True))
    e = jnp.exp(wl - jnp.where(jnp.isfinite(shift), shift, 0.0))         # [B, H, Tq, Tk, M]
    den = jnp.einsum("bhqkm->bqhm", e)[..., None]
    num_k = jnp.einsum("bhqkm,bkhd->bqhmd", e, k32)
    num_v = jnp.einsum("bhqkm,bkhd->bqhmd", e, v32)
  empty = den[..., 0] <= 0
  safe = jnp.where(den > 0, den, 1.0)
  slot_k, slot_v = num_k / safe, num_v / safe                             # [B, Tq, H, M, D]
  read = jnp.einsum("bqhd,bqhmd->bqhm", q.astype(jnp.float32), slot_k) * scale
  weights = masks.masked_softmax(read, ~empty)
  return jnp.einsum("bqhm,bqhmd->bqhd", weights, slot_v).astype(q.dtype)
