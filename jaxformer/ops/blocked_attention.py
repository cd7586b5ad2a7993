"""Blocked attention in plain JAX: online softmax over key blocks, O(T) memory in both passes.

This is the portable fallback that runs on every backend. All queries are processed together
(large, accelerator-friendly matmuls) while a `lax.scan` walks over blocks of `block_k` keys,
so the largest temporary is [B, H, Tq, block_k] instead of [B, H, Tq, Tk]. The backward pass
(`custom_vjp`) saves only the output and the per-row log-sum-exp and recomputes the
probabilities block by block, as in FlashAttention-2.

Masks are built per key block from positions (causal, window, padding of the last block) and
segment ids; a user `mask`/`bias` is sliced per block. Grouped-query attention never repeats
K/V: queries are viewed as [B, Tq, H_kv, group, D] and contracted against the shared kv head.
Fully masked blocks are still computed (no data-dependent skipping here); the Pallas kernel
skips them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxformer.ops import masks
from jaxformer.ops.flash_vjp import flash_vjp

DEFAULT_BLOCK_K = 512


@dataclasses.dataclass(frozen=True)
class _Static:
  causal: bool
  window: masks.Window | None
  scale: float
  block_k: int
  tq: int
  tk: int


def blocked_attention(q, k, v, *, bias=None, mask=None, q_segment_ids=None,
                      kv_segment_ids=None, causal=False, window=None, scale,
                      block_k: int = DEFAULT_BLOCK_K):
  """Attention over validated inputs (see `ops.attention.dot_product_attention`).

  q [B, Tq, H, D]; k, v [B, Tk, Hkv, D]; bias/mask 4-D broadcastable to [B, H, Tq, Tk] or None;
  segment ids [B, Tq] / [B, Tk] or None; window a (left, right) tuple or None.
  """
  tk = k.shape[1]
  block_k = max(1, min(block_k, tk))
  static = _Static(causal, window, float(scale), block_k, q.shape[1], tk)
  return _attention(q, k, v, bias, mask, q_segment_ids, kv_segment_ids, static)


def _grouped(q, num_kv_heads):
  b, t, h, d = q.shape
  return q.reshape(b, t, num_kv_heads, h // num_kv_heads, d)


def _pad_keys(x, num_blocks, block_k, axis):
  pad = num_blocks * block_k - x.shape[axis]
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def _key_block(x, j, static, axis):
  """Block j of keys along `axis` (a size-1 broadcast axis is returned as is)."""
  if x is None or x.shape[axis] == 1:
    return x
  return jax.lax.dynamic_slice_in_dim(x, j * static.block_k, static.block_k, axis)


class _Blocks:
  """Key-blocked views of the inputs and the per-block logits/mask computation."""

  def __init__(self, q, k, v, bias, mask, q_seg, kv_seg, static):
    self.static = static
    hkv = k.shape[2]
    self.num_blocks = -(-static.tk // static.block_k)
    pad = functools.partial(_pad_keys, num_blocks=self.num_blocks, block_k=static.block_k)
    self.q = _grouped(q, hkv)                                   # [B, Tq, Hkv, G, D]
    self.k = pad(k, axis=1)
    self.v = pad(v, axis=1)
    self.bias = masks.split_heads(bias, hkv)                    # [b, hkv, g, tq, tk] or None
    self.bias_padded = None if bias is None else (
        self.bias if self.bias.shape[-1] == 1 else pad(self.bias, axis=-1))
    self.mask = masks.split_heads(mask, hkv)
    if self.mask is not None and self.mask.shape[-1] != 1:
      self.mask = pad(self.mask, axis=-1)
    self.q_seg, self.kv_seg = q_seg, (None if kv_seg is None else pad(kv_seg, axis=1))
    self.q_pos = jnp.arange(static.tq) + (static.tk - static.tq)

  def logits(self, j):
    """Masked logits [B, Hkv, G, Tq, block_k] of key block j (-inf where not visible), plus kv."""
    s = self.static
    kj = _key_block(self.k, j, s, 1)
    vj = _key_block(self.v, j, s, 1)
    logits = jnp.einsum('bqhgd,bkhd->bhgqk', self.q, kj,
                        preferred_element_type=jnp.float32) * s.scale
    if self.bias is not None:
      logits = logits + _key_block(self.bias_padded, j, s, -1).astype(jnp.float32)
    k_pos = j * s.block_k + jnp.arange(s.block_k)
    visible = masks.combine_masks(
        k_pos < s.tk,                                            # padding of the last block
        masks.structural_mask(self.q_pos, k_pos, causal=s.causal, window=s.window),
        _key_block(self.mask, j, s, -1),
        None if self.q_seg is None else
        masks.segment_mask(self.q_seg, _key_block(self.kv_seg, j, s, 1))[:, :, None],
    )
    return jnp.where(visible, logits, -jnp.inf), kj, vj


def _forward(q, k, v, bias, mask, q_seg, kv_seg, static):
  blocks = _Blocks(q, k, v, bias, mask, q_seg, kv_seg, static)
  b, tq, hkv, g, d = blocks.q.shape
  stats_shape = (b, hkv, g, tq)

  def step(carry, j):
    row_max, row_sum, acc = carry
    logits, _, vj = blocks.logits(j)
    new_max = jnp.maximum(row_max, logits.max(-1))
    safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
    p = jnp.exp(logits - safe_max[..., None])
    correction = jnp.exp(row_max - safe_max)
    row_sum = row_sum * correction + p.sum(-1)
    pv = jnp.einsum('bhgqk,bkhd->bqhgd', p.astype(v.dtype), vj,
                    preferred_element_type=jnp.float32)
    acc = acc * jnp.moveaxis(correction, 3, 1)[..., None] + pv
    return (new_max, row_sum, acc), None

  init = (jnp.full(stats_shape, -jnp.inf, jnp.float32), jnp.zeros(stats_shape, jnp.float32),
          jnp.zeros((b, tq, hkv, g, v.shape[-1]), jnp.float32))
  (row_max, row_sum, acc), _ = jax.lax.scan(step, init, jnp.arange(blocks.num_blocks))
  empty = row_sum == 0
  out = acc / jnp.moveaxis(jnp.where(empty, 1.0, row_sum), 3, 1)[..., None]
  lse = jnp.where(empty, 0.0, jnp.where(jnp.isfinite(row_max), row_max, 0.0) + jnp.log(
      jnp.where(empty, 1.0, row_sum)))
  out = out.reshape(b, tq, hkv * g, v.shape[-1]).astype(q.dtype)
  return out, lse


def _attention_bwd(static, residuals, d_out):
  q, k, v, bias, mask, q_seg, kv_seg, out, lse = residuals
  blocks = _Blocks(q, k, v, bias, mask, q_seg, kv_seg, static)
  hkv = k.shape[2]
  do = _grouped(d_out, hkv)
  # delta_i = sum_j P_ij dP_ij = do_i . o_i
  delta = jnp.einsum('bqhgd,bqhgd->bhgq', do.astype(jnp.float32),
                     _grouped(out, hkv).astype(jnp.float32))
  bias_block_shape = None if bias is None else (
      blocks.bias.shape[:-1] + (min(blocks.bias.shape[-1], static.block_k),))

  def step(dq, j):
    logits, kj, vj = blocks.logits(j)
    p = jnp.exp(logits - lse[..., None])
    dv = jnp.einsum('bhgqk,bqhgd->bkhd', p.astype(do.dtype), do,
                    preferred_element_type=jnp.float32)
    dp = jnp.einsum('bqhgd,bkhd->bhgqk', do, vj, preferred_element_type=jnp.float32)
    ds = p * (dp - delta[..., None])
    dq = dq + jnp.einsum('bhgqk,bkhd->bqhgd', ds.astype(kj.dtype), kj,
                         preferred_element_type=jnp.float32) * static.scale
    dk = jnp.einsum('bhgqk,bqhgd->bkhd', ds.astype(q.dtype), blocks.q,
                    preferred_element_type=jnp.float32) * static.scale
    dbias = None if bias is None else masks.sum_to_shape(ds, bias_block_shape)
    return dq, (dk, dv, dbias)

  dq, (dk, dv, dbias) = jax.lax.scan(step, jnp.zeros(blocks.q.shape, jnp.float32),
                                     jnp.arange(blocks.num_blocks))

  def unblock(x):  # [nb, B, bk, ...] -> [B, Tk, ...]
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape((x.shape[0], -1) + x.shape[3:])[:, :static.tk]

  dq = dq.reshape(q.shape).astype(q.dtype)
  dk, dv = unblock(dk).astype(k.dtype), unblock(dv).astype(v.dtype)
  if bias is not None:
    if bias.shape[-1] == 1:
      dbias = dbias.sum(0)
    else:  # [nb, b, hkv, g, tq, bk] -> [b, hkv, g, tq, Tk]
      dbias = jnp.moveaxis(dbias, 0, -2)
      dbias = dbias.reshape(dbias.shape[:-2] + (-1,))[..., :static.tk]
    dbias = dbias.reshape(bias.shape).astype(bias.dtype)
  return dq, dk, dv, dbias, None, None, None


_attention = flash_vjp(_forward, _attention_bwd)
