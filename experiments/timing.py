"""The one timing helper of the benchmarks: median wall time of a JAX call, after a warm-up
call that compiles (the median is robust to the occasional slow repeat on a shared CPU)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax


def median_seconds(fn: Callable[..., Any], *args, repeats: int = 5, warmup: bool = True
                   ) -> float:
  """Median seconds of `fn(*args)` (waited for with block_until_ready) over `repeats` calls."""
  if warmup:
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)
