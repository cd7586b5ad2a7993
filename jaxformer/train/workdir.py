"""The run directory: checked before any work, owned by one training at a time, cleared by
--fresh.

The lock is an advisory `flock` on `<workdir>/.lock`, held for the life of the training
process: the kernel releases it when the process exits in any way (a crash or a SIGKILL
included), so a lock left by a dead process is never in the way and needs no clean-up. It is
local to one machine's view of the file system (on NFS, flock works where the server supports
it); a multi-host job takes it on process 0 only.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import shutil
import socket
import tempfile

LOCK_NAME = ".lock"
# What a training run writes (all of it goes on --fresh; the lock file stays).
RUN_FILES = ("checkpoints", "best", "metrics.jsonl", "samples.txt", "curves.png", "attention",
             "profile", "config.json", "tokenizer.json")
_TB_PREFIX = "events.out.tfevents"


def check_usable(workdir: str) -> None:
  """Create `workdir` if needed and prove it is writable, before any work: a file in the way,
  a read-only or pseudo file system (/proc) and missing permissions are named here."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir!r} is a file, not a directory; pick another path")
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise ValueError(f"--workdir={workdir!r} is not a writable directory ({e.strerror}); "
                     "pick a path you can write to") from e


class Lock:
  """Exclusive ownership of a workdir (see the module docstring)."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_NAME)
    self._file = None

  def __enter__(self) -> "Lock":
    f = open(self.path, "a+")
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      f.seek(0)
      owner = f.read().strip() or "another process"
      f.close()
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        raise
      raise ValueError(f"--workdir={os.path.dirname(self.path)!r} is in use by another "
                       f"training ({owner}); wait for it to finish, or use another "
                       "--workdir") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
            f"{datetime.datetime.now().isoformat(timespec='seconds')}\n")
    f.flush()
    self._file = f
    return self

  def __exit__(self, *exc) -> None:
    if self._file is not None:
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None


def clear(workdir: str) -> list[str]:
  """--fresh: remove the previous run's artifacts (explicitly asked for); returns their names."""
  removed = []
  for name in sorted(os.listdir(workdir)):
    if name in RUN_FILES or name.startswith(_TB_PREFIX) or name.endswith(".tmp"):
      path = os.path.join(workdir, name)
      if os.path.isdir(path):
        shutil.rmtree(path)
      else:
        os.remove(path)
      removed.append(name)
  return removed
