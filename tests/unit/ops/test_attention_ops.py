"""dot_product_attention: every impl against the float64 NumPy reference, values and grads."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.ops import attention as attn_ops
from jaxformer.ops import blocked_attention
from jaxformer.ops.attention import dot_product_attention, dot_product_attention_weights
from tests import attention_reference as ref

RNG = np.random.default_rng(0)


make_inputs = functools.partial(ref.random_inputs, b=2, tq=37, tk=37, h=12, hkv=4, d=48)
segments = functools.partial(ref.sorted_segments, num_segments=4)


# name -> (shape kwargs, attention kwargs builder)
def cases():
  b, t = 2, 37
  rng = np.random.default_rng(2)
  bias_full = rng.normal(size=(b, 12, t, t)).astype(np.float32)
  mask_rows_empty = rng.random((b, 1, t, t)) > 0.5
  mask_rows_empty[:, :, 3] = False         # query row 3 sees nothing
  mask_rows_empty[0, :, 10] = False
  return {
      "plain": ({}, {}),
      "causal": ({}, dict(causal=True)),
      "causal_decode_tq_lt_tk": (dict(tq=5, tk=37), dict(causal=True)),
      "window_int_causal": ({}, dict(causal=True, window=6)),
      "window_two_sided": ({}, dict(window=(4, 3))),
      "window_left_unbounded": ({}, dict(window=(None, 2))),
      "segments": ({}, dict(segment_ids=segments(b, t))),
      "segments_causal_window": ({}, dict(segment_ids=segments(b, t), causal=True, window=5)),
      "cross_segments_empty_rows": (dict(tq=11, tk=37), dict(
          segment_ids=(np.full((b, 11), 9, np.int32), segments(b, 37)))),
      "bias_full": ({}, dict(bias=bias_full)),
      "bias_broadcast_keys": ({}, dict(bias=bias_full[:, :1, :1, :])),
      "mask_empty_rows": ({}, dict(mask=mask_rows_empty)),
      "everything": ({}, dict(bias=bias_full, mask=mask_rows_empty, causal=True, window=(7, None),
                              segment_ids=segments(b, t), scale=0.3)),
      "mqa": (dict(h=8, hkv=1, d=16), dict(causal=True)),
      "mha_tk_gt_tq": (dict(h=4, hkv=4, tq=13, tk=29), {}),
  }


CASES = cases()


# Key blocks of impl="blocked" in the grad tests: 37 keys are 5 blocks, the last one ragged.
BLOCK_K = 8


@functools.cache
def _grads(impl, name):
  """jit(grad) of `impl` on case `name`, one per (impl, case) for the whole file: the float64
  reference test and the blocked == xla test run the same programs on different inputs."""
  blocks = dict(block_sizes=(BLOCK_K, BLOCK_K)) if impl == "blocked" else {}
  return ref.grad_fn(CASES[name][1], functools.partial(dot_product_attention, impl=impl,
                                                       **blocks))


@pytest.mark.parametrize("impl", ["xla", "blocked"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_float64_reference(name, impl):
  shape_kw, kw = CASES[name]
  if "bias" in kw and kw["bias"].shape[1] != 1 and shape_kw.get("h", 12) != kw["bias"].shape[1]:
    pytest.skip("bias heads")
  q, k, v, d_out = make_inputs(**shape_kw)
  bias = kw.get("bias")
  expected, _ = ref.attention(q, k, v, bias=bias, **ref.reference_kwargs(kw))
  dq_r, dk_r, dv_r, ds_r = ref.attention_grads(q, k, v, d_out, bias=bias,
                                               **ref.reference_kwargs(kw))

  grads, out = _grads(impl, name)(q, k, v, d_out)
  ref.assert_matches(out, grads, expected, (dq_r, dk_r, dv_r, ds_r), bias)


@pytest.mark.parametrize("name", sorted(CASES))
def test_blocked_equals_xla(name):
  shape_kw, kw = CASES[name]
  q, k, v, d_out = make_inputs(**shape_kw, seed=3)
  bias = kw.get("bias")
  if bias is not None and bias.shape[1] not in (1, q.shape[2]):
    pytest.skip("bias heads")
  results = {impl: _grads(impl, name)(q, k, v, d_out) for impl in ("xla", "blocked")}
  chex.assert_trees_all_close(results["blocked"], results["xla"], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("block_k", [1, 5, 16, 64])
def test_blocked_any_block_size(block_k):
  q, k, v, _ = make_inputs(b=1, tq=19, tk=23, h=4, hkv=2, d=8)
  got = jax.jit(functools.partial(blocked_attention.blocked_attention, causal=True,
                                  window=(5, None), scale=0.25, block_k=block_k))(q, k, v)
  want, _ = ref.attention(q, k, v, causal=True, window=(5, None), scale=0.25)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "blocked"])
def test_fully_masked_rows_are_zero_and_grads_finite(impl):
  q, k, v, d_out = make_inputs(b=1, tq=6, tk=6, h=2, hkv=2, d=8)
  mask = np.zeros((1, 1, 6, 6), bool)
  bias = np.full((1, 2, 6, 6), -np.inf, np.float32)    # -inf logits must not create NaN
  for kw in (dict(mask=mask), dict(bias=bias)):
    def loss(q, k, v, kw=kw):
      out = dot_product_attention(q, k, v, impl=impl, **kw)
      return jnp.sum(out * d_out), out
    grads, out = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    np.testing.assert_array_equal(out, 0)
    chex.assert_tree_all_finite(grads)
    for g in grads:
      np.testing.assert_array_equal(g, 0)


def test_bfloat16_inputs_close_to_reference():
  q, k, v, _ = make_inputs(b=1, tq=33, tk=33, h=4, hkv=2, d=32)
  want, _ = ref.attention(q, k, v, causal=True)
  for impl in ("xla", "blocked"):
    out = jax.jit(functools.partial(dot_product_attention, causal=True, impl=impl))(
        *(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=3e-2, rtol=3e-2)


def test_self_attention_is_permutation_equivariant():
  q, k, v, _ = make_inputs(b=1, tq=17, tk=17, h=4, hkv=4, d=8)
  perm = np.random.default_rng(5).permutation(17)
  for impl in ("xla", "blocked"):
    fn = jax.jit(lambda q, k, v, impl=impl: dot_product_attention(q, k, v, impl=impl))
    out = fn(q, k, v)
    out_p = fn(q[:, perm], k[:, perm], v[:, perm])
    np.testing.assert_allclose(out_p, out[:, perm], atol=1e-5)


def test_weights_match_reference_and_sum_to_one():
  q, k, _, _ = make_inputs(b=2, tq=9, tk=9, h=6, hkv=3, d=8)
  seg = segments(2, 9)
  w = jax.jit(lambda q, k: dot_product_attention_weights(q, k, causal=True, segment_ids=seg))(
      q, k)
  _, p = ref.attention(q, k, k, causal=True, q_seg=seg, kv_seg=seg)
  chex.assert_shape(w, (2, 6, 9, 9))
  np.testing.assert_allclose(w, p, atol=1e-6)
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)


# ---------------------------------------------------------------- cuDNN delegation / dispatch


@pytest.mark.parametrize("name", ["plain", "causal", "causal_decode_tq_lt_tk", "window_int_causal",
                                  "window_two_sided", "segments_causal_window", "mask_empty_rows",
                                  "cross_segments_empty_rows", "bias_full"])
def test_jax_nn_translation_matches_reference(name):
  """The cuDNN path's argument translation, run through jax.nn's xla implementation."""
  shape_kw, kw = CASES[name]
  q, k, v, _ = make_inputs(**shape_kw)
  kw = dict(kw)
  a = attn_ops._validate(q, k, v, kw.get("bias"), kw.get("mask"), kw.get("causal", False),
                         kw.get("window"), kw.get("segment_ids"), kw.get("scale"), "cudnn")
  kw.pop("causal", None)
  out = jax.jit(lambda q, k, v: attn_ops._jax_nn_attention(q, k, v, a, implementation="xla"))(
      q, k, v)
  bias = kw.pop("bias", None)
  want, _ = ref.attention(q, k, v, bias=bias, causal=a["causal"], **ref.reference_kwargs(kw))
  np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-5)


def test_cudnn_on_cpu_is_a_clear_error():
  q, k, v, _ = make_inputs(b=1, tq=8, tk=8, h=2, hkv=2, d=8)
  with pytest.raises(ValueError, match="impl='cudnn'.*GPU"):
    dot_product_attention(q, k, v, impl="cudnn")


def test_auto_picks_by_size(monkeypatch):
  q, k, v, _ = make_inputs(b=1, tq=16, tk=16, h=2, hkv=2, d=8)
  a = attn_ops._validate(q, k, v, None, None, False, None, None, None, "auto")
  assert attn_ops._resolve_impl("auto", q, k, v, a) == "xla"
  monkeypatch.setattr(attn_ops, "AUTO_XLA_MAX_LOGIT_BYTES", 100)
  assert attn_ops._resolve_impl("auto", q, k, v, a) == "blocked"
  auto = jax.jit(dot_product_attention)(q, k, v)
  np.testing.assert_allclose(auto, jax.jit(functools.partial(dot_product_attention, impl="xla"))(
      q, k, v), atol=1e-6)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=np.zeros((2, 8, 3, 8)), v=np.zeros((2, 8, 3, 8))), "num_kv_heads=3.*num_heads=4"),
    (dict(q=np.zeros((2, 8, 4))), "q must be"),
    (dict(k=np.zeros((2, 8, 2, 6)), v=np.zeros((2, 8, 2, 6))), "head_dim"),
    (dict(v=np.zeros((2, 9, 2, 8))), "k and v"),
    (dict(k=np.zeros((3, 8, 2, 8)), v=np.zeros((3, 8, 2, 8))), "batch"),
    (dict(window=-1), "window"),
    (dict(window=(2, -3)), "window"),
    (dict(window="big"), "window"),
    (dict(impl="flash"), "impl='flash'"),
    (dict(mask=np.ones((2, 1, 8, 8), np.float32)), "mask must be a bool"),
    (dict(mask=np.ones((2, 3, 8, 8), bool)), "mask of shape.*heads"),
    (dict(bias=np.ones((2, 4, 8, 7), np.float32)), "bias of shape.*kv_length"),
    (dict(segment_ids=np.zeros((2, 9), np.int32)), "segment_ids"),
    (dict(causal=1), "causal"),
])
def test_bad_input_raises_value_error_naming_argument(kwargs, match):
  args = dict(q=np.zeros((2, 8, 4, 8), np.float32), k=np.zeros((2, 8, 2, 8), np.float32),
              v=np.zeros((2, 8, 2, 8), np.float32))
  for name in ("q", "k", "v"):
    if name in kwargs:
      args[name] = kwargs.pop(name)
  with pytest.raises(ValueError, match=match):
    dot_product_attention(args["q"], args["k"], args["v"], **kwargs)
