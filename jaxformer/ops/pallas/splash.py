"""JAX's splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`) as `impl="splash"`.

Splash is the TPU flash-attention kernel JAX ships (MaxText's default on TPU): forward, dq and
dk/dv Mosaic kernels over a (head, q block, kv block) grid that stream K/V blocks through VMEM
(no whole-sequence block, so no VMEM bound on the length) and skip the (q block, kv block)
pairs its mask marks empty. This module translates our semantics to it:

  causal / window   a `CausalMask` or `LocalMask` per head, with offset Tk - Tq (our masks
                    align the last query with the last key); block skipping comes from them.
  GQA / MQA         the MHA kernel takes Hkv < H heads natively (query head h reads kv head
                    h // (H // Hkv)); Hkv == 1 uses the MQA kernel (k/v [T, D]).
  segment ids       `SegmentIds(q, kv)`, one [B, T] array (packed rows, self-attention).
  batch             vmapped; scale multiplies q (splash has no scale argument).
  empty rows        splash masks with a finite value, so a query with no visible key would
                    average all keys; with Tq != Tk the structural mask's empty rows are
                    known statically and zeroed (the other paths return zeros there).

What splash cannot take is refused by `unsupported_reason` (a bias, a dense mask, a
(q_ids, kv_ids) segment pair, lengths that are not multiples of 128, dtypes other than
float32/bfloat16, a head_dim that differs between q and v) before anything is traced.
On CPU it runs in the Pallas interpreter (tests); on GPU it is refused.
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from jaxformer.ops.pallas.attention import target_platform

_CONFIG_FIELD = "model.attention_block_sizes"
LANES = 128                   # splash's blocks are multiples of the 128-lane width
# MaxText's default splash blocks (sa_block_* = 512 in its base.yml); shrunk to a divisor.
DEFAULT_BLOCK = 512
_DTYPES = (jnp.float32, jnp.bfloat16)


def _largest_block(length: int, cap: int = DEFAULT_BLOCK) -> int:
  for b in (512, 256, 128):
    if b <= cap and length % b == 0:
      return b
  return 0


def unsupported_reason(q, k, v, *, bias=None, mask=None, q_segment_ids=None,
                       kv_segment_ids=None, block_sizes=None, platform=None) -> str | None:
  """Why impl="splash" cannot run these (validated) inputs, naming the field, or None."""
  platform = platform or target_platform(q)
  if platform not in ("tpu", "cpu"):
    return (f"splash attention is a TPU (Mosaic) kernel, interpreted on CPU; the program is "
            f"compiled for {platform!r}")
  if bias is not None:
    return "it takes no additive bias (ALiBi, T5 relative bias, DeBERTa positions)"
  if mask is not None:
    return "it takes no dense boolean mask (only causal/window/segment ids)"
  if q_segment_ids is not None and q_segment_ids is not kv_segment_ids:
    return ("segment_ids must be one [B, T] array (self-attention); a (q_ids, kv_ids) pair "
            "can leave a query with no visible key, which splash does not zero")
  if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
    return f"it needs float32 or bfloat16 q, k, v of one dtype (got {q.dtype}, {k.dtype}, {v.dtype})"
  if v.shape[-1] != q.shape[-1]:
    return f"it needs one head_dim for q/k/v (got {q.shape[-1]}, {v.shape[-1]})"
  tq, tk = q.shape[1], k.shape[1]
  if tq % LANES or tk % LANES:
    return (f"it needs query and key lengths that are multiples of {LANES} (got Tq={tq}, "
            f"Tk={tk}; model.max_len / the batch length)")
  if block_sizes is not None:
    for name, b, t in (("block_q", block_sizes[0], tq), ("block_k", block_sizes[1], tk)):
      if b % LANES or t % b:
        return (f"{name}={b} ({_CONFIG_FIELD}) must be a multiple of {LANES} that divides "
                f"the length {t}")
  return None


def _structural(tq, tk, causal, window):
  """The splash mask for one head and the static [Tq] row-has-a-key vector (None if all do)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  offset = tk - tq
  left, right = window if window is not None else (None, None)
  if causal:
    right = 0 if right is None else min(right, 0)
  if left is None and right is None:
    mask = sa.FullMask((tq, tk))
  elif left is None and right == 0:
    mask = sa.CausalMask((tq, tk), offset=offset)
  else:
    mask = sa.LocalMask((tq, tk), window_size=(left, right), offset=offset)
  pos = np.arange(tq) + offset
  lo = np.zeros(tq, np.int64) if left is None else pos - left
  hi = np.full(tq, tk - 1) if right is None else pos + right
  has_key = (np.maximum(lo, 0) <= np.minimum(hi, tk - 1))
  return mask, None if has_key.all() else has_key


