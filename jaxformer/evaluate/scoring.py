"""Log-probabilities of token sequences under a decoder LM: the one scoring core that the
perplexity of a corpus, multiple-choice scoring and the lm-evaluation-harness adapter share.

A scoring row is a token sequence `seq` (at most `width + 1` tokens, `width` the model's
context) and the index `first` of its first scored token: the row predicts seq[first:] from
everything before it. Rows are right-padded into batches of `batch_size` rows whose length
is the smallest bucket (a power of two >= 16, or `width`) that holds the longest row, so a
run of evaluation compiles once per bucket, not once per length. A causal model never looks
right, so padding after a row changes none of its scores.

`rolling_rows` cuts one long sequence into rows that predict each of its tokens exactly
once, each with as much context as the model takes: consecutive windows of `width`
predictions (the windows training's eval reads with data.eval_batches=None), the last one
given the full `width` tokens of context and scoring only the tokens not yet scored (the
rule lm-evaluation-harness's `loglikelihood_rolling` states).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import models, run_settings

MIN_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class Row:
  """A sequence and the index of its first scored token (>= 1)."""
  tokens: tuple[int, ...]
  first: int

  @property
  def scored(self) -> int:
    return len(self.tokens) - self.first


@dataclasses.dataclass(frozen=True)
class RowScore:
  """Per scored token: its log-probability and whether it is the argmax (greedy) token."""
  logprobs: np.ndarray          # float64 [scored]
  greedy: np.ndarray            # bool [scored]

  @property
  def total(self) -> float:
    return float(self.logprobs.sum())

  @property
  def is_greedy(self) -> bool:
    return bool(self.greedy.all())


def rolling_rows(tokens: Sequence[int], width: int, prefix: int | None = None) -> list[Row]:
  """Rows that score every token of `tokens` once (the first only when `prefix`, a token
  to condition it on, is given); see the module docstring."""
  seq = ([int(prefix)] if prefix is not None else []) + [int(t) for t in tokens]
  rows, first = [], 1
  while first < len(seq):
    last = min(first + width, len(seq))              # predictions [first, last)
    start = max(0, last - 1 - width)                 # inputs seq[start:last - 1]
    rows.append(Row(tuple(seq[start:last]), first - start))
    first = last
  return rows


def continuation_row(context: Sequence[int], continuation: Sequence[int], width: int) -> Row:
  """The row scoring `continuation` after `context` (context cut on the left to fit)."""
  if not continuation:
    raise ValueError("the continuation is empty: there is nothing to score")
  if len(continuation) > width:
    raise ValueError(f"the continuation is {len(continuation)} tokens, more than the model's "
                     f"context of {width}; shorten it")
  if not context:
    raise ValueError("the context is empty and the model has no token to start from")
  seq = (list(context) + list(continuation))[-(width + 1):]
  return Row(tuple(int(t) for t in seq), len(seq) - len(continuation))


@functools.partial(jax.jit, static_argnames=("module", "vocab_limit"))
def _token_scores(module, params, inputs, targets, *, vocab_limit):
  logits = module.apply({"params": params}, inputs, deterministic=True).astype(jnp.float32)
  logp = (jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
          - jax.nn.logsumexp(logits, axis=-1))
  if vocab_limit is not None:                        # padded vocabulary rows: never greedy
    logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits, -jnp.inf)
  return logp, jnp.argmax(logits, axis=-1) == targets


class Scorer:
  """Scores rows with a decoder LM's params; `width` is its context (the run's
  data.seq_len, at most model.max_len where positions are learned)."""

  def __init__(self, config, params, *, batch_size: int = 16, width: int | None = None,
               vocab_limit: int | None = None):
    m = models.settings_of(config)
    if m.get("family") != "decoder":
      raise ValueError(f"model.family={m.get('family')!r}: scoring text needs a decoder LM "
                       "(family 'decoder')")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
      raise ValueError(f"--batch_size={batch_size!r} must be an int >= 1")
    limit = int(m["max_len"]) if m["positions"] == "learned" else None
    default = run_settings.parse_section("data", config.data).seq_len or m["max_len"]
    width = int(default if width is None else width)
    if width < 1 or (limit is not None and width > limit):
      raise ValueError(f"--max_length={width} must be in [1, model.max_len={limit}] (the "
                       "model's learned position table)" if limit else
                       f"--max_length={width} must be >= 1")
    self.width, self.batch_size = min(width, limit or width), batch_size
    self.vocab_size = int(m["vocab_size"])
    self.vocab_limit = None if vocab_limit is None or vocab_limit >= self.vocab_size else int(
        vocab_limit)
    self.module = models.build(m)
    if isinstance(params, Mapping) and "params" in params:
      params = params["params"]
    self.params = nn.unbox(params)

  def bucket(self, length: int) -> int:
    size = MIN_BUCKET
    while size < length:
      size *= 2
    return min(size, self.width)

  def score(self, rows: Sequence[Row]) -> list[RowScore]:
    """The scores of `rows`, in order (batched longest first, lm-eval's order)."""
    for i, row in enumerate(rows):
      if not 1 <= row.first < len(row.tokens) or len(row.tokens) > self.width + 1:
        raise ValueError(f"row {i}: {len(row.tokens)} tokens scored from {row.first}; a row "
                         f"holds 2 to {self.width + 1} tokens and scores at least one")
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i].tokens))
    out: list[RowScore | None] = [None] * len(rows)
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      width = self.bucket(max(len(rows[i].tokens) - 1 for i in chunk))
      inputs = np.zeros((self.batch_size, width), np.int32)
      targets = np.zeros((self.batch_size, width), np.int32)
      for r, i in enumerate(chunk):
        seq = np.asarray(rows[i].tokens, np.int32)
        inputs[r, :len(seq) - 1], targets[r, :len(seq) - 1] = seq[:-1], seq[1:]
      logp, greedy = jax.device_get(_token_scores(self.module, self.params, inputs, targets,
                                                  vocab_limit=self.vocab_limit))
      for r, i in enumerate(chunk):
        row = rows[i]
        span = slice(row.first - 1, len(row.tokens) - 1)
        out[i] = RowScore(logp[r, span].astype(np.float64), greedy[r, span].copy())
    return out

  def score_sequence(self, tokens: Sequence[int], prefix: int | None = None) -> RowScore:
    """Every token of `tokens` (after the first, unless `prefix`) scored once with rolling
    windows, as one RowScore."""
    scores = self.score(rolling_rows(tokens, self.width, prefix))
    return concatenate(scores)


