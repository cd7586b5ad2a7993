"""Orbax checkpoints of the train state, falling back to an older step if the latest is bad."""

from __future__ import annotations

import contextlib
import logging
import os

import jax
import orbax.checkpoint as ocp


def _options(name: str, **kwargs) -> ocp.CheckpointManagerOptions:
  """Async manager options with a barrier-key prefix of its own.

  Why the prefix: the latest and best managers save asynchronously at the same step, and
  Orbax names a process barrier by its name and step only, so without a prefix the two
  managers' background threads share barrier keys and can pass each other's barriers on
  different processes: a checkpoint is finalized before every process has written its
  shards (or, with collective barriers, they deadlock). Seen in the 2-process test under
  load.
  """
  return ocp.CheckpointManagerOptions(
      create=True, enable_async_checkpointing=True,
      multiprocessing_options=ocp.options.MultiprocessingOptions(
          barrier_sync_key_prefix=name), **kwargs)


class Checkpoints:
  """Keeps the last `keep` checkpoints of a pytree state under `directory` (saved
  asynchronously; Orbax writes to a temporary directory and renames, so a killed save
  never looks finished)."""

  def __init__(self, directory: str | os.PathLike, *, keep: int = 3):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=_options("latest", max_to_keep=keep))

  def save(self, step: int, state) -> None:
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore_latest(self, abstract_state):
    """(step, state) of the newest readable checkpoint, or None if there is none.

    An unreadable checkpoint is renamed to `<step>.unreadable` (kept for inspection, out of
    the way of the step that will be saved again) and the next older one is tried.
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        with _quiet_asyncio():
          return step, self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
      except Exception as e:  # pylint: disable=broad-except
        path = os.path.join(self.directory, str(step))
        aside = _unused_name(f"{path}.unreadable")
        reason = (str(e).strip().splitlines() or [""])[0][:200]
        logging.warning("checkpoint at step %d is unreadable (%s: %s); moved to %s, trying "
                        "an older one", step, type(e).__name__, reason, aside)
        os.replace(path, aside)
        self.manager.reload()
    return None

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
  while os.path.exists(candidate):
    i += 1
    candidate = f"{path}.{i}"
  return candidate


def abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class BestCheckpoints:
  """Params of the `keep` best eval steps by `metric` under `directory` (eval_loss: lower is
  better; eval_accuracy: higher). Written only when an eval beats a kept one, so a long run
  does not rewrite its best model at every eval."""

  def __init__(self, directory: str | os.PathLike, *, metric: str = "eval_loss",
               keep: int = 1):
    self.metric, self.mode = metric, ("min" if metric.endswith("loss") else "max")
    self.keep = keep
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=_options("best", max_to_keep=keep, best_fn=lambda m: m[metric],
                         best_mode=self.mode, keep_checkpoints_without_metrics=False))

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
