"""What the command lines print, and where: one policy for every entry point.

- **Third-party noise is off by default.** At the default verbosity the console shows
  jaxformer's own lines, its warnings and JAX's; other libraries' log records below ERROR
  (tensorflow-datasets' "Using custom data configuration", Orbax, grain, ...) are dropped,
  and TFDS's own prints and progress bars during a dataset preparation are hidden
  (`third_party_output`); jaxformer says what it does instead (`announce`). `--verbosity=N`
  (or `-v N`) turns the filter off and sets absl's level as usual (0: INFO, 1: DEBUG).
- **A multi-process job prints like one process.** Process 0 owns the console. Every other
  process writes everything it prints (progress, evaluations, samples, tracebacks, its log
  records at the chosen verbosity) to `<workdir>/logs/process_<i>.log`, and shows only log
  records of WARNING and above, user errors and uncaught exceptions on its console
  (`route_process_output`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
import time
import traceback
import warnings
from typing import TextIO

from jaxformer import paths, workdir_layout

# Where our own and JAX's records come from (others' are third-party at the default verbosity).
_OWN_PATHS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d)
                   + os.sep for d in ("jaxformer", "configs", "launch", "experiments"))
_SHOWN_PACKAGES = (f"{os.sep}jax{os.sep}", f"{os.sep}jaxlib{os.sep}")
_console: TextIO | None = None        # the real stderr of a process whose output is routed
SHUTDOWN_TEXT = "after interpreter shutdown"  # concurrent.futures' refusal once Python exits
DISK_FULL_TEXT = "No space left on device"       # strerror(ENOSPC), as wrappers quote it


def disk_full_path(error: BaseException) -> str | None:
  """The path (or 'a file') when `error` or an exception it came from is a full disk: an
  OSError ENOSPC, or a library's wrapper of one (TensorStore's RESOURCE_EXHAUSTED names
  errno 28 only in its message; the path is then the file it names); None otherwise."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
      return error.filename or "a file"
    if DISK_FULL_TEXT in str(error):
      named = re.search(r'"(/[^"]+)"', str(error))
      return named.group(1) if named else "a file"
    error = error.__cause__ or error.__context__
  return None


class ThirdPartyFilter(logging.Filter):
  """Drops records below ERROR that come from neither jaxformer nor JAX, and other libraries'
  reports of a full disk at any level (Orbax's writer threads log one per failed shard; the
  run reports the full disk itself, in one line), or of a background thread that outlived
  the run and met the interpreter's exit (an Orbax writer still retrying a failed save when
  the CLI exits after its one line)."""

  def filter(self, record: logging.LogRecord) -> bool:
    path = os.path.abspath(record.pathname)
    if path.startswith(_OWN_PATHS) or any(p in path for p in _SHOWN_PACKAGES):
      return True
    if record.levelno < logging.ERROR:
      return False
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, RuntimeError) and SHUTDOWN_TEXT in str(error):
      return False
    return DISK_FULL_TEXT not in record.getMessage() and disk_full_path(error) is None


def configure_logging(verbosity_given: bool) -> None:
  """The absl entry points' logging: WARNING without third-party records unless the user
  set --verbosity, whose level is then kept as given (absl sets it)."""
  from absl import logging as absl_logging
  if verbosity_given:
    return
  absl_logging.set_verbosity(absl_logging.WARNING)   # absl's own default would be INFO
  # asyncio only reports Orbax's and TensorStore's internal tasks ("Task exception was never
  # retrieved" for each shard write that failed with the one that the run reports itself)
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)
  # a failed asynchronous save (a full disk) leaves Orbax coroutines that were never awaited;
  # Python warns about each one at exit ("Enable tracemalloc ..."), after the run's one line
  warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                          category=RuntimeWarning)
  handler = absl_logging.get_absl_handler()
  if not any(isinstance(f, ThirdPartyFilter) for f in handler.filters):
    handler.addFilter(ThirdPartyFilter())


def verbose() -> bool:
  """Whether the user asked to see INFO records (then third-party output is shown too)."""
  return logging.getLogger().isEnabledFor(logging.INFO)


