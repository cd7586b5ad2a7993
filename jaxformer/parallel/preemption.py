"""Stop requests every process agrees on: SIGTERM or SIGINT to any one process stops every
process after the same step, so together they save one consistent checkpoint; a second signal
to a process ends it at once.

Why: a flag set only in the process that got the signal lets it save step k while the others
run step k+1 and wait forever in its collectives.

    with StopRequest(start) as stop:          # start: the step the run resumed from
      for done in range(start + 1, steps + 1):
        ...                                   # step `done`
        if stop.reached(done):                # the same answer on every process
          save(done); break

Signals are seen off the main thread: Python runs a signal handler only when the main thread
returns to the interpreter, which a process blocked inside XLA (a collective whose peer is
gone) never does. The handlers installed here do nothing themselves; the C-level trampoline
writes each signal's number to a wakeup socket (`signal.set_wakeup_fd`) and a daemon thread
reads it. The first signal asks for the agreed stop; the second prints one line and exits
with 128 + the signal's number (a checkpoint being written is left uncommitted, so the rerun
resumes from the last complete one).

One process: the first signal sets a flag, read after each step.
Several processes: JAX's preemption sync point. The preemption service that
`jax.distributed.initialize` starts installs a C++ SIGTERM handler that only records the
signal (later ones are ignored); its own thread publishes the notice through the coordination
service, and the services of all processes agree on the step after the furthest process's
current one; `reached_preemption_sync_point` is True at that step everywhere. No process waits
on another's next collective, and a step pays one mutex. Here the reading thread forwards the
first signal to that C++ handler (read with `sigaction` before ours replaces it), so both
the agreed stop and the second-signal exit work. Where the handler cannot be read (not Linux,
or an SA_SIGINFO handler), SIGTERM stays with JAX alone and SIGINT is re-raised as SIGTERM.
Steps are counted from `start`, the same on every process, so a signal during start-up stops
them all after their first step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import signal
import socket
import sys
import threading

import jax
from jax.experimental import multihost_utils

_SA_SIGINFO = 4
_WAKE_TO_END = 0                    # not a signal number: ends the reading thread
_SIGACTION_BYTES = 512              # >= sizeof(struct sigaction) on every Linux ABI


def _libc():
  return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _c_handler(signum: int):
  """(the C function currently handling `signum`, its saved `struct sigaction`) where that is
  a plain `void(int)` handler on Linux; None otherwise."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    saved = ctypes.create_string_buffer(_SIGACTION_BYTES)
    if _libc().sigaction(signum, None, saved) != 0:
      return None
  except (OSError, AttributeError):
    return None
  address = ctypes.c_void_p.from_buffer(saved).value
  # glibc's struct sigaction: handler, sigset_t (1024 bits), int sa_flags
  flags = ctypes.c_int.from_buffer(saved, ctypes.sizeof(ctypes.c_void_p) + 128).value
  if not address or address in (int(signal.SIG_DFL), int(signal.SIG_IGN)) or flags & _SA_SIGINFO:
    return None
  return ctypes.CFUNCTYPE(None, ctypes.c_int)(address), saved


class StopRequest:
  """While entered, SIGTERM/SIGINT ask the run to stop; `reached(done)` says whether to stop
  after step `done` (checked after every step); a second signal exits at once."""

  def __init__(self, start: int, *, out=None):
    self._start = start
    self._agreed = jax.process_count() > 1     # the processes must agree on the step
    self._requested = False
    self._signals = 0
    self._out = out
    self._previous = {}
    self._wakeup = None
    self._jax_sigterm = None

  def __enter__(self):
    if self._agreed:
      _check_preemption_service()
      self._jax_sigterm = _c_handler(signal.SIGTERM)
    # several processes, JAX's handler unreadable: SIGTERM stays with it
    keep_jax = self._agreed and self._jax_sigterm is None
    ours = (signal.SIGINT,) if keep_jax else (signal.SIGTERM, signal.SIGINT)
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    try:
      previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:           # not the main thread: signals stay with whoever has them
      reader.close(), writer.close()
      return self
    self._wakeup = (reader, writer, previous_fd)
    handler = self._to_jax if keep_jax else self._ignore if self._agreed else self._request
    for sig in ours:
      self._previous[sig] = signal.signal(sig, handler)
    self._reader = threading.Thread(target=self._read_signals, name="jaxformer-signals",
                                    daemon=True)
    self._reader.start()
    return self

  @staticmethod
  def _ignore(signum, frame):
    """The work happens on the reading thread (module docstring)."""

  def _request(self, signum, frame):
    """One process: also set here, so the step after the signal sees it (the reading thread
    sets it too, for a main thread that does not return to Python)."""
    self._requested = True

  @staticmethod
  def _to_jax(signum, frame):
    signal.raise_signal(signal.SIGTERM)      # JAX's own handler: every process stops

  def _read_signals(self):
    reader = self._wakeup[0]
    while True:
      try:
        select.select([reader], [], [])
        data = reader.recv(64)
      except (OSError, ValueError):          # closed by __exit__
        return
      if not data:
        return
      for signum in data:
        if signum == _WAKE_TO_END:
          return
        self._on_signal(signum)

  def _on_signal(self, signum: int):
    if signum not in (signal.SIGTERM, signal.SIGINT):
      return
    self._signals += 1
    if self._signals >= 2:
      out = self._out or sys.stderr
      print(f"error: a second stop signal ({signal.Signals(signum).name}): exiting now without "
            "saving; a rerun resumes from the last complete checkpoint", file=out, flush=True)
      os._exit(128 + signum)
    logging.info("signal %d: stopping after this step", signum)
    print(f"{signal.Signals(signum).name}: stopping after this step and saving a checkpoint; "
          "send it again to exit at once", file=self._out or sys.stderr, flush=True)
    if self._agreed and self._jax_sigterm is not None:
      self._jax_sigterm[0](signal.SIGTERM)     # JAX's preemption notice: every process stops
    elif not self._agreed:
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
      if sig == signal.SIGTERM and self._jax_sigterm is not None:   # JAX's C++ handler back
        signal.signal(sig, signal.SIG_DFL)
        _libc().sigaction(sig, self._jax_sigterm[1], None)
      else:
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if self._wakeup is not None:
      reader, writer, previous_fd = self._wakeup
      signal.set_wakeup_fd(previous_fd)
      writer.send(bytes([_WAKE_TO_END]))     # no thread of ours outlives the run
      self._reader.join(timeout=5)
      writer.close()
      reader.close()
      self._wakeup = None


def _check_preemption_service():
  """JAX keeps the service in a private module: where a newer JAX moved it, nothing is
  checked (reached_preemption_sync_point then raises JAX's own error)."""
  from jax._src import distributed as jax_distributed
  state = getattr(jax_distributed, "global_state", None)
  if state is not None and getattr(state, "preemption_sync_manager", "") is None:
    raise ValueError("a multi-process run needs JAX's preemption service to stop every "
                     "process at the same step; unset JAX_ENABLE_PREEMPTION_SERVICE (or set "
                     "jax_enable_preemption_service=True) before jax.distributed.initialize")