def block_sizes_for(tq: int, tk: int, block_sizes=None):
  """splash `BlockSizes`: (block_q, block_k) from the user, else the largest of 512/256/128
  dividing each length, for the forward, dq and dk/dv kernels alike."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  bq, bk = block_sizes if block_sizes is not None else (_largest_block(tq), _largest_block(tk))
  return sa.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq,
                       block_kv_dkv=bk, block_kv_dkv_compute=bk, block_q_dq=bq,
                       block_kv_dq=bk)


def splash_attention(q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=False,
                     window=None, scale: float, block_sizes=None, interpret=None):
  """Attention over validated inputs that `unsupported_reason` accepts.

  q [B, Tq, H, D]; k, v [B, Tk, Hkv, D]; segment ids [B, T] or None; window (left, right) or
  None; block_sizes (block_q, block_k) multiples of 128 or None. Returns [B, Tq, H, D]."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  del kv_segment_ids        # the same array as q_segment_ids (unsupported_reason)
  b, tq, h, d = q.shape
  tk, hkv = k.shape[1], k.shape[2]
  if interpret is None:
    interpret = target_platform(q) != "tpu"
  head_mask, has_key = _structural(tq, tk, causal, window)
  mqa = hkv == 1
  make = sa.make_splash_mqa if mqa else sa.make_splash_mha
  kernel = make(sa.MultiHeadMask([head_mask] * h), block_sizes=block_sizes_for(tq, tk, block_sizes),
                head_shards=1, q_seq_shards=1, interpret=interpret)
  qh = jnp.swapaxes((q * jnp.asarray(scale, q.dtype)), 1, 2)      # [B, H, Tq, D]
  kh, vh = (x[:, :, 0] if mqa else jnp.swapaxes(x, 1, 2) for x in (k, v))
  if q_segment_ids is None:
    out = jax.vmap(kernel)(qh, kh, vh)
  else:
    seg = sa.SegmentIds(q=q_segment_ids.astype(jnp.int32), kv=q_segment_ids.astype(jnp.int32))
    out = jax.vmap(lambda q_, k_, v_, s: kernel(q_, k_, v_, segment_ids=s))(qh, kh, vh, seg)
  out = jnp.swapaxes(out, 1, 2)
  if has_key is not None:
    out = jnp.where(jnp.asarray(has_key)[None, :, None, None], out, 0)
  return out.astype(q.dtype)


# ------------------------------------------------------------------------------------- cost

# Splash's kernels carry no `pl.CostEstimate`; the planner counts them as ours are counted
# (`ops.pallas.attention`): matmul flops per visited (q block, kv block) pair, per batch row
# and query head, in units of block_q * block_kv * head_dim: forward 4 (QK^T, PV), dq 6 (QK^T
# recomputed, dO V^T, dS K), dk/dv 8 (QK^T recomputed, P^T dO, dO V^T, dS^T Q).
FLOPS_PER_BLOCK_PAIR = {"fwd": 4, "dq": 6, "dkv": 8}


def visited_block_pairs(tq: int, tk: int, *, causal: bool, window=None,
                        block_sizes=None) -> int:
  """The (q block, kv block) pairs splash computes for one head: the nonzero entries of its
  own block map (`process_mask`) for our causal/window mask at these lengths and blocks."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info
  head_mask, _ = _structural(tq, tk, causal, window)
  bs = block_sizes_for(tq, tk, block_sizes)
  info, _ = splash_attention_mask_info.process_mask(sa.MultiHeadMask([head_mask]),
                                                    (bs.block_q, bs.block_kv))
  if info.block_mask is None:
    return (tq // bs.block_q) * (tk // bs.block_kv)
  return int((np.asarray(info.block_mask) != 0).sum())


def kernel_flops(kind: str, *, batch: int, heads: int, tq: int, tk: int, head_dim: int,
                 causal: bool, window=None, block_sizes=None) -> float:
  """Matmul flops of one call of splash's `kind` ("fwd" | "dq" | "dkv") kernel over `batch`
  rows and `heads` query heads."""
  bs = block_sizes_for(tq, tk, block_sizes)
  pairs = visited_block_pairs(tq, tk, causal=causal, window=window, block_sizes=block_sizes)
  return float(FLOPS_PER_BLOCK_PAIR[kind] * bs.block_q * bs.block_kv * head_dim * pairs
               * batch * heads)
