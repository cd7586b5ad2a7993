"""Pallas flash attention (CPU interpret mode) against the float64 NumPy reference; on a GPU or
TPU also compiled for the device (markers `gpu`/`tpu`, tests/accelerators.py)."""

from __future__ import annotations

import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import models
from jaxformer.ops.attention import dot_product_attention
from jaxformer.ops.pallas import attention as pallas_ops
from tests import accelerators
from tests import attention_reference as ref

BLOCK = 16


make_inputs = functools.partial(ref.random_inputs, b=2, tq=33, tk=33, h=4, hkv=2, d=8)
segments = functools.partial(ref.sorted_segments, num_segments=3)


def alibi_bias(h, tq, tk):
  """[1, H, Tq, Tk] ALiBi: -slope_h * distance to the key (queries are the last Tq positions)."""
  slopes = 2.0 ** (-8.0 * np.arange(1, h + 1) / h)
  dist = (np.arange(tq)[:, None] + tk - tq) - np.arange(tk)[None, :]
  return (-slopes[:, None, None] * np.abs(dist))[None].astype(np.float32)


def cases():
  b, t = 2, 33
  rng = np.random.default_rng(2)
  mask = rng.random((b, 1, t, t)) > 0.4
  mask[:, :, 5] = False                     # query row 5 sees nothing
  return {
      "causal_gqa2_d12": (dict(d=12), dict(causal=True)),
      "decode_mqa8_window": (dict(tq=7, h=8, hkv=1, d=16), dict(causal=True, window=(9, None))),
      "tq_one_mha": (dict(tq=1, h=2, hkv=2), {}),
      "segments_alibi_causal": ({}, dict(segment_ids=segments(b, t), causal=True,
                                         bias=alibi_bias(4, t, t))),
      "everything_empty_rows": ({}, dict(
          bias=rng.normal(size=(b, 4, t, t)).astype(np.float32), mask=mask, causal=True,
          window=(7, None), segment_ids=segments(b, t), scale=0.3)),
      "cross_segments_all_empty": (dict(tq=7), dict(
          segment_ids=(np.full((b, 7), 9, np.int32), segments(b, t)))),
      "head_dim_64_window": (dict(b=1, tq=19, tk=19, h=2, hkv=1, d=64),
                             dict(causal=True, window=(5, None))),
      "head_dim_128_gqa2": (dict(b=1, tq=19, tk=19, h=4, hkv=2, d=128), dict(causal=True)),
      "head_dim_256_mha": (dict(b=1, tq=19, tk=23, h=2, hkv=2, d=256), {}),
  }


CASES = cases()


def _pallas(q, k, v, *, bias=None, mask=None, segment_ids=None, causal=False, window=None,
            scale=None, **block_kw):
  """`pallas_attention` with `dot_product_attention`'s argument conventions."""
  q_seg = kv_seg = segment_ids
  if isinstance(segment_ids, tuple):
    q_seg, kv_seg = segment_ids
  return pallas_ops.pallas_attention(
      q, k, v, bias=bias, mask=mask, q_segment_ids=q_seg, kv_segment_ids=kv_seg,
      causal=causal, window=window,
      scale=1 / np.sqrt(q.shape[-1]) if scale is None else scale, **block_kw)


def _with_impl(impl):
  return lambda *args, **kw: dot_product_attention(*args, impl=impl, **kw)


