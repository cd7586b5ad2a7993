"""The run directory: checked before any work, owned by one training at a time, cleared by
--fresh.

The lock is an advisory `flock` on `<workdir>/.lock`, held for the life of the training
process: the kernel releases it when the process exits in any way (a crash or a SIGKILL
included), so a lock left by a dead process is never in the way and needs no clean-up. It is
local to one machine's view of the file system (on NFS, flock works where the server supports
it); a multi-host job takes it on process 0 only. `holder` tells who holds it without waiting
(the sweep driver asks before starting a point).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import tempfile
import time

from jaxformer import paths, run_files
from jaxformer.data import tokenizers

# flock has no test: `holder` takes a free lock for a moment, so `Lock` retries that long.
_PROBE_GRACE_S = 0.5
_TOKENIZER_FILES = (tokenizers.TOKENIZER_FILE, tokenizers.SPM_MODEL_FILE,
                    tokenizers.HF_MODEL_FILE)
# What a training run writes (all of it goes on --fresh; the lock file stays).
RUN_FILES = (run_files.CHECKPOINTS, run_files.BEST, run_files.METRICS, run_files.SAMPLES,
             run_files.CURVES, run_files.ATTENTION, run_files.PROFILE, run_files.CONFIG,
             run_files.BRANCH, run_files.POSTTRAIN_SOURCE, *_TOKENIZER_FILES)


def check_usable(workdir: str) -> None:
  """Create `workdir` if needed and prove it is writable, before any work: a scheme that
  cannot be served, a file in the way, a read-only or pseudo file system (/proc), missing
  permissions and an unreachable bucket are named here."""
  p = paths.path(workdir)
  if paths.is_remote(workdir):
    _check_remote_writable(p, workdir)
    return
  if p.exists() and not p.is_dir():
    raise ValueError(f"--workdir={workdir!r} is a file, not a directory; pick another path")
  try:
    p.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=p):
      pass
  except OSError as e:
    raise ValueError(f"--workdir={workdir!r} is not a writable directory ({e.strerror}); "
                     "pick a path you can write to") from e


def _check_remote_writable(p, workdir: str) -> None:
  """An object store has no directories to create: write and delete a probe object."""
  probe = p / f".jaxformer-probe-{socket.gethostname()}-{os.getpid()}"
  try:
    probe.write_text("")
    probe.unlink()
  except Exception as e:  # noqa: BLE001  (fsspec backends raise many types)
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise ValueError(f"--workdir={workdir!r} is not writable ({reason}); check the bucket "
                     "name and your credentials") from e


def lock_path(workdir: str) -> str:
  """The lock file: in the workdir, or for a remote workdir (object stores have no flock) in
  its local mirror, which excludes other trainings on this machine only."""
  if paths.is_remote(workdir):
    directory = paths.local_mirror(workdir, "lock")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, run_files.LOCK)
  return os.path.join(workdir, run_files.LOCK)


class Lock:
  """Exclusive ownership of a workdir (see the module docstring)."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = lock_path(workdir)
    self._file = None

  def __enter__(self) -> "Lock":
    f = open(self.path, "a+")
    deadline = time.monotonic() + _PROBE_GRACE_S
    try:
      while not _try_flock(f):
        if time.monotonic() >= deadline:
          raise BlockingIOError(errno.EAGAIN, "held")
        time.sleep(0.02)
    except OSError as e:
      f.seek(0)
      owner = f.read().strip() or "another process"
      f.close()
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        raise
      raise ValueError(f"--workdir={self.workdir!r} is in use by another "
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


def _try_flock(f) -> bool:
  """Take the exclusive lock of open file `f` if free: True if taken, False if held."""
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except OSError as e:
    if e.errno not in (errno.EAGAIN, errno.EACCES):
      raise
    return False


def holder(workdir: str) -> str | None:
  """Who holds `workdir`'s lock ("pid N on HOST, since ..."), or None when no process does.
  Asking takes a free lock for a moment (see `_PROBE_GRACE_S`); a lock file that cannot be
  locked at all (a file system without flock) counts as free, as `Lock` would fail itself."""
  try:
    f = open(lock_path(workdir))
  except OSError:                # none yet (or unreadable: `Lock` will say why)
    return None
  with f:
    try:
      if _try_flock(f):
        return None
    except OSError:
      return None
    return f.read().strip() or "another process"


def remove_rejected_attempt(workdir: str) -> list[str]:
  """Without config.json a workdir holds no accepted run: a tokenizer there was left by an
  attempt whose config was rejected after the data was read, and must not be reused by the
  corrected run (it may describe other data). Removed; returns the names."""
  p = paths.path(workdir)
  if (p / run_files.CONFIG).exists():
    return []
  names = [n for n in _TOKENIZER_FILES if (p / n).exists()]
  for name in names:
    (p / name).unlink()
  return names


def clear(workdir: str) -> list[str]:
  """--fresh: remove the previous run's artifacts (explicitly asked for); returns their names."""
  removed = []
  for path in sorted(paths.path(workdir).iterdir()):
    name = path.name
    if name in RUN_FILES or name.startswith(run_files.TENSORBOARD_PREFIX) or name.endswith(".tmp"):
      if path.is_dir():
        path.rmtree()
      else:
        path.unlink()
      removed.append(name)
  return removed


def parse_branch(value: str) -> tuple[str, int]:
  """'TRUNK_WORKDIR@STEP' -> (workdir, step); ValueError naming --branch_from."""
  trunk, sep, step = value.rpartition("@")
  if not sep or not trunk or not step.isdigit() or int(step) < 1:
    raise ValueError(f"--branch_from={value!r}: expected TRUNK_WORKDIR@STEP, e.g. "
                     "runs/trunk@8000 (a checkpoint the trunk kept)")
  return trunk, int(step)


def branch(trunk: str, step: int, workdir: str) -> bool:
  """Start `workdir` as a cooldown branch of the run in `trunk` at its checkpoint `step`.

  Why: a warmup-stable-decay run (`optim.schedule="wsd"`) holds its learning rate until the
  decay, so a checkpoint of its stable phase is also a checkpoint of every shorter run of the
  same schedule; training a copy of it with a smaller `train.steps` decays there and gives the
  loss of that shorter run for the cost of its decay (Hägele et al. 2024). The copy is an
  ordinary resumable run: config.json (the trunk's, without its `checkpoint_steps`), that one
  checkpoint, the tokenizer and the trunk's metrics up to `step`; the resume checks then refuse
  a branch whose model, data or learning rate of the steps taken differ from the trunk's.
  Idempotent: a workdir already branched from (trunk, step) is left as it is (False); one
  holding another run is refused. Written on process 0 only.
  """
  src, dst = paths.path(trunk), paths.path(workdir)
  marker = {"trunk": paths.absolute(trunk), "step": int(step)}
  if (dst / run_files.CONFIG).exists():
    if (dst / run_files.BRANCH).exists():
      if json.loads((dst / run_files.BRANCH).read_text()) == marker:
        return False
    raise ValueError(f"--workdir={workdir} already holds a run that is not a branch of "
                     f"{trunk} at step {step}; branch into a new --workdir")
  checkpoint = src / run_files.CHECKPOINTS / str(step)
  if not (src / run_files.CONFIG).exists() or not checkpoint.is_dir():
    kept = sorted(int(p.name) for p in (src / run_files.CHECKPOINTS).iterdir()
                  if p.name.isdigit()) if (src / run_files.CHECKPOINTS).exists() else []
    raise ValueError(f"--branch_from={trunk}@{step}: the trunk has no checkpoint at step "
                     f"{step} (kept: {kept or 'none'}); keep it with "
                     f"--config.train.checkpoint_steps=({step},) when training the trunk")
  check_usable(workdir)
  with Lock(workdir):
    clear(workdir)                          # the remains of an interrupted branch, if any
    _copy_tree(checkpoint, dst / run_files.CHECKPOINTS / str(step))
    for name in _TOKENIZER_FILES:
      if (src / name).exists():
        (src / name).copy(dst / name)
    if (src / run_files.METRICS).exists():
      lines = [line for line in (src / run_files.METRICS).read_text().splitlines()
               if line.strip() and json.loads(line).get("step", 0) <= step]
      paths.write_text(str(dst / run_files.METRICS), "".join(l + "\n" for l in lines))
    config = json.loads((src / run_files.CONFIG).read_text())
    config.setdefault("train", {})["checkpoint_steps"] = []
    paths.write_text(str(dst / run_files.BRANCH), json.dumps(marker) + "\n")
    paths.write_text(str(dst / run_files.CONFIG), json.dumps(config, indent=2))   # last: done
  return True


def _copy_tree(src, dst) -> None:
  dst.mkdir(parents=True, exist_ok=True)
  for item in src.iterdir():
    if item.is_dir():
      _copy_tree(item, dst / item.name)
    else:
      item.copy(dst / item.name)
