"""The chunked loss (`ops.cross_entropy`) against a float64 NumPy reference: values and
gradients with respect to the hidden states, the readout kernel (tied [V, d] and untied
[d, V]) and its bias, with odd lengths, fully masked rows, label smoothing, z-loss, μP's
output multiplier and bfloat16 inputs."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.ops.cross_entropy import Readout, chunked_cross_entropy
from tests.arrays import EPS32, LAMBDA, rand

EPS_BF16 = 2.0 ** -7


def reference(h, kernel, bias, labels, a, c, *, vocab_major, scale, s, z):
  """float64: per-position (objective, nll, correct) and the gradients of
  sum(a * objective + c * nll) wrt h, kernel, bias."""
  h, kernel = np.asarray(h, np.float64), np.asarray(kernel, np.float64)
  k = kernel.T if vocab_major else kernel                     # [d, V]
  logits = (h @ k) * (scale or 1.0) + (0.0 if bias is None else np.asarray(bias, np.float64))
  v = logits.shape[-1]
  m = logits.max(-1, keepdims=True)
  log_z = (np.log(np.exp(logits - m).sum(-1, keepdims=True)) + m)[..., 0]
  onehot = np.eye(v)[labels]
  nll = log_z - (onehot * logits).sum(-1)
  objective = (1 - s) * nll + s * (log_z - logits.mean(-1)) + z * log_z ** 2
  correct = (logits.argmax(-1) == labels).astype(np.float64)
  p = np.exp(logits - log_z[..., None])
  g = (a[..., None] * (p * (1 + 2 * z * log_z[..., None]) - (1 - s) * onehot - s / v)
       + c[..., None] * (p - onehot))
  db = g.sum((0, 1))
  g = g * (scale or 1.0)
  dh = g @ k.T
  dk = np.einsum("btd,btv->dv", h, g)
  return (objective, nll, correct), (dh, dk.T if vocab_major else dk, db)


def run(h, kernel, bias, labels, a, c, *, vocab_major, scale, s, z, chunk):
  def loss(h, kernel, bias):
    readout = Readout(kernel, bias, vocab_major=vocab_major, scale=scale)
    obj, nll, correct = chunked_cross_entropy(h, readout, labels, chunk=chunk,
                                              label_smoothing=s, z_loss=z)
    return jnp.sum(a * obj + c * nll), (obj, nll, correct)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(h, kernel, bias)


CASES = [  # (B, T, d, V, chunk, vocab_major, bias, scale, smoothing, z)
    (2, 13, 16, 37, 4, True, False, None, 0.0, 0.0),      # odd T: 4 tiles, the last padded
    (3, 7, 8, 50, 3, False, True, 0.5, 0.1, 1e-3),        # untied, bias, μP multiplier
    (1, 9, 12, 29, 16, True, True, None, 0.2, 1e-2),      # chunk > T: one tile
    (2, 6, 8, 31, 6, False, False, 0.25, 0.0, 1e-2),
]


@pytest.mark.parametrize("b, t, d, v, chunk, vocab_major, with_bias, scale, s, z", CASES)
def test_chunked_loss_matches_float64(b, t, d, v, chunk, vocab_major, with_bias, scale, s, z):
  h = rand((b, t, d), seed=1)
  kernel = rand((v, d) if vocab_major else (d, v), seed=2, scale=0.5)
  bias = rand((v,), seed=3) if with_bias else None
  rng = np.random.default_rng(4)
  labels = rng.integers(0, v, size=(b, t))
  a = rng.uniform(size=(b, t)).astype(np.float32)
  a[0] = 0.0                                         # a fully masked row: no gradient from it
  c = rng.uniform(size=(b, t)).astype(np.float32)
  c[0] = 0.0
  (dh, dk, db), (obj, nll, correct) = run(h, kernel, bias, labels, a, c,
                                          vocab_major=vocab_major, scale=scale, s=s, z=z,
                                          chunk=chunk)
  (w_obj, w_nll, w_correct), (w_dh, w_dk, w_db) = reference(
      h, kernel, bias, labels, a, c, vocab_major=vocab_major, scale=scale, s=s, z=z)
  # float32: a d-term dot, then a V-term log-sum-exp (and mean); the gradients add a V-term
  # (dh) or B*T-term (dW, db) sum of those
  tol = lambda n, want: LAMBDA * math.sqrt(n) * EPS32 * float(np.abs(want).max())
  for got, want in ((obj, w_obj), (nll, w_nll)):
    np.testing.assert_allclose(got, want, rtol=0, atol=tol(d + v, np.abs(w_obj) + 10))
  np.testing.assert_array_equal(correct, w_correct)
  np.testing.assert_allclose(dh, w_dh, rtol=0, atol=tol(d + 2 * v, w_dh) + 1e-7)
  np.testing.assert_allclose(dk, w_dk, rtol=0, atol=tol(d + v + b * t, w_dk) + 1e-7)
  assert np.all(np.asarray(dh)[0] == 0)              # the masked row
  if with_bias:
    np.testing.assert_allclose(db, w_db, rtol=0, atol=tol(d + v + b * t, w_db) + 1e-7)
  else:
    assert db is None


@pytest.mark.parametrize("vocab_major", [True, False])
def test_chunked_loss_in_bfloat16_matches_float64_of_the_rounded_inputs(vocab_major):
  """bf16 hidden states and kernel: the matmuls run in bf16 with float32 accumulation, the
  logits' gradient is rounded to bf16 before its two matmuls (as the dense bf16 path); dW
  accumulates in float32 over the tiles."""
  b, t, d, v = 2, 11, 16, 40
  h = jnp.asarray(rand((b, t, d), seed=5), jnp.bfloat16)
  kernel = jnp.asarray(rand((v, d) if vocab_major else (d, v), seed=6, scale=0.5),
                       jnp.bfloat16)
  labels = np.random.default_rng(7).integers(0, v, size=(b, t))
  a = np.ones((b, t), np.float32)
  c = np.zeros((b, t), np.float32)
  (dh, dk, _), (obj, nll, _) = run(h, kernel, None, labels, a, c, vocab_major=vocab_major,
                                   scale=None, s=0.1, z=1e-3, chunk=4)
  assert dh.dtype == jnp.bfloat16 and dk.dtype == jnp.bfloat16 and obj.dtype == jnp.float32
  (w_obj, w_nll, _), (w_dh, w_dk, _) = reference(
      np.asarray(h, np.float64), np.asarray(kernel, np.float64), None, labels, a, c,
      vocab_major=vocab_major, scale=None, s=0.1, z=1e-3)
  # float32 accumulation of exact bf16 products: the float32 bound; the outputs and the
  # rounded logit gradient cost a bf16 rounding each (relative 2^-8), summed over v or b*t
  np.testing.assert_allclose(obj, w_obj, rtol=0, atol=LAMBDA * math.sqrt(d + v) * EPS32
                             * np.abs(w_obj).max())
  np.testing.assert_allclose(nll, w_nll, rtol=0, atol=LAMBDA * math.sqrt(d + v) * EPS32
                             * np.abs(w_obj).max())
  bf16_tol = lambda n, want: LAMBDA * math.sqrt(n) * EPS_BF16 * float(np.abs(want).max())
  np.testing.assert_allclose(np.asarray(dh, np.float64), w_dh, rtol=0, atol=bf16_tol(v, w_dh))
  np.testing.assert_allclose(np.asarray(dk, np.float64), w_dk, rtol=0,
                             atol=bf16_tol(b * t, w_dk))


def test_chunked_loss_refuses_bad_shapes():
  h = jnp.zeros((2, 5, 8))
  with pytest.raises(ValueError, match="chunk=0"):
    chunked_cross_entropy(h, Readout(jnp.zeros((8, 11))), jnp.zeros((2, 5), int), chunk=0)
  with pytest.raises(ValueError, match="does not match hidden width 8"):
    chunked_cross_entropy(h, Readout(jnp.zeros((8, 11)), vocab_major=True),
                          jnp.zeros((2, 5), int))
