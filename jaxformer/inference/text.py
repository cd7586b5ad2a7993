"""Text in, text out: a prompt continued by a decoder LM, decoded with the run's tokenizer."""

from __future__ import annotations

import numpy as np

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
  m = config.model
  limit = m.max_len if m.get("positions", "learned") == "learned" else None
  out, remaining, chunk = tokenizer.encode(prompt).tolist(), max_new_tokens, 0
  ids = np.asarray(out if limit is None or len(out) < limit else out[-(limit // 2):])
  while remaining > 0:
    # Every chunk after the first has one shape (a full window; the last is cut), so the
    # whole sample compiles at most twice. A token depends on its index, not on n.
    n = remaining if limit is None else limit - len(ids)
    chunk_seed = int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0])
    new = generate(m, params, np.asarray(ids), max_new_tokens=n, temperature=temperature,
                   top_k=top_k, top_p=top_p, seed=chunk_seed,
                   vocab_limit=min(tokenizer.vocab_size, m.vocab_size))[len(ids):]
    out.extend(new[:remaining].tolist())
    remaining -= min(n, remaining)
    chunk += 1
    ids = np.asarray(out[-(limit // 2):]) if limit is not None else np.asarray(out)
  return tokenizer.decode(out)