def _with_blocks(block_q, block_k):
  return lambda *args, **kw: _pallas(*args, block_q=block_q, block_k=block_k, **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_grads_match_float64_reference(name):
  _check_against_reference(*CASES[name], _with_blocks(BLOCK, BLOCK))


def _check_against_reference(shape_kw, kw, attention):
  """`attention`'s output and dq/dk/dv(/dbias) against the float64 reference; rows with no
  visible key are exactly zero."""
  q, k, v, d_out = make_inputs(**shape_kw)
  bias = kw.get("bias")
  expected, _ = ref.attention(q, k, v, bias=bias, **ref.reference_kwargs(kw))
  dq, dk, dv, ds = ref.attention_grads(q, k, v, d_out, bias=bias, **ref.reference_kwargs(kw))

  grads, out = ref.grad_fn(kw, attention)(q, k, v, d_out)
  ref.assert_matches(out, grads, expected, (dq, dk, dv, ds), bias)
  visible = ref.visible_mask(q.shape[0], q.shape[2], q.shape[1], k.shape[1],
                             **{key: val for key, val in ref.reference_kwargs(kw).items()
                                if key != "scale"})
  empty_rows = ~visible.any(-1)                 # [B, H, Tq]
  if empty_rows.any():
    np.testing.assert_array_equal(np.moveaxis(np.asarray(out), 2, 1)[empty_rows], 0)
    np.testing.assert_array_equal(np.moveaxis(np.asarray(grads[0]), 2, 1)[empty_rows], 0)


def hardware_cases():
  """Shapes the kernels also lower for on this host (LOWERING_CASES), in float32."""
  b, tq, tk = 2, 77, 200
  kv_ids = segments(b, tk)
  rng = np.random.default_rng(4)
  return {
      "head_dim_128_gqa2": CASES["head_dim_128_gqa2"],
      "everything_mqa_d64": (dict(b=b, tq=tq, tk=tk, h=4, hkv=1, d=64), dict(
          causal=True, window=(50, None), bias=alibi_bias(4, tq, tk),
          mask=rng.random((b, 1, tq, tk)) > 0.2, segment_ids=(kv_ids[:, tk - tq:], kv_ids))),
  }


HARDWARE_CASES = hardware_cases()


@pytest.mark.parametrize("platform", accelerators.params("gpu", "tpu"))
@pytest.mark.parametrize("name", sorted(HARDWARE_CASES))
def test_kernels_compiled_for_the_device_match_float64_reference(name, platform):
  """The kernels as Triton (GPU) or Mosaic (TPU) programs, not interpreted, on the device:
  the same reference and tolerances as the interpreted cases (float32 at `highest`)."""
  shape_kw, kw = HARDWARE_CASES[name]
  attention = functools.partial(_pallas, interpret=False)
  with accelerators.on_device(platform):
    q, k, v, _ = make_inputs(**shape_kw)
    accelerators.assert_kernel_compiled(platform, lambda q, k, v: attention(q, k, v, **kw),
                                        q, k, v)
    _check_against_reference(shape_kw, kw, attention)


def test_dot_product_attention_pallas_equals_xla_under_jit_grad():
  """Default block sizes, two-sided window, segments, MQA (ratio 8)."""
  q, k, v, d_out = make_inputs(b=1, tq=21, tk=21, h=8, hkv=1, d=16, seed=3)
  kw = dict(causal=True, window=(6, 2), segment_ids=segments(1, 21))
  got = ref.grad_fn(kw, _with_impl("pallas"))(q, k, v, d_out)
  want = ref.grad_fn(kw, _with_impl("xla"))(q, k, v, d_out)
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)


def test_bfloat16_forward_within_bf16_tolerance():
  q, k, v, _ = make_inputs(b=1, tq=33, tk=33, h=4, hkv=2, d=16)
  want, _ = ref.attention(q, k, v, causal=True)
  out = jax.jit(functools.partial(pallas_ops.pallas_attention, causal=True, scale=0.25,
                                  block_q=BLOCK, block_k=BLOCK))(
      *(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)))
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=3e-2, rtol=3e-2)


def test_skipped_key_blocks_are_never_read():
  """Keys outside every query's window hold NaN: the kernels must not load them (blocked,
  which computes every block, turns them into NaN), while visible blocks stay exact."""
  q, k, v, d_out = make_inputs(b=1, tq=8, tk=64, h=2, hkv=1, d=8)
  kw = dict(causal=True, window=(10, None))    # queries at 56..63 see keys >= 46 only
  k[:, :32], v[:, :32] = np.nan, np.nan       # key blocks 0 and 1 (block 16) are invisible
  blocked = jax.jit(functools.partial(dot_product_attention, impl="blocked", **kw))(q, k, v)
  assert np.isnan(np.asarray(blocked)).all(), "poisoning must be able to fail this test"
  grads, out = ref.grad_fn(kw, _with_blocks(BLOCK, BLOCK))(q, k, v, d_out)
  want, _ = ref.attention(q, np.nan_to_num(k), np.nan_to_num(v), **kw)
  np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-5)
  chex.assert_tree_all_finite(grads[0])
  np.testing.assert_array_equal(grads[1][:, :32], 0)   # no query reached those keys
  np.testing.assert_array_equal(grads[2][:, :32], 0)