def concatenate(scores: Sequence[RowScore]) -> RowScore:
  if not scores:
    return RowScore(np.zeros(0, np.float64), np.zeros(0, bool))
  return RowScore(np.concatenate([s.logprobs for s in scores]),
                  np.concatenate([s.greedy for s in scores]))


def check_vocab(config, tokenizer):
  """The run's tokenizer fits its model (a text run with its tokenizer.json)."""
  if tokenizer is None:
    raise ValueError("this run has no tokenizer (tokenizer.json is missing from its workdir); "
                     "rerun train on the workdir with the same data.source and data.tokenizer "
                     "to write it again")
  vocab = models.settings_of(config).vocab_size
  if tokenizer.vocab_size > vocab:
    raise ValueError(f"the run's tokenizer has {tokenizer.vocab_size} ids but "
                     f"model.vocab_size={vocab}; the tokenizer does not "
                     "belong to this model")


def start_token(tokenizer) -> int | None:
  """The token an empty context conditions on: the tokenizer's eos (documents follow one in
  a token stream), else its bos, else a newline where it is one token (the char and most
  text tokenizers), else None."""
  for special in (tokenizer.eos_id, tokenizer.bos_id):
    if special is not None:
      return int(special)
  try:
    ids = tokenizer.encode("\n")
  except ValueError:
    return None
  return int(ids[0]) if len(ids) == 1 else None
