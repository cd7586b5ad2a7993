"""Orbax checkpoints of the train state, falling back to an older step if the latest is bad."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil

import jax
import orbax.checkpoint as ocp

from jaxformer import paths
from jaxformer.state.train_state import ADDED_LATER


def _options(name: str, *, read_only: bool = False, **kwargs) -> ocp.CheckpointManagerOptions:
  """Async manager options with a barrier-key prefix of its own.

  Why the prefix: the latest and best managers save asynchronously at the same step, and
  Orbax names a process barrier by its name and step only, so without a prefix the two
  managers' background threads share barrier keys and can pass each other's barriers on
  different processes: a checkpoint is finalized before every process has written its
  shards (or, with collective barriers, they deadlock). Seen in the 2-process test under
  load.
  """
  if read_only:            # a reader (sample, evaluation of a run) writes nothing at all
    return ocp.CheckpointManagerOptions(create=False, read_only=True,
                                        enable_async_checkpointing=False, **kwargs)
  return ocp.CheckpointManagerOptions(
      create=True, enable_async_checkpointing=True,
      multiprocessing_options=ocp.options.MultiprocessingOptions(
          barrier_sync_key_prefix=name), **kwargs)


def _check_directory(directory: str) -> None:
  """A path in the way of a checkpoint directory, refused before Orbax sees it (Orbax's
  background threads fail on it with tracebacks and then keep the process from exiting)."""
  p = paths.path(directory)
  if p.exists() and not p.is_dir():
    raise ValueError(f"{directory} is a file, not a directory of checkpoints; move it away "
                     "or delete it")


class Checkpoints:
  """Keeps the last `keep` checkpoints of a pytree state under `directory`, and with
  `keep_every=N` also every step that is a multiple of N (intermediate checkpoints for
  scaling studies; 0: none), and every step in `keep_steps` (branch points of cooldown
  branches). Saved asynchronously; Orbax writes to a temporary directory and
  renames, so a killed save never looks finished. `read_only=True`: a reader of a run another
  process may be training (it restores, never saves, renames or deletes)."""

  def __init__(self, directory: str | os.PathLike, *, keep: int = 3, keep_every: int = 0,
               keep_steps=(), read_only: bool = False):
    if not read_only and (keep < 1 or keep_every < 0):
      raise ValueError(f"keep={keep} must be >= 1 and keep_every={keep_every} >= 0 (0: off)")
    self.directory = paths.absolute(directory)
    _check_directory(self.directory)
    self.read_only = read_only
    policies = [ocp.checkpoint_managers.LatestN(keep)]
    if keep_every:
      policies.append(ocp.checkpoint_managers.EveryNSteps(keep_every))
    if keep_steps:
      policies.append(ocp.checkpoint_managers.CustomSteps(list(keep_steps)))
    kept = {} if read_only else dict(
        preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies))
    self._open = lambda: ocp.CheckpointManager(
        self.directory, options=_options("latest", read_only=read_only, **kept))
    self.manager = self._open()

  def save(self, step: int, state) -> None:
    self.manager.wait_until_finished()       # Orbax waits for the previous save here anyway
    check_free_space(self.directory, state)
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore_latest(self, abstract_state):
    """(step, state) of the newest readable checkpoint, or None if there is none.

    The owner moves an unreadable checkpoint to `<step>.unreadable` (kept for inspection, out
    of the way of the step that will be saved again) and tries the next older one. A reader
    moves nothing: it skips it, and re-lists the steps when one vanished under it (the
    training deletes old checkpoints while it runs).
    """
    tried = set()
    while True:
      steps = [s for s in sorted(self.manager.all_steps(), reverse=True) if s not in tried]
      if not steps:
        return None
      step = steps[0]
      tried.add(step)
      try:
        with _quiet_asyncio():
          return step, self._restore(step, abstract_state)
      except Exception as e:  # pylint: disable=broad-except
        path = os.path.join(self.directory, str(step))
        reason = (str(e).strip().splitlines() or [""])[0][:200]
        if self.read_only:
          if paths.path(path).exists():
            logging.warning("checkpoint at step %d is unreadable (%s: %s); trying an older one",
                            step, type(e).__name__, reason)
          self.manager.close()        # a manager whose restore failed may not restore again
          self.manager = self._open()
        else:
          aside = _unused_name(f"{path}.unreadable")
          logging.warning("checkpoint at step %d is unreadable (%s: %s); moved to %s, trying "
                          "an older one", step, type(e).__name__, reason, aside)
          paths.path(path).rename(aside)
          self.manager.reload()

  def restore_step(self, step: int, abstract_state):
    """The state saved at `step`, or None if no checkpoint of that step is kept."""
    if step not in self.manager.all_steps():
      return None
    with _quiet_asyncio():
      return self._restore(step, abstract_state)

  def _restore(self, step: int, abstract_state):
    """The state at `step`; the entries of `ADDED_LATER` that a checkpoint written before
    they existed lacks come back as zeros (Orbax refuses a target with keys the checkpoint
    does not have), so an older run still resumes and samples."""
    missing = []
    if isinstance(abstract_state, dict) and any(k in abstract_state for k in ADDED_LATER):
      saved = ocp.StandardCheckpointHandler().metadata(
          paths.path(self.directory) / str(step) / "default")   # the manager's single item
      missing = [k for k in ADDED_LATER if k in abstract_state and k not in saved.keys()]
    target = {k: v for k, v in abstract_state.items() if k not in missing} if missing else \
        abstract_state
    state = self.manager.restore(step, args=ocp.args.StandardRestore(target))
    for key in missing:
      state[key] = jax.tree.map(_zeros, abstract_state[key])
    return state

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


@contextlib.contextmanager
def _quiet_asyncio():
  """A failed restore leaves Orbax's sibling read tasks failing too, and asyncio logs each
  one's traceback ("Task exception was never retrieved": ~100 lines for one bad file). The
  one warning restore_latest logs says it all."""
  logger = logging.getLogger("asyncio")
  level = logger.level
  logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    logger.setLevel(level)


def _unused_name(path: str) -> str:
  """path, or path.1, path.2, ...: the first that does not exist (moving a checkpoint aside
  never fails because an earlier one was moved to the same name)."""
  candidate, i = path, 0
  while paths.path(candidate).exists():
    i += 1
    candidate = f"{path}.{i}"
  return candidate


def check_free_space(directory: str, tree, *, margin: float = 1.1, slack: int = 1 << 16):
  """An OSError(ENOSPC) naming `directory` if this process's shards of `tree` do not fit.

  Why check first: a full disk found by Orbax's asynchronous writers fails hundreds of
  TensorStore tasks at once in background threads (~1,400 lines of tracebacks), while a
  check here stops the run in its own thread with one message, before a byte is written."""
  if paths.is_remote(directory):
    return                               # a bucket has no free space to ask about
  needed = sum(shard.data.nbytes for leaf in jax.tree.leaves(tree)
               if isinstance(leaf, jax.Array) for shard in leaf.addressable_shards
               if shard.replica_id == 0)
  needed = int(needed * margin) + slack
  free = shutil.disk_usage(directory).free
  if free < needed:
    raise OSError(errno.ENOSPC, f"No space left on device: a checkpoint needs about "
                  f"{needed / 1e6:,.1f} MB, {free / 1e6:,.1f} MB are free", directory)


def _zeros(x):
  """Zeros of an abstract array, on its sharding when it has one."""
  sharding = getattr(x, "sharding", None)
  if sharding is None:
    return jax.numpy.zeros(x.shape, x.dtype)
  return jax.jit(lambda: jax.numpy.zeros(x.shape, x.dtype), out_shardings=sharding)()


def abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class BestCheckpoints:
  """Params of the `keep` best eval steps by `metric` under `directory` (eval_loss: lower is
  better; eval_accuracy: higher). Written only when an eval beats a kept one, so a long run
  does not rewrite its best model at every eval."""

  def __init__(self, directory: str | os.PathLike, *, metric: str = "eval_loss",
               keep: int = 1, read_only: bool = False):
    self.metric, self.mode = metric, ("min" if metric.endswith("loss") else "max")
    self.keep = keep
    self.directory = paths.absolute(directory)
    _check_directory(self.directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=_options("best", read_only=read_only, best_fn=lambda m: m[metric],
                         best_mode=self.mode, keep_checkpoints_without_metrics=False,
                         **({} if read_only else dict(max_to_keep=keep))))

  def _kept_values(self) -> list[float]:
    self.manager.wait_until_finished()      # the previous save's metrics must be readable
    return [float(self.manager.metrics(s)[self.metric]) for s in self.manager.all_steps()]

  def _improves(self, value: float) -> bool:
    kept = self._kept_values()
    if len(kept) < self.keep:
      return True
    worst = max(kept) if self.mode == "min" else min(kept)
    return value < worst if self.mode == "min" else value > worst

  def maybe_save(self, step: int, params, eval_record: dict) -> bool:
    value = float(eval_record[self.metric])
    if not self._improves(value):
      return False
    check_free_space(self.directory, {"params": params})
    self.manager.save(step, args=ocp.args.StandardSave({"params": params}),
                      metrics={self.metric: value}, force=True)
    return True

  def forget_after(self, step: int) -> None:
    """Drop best checkpoints written after `step` (the resumed run will redo those evals)."""
    for s in self.manager.all_steps():
      if s > step:
        self.manager.delete(s)

  def best_step(self) -> int | None:
    return self.manager.best_step()

  def restore(self, abstract_params, step: int | None = None):
    step = self.best_step() if step is None else step
    if step is None:
      return None
    return self.manager.restore(
        step, args=ocp.args.StandardRestore({"params": abstract_params}))["params"]

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
