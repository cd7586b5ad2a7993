"""Stop requests every process agrees on: SIGTERM or SIGINT to any one process stops every
process after the same step, so together they save one consistent checkpoint.

Why: a flag set only in the process that got the signal lets it save step k while the others
run step k+1 and wait forever in its collectives.

    with StopRequest(start) as stop:          # start: the step the run resumed from
      for done in range(start + 1, steps + 1):
        ...                                   # step `done`
        if stop.reached(done):                # the same answer on every process
          save(done); break

One process: a Python handler sets a flag, read after each step.
Several processes: JAX's preemption sync point. The preemption service that
`jax.distributed.initialize` starts catches SIGTERM itself (a C++ handler, so no Python
handler may replace it; SIGINT is handed to it as a SIGTERM), publishes the notice through the
coordination service, and the services of all processes agree, on their own threads, on the
step after the furthest process's current one; `reached_preemption_sync_point` is True at that
step everywhere. No process waits on another's next collective, and a step pays one mutex
(no collective, no RPC; NOTES.md has the measured cost). Steps are counted from `start`, the
same on every process, so a signal during start-up stops them all after their first step.
"""

from __future__ import annotations

import logging
import signal

import jax
from jax.experimental import multihost_utils


class StopRequest:
  """While entered, SIGTERM/SIGINT ask the run to stop; `reached(done)` says whether to stop
  after step `done` (checked after every step)."""

  def __init__(self, start: int):
    self._start = start
    self._agreed = jax.process_count() > 1     # the processes must agree on the step
    self._requested = False
    self._previous = {}

  def __enter__(self):
    if self._agreed:
      _check_preemption_service()
    # several processes: SIGTERM stays with JAX's preemption service
    for sig in (signal.SIGINT,) if self._agreed else (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    logging.warning("signal %d: saving a checkpoint and stopping", signum)
    if self._agreed:
      signal.raise_signal(signal.SIGTERM)      # to JAX's handler: every process stops
    else:
      self._requested = True

  def reached(self, done: int) -> bool:
    if not self._agreed:
      return self._requested
    if not multihost_utils.reached_preemption_sync_point(done - self._start):
      return False
    logging.warning("a stop signal reached a process of the job: every process stops after "
                    "step %d and saves it", done)
    return True

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _check_preemption_service():
  """JAX keeps the service in a private module: where a newer JAX moved it, nothing is
  checked (reached_preemption_sync_point then raises JAX's own error)."""
  from jax._src import distributed as jax_distributed
  state = getattr(jax_distributed, "global_state", None)
  if state is not None and getattr(state, "preemption_sync_manager", "") is None:
    raise ValueError("a multi-process run needs JAX's preemption service to stop every "
                     "process at the same step; unset JAX_ENABLE_PREEMPTION_SERVICE (or set "
                     "jax_enable_preemption_service=True) before jax.distributed.initialize")
