"""Text in, text out: a prompt continued by a decoder LM, decoded with the run's tokenizer."""

from __future__ import annotations

import numpy as np

from jaxformer import models
from jaxformer.inference.decode import generate


def sample_text(config, params, tokenizer, *, prompt: str, max_new_tokens: int,
                temperature: float = 0.8, top_k: int | None = None,
                top_p: float | None = None, seed: int = 0) -> str:
  """prompt + max_new_tokens sampled tokens, decoded (ids past the tokenizer's vocabulary,
  i.e. a padded model vocabulary, are never sampled).

  Models with learned positions cannot look past model.max_len, so beyond it generation
  continues in chunks of max_len // 2 tokens conditioned on the last max_len // 2 (the
  context crop nanoGPT uses; a shorter last chunk is a full one cut, so the chunks after the
  first share one compilation); other models decode in one pass.
  """
  if not prompt:
    raise ValueError("--prompt must not be empty")
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
      max_new_tokens < 1):
    raise ValueError(f"--max_new_tokens={max_new_tokens!r} must be an int >= 1")
  _check_samples_text(config, tokenizer)
  m = models.settings_of(config)
  limit = m["max_len"] if m["positions"] == "learned" else None
  out, remaining, chunk = tokenizer.encode(prompt).tolist(), max_new_tokens, 0
  ids = np.asarray(out if limit is None or len(out) < limit else out[-(limit // 2):])
  while remaining > 0:
    # Every chunk after the first has one shape (a full window; the last is cut), so the
    # whole sample compiles at most twice. A token depends on its index, not on n.
    n = remaining if limit is None else limit - len(ids)
    chunk_seed = int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0])
    new = generate(m, params, np.asarray(ids), max_new_tokens=n, temperature=temperature,
                   top_k=top_k, top_p=top_p, seed=chunk_seed,
                   vocab_limit=min(tokenizer.vocab_size, m["vocab_size"]))[len(ids):]
    out.extend(new[:remaining].tolist())
    remaining -= min(n, remaining)
    chunk += 1
    ids = np.asarray(out[-(limit // 2):]) if limit is not None else np.asarray(out)
  return tokenizer.decode(out)


def _check_samples_text(config, tokenizer):
  """Only a language model with its tokenizer samples text: a clear error for an image or
  sequence-to-sequence run, a run without its tokenizer, or a tokenizer that has ids the
  model cannot produce (it would never sample them, silently)."""
  m = models.settings_of(config)
  task = models.get(m.get("family")).task
  if task != "lm":
    raise ValueError(f"this run is a {m.get('family')!r} model (task {task!r}); sampling "
                     "generates text from language models (family 'decoder') only")
  if tokenizer is None:
    raise ValueError("this run has no tokenizer (tokenizer.json is missing from its workdir); "
                     "rerun train on the workdir with the same data.source and data.tokenizer "
                     "to write it again")
  if tokenizer.vocab_size > m.vocab_size:
    raise ValueError(f"the run's tokenizer has {tokenizer.vocab_size} ids but "
                     f"model.vocab_size={m.vocab_size}: ids past the model's vocabulary could "
                     "never be sampled; the tokenizer does not belong to this model")
