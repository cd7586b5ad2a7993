"""Position encodings (sinusoidal, RoPE, ALiBi) against float64 NumPy references."""


import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.ops import positions as pos_ops
from tests.gradcheck import numeric_grad
from tests.np_reference import rope_np


# ----------------------------------------------------------------------------- references

def sinusoidal_np(positions, dim, max_timescale=10_000.0):
  """Vaswani et al. (2017): PE[p, 2i] = sin(p / ts^(2i/dim)), PE[p, 2i+1] = cos(same)."""
  positions = np.asarray(positions, np.float64)
  out = np.zeros(positions.shape + (dim,), np.float64)
  for i in range(dim // 2):
    angle = positions / max_timescale ** (2 * i / dim)
    out[..., 2 * i] = np.sin(angle)
    out[..., 2 * i + 1] = np.cos(angle)
  return out


def alibi_bias_np(slopes, q_positions, k_positions):
  q = np.asarray(q_positions, np.float64)
  k = np.asarray(k_positions, np.float64)
  if q.ndim == 1:
    q = q[None]
  if k.ndim == 1:
    k = k[None]
  dist = np.abs(q[:, :, None] - k[:, None, :])                # [b, Tq, Tk]
  return -np.asarray(slopes, np.float64)[None, :, None, None] * dist[:, None]


# ----------------------------------------------------------------------------- sinusoidal

def test_sinusoidal_table_matches_vaswani():
  t, dim = 37, 48
  table = pos_ops.sinusoidal(jnp.arange(t), dim)
  chex.assert_shape(table, (t, dim))
  assert table.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(table), sinusoidal_np(np.arange(t), dim),
                             rtol=1e-5, atol=2e-5)
  # Position 0: sin = 0 on even features, cos = 1 on odd ones (interleaved layout).
  np.testing.assert_array_equal(np.asarray(table[0, 0::2]), 0.0)
  np.testing.assert_array_equal(np.asarray(table[0, 1::2]), 1.0)


def test_sinusoidal_arbitrary_positions_and_timescale():
  rng = np.random.default_rng(0)
  positions = rng.integers(0, 97, size=(3, 37))
  out = pos_ops.sinusoidal(jnp.asarray(positions), 48, max_timescale=500.0)
  chex.assert_shape(out, (3, 37, 48))
  np.testing.assert_allclose(np.asarray(out), sinusoidal_np(positions, 48, 500.0),
                             rtol=1e-5, atol=5e-5)


def test_sinusoidal_dtype():
  out = pos_ops.sinusoidal(jnp.arange(5), 8, dtype=jnp.bfloat16)
  assert out.dtype == jnp.bfloat16


def test_sinusoidal_odd_dim_raises():
  with pytest.raises(ValueError, match="dim"):
    pos_ops.sinusoidal(jnp.arange(4), 47)


# ----------------------------------------------------------------------------- RoPE

def _rope_inputs(b=3, t=37, h=2, d=48, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(b, t, h, d)).astype(np.float32)
  ct = rng.normal(size=(b, t, h, d)).astype(np.float32)
  return x, ct


def _positions(kind, b, t, seed=1):
  if kind == "1d":
    return np.arange(t, dtype=np.int32)
  rng = np.random.default_rng(seed)
  offsets = rng.integers(0, 64, size=(b, 1))
  return (offsets + np.arange(t)[None]).astype(np.int32)     # [B, T], e.g. left padding


@pytest.mark.parametrize("theta", [10_000.0, 500_000.0])
@pytest.mark.parametrize("pos_kind", ["1d", "2d"])
def test_apply_rope_values(theta, pos_kind):
  x, _ = _rope_inputs()
  positions = _positions(pos_kind, x.shape[0], x.shape[1])
  out = pos_ops.apply_rope(jnp.asarray(x), jnp.asarray(positions), theta=theta)
  chex.assert_shape(out, x.shape)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), rope_np(x, positions, theta),
                             rtol=1e-5, atol=5e-5)


def test_apply_rope_matches_rope_inv_frequencies():
  inv = pos_ops.rope_inv_frequencies(16, theta=500_000.0)
  np.testing.assert_allclose(inv, [500_000.0 ** (-2 * i / 16) for i in range(8)], rtol=1e-12)


