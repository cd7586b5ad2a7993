"""The run directory: checked before any work, owned by one training at a time, cleared by
--fresh.

Checked before any work (`check_members`): every member a run writes (`workdir_layout`) is of the
kind it writes (a file where a directory belongs, a link to nothing or an unreadable member
is refused in one line naming it and the fix), and a run that would start from step 0 over
the results of an earlier one whose checkpoints are gone is refused unless --fresh
(`check_nothing_overwritten`).

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

from jaxformer import paths, workdir_layout
from jaxformer.data import tokenizers

# flock has no test: `holder` takes a free lock for a moment, so `Lock` retries that long.
_PROBE_GRACE_S = 0.5
_TOKENIZER_FILES = (tokenizers.TOKENIZER_FILE, tokenizers.SPM_MODEL_FILE,
                    tokenizers.HF_MODEL_FILE)
# What a training run writes (all of it goes on --fresh; the lock file stays, and so does W&B's
# own `wandb/`: offline runs not synced yet are never deleted).
_L = workdir_layout
RUN_FILES = (_L.CHECKPOINTS, _L.BEST, _L.METRICS, _L.SAMPLES, _L.CURVES, _L.ATTENTION,
             _L.HEADS, _L.PROFILE, _L.CONFIG, _L.BRANCH, _L.DATA, _L.POSTTRAIN_SOURCE, _L.TRACKERS,
             *_TOKENIZER_FILES)
# Members written in place (the others are created, or replaced by a rename).
_APPENDED = (workdir_layout.METRICS, workdir_layout.SAMPLES, workdir_layout.LOCK)
# Orbax writes a checkpoint into `<step>.orbax-checkpoint-tmp-<n>` and renames it when done.
_ORBAX_TMP = ".orbax-checkpoint-tmp"


def _is_member(name: str) -> bool:
  return (name in RUN_FILES or name in (workdir_layout.LOGS, workdir_layout.LOCK)
          or name.startswith(workdir_layout.TENSORBOARD_PREFIX))


def _cleared_by_fresh(name: str) -> bool:
  return (name in RUN_FILES or name.startswith(workdir_layout.TENSORBOARD_PREFIX)
          or name.endswith(".tmp"))


def _member_problem(path, want_dir: bool) -> str | None:
  """What is wrong with member `path` of a workdir (None: nothing)."""
  local = not paths.is_remote(os.fspath(path))
  if local and os.path.islink(path) and not os.path.exists(path):
    return f"is a link to {os.readlink(path)!r}, which does not exist"
  if want_dir and not path.is_dir():
    return "is a file" if path.is_file() else "is not a directory"
  if not want_dir and path.is_dir():
    return "is a directory"
  if not want_dir and local and not os.path.isfile(path):
    return "is not a regular file"
  if local and not os.access(path, os.R_OK | (os.W_OK | os.X_OK if want_dir else 0)):
    return "cannot be read by this user"
  if local and path.name in _APPENDED and not os.access(path, os.W_OK):
    return "cannot be written by this user"
  return None


def check_members(workdir: str, *, fresh: bool = False) -> None:
  """Every member of `workdir` a run writes is of the kind it writes (`workdir_layout.DIRECTORIES`
  are directories, the rest plain files), readable and writable: a ValueError naming the first
  that is not, and the fix, before anything is read, written or compiled. With `fresh`, the
  members --fresh removes (whatever their kind) are not checked. Writes nothing."""
  p = paths.path(workdir)
  if not p.is_dir():
    return                                   # none yet (check_usable refuses a file)
  for path in sorted(p.iterdir()):
    name = path.name
    if not _is_member(name) or (fresh and _cleared_by_fresh(name)):
      continue
    want_dir = name in workdir_layout.DIRECTORIES
    problem = _member_problem(path, want_dir)
    if problem is None:
      continue
    kind = f"a directory ({name}/)" if want_dir else "a file"
    if problem.startswith("cannot"):
      fix = "give this user access to it (chmod/chown)"
    elif _cleared_by_fresh(name):
      fix = "move it away or delete it, or rerun with --fresh to discard the run in --workdir"
    else:
      fix = "move it away or delete it"
    raise ValueError(f"--workdir={workdir!r}: {name} {problem}, where a run keeps {kind}; "
                     f"{fix}")


def checkpoint_steps(workdir: str, which: str = workdir_layout.CHECKPOINTS) -> list[int]:
  """The steps of the finished checkpoints under `workdir/which` (directories named by their
  step), sorted; [] if there are none."""
  directory = paths.path(workdir) / which
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def check_nothing_overwritten(workdir: str, first_checkpoint: int, last_step: int) -> None:
  """A run that starts from step 0 (no checkpoint to resume from) must not overwrite what an
  earlier run in `workdir` wrote once it was saved (metrics.jsonl records, best/ checkpoints
  past its first checkpoint at `first_checkpoint`, or of its last step `last_step`, whose save
  the run waits for): its checkpoints are gone (deleted, or every one unreadable). A
  ValueError pointing at --fresh, unless an interrupted first save explains it (Orbax's
  temporary directory is there). What a run stopped before its first checkpoint was complete
  leaves (killed, or a full disk) is no loss: the restart writes it again, identically."""
  p = paths.path(workdir)
  directory = p / workdir_layout.CHECKPOINTS
  if checkpoint_steps(workdir):
    return
  names = [q.name for q in directory.iterdir()] if directory.is_dir() else []
  if any(_ORBAX_TMP in n for n in names):
    return                                   # its first save was interrupted

  def saved(step: int) -> bool:
    return step > first_checkpoint or step >= last_step
  reached = []
  if (p / workdir_layout.METRICS).is_file():
    from jaxformer.train import metrics    # not at import: the sweep driver imports this module
    steps = [r["step"] for r in metrics.read(str(p / workdir_layout.METRICS))]
    if steps and saved(max(steps)):
      reached.append(f"{workdir_layout.METRICS} up to step {max(steps)}")
  best = checkpoint_steps(workdir, workdir_layout.BEST)
  if best and saved(best[-1]):
    reached.append(f"{workdir_layout.BEST}/ at steps {best}")
  if not reached:
    return
  unreadable = sorted(n for n in names if ".unreadable" in n)
  why = (f"its checkpoints are unreadable ({', '.join(unreadable)})" if unreadable else
         f"{workdir_layout.CHECKPOINTS}/ is " + ("empty" if directory.is_dir() else "missing"))
  raise ValueError(f"--workdir={workdir!r} holds a run that was saved ({' and '.join(reached)}) "
                   f"but no checkpoint to resume it from ({why}); starting again from step 0 "
                   "would overwrite them: rerun with --fresh to discard them, or use a new "
                   "--workdir")


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
    return os.path.join(directory, workdir_layout.LOCK)
  return os.path.join(workdir, workdir_layout.LOCK)


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
  if (p / workdir_layout.CONFIG).exists():
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
    if _cleared_by_fresh(name):
      if path.is_dir() and not os.path.islink(path):
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


def branch(trunk: str, step: int, workdir: str, *, config=None, fresh: bool = False) -> bool:
  """Start `workdir` as a cooldown branch of the run in `trunk` at its checkpoint `step`.

  Why: a warmup-stable-decay run (`optim.schedule="wsd"`) holds its learning rate until the
  decay, so a checkpoint of its stable phase is also a checkpoint of every shorter run of the
  same schedule; training a copy of it with a smaller `train.steps` decays there and gives the
  loss of that shorter run for the cost of its decay (Hägele et al. 2024). The copy is an
  ordinary resumable run: config.json (the trunk's, without its `checkpoint_steps`), that one
  checkpoint, the tokenizer, the data's fingerprint and the trunk's metrics up to `step`; the
  resume checks then refuse a branch whose model, data or learning rate of the steps taken
  differ from the trunk's.

  Everything that can refuse it is checked before anything is copied: the trunk and its
  checkpoint, `workdir`'s members, and with `config` (the branch's training config) the
  config checks and the resume checks against the trunk's config, so a refused branch leaves
  nothing behind. Idempotent: a workdir already branched from (trunk, step) is left as it is
  (False); one holding another run is refused, or with `fresh` cleared first (--fresh).
  Written on process 0 only.
  """
  src, dst = paths.path(trunk), paths.path(workdir)
  where = f"--branch_from={trunk}@{step}"
  if not (src / workdir_layout.CONFIG).is_file():
    raise ValueError(f"{where}: no such run: {trunk} (it holds no "
                     f"{workdir_layout.CONFIG}); give the "
                     "--workdir of the trunk's training")
  kept = checkpoint_steps(trunk)
  if step not in kept:
    raise ValueError(f"{where}: the trunk has no checkpoint at step {step} (kept: "
                     f"{kept or 'none'}); branch from a kept step, or keep this one with "
                     f"--config.train.checkpoint_steps=({step},) when training the trunk")
  try:
    trunk_config = json.loads((src / workdir_layout.CONFIG).read_text())
  except ValueError as e:
    raise ValueError(f"{where}: {src / workdir_layout.CONFIG} is not JSON ({e}); restore it, or "
                     "branch from another run") from None
  trunk_config.setdefault("train", {})["checkpoint_steps"] = []
  if config is not None:
    from jaxformer.train import config_checks    # not at import: the sweep driver imports
                                                 # this module, and config_checks loads JAX
    settings = config_checks.validate(config)
    config_checks.check_continues(config, trunk_config, step, where=where, branch=True,
                                  settings=settings)
  marker = {"trunk": paths.absolute(trunk), "step": int(step)}
  check_members(workdir, fresh=fresh)
  if not fresh and (dst / workdir_layout.CONFIG).exists():
    if (dst / workdir_layout.BRANCH).is_file():
      if json.loads((dst / workdir_layout.BRANCH).read_text()) == marker:
        return False
    raise ValueError(f"--workdir={workdir} already holds a run that is not a branch of "
                     f"{trunk} at step {step}; branch into a new --workdir, or add --fresh to "
                     "discard that run")
  results = [n for n in (workdir_layout.CHECKPOINTS, workdir_layout.BEST, workdir_layout.METRICS)
             if (dst / n).exists()]
  if not fresh and results and not (dst / workdir_layout.BRANCH).exists():
    raise ValueError(f"--workdir={workdir} holds a run's {', '.join(results)} (without its "
                     f"{workdir_layout.CONFIG}); branch into a new --workdir, or add --fresh to "
                     "discard them")
  check_usable(workdir)
  with Lock(workdir):
    # --fresh, or the remains of an interrupted branch (its marker is written first) or of a
    # rejected attempt (a tokenizer)
    removed = clear(workdir)
    if fresh:
      print(f"{workdir}: --fresh, removed the previous run's {', '.join(removed) or 'nothing'}",
            flush=True)
    paths.write_text(str(dst / workdir_layout.BRANCH), json.dumps(marker) + "\n")
    ckpts = workdir_layout.CHECKPOINTS
    _copy_tree(src / ckpts / str(step), dst / ckpts / str(step))
    for name in (*_TOKENIZER_FILES, workdir_layout.DATA):
      if (src / name).exists():
        (src / name).copy(dst / name)
    if (src / workdir_layout.METRICS).exists():
      lines = [line for line in (src / workdir_layout.METRICS).read_text().splitlines()
               if line.strip() and json.loads(line).get("step", 0) <= step]
      paths.write_text(str(dst / workdir_layout.METRICS), "".join(l + "\n" for l in lines))
    paths.write_text(str(dst / workdir_layout.CONFIG), json.dumps(trunk_config, indent=2))  # last
  return True


def train_branch(config, workdir: str, trunk: str, step: int, *, fresh: bool = False,
                 data_changed_ok: bool = False) -> dict:
  """--branch_from: `branch` (process 0), then train the branch (`loop.train`, resuming the
  copy). A branch refused before it trained leaves nothing behind: its copy is discarded, so
  the corrected command (or one naming another trunk or step) starts as if it were the first.
  `fresh`: whatever `workdir` held is discarded before branching."""
  import jax
  from jaxformer import console, parallel
  from jaxformer.train import loop
  main_process = jax.process_index() == 0
  existed = paths.path(workdir).exists()
  created = parallel.process_zero_first(
      lambda: branch(trunk, step, workdir, config=config, fresh=fresh) if main_process
      else False, "branching")
  console.route_process_output(jax.process_index(), jax.process_count(), workdir)
  try:
    return loop.train(config, workdir, data_changed_ok=data_changed_ok)
  except Exception as e:
    from jaxformer import cli
    if created and cli.is_user_error(e) and is_unstarted_branch(workdir):
      discard_branch(workdir, created_dir=not existed)
    raise


def is_unstarted_branch(workdir: str) -> bool:
  """`workdir` is a branch that has not trained past its branch point: nothing in it but the
  copy `branch` made (its checkpoint, and metrics up to that step)."""
  p = paths.path(workdir)
  try:
    step = json.loads((p / workdir_layout.BRANCH).read_text())["step"]
    if checkpoint_steps(workdir) != [step] or checkpoint_steps(workdir, workdir_layout.BEST):
      return False
    if (p / workdir_layout.METRICS).is_file():
      from jaxformer.train import metrics
      if any(r["step"] > step for r in metrics.read(str(p / workdir_layout.METRICS))):
        return False
  except (OSError, ValueError, KeyError, TypeError):
    return False
  return True


def discard_branch(workdir: str, *, created_dir: bool) -> None:
  """Undo `branch` after its run was refused before training (`is_unstarted_branch`): the
  copied run goes, and the directory too when `branch` created it and nothing else is there."""
  with Lock(workdir):
    clear(workdir)
  if created_dir and not paths.is_remote(workdir):
    lock = os.path.join(workdir, workdir_layout.LOCK)
    if set(os.listdir(workdir)) <= {workdir_layout.LOCK}:
      if os.path.exists(lock):
        os.unlink(lock)
      os.rmdir(workdir)


def _copy_tree(src, dst) -> None:
  dst.mkdir(parents=True, exist_ok=True)
  for item in src.iterdir():
    if item.is_dir():
      _copy_tree(item, dst / item.name)
    else:
      item.copy(dst / item.name)