BOUND_CASES = [  # (tq, tk, block_q, block_k, causal, window)
    (33, 33, 16, 16, True, None), (33, 33, 8, 16, False, (5, 3)), (7, 40, 4, 8, True, (9, None)),
    (40, 7, 8, 4, True, None), (37, 29, 16, 4, False, (None, 2)), (50, 50, 8, 8, True, (0, 0)),
    (64, 64, 16, 16, False, (3, 20)), (17, 17, 32, 32, False, None), (9, 23, 4, 8, True, (2, 40)),
]


def _block_visibility(tq, tk, bq, bk, causal, window):
  """For each (q block, k block): (any entry visible, all entries visible and real)."""
  nq, nk = -(-tq // bq), -(-tk // bk)
  # positions as in the kernel: padded rows continue the sequence, padded keys are invisible
  qp = np.arange(nq * bq)[:, None] + (tk - tq)
  kp = np.arange(nk * bk)[None, :]
  vis = np.ones((nq * bq, nk * bk), bool)
  left, right = window if window is not None else (None, None)
  if causal:
    vis &= kp <= qp
  if left is not None:
    vis &= kp >= qp - left
  if right is not None:
    vis &= kp <= qp + right
  vis &= kp < tk
  tiles = vis.reshape(nq, bq, nk, bk)
  real_rows = (np.arange(nq * bq) < tq).reshape(nq, bq)
  any_visible = (tiles & real_rows[:, :, None, None]).any(axis=(1, 3))
  return any_visible, tiles.all(axis=(1, 3))


def _as_set(bounds, index):
  lo, mid_lo, mid_hi, hi = (int(np.asarray(x)[index]) for x in bounds)
  assert lo <= mid_lo <= mid_hi <= hi
  return set(range(lo, hi)), set(range(mid_lo, mid_hi))


def _bounds(nq, nk, kw):
  """key_block_bounds of every query block and query_block_bounds of every key block, in one
  program (eager, their jnp ops compile one by one)."""
  return jax.jit(lambda: (pallas_ops.key_block_bounds(np.arange(nq), **kw),
                          pallas_ops.query_block_bounds(np.arange(nk), **kw)))()


@pytest.mark.parametrize("tq, tk, bq, bk, causal, window", BOUND_CASES)
def test_loop_bounds_visit_exactly_the_visible_blocks(tq, tk, bq, bk, causal, window):
  any_visible, all_visible = _block_visibility(tq, tk, bq, bk, causal, window)
  nq, nk = any_visible.shape
  kw = dict(tq=tq, tk=tk, block_q=bq, block_k=bk, causal=causal, window=window)
  by_query, by_key = _bounds(nq, nk, kw)
  for i in range(nq):
    visited, unmasked = _as_set(by_query, i)
    assert visited == set(np.flatnonzero(any_visible[i])), (i, visited)
    assert unmasked == set(np.flatnonzero(all_visible[i])) & visited, (i, unmasked)
  for j in range(nk):
    visited, unmasked = _as_set(by_key, j)
    assert visited == set(np.flatnonzero(any_visible[:, j])), (j, visited)
    assert unmasked == set(np.flatnonzero(all_visible[:, j])) & visited, (j, unmasked)


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_q=48), "block_q=48 must be a power of two"),
    (dict(block_k=0), "block_k=0"),
    (dict(interpret=False), "interpret=False needs a GPU or TPU"),
    (dict(interpret="yes"), "interpret must be a bool"),
])
def test_bad_kernel_arguments_raise_value_error(kwargs, match):
  if "interpret" in kwargs and jax.default_backend() != "cpu":
    pytest.skip("interpret=False is valid on accelerators")
  q, k, v, _ = make_inputs(b=1, tq=8, tk=8, h=2, hkv=1, d=8)
  with pytest.raises(ValueError, match=match):
    pallas_ops.pallas_attention(q, k, v, scale=0.3, **kwargs)