@pytest.mark.parametrize("theta", [10_000.0, 500_000.0])
@pytest.mark.parametrize("pos_kind", ["1d", "2d"])
def test_apply_rope_grad(theta, pos_kind):
  x, ct = _rope_inputs()
  positions = _positions(pos_kind, x.shape[0], x.shape[1])

  def loss(xj):
    return jnp.sum(pos_ops.apply_rope(xj, jnp.asarray(positions), theta=theta) * ct)

  g = np.asarray(jax.grad(loss)(jnp.asarray(x)))
  idx, ng = numeric_grad(lambda xn: np.sum(rope_np(xn, positions, theta) * ct), x)
  np.testing.assert_allclose(g.ravel()[idx], ng, rtol=1e-4, atol=1e-4)
  # RoPE is an orthogonal map, so the full gradient is the inverse rotation of ct.
  np.testing.assert_allclose(g, rope_np(ct, -positions, theta), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("theta", [10_000.0, 500_000.0])
@pytest.mark.parametrize("shift", [3, 17, 250])
def test_rope_scores_depend_on_relative_position_only(theta, shift):
  rng = np.random.default_rng(3)
  t, h, d = 19, 2, 32
  q = jnp.asarray(rng.normal(size=(1, t, h, d)).astype(np.float32))
  k = jnp.asarray(rng.normal(size=(1, t, h, d)).astype(np.float32))
  m = jnp.arange(t)

  def scores(pos):
    qr = pos_ops.apply_rope(q, pos, theta=theta)
    kr = pos_ops.apply_rope(k, pos, theta=theta)
    return np.asarray(jnp.einsum("bqhd,bkhd->bhqk", qr, kr))

  base, shifted = scores(m), scores(m + shift)
  np.testing.assert_allclose(shifted, base, rtol=1e-4, atol=1e-3)
  # ... and the scores really depend on m - n (RoPE is not the identity).
  plain = np.asarray(jnp.einsum("bqhd,bkhd->bhqk", q, k))
  assert not np.allclose(base, plain, atol=1e-2)


def test_rope_single_vector_relative_property():
  """<rope(q, m), rope(k, n)> == <rope(q, m - n), rope(k, 0)> for many (m, n)."""
  rng = np.random.default_rng(4)
  d = 64
  q = rng.normal(size=(d,)).astype(np.float32)
  k = rng.normal(size=(d,)).astype(np.float32)
  ms = np.array([0, 5, 11, 30, 7, 63])
  ns = np.array([0, 2, 11, 1, 20, 40])
  def rot(v, p):
    x = jnp.broadcast_to(jnp.asarray(v), (1, len(p), 1, d))
    return np.asarray(pos_ops.apply_rope(x, jnp.asarray(p)))[0, :, 0]
  lhs = np.sum(rot(q, ms) * rot(k, ns), -1)
  rhs = np.sum(rot(q, ms - ns) * rot(k, np.zeros_like(ns)), -1)
  np.testing.assert_allclose(lhs, rhs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pos_kind", ["1d", "2d"])
def test_rope_preserves_norm(pos_kind):
  x, _ = _rope_inputs()
  positions = _positions(pos_kind, x.shape[0], x.shape[1])
  out = np.asarray(pos_ops.apply_rope(jnp.asarray(x), jnp.asarray(positions), theta=500_000.0))
  np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1),
                             rtol=1e-5)


def test_rope_position_zero_is_identity_and_dtype_kept():
  x, _ = _rope_inputs(b=2, t=5, h=1, d=8)
  out = pos_ops.apply_rope(jnp.asarray(x), jnp.zeros((5,), jnp.int32))
  np.testing.assert_allclose(np.asarray(out), x, rtol=0, atol=0)
  out16 = pos_ops.apply_rope(jnp.asarray(x, jnp.bfloat16), jnp.arange(5))
  assert out16.dtype == jnp.bfloat16


def test_rope_errors():
  x = jnp.zeros((2, 5, 1, 8))
  with pytest.raises(ValueError):
    pos_ops.apply_rope(x[0], jnp.arange(5))                   # not 4-D
  with pytest.raises(ValueError):
    pos_ops.apply_rope(x, jnp.arange(6))                      # wrong length
  with pytest.raises(ValueError, match="head_dim"):
    pos_ops.apply_rope(jnp.zeros((2, 5, 1, 7)), jnp.arange(5))


