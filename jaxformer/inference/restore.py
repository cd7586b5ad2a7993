"""A trained run restored from its workdir for inference: config, params and tokenizer.

The params come from the latest checkpoint (the whole train state, restored with the layout
`jaxformer.train.state` gives training too), from the best eval's params, or from a given
step; nothing is written.
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
from ml_collections import ConfigDict

from jaxformer import paths, workdir_layout, run_settings
from jaxformer.data import tokenizers
from jaxformer.state import checkpoint, train_state


def checkpoint_choice(which) -> str | int:
  """`which` of `load_run` checked: 'latest', 'best', or a step (an int >= 0, or its digits
  as a string, as a command line gives it)."""
  if isinstance(which, str) and which.isdigit():
    which = int(which)
  if which in ("latest", "best") or (isinstance(which, int) and not isinstance(which, bool)
                                     and which >= 0):
    return which
  raise ValueError(f"--checkpoint={which!r} must be 'latest', 'best' or a step number")


def load_run(workdir: str, *, which: str | int = "latest"):
  """(config, params, tokenizer) of a training workdir: its latest checkpoint, with
  which="best" the params kept for the best eval (train.best_metric), or with a step number
  the checkpoint of that step (from checkpoints/, else from best/). The tokenizer is None for
  runs without one (images, synthetic tasks)."""
  which = checkpoint_choice(which)
  saved = train_state.read_config(workdir)
  if saved is None:
    raise ValueError(f"--workdir={workdir!r} holds no training run (no {workdir_layout.CONFIG})")
  config = ConfigDict(saved)
  settings = run_settings.parse(config)          # the typed sections, as training read them
  latest_dir = os.path.join(workdir, workdir_layout.CHECKPOINTS)
  best_dir = os.path.join(workdir, workdir_layout.BEST)
  directory = best_dir if which == "best" else latest_dir
  if isinstance(which, str) and not _has_checkpoints(directory):    # read-only: create nothing
    raise ValueError(f"--workdir={workdir!r} has no {which} checkpoint yet ({directory} is "
                     "empty or missing); train it first, or pick --checkpoint=latest|best")
  _, _, init_boxed = train_state.train_state_fns(config)
  abstract = nn.unbox(jax.eval_shape(init_boxed))
  if which == "best":
    params = _restore_best(workdir, best_dir, abstract, settings.train.best_metric)
  elif which == "latest":
    ckpts = checkpoint.Checkpoints(directory, read_only=True)
    restored = ckpts.restore_latest(abstract)
    ckpts.close()
    params = None if restored is None else restored[1]["params"]
  else:
    params = _restore_step(workdir, latest_dir, best_dir, which, abstract,
                           settings.train.best_metric)
  if params is None:
    raise ValueError(f"--workdir={workdir!r} has no {which} checkpoint yet")
  has_tokenizer = paths.path(os.path.join(workdir, tokenizers.TOKENIZER_FILE)).exists()
  tokenizer = tokenizers.load_tokenizer(workdir) if has_tokenizer else None
  return config, params, tokenizer


def checkpoint_step(workdir: str, which: str | int = "latest") -> int | None:
  """The step whose params `load_run(workdir, which=which)` reads (None when there is none),
  without restoring anything: the CLIs print it, so `--checkpoint=best` says which step."""
  which = checkpoint_choice(which)
  if not isinstance(which, str):
    return which
  if which == "latest":
    directory = os.path.join(workdir, workdir_layout.CHECKPOINTS)
    if not _has_checkpoints(directory):
      return None
    ckpts = checkpoint.Checkpoints(directory, read_only=True)
    try:
      steps = ckpts.steps()
    finally:
      ckpts.close()
    return steps[-1] if steps else None
  directory = os.path.join(workdir, workdir_layout.BEST)
  if not _has_checkpoints(directory):
    return None
  saved = train_state.read_config(workdir)
  metric = run_settings.parse(ConfigDict(saved)).train.best_metric
  best = checkpoint.BestCheckpoints(directory, read_only=True, metric=metric)
  try:
    return best.best_step()
  finally:
    best.close()


def _has_checkpoints(directory: str) -> bool:
  found = paths.path(directory, "--workdir")
  return found.is_dir() and any(found.iterdir())


def _restore_best(workdir: str, directory: str, abstract, metric: str, step=None):
  """The params of the best eval (or of the kept best step `step`), None if none is kept."""
  try:           # Orbax reads the kept metrics when it opens the directory
    best = checkpoint.BestCheckpoints(directory, read_only=True, metric=metric)
    try:
      return best.restore(abstract["params"], step)
    finally:
      best.close()
  except Exception as e:  # noqa: BLE001  (Orbax/TensorStore raise many types)
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise ValueError(f"--workdir={workdir!r}: the best checkpoint in {directory} is "
                     f"unreadable ({reason}); use --checkpoint=latest") from e


def _restore_step(workdir: str, latest_dir: str, best_dir: str, step: int, abstract,
                  metric: str):
  """The params saved at `step`: the train state's checkpoint, else the best eval's; a
  ValueError listing the kept steps when neither holds it."""
  kept = {}
  if _has_checkpoints(latest_dir):
    ckpts = checkpoint.Checkpoints(latest_dir, read_only=True)
    try:
      kept[workdir_layout.CHECKPOINTS] = ckpts.steps()
      state = ckpts.restore_step(step, abstract)
    except Exception as e:  # noqa: BLE001  (Orbax/TensorStore raise many types)
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      raise ValueError(f"--workdir={workdir!r}: the checkpoint of step {step} in {latest_dir} "
                       f"is unreadable ({reason}); pick another step or "
                       "--checkpoint=latest|best") from e
    finally:
      ckpts.close()
    if state is not None:
      return state["params"]
  if _has_checkpoints(best_dir):
    best = checkpoint.BestCheckpoints(best_dir, read_only=True, metric=metric)
    kept[workdir_layout.BEST] = sorted(best.manager.all_steps())
    best.close()
    if step in kept[workdir_layout.BEST]:
      return _restore_best(workdir, best_dir, abstract, metric, step)
  where = "; ".join(f"{name}/ keeps steps {steps}" for name, steps in kept.items())
  raise ValueError(f"--workdir={workdir!r} has no checkpoint of step {step} "
                   f"({where or 'it has no checkpoints yet'}); pick a kept step or "
                   "--checkpoint=latest|best")
