"""Text sampling from a trained run: restore a workdir, decode with the KV cache."""

from __future__ import annotations

import json
import os

import flax.linen as nn
import jax
import numpy as np
from ml_collections import ConfigDict

from jaxformer.data.tokenizers import load_tokenizer
from jaxformer.generate import generate


def load_run(workdir: str, *, which: str = "latest"):
  """(config, params, tokenizer) of a training workdir: its latest checkpoint, or with
  which="best" the params kept for the best eval (train.best_metric). The tokenizer is None
  for runs without one (images, synthetic tasks)."""
  if which not in ("latest", "best"):
    raise ValueError(f"--checkpoint={which!r} must be 'latest' or 'best'")
  from jaxformer.train import checkpoint, loop   # noqa: deferred (train imports this module)
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise ValueError(f"--workdir={workdir!r} holds no training run (no config.json)")
  try:
    with open(path) as f:
      config = ConfigDict(json.load(f))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); it is written by training: restore "
                     "it or retrain in a new --workdir") from e
  directory = os.path.join(workdir, "best" if which == "best" else "checkpoints")
  if not os.path.isdir(directory) or not os.listdir(directory):   # read-only: create nothing
    raise ValueError(f"--workdir={workdir!r} has no {which} checkpoint yet ({directory} is "
                     "empty or missing); train it first, or pick --checkpoint=latest|best")
  _, _, init_boxed = loop.train_state_fns(config)
  abstract = nn.unbox(jax.eval_shape(init_boxed))
  if which == "best":
    best = checkpoint.BestCheckpoints(os.path.join(workdir, "best"),
                                      metric=config.train.get("best_metric", "eval_loss"))
    params = best.restore(abstract["params"])
    best.close()
  else:
    ckpts = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"))
    restored = ckpts.restore_latest(abstract)
    ckpts.close()
    params = None if restored is None else restored[1]["params"]
  if params is None:
    raise ValueError(f"--workdir={workdir!r} has no {which} checkpoint yet")
  has_tokenizer = os.path.exists(os.path.join(workdir, "tokenizer.json"))
  tokenizer = load_tokenizer(workdir) if has_tokenizer else None
  return config, params, tokenizer


def sample_text(config, params, tokenizer, *, prompt: str, max_new_tokens: int,
                temperature: float = 0.8, top_k: int | None = None,
                top_p: float | None = None, seed: int = 0) -> str:
  """prompt + max_new_tokens sampled tokens, decoded (ids past the tokenizer's vocabulary,
  i.e. a padded model vocabulary, are never sampled).

  Models with learned positions cannot look past model.max_len, so beyond it generation
  continues in chunks of max_len // 2 tokens conditioned on the last max_len // 2 (the
  context crop nanoGPT uses); other models decode in one pass.
  """
  if not prompt:
    raise ValueError("--prompt must not be empty")
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
      max_new_tokens < 1):
    raise ValueError(f"--max_new_tokens={max_new_tokens!r} must be an int >= 1")
  m = config.model
  limit = m.max_len if m.get("positions", "learned") == "learned" else None
  out, remaining, chunk = tokenizer.encode(prompt).tolist(), max_new_tokens, 0
  ids = np.asarray(out if limit is None or len(out) < limit else out[-(limit // 2):])
  while remaining > 0:
    n = remaining if limit is None else min(remaining, limit - len(ids))
    chunk_seed = int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0])
    new = generate(m, params, np.asarray(ids), max_new_tokens=n, temperature=temperature,
                   top_k=top_k, top_p=top_p, seed=chunk_seed,
                   vocab_limit=min(tokenizer.vocab_size, m.vocab_size))[len(ids):]
    out.extend(new.tolist())
    remaining -= n
    chunk += 1
    ids = np.asarray(out[-(limit // 2):]) if limit is not None else np.asarray(out)
  return tokenizer.decode(out)