# ----------------------------------------------------------------------------- ALiBi

def test_alibi_slopes_power_of_two():
  np.testing.assert_allclose(pos_ops.alibi_slopes(8), [1 / 2 ** k for k in range(1, 9)],
                             rtol=1e-6)
  # General power of two n: 2^(-8 i / n), i = 1..n.
  np.testing.assert_allclose(pos_ops.alibi_slopes(16),
                             [2.0 ** (-0.5 * i) for i in range(1, 17)], rtol=1e-6)
  np.testing.assert_allclose(pos_ops.alibi_slopes(1), [2.0 ** -8], rtol=1e-6)
  assert pos_ops.alibi_slopes(8).dtype == np.float32


def test_alibi_slopes_non_power_of_two():
  # Paper recipe for 12 heads: the 8 slopes of 8 heads (2^-1 .. 2^-8), then every other
  # slope of the 16-head sequence 2^-0.5, 2^-1, 2^-1.5, ...: i.e. 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  expected = [2.0 ** -k for k in range(1, 9)] + [2.0 ** -(k + 0.5) for k in range(4)]
  np.testing.assert_allclose(pos_ops.alibi_slopes(12), expected, rtol=1e-6)
  # 3 heads: [2^-4, 2^-8] then the first of every other 4-head slope, 2^-2.
  np.testing.assert_allclose(pos_ops.alibi_slopes(3), [2.0 ** -4, 2.0 ** -8, 2.0 ** -2],
                             rtol=1e-6)
  assert len(pos_ops.alibi_slopes(15)) == 15
  with pytest.raises(ValueError):
    pos_ops.alibi_slopes(0)


@pytest.mark.parametrize("num_heads", [8, 12])
def test_alibi_bias_1d(num_heads):
  tq, tk = 5, 37
  q_pos = np.arange(tk - tq, tk)                               # the last Tq queries
  k_pos = np.arange(tk)
  bias = pos_ops.alibi_bias(num_heads, jnp.asarray(q_pos), jnp.asarray(k_pos))
  chex.assert_shape(bias, (1, num_heads, tq, tk))
  slopes = pos_ops.alibi_slopes(num_heads)
  np.testing.assert_allclose(np.asarray(bias), alibi_bias_np(slopes, q_pos, k_pos),
                             rtol=1e-6, atol=1e-6)
  # On the causal part (k <= q) it is the paper's slope * (k - q).
  rel = (k_pos[None, :] - q_pos[:, None]).astype(np.float64)  # [Tq, Tk]
  causal = rel <= 0
  expected = slopes.astype(np.float64)[:, None, None] * rel[None]
  got = np.asarray(bias)[0]
  np.testing.assert_allclose(got[:, causal], expected[:, causal], rtol=1e-6, atol=1e-6)


def test_alibi_bias_batched_positions():
  rng = np.random.default_rng(5)
  b, t, h = 3, 37, 12
  positions = (rng.integers(0, 10, size=(b, 1)) + np.arange(t)[None]).astype(np.int32)
  bias = pos_ops.alibi_bias(h, jnp.asarray(positions), jnp.asarray(positions))
  chex.assert_shape(bias, (b, h, t, t))
  slopes = pos_ops.alibi_slopes(h)
  np.testing.assert_allclose(np.asarray(bias), alibi_bias_np(slopes, positions, positions),
                             rtol=1e-6, atol=1e-6)
  rel = positions[:, None, :] - positions[:, :, None]          # [b, Tq, Tk]: k - q
  causal = np.broadcast_to((rel <= 0)[:, None], bias.shape)
  expected = slopes[None, :, None, None].astype(np.float64) * rel[:, None]
  np.testing.assert_allclose(np.asarray(bias)[causal], expected[causal], rtol=1e-6, atol=1e-6)
  # Diagonal is zero, bias never positive.
  assert np.all(np.asarray(bias) <= 0)
  np.testing.assert_array_equal(np.diagonal(np.asarray(bias), axis1=2, axis2=3), 0.0)
