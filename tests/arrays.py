"""Seeded random float32 inputs shared by the layer tests, and the float32 error bounds the
numerical tests compare with: a tolerance follows from the computation (its reductions'
lengths, its magnitudes, its optimizer), never from one machine's output, so the suite passes
on any x86 CPU (vector width, FMA or not, BLAS kernels) and on any sharding of the sums."""

import math

import jax
import numpy as np

# float32's relative spacing, 2^-23: one rounding errs by at most EPS32/2 of its result.
EPS32 = float(np.finfo(np.float32).eps)
# Width of the probabilistic bound below: it fails with probability <= 2 n exp(-LAMBDA^2 / 2)
# = 2.5e-14 n per result (n: the reduction's length).
LAMBDA = 8.0


def rand(shape, seed=0, scale=1.0):
  """float32 N(0, scale^2) values of `shape`, the same for the same seed."""
  return (scale * np.random.default_rng(seed).normal(size=shape)).astype(np.float32)


def sum_tol(length: int, scale: float = 1.0) -> float:
  """Bound on |a - b| for two float32 evaluations of one sum (or dot product) of `length`
  terms whose magnitudes add up to `scale`, in any order: another vector width, FMA or
  separate multiply and add, partial sums per shard then an all-reduce, a blocked kernel.

  Rounding errors as independent zero-mean variables (Higham & Mary, SIAM J. Sci. Comput.
  41(5), 2019): each evaluation is within LAMBDA sqrt(n) (EPS32 / 2) scale of the exact sum
  with probability >= 1 - 2 n exp(-LAMBDA^2 / 2), so two differ by at most
  LAMBDA sqrt(n) EPS32 scale. (The worst case, n EPS32 scale, is never approached: errors
  cancel.) For a chain of reductions (a network: its contractions n1, n2, ... over
  layer-normed activations, then a loss's mean over tokens) the errors add in quadrature:
  sum_tol(n1 + n2 + ...). A relative tolerance of a sum of same-sign terms (a mean loss, a
  norm): sum_tol(n)."""
  return LAMBDA * math.sqrt(length) * EPS32 * scale


def assert_close_f32(got, want, length: int):
  """Every leaf of `got` equals `want`'s to sum_tol(length, scale), scale the leaf's largest
  magnitude in `want`: two float32 computations of the same values whose longest chain of
  reductions sums `length` terms (sum_tol's note), e.g. sharded and on one device."""
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    w = np.asarray(w)
    np.testing.assert_allclose(np.asarray(g), w, rtol=0,
                               atol=sum_tol(length, float(np.abs(w).max(initial=0.0))),
                               err_msg=jax.tree_util.keystr(path))


def adam_tol(steps: int, lr: float, eps: float, grad_length: int,
             grad_scale: float = 1.0) -> float:
  """Bound on a parameter's difference after `steps` Adam(W) steps at learning rate `lr` and
  epsilon `eps` of two runs whose gradients differ only by float32 rounding (a mesh against
  one device, another CPU): each gradient coordinate sums `grad_length` terms (the batch's
  tokens) whose magnitudes add up to <= `grad_scale`, so the runs' gradients differ by
  d <= sum_tol(grad_length, grad_scale).

  A step moves a coordinate by lr m/(sqrt(v) + eps) (bias-corrected moments); its derivative
  in any of the step's gradients is at most 2 lr / (sqrt(v) + eps) <= 2 lr / eps, largest
  where the exact gradient is ~0 and the step is made of rounding noise. So each step adds at
  most 2 lr d / eps, and never more than a step itself, lr: the bound is
  steps * lr * min(1, 2 d / eps). It is useful only with eps well above d: the training
  tests use eps = 1e-3 (`tests/sharded_gpt.constant_lr`); at eps = 1e-8 it is steps * lr,
  everything training moved. (The weight decay and the clip scale are the same elementwise
  or global factors in both runs; the rounding of the parameter's own update is relative:
  `assert_trained_close`'s rtol.)"""
  return steps * lr * min(1.0, 2 * sum_tol(grad_length, grad_scale) / eps)


def assert_trained_close(got, want, *, steps: int, lr: float, eps: float, grad_length: int,
                         grad_scale: float = 1.0):
  """Two parameter trees after the same `steps` Adam steps agree to `adam_tol` (absolute) and
  steps * EPS32 (relative: each step rounds the parameter once in each run)."""
  atol = adam_tol(steps, lr, eps, grad_length, grad_scale)
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol, rtol=steps * EPS32,
                               err_msg=jax.tree_util.keystr(path))
