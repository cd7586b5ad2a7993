"""Finite-difference gradients of float64 NumPy reference functions."""

import numpy as np


def numeric_grad(f, x: np.ndarray, *, num: int = 12, eps: float = 1e-6, seed: int = 0):
  """Central differences of scalar f at `num` random coordinates of x.

  Returns (flat indices, gradient values) so a test can compare jax.grad at those entries.
  """
  x = np.asarray(x, np.float64)
  rng = np.random.default_rng(seed)
  idx = rng.choice(x.size, size=min(num, x.size), replace=False)
  grads = []
  for i in idx:
    xp, xm = x.copy().ravel(), x.copy().ravel()
    xp[i] += eps
    xm[i] -= eps
    grads.append((f(xp.reshape(x.shape)) - f(xm.reshape(x.shape))) / (2 * eps))
  return idx, np.asarray(grads)
