"""ops/attention_variants.py against float64 NumPy references: linear attention and the
prefix-written routing cache (their running-sum and quadratic forms, masks with empty rows,
GQA, decode alignment) and the learned routing cache; values, gradients, causality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.ops.attention_variants import (feature_map, linear_attention,
                                              routing_cache_attention, routing_prefix_attention)
from tests.arrays import rand
from tests.gradcheck import numeric_grad


def np_phi(x):
  return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def np_linear(q, k, v, causal=False, mask=None):
  """Per query: sum_j phi(q).phi(k_j) v_j / sum_j phi(q).phi(k_j) over visible j, float64."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, tq, h, d = q.shape
  tk, hkv = k.shape[1], k.shape[2]
  out = np.zeros((b, tq, h, v.shape[-1]))
  for bi in range(b):
    for i in range(tq):
      for hi in range(h):
        kh = hi // (h // hkv)
        w = np_phi(k[bi, :, kh]) @ np_phi(q[bi, i, hi])                  # [Tk]
        vis = np.ones(tk, bool)
        if causal:
          vis &= np.arange(tk) <= i + tk - tq
        if mask is not None:
          vis &= np.broadcast_to(mask, (b, h, tq, tk))[bi, hi, i]
        if vis.any():
          out[bi, i, hi] = (w[vis] @ v[bi, vis, kh]) / w[vis].sum()
  return out


def np_routing(q, keys, values, scale=None):
  q, keys, values = (np.asarray(a, np.float64) for a in (q, keys, values))
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  logits = np.einsum("bthd,mhd->bhtm", q, keys) * scale
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum("bhtm,mhd->bthd", w, values)


def np_routing_prefix(q, k, v, writes, causal=False, mask=None, scale=None):
  """Per query: slots = softmax_j(u_m.k_j)-weighted keys and values over visible j, then a
  softmax over the slots; float64."""
  q, k, v, writes = (np.asarray(a, np.float64) for a in (q, k, v, writes))
  b, tq, h, d = q.shape
  tk, hkv = k.shape[1], k.shape[2]
  scale = d ** -0.5 if scale is None else scale
  out = np.zeros((b, tq, h, d))
  for bi in range(b):
    for i in range(tq):
      for hi in range(h):
        kh = hi // (h // hkv)
        vis = np.ones(tk, bool)
        if causal:
          vis &= np.arange(tk) <= i + tk - tq
        if mask is not None:
          vis &= np.broadcast_to(mask, (b, h, tq, tk))[bi, hi, i]
        if not vis.any():
          continue
        kk, vv = k[bi, vis, kh], v[bi, vis, kh]
        a = writes[:, hi] @ kk.T * scale                                   # [M, n]
        w = np.exp(a - a.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        slot_k, slot_v = w @ kk, w @ vv
        r = slot_k @ q[bi, i, hi] * scale
        p = np.exp(r - r.max())
        out[bi, i, hi] = (p / p.sum()) @ slot_v
  return out


def test_feature_map_is_elu_plus_one_and_positive():
  x = np.linspace(-80, 5, 171).astype(np.float32)
  np.testing.assert_allclose(feature_map(x), np_phi(x.astype(np.float64)), rtol=1e-6)
  assert (np.asarray(feature_map(x)) > 0).all()


def _mask_with_empty_rows(b, h, tq, tk):
  m = np.random.default_rng(3).random((b, h, tq, tk)) > 0.4
  m[:, :, 2] = False                        # query row 2 sees nothing
  return m


# name -> (q shape [B, Tq, H, D], kv heads, Tk, kwargs)
CASES = {
    "causal_running_sums": ((2, 13, 3, 5), 3, 13, dict(causal=True)),
    "causal_gqa": ((1, 11, 6, 4), 2, 11, dict(causal=True)),
    "bidirectional": ((2, 7, 2, 3), 2, 9, {}),
    "causal_decode_tq_lt_tk": ((2, 3, 2, 5), 1, 10, dict(causal=True)),
    "mask_empty_rows": ((2, 9, 2, 3), 2, 9, dict(mask=True)),
    "causal_and_mask": ((1, 9, 4, 3), 2, 9, dict(causal=True, mask=True)),
}


GRAD_CASES = ("causal_gqa", "causal_decode_tq_lt_tk", "mask_empty_rows")


def jitted(fn, **kw):
  """fn(*arrays, **kw) as one jitted program: an eager call dispatches (and compiles) each op
  of the function (and of its VJP) on its own, 5-10x the CPU of one compile."""
  return jax.jit(lambda *a: fn(*a, **kw))


def _check_grads(fn, ref, args, kw, w, num):
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a, **kw) * w),
                           argnums=tuple(range(len(args)))))(*args)
  for i, x in enumerate(args):
    def f(xi, i=i):
      a = list(args)
      a[i] = xi
      return np.sum(ref(*a, **kw) * w)
    idx, numeric = numeric_grad(f, x, num=num, seed=i)
    np.testing.assert_allclose(np.asarray(grads[i]).ravel()[idx], numeric, atol=1e-4, rtol=1e-3)
    assert np.isfinite(np.asarray(grads[i])).all()


def _case(name, nargs_writes=False):
  (b, tq, h, d), hkv, tk, kw = CASES[name]
  args = [rand((b, tq, h, d), 0), rand((b, tk, hkv, d), 1), rand((b, tk, hkv, d), 2)]
  if nargs_writes:
    args.append(rand((3, h, d), 4))
  if kw.get("mask"):
    kw = dict(kw, mask=_mask_with_empty_rows(b, h, tq, tk))
  return args, kw


