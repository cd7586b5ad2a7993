"""Float64 NumPy reference of dot_product_attention (values and analytic gradients), its
random inputs, and the harness that checks an implementation against it."""

import jax
import jax.numpy as jnp
import numpy as np


def visible_mask(b, h, tq, tk, *, mask=None, causal=False, window=None, q_seg=None, kv_seg=None):
  """[B, H, Tq, Tk] bool written with explicit loops-free NumPy, independent of jaxformer."""
  qp = np.arange(tq)[:, None] + (tk - tq)
  kp = np.arange(tk)[None, :]
  vis = np.ones((b, h, tq, tk), bool)
  if causal:
    vis &= kp <= qp
  if window is not None:
    left, right = (window, 0) if isinstance(window, int) else window
    if left is not None:
      vis &= kp >= qp - left
    if right is not None:
      vis &= kp <= qp + right
  if q_seg is not None:
    vis &= (q_seg[:, None, :, None] == kv_seg[:, None, None, :])
  if mask is not None:
    vis &= np.broadcast_to(mask, vis.shape)
  return vis


def attention(q, k, v, *, bias=None, scale=None, **mask_kw):
  """Returns (out [B, Tq, H, D], probs [B, H, Tq, Tk]); rows with no visible key are 0."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, tq, h, d = q.shape
  tk, hkv = k.shape[1], k.shape[2]
  rep = h // hkv
  kr, vr = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
  scale = 1 / np.sqrt(d) if scale is None else scale
  s = np.einsum('bqhd,bkhd->bhqk', q, kr) * scale
  if bias is not None:
    s = s + np.asarray(bias, np.float64)
  vis = visible_mask(b, h, tq, tk, **mask_kw)
  s = np.where(vis, s, -np.inf)
  m = s.max(-1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0)
  e = np.where(vis, np.exp(s - m), 0)
  denom = e.sum(-1, keepdims=True)
  p = e / np.where(denom == 0, 1, denom)
  return np.einsum('bhqk,bkhd->bqhd', p, vr), p


def attention_grads(q, k, v, d_out, *, bias=None, scale=None, **mask_kw):
  """Analytic (dq, dk, dv, dbias[B, H, Tq, Tk]) for the loss sum(out * d_out)."""
  q, k, v, d_out = (np.asarray(x, np.float64) for x in (q, k, v, d_out))
  b, tq, h, d = q.shape
  hkv = k.shape[2]
  rep = h // hkv
  scale = 1 / np.sqrt(d) if scale is None else scale
  _, p = attention(q, k, v, bias=bias, scale=scale, **mask_kw)
  kr, vr = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
  dv = np.einsum('bhqk,bqhd->bkhd', p, d_out)
  dp = np.einsum('bqhd,bkhd->bhqk', d_out, vr)
  ds = p * (dp - (dp * p).sum(-1, keepdims=True))
  dq = np.einsum('bhqk,bkhd->bqhd', ds, kr) * scale
  dk = np.einsum('bhqk,bqhd->bkhd', ds, q) * scale

  def fold(x):  # sum the repeated query heads back onto their kv head
    return x.reshape(x.shape[:2] + (hkv, rep, d)).sum(3)

  return dq, fold(dk), fold(dv), ds


def reference_kwargs(kw):
  """`dot_product_attention` keyword arguments as `attention`/`attention_grads` take them:
  segment_ids (one array, or a (query, key) pair) as q_seg/kv_seg; the bias left out (it is
  passed on its own)."""
  out = {key: val for key, val in kw.items() if key not in ("bias", "segment_ids")}
  seg = kw.get("segment_ids")
  if seg is not None:
    out["q_seg"], out["kv_seg"] = seg if isinstance(seg, tuple) else (seg, seg)
  return out


def random_inputs(b, tq, tk, h, hkv, d, seed=0):
  """float32 q [b, tq, h, d], k/v [b, tk, hkv, d] and an output cotangent d_out."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, tq, h, d)).astype(np.float32)
  k = rng.normal(size=(b, tk, hkv, d)).astype(np.float32)
  v = rng.normal(size=(b, tk, hkv, d)).astype(np.float32)
  d_out = rng.normal(size=(b, tq, h, d)).astype(np.float32)
  return q, k, v, d_out


def sorted_segments(b, t, num_segments, seed=1):
  """[b, t] int32 packed-sequence ids in 0..num_segments-1 (sorted: contiguous segments)."""
  rng = np.random.default_rng(seed)
  return np.sort(rng.integers(0, num_segments, size=(b, t)), axis=1).astype(np.int32)


def grad_fn(kw, attention):
  """jit(grad) of sum(attention(q, k, v, **kw) * d_out) w.r.t. q, k, v (and the bias if kw
  has one): (q, k, v, d_out) -> (grads, out)."""
  kw = dict(kw)
  bias = kw.pop("bias", None)

  def loss(q, k, v, bias, d_out):
    out = attention(q, k, v, **kw, **({} if bias is None else dict(bias=bias)))
    return jnp.sum(out * d_out), out

  argnums = (0, 1, 2) + ((3,) if bias is not None else ())
  grad = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))
  return lambda q, k, v, d_out: grad(q, k, v, bias, d_out)


def assert_matches(out, grads, expected, ref_grads, bias=None):
  """`out` and grads (dq, dk, dv[, dbias]) of an implementation vs the float64 reference
  (`attention`, `attention_grads`); a broadcast bias's cotangent is summed over its broadcast
  dims."""
  assert out.shape == expected.shape and all(np.isfinite(g).all() for g in grads)
  np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-5)
  for got, want in zip(grads[:3], ref_grads[:3]):
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)
  if bias is not None:
    want = ref_grads[3].sum(axis=tuple(i for i, n in enumerate(bias.shape) if n == 1),
                            keepdims=True)
    np.testing.assert_allclose(grads[3], want, atol=5e-5, rtol=1e-4)
