"""What agreeing on a stop costs per training step on several processes: JAX's preemption sync
point (what `jaxformer.parallel.preemption.StopRequest.reached` calls after every step) against
the two other ways to agree on a flag every step, an all-gather of a bool across processes and
a lookup in the coordination service's key-value store.

    python -m launch.local --num_processes=2 -- python -m experiments.bench_stop_agreement

Process 0 prints microseconds per call (median of 5 rounds) as a markdown table.
"""

from __future__ import annotations

import itertools
import statistics
import time

import numpy as np
from jax.experimental import multihost_utils

from jaxformer import parallel
from jaxformer.parallel.preemption import StopRequest


def per_call_us(fn, calls: int, rounds: int = 5) -> float:
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(calls):
      fn()
    times.append((time.perf_counter() - start) / calls * 1e6)
  return statistics.median(times)


def main():
  index, count = parallel.initialize()
  from jax._src import distributed          # the coordination service's key-value store
  client = distributed.global_state.client
  client.key_value_set(f"bench/stop/{index}", "0")
  steps = itertools.count(1)
  with StopRequest(0) as stop:
    rows = [("JAX preemption sync point (StopRequest.reached)",
             per_call_us(lambda: stop.reached(next(steps)), 100_000)),
            ("coordination service key lookup (key_value_try_get)",
             per_call_us(lambda: client.key_value_try_get(f"bench/stop/{index}"), 2_000)),
            ("all-gather of a bool (multihost_utils.process_allgather)",
             per_call_us(lambda: multihost_utils.process_allgather(np.bool_(False)), 200))]
  if index == 0:
    print(f"| agreement on a stop, {count} CPU processes | us per step |\n|---|---:|")
    for name, us in rows:
      print(f"| {name} | {us:,.1f} |")


if __name__ == "__main__":
  main()
