"""Float64 NumPy references shared by the layer and position tests."""

import math

import numpy as np
from scipy.special import erf


def rope_np(x, positions, theta=10_000.0):
  """Rotate-half RoPE in float64: feature i (< D/2) is rotated together with i + D/2."""
  x = np.asarray(x, np.float64)
  positions = np.asarray(positions, np.float64)
  if positions.ndim == 1:
    positions = positions[None]
  d = x.shape[-1]
  half = d // 2
  inv_freq = np.array([theta ** (-2.0 * i / d) for i in range(half)])
  angles = positions[:, :, None, None] * inv_freq            # [B, T, 1, D/2]
  x1, x2 = x[..., :half], x[..., half:]
  return np.concatenate([x1 * np.cos(angles) - x2 * np.sin(angles),
                         x2 * np.cos(angles) + x1 * np.sin(angles)], axis=-1)


def layernorm_np(p, x, eps=1e-5, use_bias=True):
  x = np.asarray(x, np.float64)
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  y = (x - mean) / np.sqrt(var + eps) * p["scale"]
  return y + p["bias"] if use_bias else y


def rmsnorm_np(p, x, eps=1e-6):
  x = np.asarray(x, np.float64)
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * p["scale"]


ACT_NP = {
    "relu": lambda h: np.maximum(h, 0.0),
    "gelu": lambda h: 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3))),
    "gelu_exact": lambda h: 0.5 * h * (1 + erf(h / math.sqrt(2))),
    "silu": lambda h: h / (1 + np.exp(-h)),
}
