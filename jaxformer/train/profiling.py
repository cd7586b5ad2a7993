"""Profile a few chosen training steps with the JAX profiler (`train.profile_steps`).

Tracing every step would be huge and slow, and the first steps are dominated by compilation,
so the loop traces a short run of consecutive steps chosen in the config, e.g. "10-12". The
trace lands in `<workdir>/profile` (`plugins/profile/<run>/<host>.xplane.pb`), which
TensorBoard's profile plugin, XProf and Perfetto read.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import jax

from jaxformer import paths, workdir_layout

FIELD = "train.profile_steps"


def parse_profile_steps(spec: Sequence[int] | str | None) -> tuple[int, ...]:
  """Consecutive step numbers from [10, 11, 12], "10-12", "10,11,12", "10"; () for none."""
  if spec is None or (isinstance(spec, str) and not spec.strip()):
    return ()
  try:
    if isinstance(spec, str):
      if "-" in spec:
        first, last = (int(part) for part in spec.split("-"))
        steps = tuple(range(first, last + 1))
      else:
        steps = tuple(int(part) for part in spec.split(","))
    else:
      steps = tuple(_as_int(s) for s in spec)
  except (TypeError, ValueError):
    raise ValueError(f"{FIELD}={spec!r}: expected a list of steps or a string like "
                     "'10-12' or '10,11,12'") from None
  if not steps:
    raise ValueError(f"{FIELD}={spec!r} names no step (a range 'a-b' needs a <= b); use e.g. "
                     "'10-12', or leave it empty")
  if steps[0] < 0 or steps != tuple(range(steps[0], steps[0] + len(steps))):
    raise ValueError(f"{FIELD}={spec!r}: steps must be non-negative, increasing and "
                     "consecutive (one trace), e.g. '10-12'")
  return steps


def _as_int(value) -> int:
  if isinstance(value, bool) or int(value) != value:
    raise ValueError(value)
  return int(value)


class StepProfiler:
  """Starts a trace before the first chosen step and stops it after the last one.

  The loop calls `before(step)` ahead of each train step and `after(step, outputs)` once it
  has the step's outputs; `after` blocks on them before stopping so the trace holds the
  device work. A run resumed inside the range traces the remaining steps; `close()` stops a
  trace the run did not finish (preemption).
  """

  def __init__(self, workdir: str | os.PathLike, steps: Sequence[int] | str | None):
    self.steps = parse_profile_steps(steps)
    self.target = os.path.join(os.fspath(workdir), workdir_layout.PROFILE)
    self.trace_dir = paths.local_mirror(self.target, workdir_layout.PROFILE)   # jax traces locally
    self.active = False
    self._done = False

  def before(self, step: int) -> None:
    if not self.active and not self._done and step in self.steps:
      os.makedirs(self.trace_dir, exist_ok=True)
      jax.profiler.start_trace(self.trace_dir)
      self.active = True
      logging.info("profiling steps %d-%d into %s", step, self.steps[-1], self.trace_dir)

  def after(self, step: int, outputs=None) -> None:
    if self.active and step >= self.steps[-1]:
      jax.block_until_ready(outputs)
      self._stop()

  def close(self) -> None:
    if self.active:
      self._stop()

  def __enter__(self) -> StepProfiler:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _stop(self) -> None:
    jax.profiler.stop_trace()
    self.active, self._done = False, True
    paths.upload(self.trace_dir, self.target)
    logging.info("profile written to %s", self.target)
