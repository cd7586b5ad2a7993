"""The driver's child trainings: how a point's train command is started (its log, its own
session, its XLA threads) and how a stop signal to the driver reaches every running training
(`Stop`), ending the sweep with `Interrupted`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

# (train command, log path) -> exit status; a stop signal reaches `subprocess_runner`'s only.
Runner = Callable[[Sequence[str], str], int]


def limit_xla_threads(threads: int) -> None:
  """Give every point started from now on `threads` XLA:CPU threads (through XLA_FLAGS, which
  the subprocesses inherit): on a small CPU, several single-threaded points at once train
  faster in total than one multi-threaded point (measured 1.2-1.3x on 2 cores)."""
  if threads < 1:
    raise ValueError(f"threads={threads} must be >= 1")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_cpu_multi_thread_eigen=false "
                             f"intra_op_parallelism_threads={threads}").strip()


class NotStarted(Exception):
  """A point's training was not started: the sweep is stopping."""


class Interrupted(SystemExit):
  """The sweep was stopped by SIGINT, SIGTERM or SIGHUP, after its trainings exited. A
  SystemExit with the shell's code for the signal (128 + signal: 130 for Ctrl-C, 143 for
  SIGTERM, 129 for SIGHUP), so an uncaught one ends the program with that code and no
  traceback; `rows` are the selected points' summary rows."""

  def __init__(self, signum: int, rows: list[dict[str, Any]]):
    super().__init__(128 + signum)
    self.signum, self.rows = signum, rows


def _say(line: str):
  """Print from a signal handler: never let a closed terminal or an interrupted print of the
  main thread turn the stop into a crash that would orphan the trainings."""
  try:
    print(line, flush=True)
  except (OSError, RuntimeError):
    pass


class Stop:
  """A running sweep's trainings and its stop request.

  Each training runs in its own session, so a terminal's Ctrl-C (sent to the foreground
  process group) reaches the driver only, and the driver decides what each training gets:
  the first SIGINT/SIGTERM is forwarded once to every running training (SIGHUP, the terminal
  going away, as SIGTERM: train saves on SIGTERM/SIGINT), no new point starts, and the driver
  waits for them; a second signal kills their process groups (each resumes from its last
  complete checkpoint).
  """

  def __init__(self):
    self.signum: int | None = None
    self.event = threading.Event()           # set at the first signal: wakes waiting points
    self._lock = threading.Lock()            # taken by pool threads and the handler only
    self._children: set[subprocess.Popen] = set()

  def spawn(self, command: Sequence[str], log) -> subprocess.Popen:
    with self._lock:
      if self.signum is not None:
        raise NotStarted
      proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
      self._children.add(proc)
    return proc

  def wait(self, proc: subprocess.Popen) -> int:
    try:
      return proc.wait()
    finally:
      with self._lock:
        self._children.discard(proc)

  def handle(self, signum: int, frame=None):
    del frame
    with self._lock:
      first = self.signum is None
      if first:
        self.signum = signum
      children = [p for p in self._children if p.poll() is None]
      for proc in children:
        try:
          if first:
            proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)
          else:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:           # exited meanwhile
          pass
    self.event.set()
    name = signal.Signals(signum).name
    if first:
      _say(f"[sweep] {name}: stopping: {len(children)} running training(s) told to save a "
           f"checkpoint and exit, no new point starts ({name} again kills them)")
    else:
      _say(f"[sweep] {name} again: killing {len(children)} training(s); each resumes from "
           "its last complete checkpoint")

  @contextlib.contextmanager
  def active(self):
    """While the sweep runs: `subprocess_runner` starts its trainings through this stop, and
    SIGINT/SIGTERM/SIGHUP are handled (main thread only; a signal the process ignores, e.g.
    SIGHUP under nohup, stays ignored)."""
    global _active
    _active = self
    previous = {}
    try:
      if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
          if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, self.handle)
      yield self
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)
      _active = None


_active: Stop | None = None     # the running sweep's (signals are process-wide)


def subprocess_runner(command: Sequence[str], log_path: str) -> int:
  """Run `command`, stdout and stderr appended to `log_path`; returns the exit status. Under
  `run`, the training runs in its own session and the sweep's stop signal reaches it (see
  `Stop`)."""
  stop = _active
  with open(log_path, "a") as log:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    if stop is None:
      return subprocess.run(list(command), stdout=log, stderr=subprocess.STDOUT,
                            check=False).returncode
    return stop.wait(stop.spawn(command, log))