def test_default_block_sizes_per_backend():
  assert pallas_ops.default_block_sizes(64, "gpu") == (128, 64)
  assert pallas_ops.default_block_sizes(256, "gpu") == (32, 32)
  assert pallas_ops.default_block_sizes(128, "tpu") == (128, 128)
  for d in (64, 128, 256):
    assert all(b & (b - 1) == 0 for b in pallas_ops.default_block_sizes(d, "gpu"))


LOWERING_CASES = {   # (shape kwargs, kernel kwargs, bias/mask/segments)
    "causal_gqa4_bf16_d128": (dict(b=2, tq=300, tk=300, h=8, hkv=2, d=128, dtype=jnp.bfloat16),
                              dict(causal=True), False),
    "everything_mqa_f32_d64": (dict(b=2, tq=77, tk=200, h=4, hkv=1, d=64, dtype=jnp.float32),
                               dict(causal=True, window=(50, None)), True),
    "window_bf16_d256": (dict(b=1, tq=256, tk=256, h=2, hkv=2, d=256, dtype=jnp.bfloat16),
                         dict(window=(64, 64)), False),
}


@pytest.mark.parametrize("backend, platform, call", [
    ("gpu", "cuda", "__gpu$xla.gpu.triton"), ("tpu", "tpu", "tpu_custom_call")])
@pytest.mark.parametrize("name", sorted(LOWERING_CASES))
def test_kernels_lower_for_gpu_triton_and_tpu_mosaic(name, backend, platform, call):
  """Forward + backward lower through Pallas to Triton / Mosaic on this CPU host: block shapes,
  index maps and kernel bodies satisfy each backend's lowering rules (running them needs the
  device; see docs/design/attention.md)."""
  shape, kw, extras = LOWERING_CASES[name]
  b, tq, tk, h, hkv, d = (shape[key] for key in ("b", "tq", "tk", "h", "hkv", "d"))
  struct = jax.ShapeDtypeStruct
  q, kv = struct((b, tq, h, d), shape["dtype"]), struct((b, tk, hkv, d), shape["dtype"])
  others = ((struct((1, h, tq, tk), jnp.float32), struct((b, 1, tq, tk), jnp.bool_),
             struct((b, tq), jnp.int32), struct((b, tk), jnp.int32)) if extras else ())

  def loss(q, k, v, *others):
    names = ("bias", "mask", "q_segment_ids", "kv_segment_ids")
    out = pallas_ops.pallas_attention(q, k, v, scale=0.1, backend=backend,
                                      **dict(zip(names, others)), **kw)
    return jnp.sum(out.astype(jnp.float32))

  argnums = (0, 1, 2, 3) if extras else (0, 1, 2)
  text = jax.jit(jax.grad(loss, argnums)).trace(q, kv, kv, *others).lower(
      lowering_platforms=(platform,)).as_text()
  assert re.findall(r"custom_call @(\S+?)\(", text) == [call] * 3
  assert set(re.findall(r"jaxformer_flash_\w+", text)) == {
      "jaxformer_flash_forward", "jaxformer_flash_dq", "jaxformer_flash_dkdv"}


def test_block_sizes_reach_the_kernel_and_bad_ones_fail_early():
  q, k, v, _ = make_inputs(b=1, tq=40, tk=40, h=2, hkv=1, d=8)
  want = jax.jit(functools.partial(dot_product_attention, causal=True, impl="xla"))(q, k, v)
  for impl in ("pallas", "blocked"):
    got = jax.jit(functools.partial(dot_product_attention, causal=True, impl=impl,
                                    block_sizes=(8, 16)))(q, k, v)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  jaxpr = str(jax.make_jaxpr(lambda q: dot_product_attention(
      q, k, v, impl="pallas", block_sizes=(8, 16)))(q))
  assert "grid=(1, 2, 5)" in jaxpr           # 40 queries in blocks of 8
  assert "f32[1,1,48,8]" in jaxpr            # 40 keys padded to blocks of 16
  with pytest.raises(ValueError, match=r"block_sizes=\(8,\) must be a \(block_q, block_k\)"):
    dot_product_attention(q, k, v, impl="pallas", block_sizes=(8,))
  config = dict(family="decoder", vocab_size=16, d_model=16, num_heads=2, num_layers=1,
                mlp_dim=32, max_len=8, attention_impl="pallas", attention_block_sizes=(48, 64))
  with pytest.raises(ValueError, match=r"model.attention_block_sizes=\(48, 64\) must be "
                                       "powers of two for attention_impl='pallas'"):
    models.build(config)
  built = models.build(dict(config, attention_block_sizes=[32, 64]))
  assert built.block.attention_block_sizes == (32, 64)