@contextlib.contextmanager
def third_party_output():
  """Around a library call that prints progress of its own (a TFDS dataset preparation): its
  stdout and absl warnings are hidden unless `verbose()`. Errors still propagate."""
  if verbose():
    yield
    return
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
      yield
  finally:
    absl_logger.setLevel(level)


class _Note:
  details = ""               # what `announce` appends to its line, set by the caller


@contextlib.contextmanager
def announce(what: str):
  """One line for first-time work the user waits for: `what ...` now, ` done in T` after
  (on the same line; on two when `verbose()`). The caller may add `note.details`."""
  note, lines = _Note(), verbose()      # verbose: other output comes in between
  print(f"{what} ...", end="\n" if lines else "", flush=True)
  start = time.perf_counter()
  try:
    yield note
  except BaseException:
    print(f"{what}: failed" if lines else " failed", flush=True)
    raise
  done = f"done in {time.perf_counter() - start:.1f} s" + (
      f" ({note.details})" if note.details else "")
  print(f"{what}: {done}" if lines else f" {done}", flush=True)


def short_path(path) -> str:
  """`path` with the home directory written as ~ (lines stay short)."""
  path, home = os.fspath(path), os.path.expanduser("~")
  if home not in ("", "/") and path.startswith(home + os.sep):
    return "~" + path[len(home):]
  return path


class _LazyFile:
  """A text stream that creates its file (and directory) at the first write, so a process
  that never prints leaves nothing behind; appends (after `header`), line-buffered."""

  def __init__(self, path: str, header: str = ""):
    self.path, self.header, self._file = path, header, None

  def _open(self) -> TextIO:
    if self._file is None:
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
      self._file = open(self.path, "a", buffering=1, encoding="utf-8")
      self._file.write(self.header)
    return self._file

  def write(self, text: str) -> int:
    return self._open().write(text)

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()

  def isatty(self) -> bool:
    return False

  def fileno(self) -> int:
    return self._open().fileno()


def log_path(workdir: str, process_index: int) -> str:
  """`<workdir>/logs/process_<i>.log` (for a remote workdir: in its local mirror, as a log is
  appended line by line, which object stores cannot do)."""
  logs = workdir_layout.LOGS
  return os.path.join(paths.local_mirror(os.path.join(workdir, logs), logs),
                      f"process_{process_index}.log")


def route_process_output(process_index: int, process_count: int, workdir: str) -> None:
  """Process 0 keeps the console; process i > 0 writes its output to its log file (see the
  module docstring). Call once, after the process index is known."""
  global _console
  if process_index == 0 or _console is not None:
    return
  log = _LazyFile(log_path(workdir, process_index),
                  header=f"=== process {process_index} of {process_count}, pid {os.getpid()}, "
                         f"started {time.strftime('%Y-%m-%d %H:%M:%S')} (process 0 prints the "
                         "run's progress) ===\n")
  _console = sys.stderr
  sys.stdout = sys.stderr = log
  from absl import logging as absl_logging
  absl_handler = absl_logging.get_absl_handler()
  # absl's handler keeps the stream it was made with (the console): every record goes to the
  # log instead, the console handler below shows warnings and errors once
  absl_handler.python_handler.stream = log
  console_handler = logging.StreamHandler(_console)       # warnings and errors: the console
  console_handler.setLevel(logging.WARNING)
  console_handler.setFormatter(absl_logging.PythonFormatter())
  for f in absl_handler.filters:
    console_handler.addFilter(f)
  logging.getLogger().addHandler(console_handler)
  sys.excepthook = _excepthook


def _excepthook(kind, value, tb) -> None:
  """An uncaught exception of a routed process: in its log file and on its console."""
  text = "".join(traceback.format_exception(kind, value, tb))
  sys.stderr.write(text)
  sys.stderr.flush()
  if _console is not None:
    _console.write(text)
    _console.flush()


def error(line: str) -> None:
  """A user error line: on stderr, and on the console too when stderr is routed to a file."""
  print(line, file=sys.stderr, flush=True)
  if _console is not None and sys.stderr is not _console:
    print(line, file=_console, flush=True)