@pytest.mark.parametrize("variant", ["linear", "routing_prefix"])
@pytest.mark.parametrize("name", GRAD_CASES)
def test_gradients_match_float64_reference(variant, name):
  args, kw = _case(name, variant == "routing_prefix")
  fn, ref = ((linear_attention, np_linear) if variant == "linear" else
             (routing_prefix_attention, np_routing_prefix))
  _check_grads(fn, ref, args, kw, rand(args[0].shape, 5), num=6)


@pytest.mark.parametrize("variant", ["linear", "routing_prefix"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_match_float64_reference(variant, name):
  args, kw = _case(name, variant == "routing_prefix")
  fn, ref = ((linear_attention, np_linear) if variant == "linear" else
             (routing_prefix_attention, np_routing_prefix))
  got = np.asarray(jitted(fn, **kw)(*args))
  np.testing.assert_allclose(got, ref(*args, **kw), atol=2e-5, rtol=1e-4)
  if "mask" in kw:
    assert (got[:, 2] == 0).all()


def test_routing_prefix_running_sums_equal_the_quadratic_form():
  q, k, v = rand((2, 17, 3, 4), 0), rand((2, 17, 3, 4), 1), rand((2, 17, 3, 4), 2)
  writes = rand((5, 3, 4), 3, scale=3.0)
  causal = np.tril(np.ones((17, 17), bool))
  np.testing.assert_allclose(jitted(routing_prefix_attention, causal=True)(q, k, v, writes),
                             jitted(routing_prefix_attention, mask=causal)(q, k, v, writes),
                             atol=2e-5, rtol=1e-4)


def test_linear_running_sums_equal_the_quadratic_form():
  q, k, v = rand((2, 17, 3, 4), 0), rand((2, 17, 3, 4), 1), rand((2, 17, 3, 4), 2)
  causal = np.tril(np.ones((17, 17), bool))
  np.testing.assert_allclose(jitted(linear_attention, causal=True)(q, k, v),
                             jitted(linear_attention, mask=causal)(q, k, v), atol=2e-6,
                             rtol=1e-5)


@pytest.mark.parametrize("fn", ["linear", "routing_prefix"])
def test_causal_output_at_t_does_not_depend_on_later_inputs(fn):
  writes = rand((4, 2, 4), 7)
  attn = jitted(linear_attention if fn == "linear" else
                lambda q, k, v, **kw: routing_prefix_attention(q, k, v, writes, **kw),
                causal=True)
  q, k, v = rand((1, 12, 2, 4), 0), rand((1, 12, 2, 4), 1), rand((1, 12, 2, 4), 2)
  out = attn(q, k, v)
  t = 5
  q2, k2, v2 = (np.concatenate([a[:, :t + 1], rand(a[:, t + 1:].shape, 9)], 1)
                for a in (q, k, v))
  out2 = attn(q2, k2, v2)
  np.testing.assert_array_equal(np.asarray(out)[:, :t + 1], np.asarray(out2)[:, :t + 1])
  assert not np.allclose(np.asarray(out)[:, t + 1:], np.asarray(out2)[:, t + 1:])


def test_routing_cache_matches_float64_reference_values_and_grads():
  q, keys, values = rand((2, 7, 3, 5), 0), rand((16, 3, 5), 1), rand((16, 3, 5), 2)
  for scale in (None, 0.7):
    np.testing.assert_allclose(jitted(routing_cache_attention, scale=scale)(q, keys, values),
                               np_routing(q, keys, values, scale), atol=2e-6, rtol=1e-5)
  w = rand((2, 7, 3, 5), 5)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(routing_cache_attention(*a) * w),
                           argnums=(0, 1, 2)))(q, keys, values)
  for i, x in enumerate((q, keys, values)):
    def f(xi, i=i):
      args = [q, keys, values]
      args[i] = xi
      return np.sum(np_routing(*args) * w)
    idx, numeric = numeric_grad(f, x, num=10, seed=i)
    np.testing.assert_allclose(np.asarray(grads[i]).ravel()[idx], numeric, atol=1e-4, rtol=1e-3)


def test_routing_cache_is_token_wise():
  """Position t's output depends on q_t alone: permuting positions permutes the outputs."""
  q, keys, values = rand((1, 9, 2, 4), 0), rand((5, 2, 4), 1), rand((5, 2, 4), 2)
  perm = np.random.default_rng(0).permutation(9)
  attn = jax.jit(routing_cache_attention)
  np.testing.assert_allclose(np.asarray(attn(q[:, perm], keys, values)),
                             np.asarray(attn(q, keys, values))[:, perm],
                             rtol=1e-6, atol=1e-7)


def test_bad_shapes_are_refused():
  with pytest.raises(ValueError, match="keys, values"):
    routing_cache_attention(rand((1, 3, 2, 4)), rand((5, 3, 4)), rand((5, 3, 4)))
  with pytest.raises(ValueError, match="write_queries must be"):
    routing_prefix_attention(rand((1, 3, 2, 4)), rand((1, 3, 2, 4)), rand((1, 3, 2, 4)),
                             rand((5, 2, 3)))
  with pytest.raises(ValueError, match="must divide"):
    linear_attention(rand((1, 3, 5, 4)), rand((1, 3, 2, 4)), rand((1, 3, 2, 4)))
