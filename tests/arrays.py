"""Seeded random float32 inputs shared by the layer tests."""

import numpy as np


def rand(shape, seed=0, scale=1.0):
  """float32 N(0, scale^2) values of `shape`, the same for the same seed."""
  return (scale * np.random.default_rng(seed).normal(size=shape)).astype(np.float32)
