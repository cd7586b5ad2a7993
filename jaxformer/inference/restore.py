"""A trained run restored from its workdir for inference: config, params and tokenizer.

The params come from the latest checkpoint (the whole train state, restored with the layout
`jaxformer.train.state` gives training too) or from the best eval's params; nothing is written.
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
from ml_collections import ConfigDict

from jaxformer import paths, workdir_layout, run_settings
from jaxformer.data import tokenizers
from jaxformer.state import checkpoint, train_state


def load_run(workdir: str, *, which: str = "latest"):
  """(config, params, tokenizer) of a training workdir: its latest checkpoint, or with
  which="best" the params kept for the best eval (train.best_metric). The tokenizer is None
  for runs without one (images, synthetic tasks)."""
  if which not in ("latest", "best"):
    raise ValueError(f"--checkpoint={which!r} must be 'latest' or 'best'")
  saved = train_state.read_config(workdir)
  if saved is None:
    raise ValueError(f"--workdir={workdir!r} holds no training run (no {workdir_layout.CONFIG})")
  config = ConfigDict(saved)
  settings = run_settings.parse(config)          # the typed sections, as training read them
  directory = os.path.join(workdir, workdir_layout.BEST if which == "best"
                           else workdir_layout.CHECKPOINTS)
  found = paths.path(directory, "--workdir")
  if not found.is_dir() or not any(found.iterdir()):        # read-only: create nothing
    raise ValueError(f"--workdir={workdir!r} has no {which} checkpoint yet ({directory} is "
                     "empty or missing); train it first, or pick --checkpoint=latest|best")
  _, _, init_boxed = train_state.train_state_fns(config)
  abstract = nn.unbox(jax.eval_shape(init_boxed))
  if which == "best":
    try:           # Orbax reads the kept metrics when it opens the directory
      best = checkpoint.BestCheckpoints(directory, read_only=True,
                                        metric=settings.train.best_metric)
      try:
        params = best.restore(abstract["params"])
      finally:
        best.close()
    except Exception as e:  # noqa: BLE001  (Orbax/TensorStore raise many types)
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      raise ValueError(f"--workdir={workdir!r}: the best checkpoint in {directory} is "
                       f"unreadable ({reason}); use --checkpoint=latest") from e
  else:
    ckpts = checkpoint.Checkpoints(directory, read_only=True)
    restored = ckpts.restore_latest(abstract)
    ckpts.close()
    params = None if restored is None else restored[1]["params"]
  if params is None:
    raise ValueError(f"--workdir={workdir!r} has no {which} checkpoint yet")
  has_tokenizer = paths.path(os.path.join(workdir, tokenizers.TOKENIZER_FILE)).exists()
  tokenizer = tokenizers.load_tokenizer(workdir) if has_tokenizer else None
  return config, params, tokenizer
