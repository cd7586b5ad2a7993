"""Orbax checkpoints of the train state, falling back to an older step if the latest is bad."""

from __future__ import annotations

import logging
import os

import jax
import orbax.checkpoint as ocp


class Checkpoints:
  """Keeps the last `keep` checkpoints of a pytree state under `directory` (saved
  asynchronously; Orbax writes to a temporary directory and renames, so a killed save
  never looks finished)."""

  def __init__(self, directory: str | os.PathLike, *, keep: int = 3):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=True))

  def save(self, step: int, state) -> None:
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore_latest(self, abstract_state):
    """(step, state) of the newest readable checkpoint, or None if there is none.

    An unreadable checkpoint is renamed to `<step>.unreadable` (kept for inspection, out of
    the way of the step that will be saved again) and the next older one is tried.
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        return step, self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("checkpoint at step %d is unreadable (%s: %s); trying an older one",
                        step, type(e).__name__, e)
        path = os.path.join(self.directory, str(step))
        os.replace(path, f"{path}.unreadable")
        self.manager.reload()
    return None

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
