"""A per-process watchdog: no process of a run waits forever, and a dead peer stops the job.

Why: a multi-process job stops as a whole only when every process returns to Python. A process
blocked in a collective whose peer was stopped (SIGSTOP, a hung host) or killed (OOM, node
loss), or in a write that never returns, waits forever and its launcher with it. The run marks
its progress (`beat(phase, step)`: a data read, a train step, an evaluation batch, a checkpoint)
and a daemon thread checks, off the main thread, two things:

- **a stall**: no progress for `timeout` seconds (`train.stall_timeout`; the first call of each
  jitted step compiles, so a phase marked `compiling=True` gets `COMPILE_ALLOWANCE` times
  more). It prints one line naming the phase, step and process, then every thread's Python
  stack (faulthandler), and exits with `EXIT_RESUMABLE`;
- **a dead peer** (several processes): a process of the same host that is gone (its pid,
  polled every `poll_s` seconds; see `_Peers` for other hosts) or a coordinator that cannot
  be reached prints one line naming it and exits with `EXIT_RESUMABLE` at once, before JAX's
  own handling (an abort after its heartbeat timeout) prints a hundred lines of C++ stack.

Both exits are `os._exit`: the main thread may be inside XLA, where no Python exception
reaches it. The launcher (`launch.local`, `srun --kill-on-bad-exit`, `launch.tpu`) then stops
the others; nothing written is lost (Orbax commits a checkpoint by renaming a finished
directory, metrics.jsonl is truncated to the checkpoint on resume), so a rerun resumes.
Exit codes are distinct from a user mistake's 2: 75 is EX_TEMPFAIL ("try again").
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import sys
import threading
import time

import jax

from jaxformer.parallel import distributed

EXIT_RESUMABLE = 75            # EX_TEMPFAIL: the job stopped, a rerun resumes it
COMPILE_ALLOWANCE = 5           # a phase that compiles may take this many timeouts
DEFAULT_POLL_S = 2.0

_active: Watchdog | None = None


def beat(phase: str, step: int, *, compiling: bool = False) -> None:
  """Mark progress of the running watchdog (if any): `phase` started at `step`."""
  if _active is not None:
    _active.beat(phase, step, compiling=compiling)


def _pid_gone(pid: int) -> bool:
  """A process of this host that no longer runs (gone, or a zombie its parent has not reaped)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
  except FileNotFoundError:
    return True
  except OSError:
    return False


def peer_lost(error: BaseException) -> None:
  """A collective failed on the main thread (several processes): exit naming the process that
  stopped (`Watchdog.peer_lost`); returns where no watchdog runs, for the caller to re-raise."""
  if _active is not None and _active.count > 1:
    _active.peer_lost(error)


class _Peers:
  """Which processes of the job are gone: those on this host by their pid (at once, every
  poll). Each process registers its host and pid in the coordination service's key-value
  store. A peer on another host is not polled (the service's own check is a barrier, and
  polling every peer from every host is quadratic): its death ends the collective that waits
  for it (Gloo: at once; `peer_lost` then names what it can) or, failing that, the stall
  watchdog or JAX's heartbeat check (`heartbeat_timeout_seconds`) ends the process."""

  def __init__(self, index: int, count: int):
    self.index, self.count, self.local = index, count, {}
    self.client = distributed.coordination_client() if count > 1 else None
    if self.client is not None:
      self.client.key_value_set(f"jaxformer/process/{index}",
                                f"{socket.gethostname()} {os.getpid()}", allow_overwrite=True)

  def _learn(self) -> None:
    for i in set(range(self.count)) - {self.index} - set(self.local):
      try:
        host, pid = self.client.key_value_try_get(f"jaxformer/process/{i}").split()
      except Exception:  # noqa: BLE001  (not registered yet)
        continue
      self.local[i] = int(pid) if host == socket.gethostname() else None

  def gone(self) -> list[int]:
    """The processes of this host known to be gone; raises if the coordination service (on
    process 0) cannot be reached."""
    if self.client is None:
      return []
    self._learn()
    return sorted(i for i, pid in self.local.items() if pid is not None and _pid_gone(pid))