def _pallas_costs(f, *args) -> dict:
  """{kernel name: its pallas_call's CostEstimate} in the jaxpr of f(*args) (traced only)."""
  found = {}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "pallas_call":
        found[eqn.params["name"]] = eqn.params["cost_estimate"]
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner)

  walk(jax.make_jaxpr(f)(*args).jaxpr)
  return found




def test_cost_estimates_are_the_hand_count_of_a_causal_gqa_shape():
  """B=2, T=512, 4 query heads on 2 kv heads, D=64, bf16, causal, 128-blocks (TPU): a query
  block i visits key blocks 0..i, 1+2+3+4 = 10 of 16 pairs per (batch, head)."""
  b, t, h, hkv, d, blk = 2, 512, 4, 2, 64, 128
  q = jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((b, t, hkv, d), jnp.bfloat16)

  def loss(q, k, v):
    out = pallas_ops.pallas_attention(q, k, v, scale=0.1, causal=True, backend="tpu")
    return jnp.sum(out.astype(jnp.float32))

  costs = _pallas_costs(jax.grad(loss, (0, 1, 2)), q, kv, kv)
  pairs = b * h * 10
  tile = pairs * blk * blk
  fwd = costs["jaxformer_flash_forward"]
  assert fwd.flops == 2 * tile * d + 2 * tile * d                 # Q K^T, P V
  assert fwd.transcendentals == tile + pairs * blk + b * h * t     # exp(s), rescale, log
  q_bytes, kv_bytes, stat = b * h * t * d * 2, b * hkv * t * d * 2, b * h * t * 4
  assert fwd.bytes_accessed == 2 * q_bytes + 2 * kv_bytes + stat  # q, K, V in; O, LSE out
  assert (fwd.flops, fwd.transcendentals, fwd.bytes_accessed) == (335544320, 1325056, 1589248)
  dq, dkdv = costs["jaxformer_flash_dq"], costs["jaxformer_flash_dkdv"]
  assert dq.flops == 6 * tile * d and dkdv.flops == 8 * tile * d  # + recomputed Q K^T
  assert dq.transcendentals == dkdv.transcendentals == tile
  assert dq.bytes_accessed == 3 * q_bytes + 2 * kv_bytes + 2 * stat
  assert dkdv.bytes_accessed == 2 * q_bytes + 4 * kv_bytes + 2 * stat
  # no mask: every pair
  full = _pallas_costs(lambda q, k, v: pallas_ops.pallas_attention(
      q, k, v, scale=0.1, backend="tpu"), q, kv, kv)["jaxformer_flash_forward"]
  assert full.flops == fwd.flops * 16 // 10


@pytest.mark.parametrize("tq, tk, bq, bk, causal, window", [
    (512, 512, 128, 128, True, None), (40, 40, 8, 16, True, None), (7, 33, 16, 16, True, None),
    (100, 100, 16, 32, False, (20, 5)), (64, 64, 16, 16, False, None),
    (33, 50, 16, 8, True, (9, None))])
def test_visited_block_pairs_are_the_kernels_loop_bounds(tq, tk, bq, bk, causal, window):
  cfg = pallas_ops._Config(causal=causal, window=window, scale=1.0, block_q=bq, block_k=bk,
                           tq=tq, tk=tk, interpret=True, backend="cpu", head_dim=8)
  kw = cfg.bounds_kwargs()
  (lo, _, _, hi), (k_lo, _, _, k_hi) = _bounds(-(-tq // bq), -(-tk // bk), kw)
  assert pallas_ops.visited_block_pairs(cfg, "query") == int(np.sum(hi - lo))
  assert pallas_ops.visited_block_pairs(cfg, "key") == int(np.sum(k_hi - k_lo))