class Watchdog:
  """While entered, stops this process when the run stalls or a peer dies (module docstring).
  `timeout` <= 0 turns the stall check off (the dead-peer check stays)."""

  def __init__(self, timeout: float, *, resume_hint: str = "", poll_s: float = DEFAULT_POLL_S,
               out=None):
    self.timeout = float(timeout)
    self.resume_hint = resume_hint
    self.poll_s = poll_s
    self.out = out
    self.index, self.count = jax.process_index(), jax.process_count()
    # not armed until the first beat: set-up (a dataset's preparation) may take hours
    self._phase, self._step, self._allowance = "set-up", 0, float("inf")
    self._last = time.monotonic()
    self._stop = threading.Event()
    self._peers = _Peers(self.index, self.count)
    self._thread = threading.Thread(target=self._watch, name="jaxformer-watchdog", daemon=True)

  def beat(self, phase: str, step: int, *, compiling: bool = False) -> None:
    self._phase, self._step = phase, step
    self._allowance = self.timeout * (COMPILE_ALLOWANCE if compiling else 1)
    self._last = time.monotonic()

  def __enter__(self) -> Watchdog:
    global _active
    self._last = time.monotonic()
    self._thread.start()
    _active = self
    return self

  def __exit__(self, *exc) -> None:
    global _active
    _active = None
    self._stop.set()
    self._thread.join(timeout=5)

  def _where(self) -> str:
    who = f"process {self.index} of {self.count}" if self.count > 1 else "the run"
    return f"{who}, in {self._phase} at step {self._step}"

  def _watch(self) -> None:
    interval = min(self.poll_s, self.timeout / 4) if self.timeout > 0 else self.poll_s
    while not self._stop.wait(interval):
      waited = time.monotonic() - self._last
      if self.timeout > 0 and waited > self._allowance:
        self._exit(EXIT_RESUMABLE,
                   f"no progress for {waited:.0f} s ({self._where()}; train.stall_timeout="
                   f"{self.timeout:g} s); stopping this process so the job stops{self.resume_hint}"
                   "; the stacks of its threads follow", stacks=True)
      if self.count > 1:
        self._check_peers()

  def _check_peers(self) -> None:
    try:
      dead = self._peers.gone()
    except Exception as e:  # noqa: BLE001  (the coordinator itself is gone)
      if self.index != 0 and not self._stop.is_set():
        self._exit(EXIT_RESUMABLE,
                   f"process 0 (the job's coordinator) stopped or cannot be reached "
                   f"({type(e).__name__}); {self._where()} stops too{self.resume_hint}")
      return
    if dead and not self._stop.is_set():
      self._exit(EXIT_RESUMABLE, self._lost_message(dead))

  def _lost_message(self, dead: list[int]) -> str:
    names = ", ".join(map(str, dead))
    return (f"process{'es' if len(dead) > 1 else ''} {names} of the job stopped (died or was "
            f"killed); {self._where()} stops too{self.resume_hint}")

  def peer_lost(self, error: BaseException, wait_s: float = 10.0) -> None:
    """Called by the main thread with a failed collective's error: exit naming the process
    that stopped (waiting up to `wait_s` for it to show as gone), or naming the error."""
    deadline = time.monotonic() + wait_s
    while True:
      try:
        dead = self._peers.gone()
      except Exception:  # noqa: BLE001
        dead = [0]
      if dead or time.monotonic() > deadline:
        break
      time.sleep(0.2)
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    self._exit(EXIT_RESUMABLE, self._lost_message(dead) if dead else
               f"a collective failed ({first}); {self._where()} stops{self.resume_hint}")

  def _exit(self, code: int, message: str, *, stacks: bool = False) -> None:
    out = self.out or sys.stderr
    try:
      print(f"error: {message}", file=out, flush=True)
      if stacks:
        faulthandler.dump_traceback(file=out, all_threads=True)
      out.flush()
    except Exception:  # noqa: BLE001  (a closed stream must not keep the process alive)
      logging.exception("watchdog: could not report")
    os._exit(code)
