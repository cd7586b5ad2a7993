"""A copy ("induction") needle in real text: can a model retrieve a string from its context?

    needles = make_needles(text_tokens, context_len=256, needle_len=8, cue_len=2,
                           alphabet=rare_tokens(text_tokens, 8), depths=[0.1, 0.5], count=32)
    score_needles(logits_fn, needles)      # {"accuracy": ..., "exact": ..., "chance": ...}

Each example is one row of `context_len` tokens: a window of real text with a random string
(the needle: `needle_len` tokens drawn with replacement from `alphabet`, e.g. the corpus's
rarest characters) inserted at `depth` (the fraction of the text before it), and the text's
end followed by the needle again. The first `cue_len` needle tokens of that repeat are the cue;
the other `needle_len - cue_len` are the answer, scored. The alphabet's tokens being rare in
the text, the language alone predicts them badly: a correct answer needs the model to find the
cue earlier in its context and copy what followed it (an induction head), so it measures
whether the needle is still in reach, e.g. through a compressed KV cache.

`logits_fn` is any callable `tokens [B, T] int32 -> logits [B, T, V]` of a causal model (the
logits at position t depend on tokens[:, :t + 1] only): a plain forward pass
(`forward_logits_fn`) or a decode through a compressed cache
(`jaxformer.inference.streaming.stream_logits`). Two scorings:
- "teacher_forced": one call; answer token i is right when the argmax of the logits at the
  position before it is the token;
- "greedy": the answer is produced one token at a time from the model's own previous answers
  (`needle_len - cue_len` calls, every one on the full, fixed-shape rows: a causal model does
  not see the tokens after the position it predicts, so they are left as they are).

`chance` is 1 / len(alphabet) (guessing the alphabet's tokens uniformly); a model that
ignores the context does about that well or worse.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence

import numpy as np

SCORINGS = ("teacher_forced", "greedy")


@dataclasses.dataclass(frozen=True)
class Needles:
  """A batch of needle rows (all numpy).

  tokens: int32 [N, L], the rows; answer_mask: bool [N, L], True on the answer tokens (the
  scored ones: the repeat's last `needle_len - cue_len` tokens, at the end of every row);
  needle_start: int [N], where the first copy of the needle begins; depth: float [N], the
  requested depth of each row; alphabet: the tokens needles are drawn from.
  """
  tokens: np.ndarray
  answer_mask: np.ndarray
  needle_start: np.ndarray
  depth: np.ndarray
  needle_len: int
  cue_len: int
  alphabet: tuple[int, ...]

  @property
  def answer_start(self) -> int:
    """Index of the first answer token (the same in every row)."""
    return self.tokens.shape[1] - (self.needle_len - self.cue_len)

  @property
  def distance(self) -> np.ndarray:
    """Tokens between the needle's first copy and the cue's last token, per row: how far
    back the model must look (a cache that keeps fewer recent tokens loses the needle)."""
    return (self.answer_start - 1) - self.needle_start

  def rows(self, keep) -> "Needles":
    """The rows selected by `keep` (a boolean mask or indices)."""
    return dataclasses.replace(self, tokens=self.tokens[keep],
                               answer_mask=self.answer_mask[keep],
                               needle_start=self.needle_start[keep], depth=self.depth[keep])


def rare_tokens(text_tokens, count: int, *, min_count: int = 1) -> tuple[int, ...]:
  """The `count` least frequent token ids of `text_tokens` among those occurring at least
  `min_count` times (ties: smaller id first): an alphabet whose tokens the text rarely
  predicts but the model has seen."""
  tokens = np.asarray(text_tokens).ravel()
  if tokens.size == 0 or tokens.dtype.kind not in "iu":
    raise ValueError("text_tokens must be a non-empty integer array")
  ids, counts = np.unique(tokens, return_counts=True)
  keep = counts >= min_count
  ids, counts = ids[keep], counts[keep]
  if not isinstance(count, numbers.Integral) or isinstance(count, bool) or not (
      2 <= count <= ids.size):
    raise ValueError(f"count={count!r} must be an int in [2, {ids.size}] (the distinct tokens "
                     f"occurring >= min_count={min_count} times)")
  order = np.lexsort((ids, counts))
  return tuple(int(i) for i in ids[order[:count]])


def make_needles(text_tokens, *, context_len: int, alphabet: Sequence[int],
                 depths: Sequence[float] = (0.5,), count: int = 16, needle_len: int = 8,
                 cue_len: int = 2, seed: int = 0) -> Needles:
  """`count` rows per depth (rows ordered depth by depth), each from its own random window
  of `text_tokens` (1-D real text, e.g. a validation split).

  Row layout (L = context_len, n = needle_len, c = cue_len, m = L - 2 n text tokens):
  text[:round(depth * m)], needle, text[round(depth * m):m], needle[:c], needle[c:] (answer).
  depth 0: the needle opens the row; depth 1: it sits just before the cue's repeat.
  Needles are drawn with replacement from `alphabet`, every run of c tokens in a needle
  distinct (so the last c tokens always name one place to copy from: the task is well posed
  for a copier reading c tokens back).
  """
  text = np.asarray(text_tokens)
  if text.ndim != 1 or text.dtype.kind not in "iu":
    raise ValueError(f"text_tokens must be a 1-D integer array; got {text.dtype} {text.shape}")
  for name, value, low in (("needle_len", needle_len, 2), ("cue_len", cue_len, 1),
                           ("count", count, 1), ("context_len", context_len, 1)):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
      raise ValueError(f"{name}={value!r} must be an int >= {low}")
  if cue_len >= needle_len:
    raise ValueError(f"cue_len={cue_len} must be < needle_len={needle_len} (the rest is "
                     "the answer)")
  text_len = context_len - 2 * needle_len
  if text_len < 1 or text.size < text_len:
    raise ValueError(f"context_len={context_len} leaves {text_len} text tokens for a needle of "
                     f"{needle_len} and a cue of {cue_len}; it must leave >= 1, and "
                     f"text_tokens ({text.size}) must hold them")
  alphabet = tuple(int(a) for a in alphabet)
  if len(set(alphabet)) < 2:
    raise ValueError(f"alphabet={alphabet} needs >= 2 distinct token ids")
  depths = [float(d) for d in depths]
  if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
    raise ValueError(f"depths={depths} must be a non-empty list of fractions in [0, 1]")
  rng = np.random.default_rng(seed)
  rows, starts, row_depths = [], [], []
  for depth in depths:
    for _ in range(count):
      offset = int(rng.integers(0, text.size - text_len + 1))
      window = text[offset:offset + text_len]
      needle = _draw_needle(rng, alphabet, needle_len, cue_len)
      at = int(round(depth * text_len))
      rows.append(np.concatenate([window[:at], needle, window[at:], needle]))
      starts.append(at)
      row_depths.append(depth)
  tokens = np.stack(rows).astype(np.int32)
  mask = np.zeros(tokens.shape, bool)
  mask[:, context_len - (needle_len - cue_len):] = True
  return Needles(tokens=tokens, answer_mask=mask, needle_start=np.asarray(starts),
                 depth=np.asarray(row_depths), needle_len=int(needle_len),
                 cue_len=int(cue_len), alphabet=alphabet)


def _draw_needle(rng, alphabet, n, c):
  for _ in range(1000):
    needle = rng.choice(np.asarray(alphabet), size=n)
    grams = [tuple(needle[i:i + c]) for i in range(n - c + 1)]
    if len(set(grams)) == len(grams):
      return needle
  raise ValueError(f"could not draw a needle of {n} tokens from {len(alphabet)} whose "
                   f"{c}-token runs all differ; use a larger alphabet or a longer cue")


def score_needles(logits_fn: Callable, needles: Needles, *, scoring: str = "teacher_forced",
                  batch_size: int | None = None) -> dict:
  """Answer accuracy of `logits_fn` (tokens [B, L] -> logits [B, L, V], causal) on
  `needles`: {"accuracy": fraction of answer tokens right, "exact": fraction of rows with
  every answer token right, "chance": 1 / len(alphabet), "rows", "scoring", and per row
  "row_accuracy" (a list, for intervals)}. `batch_size` rows per call (default all)."""
  if scoring not in SCORINGS:
    raise ValueError(f"scoring={scoring!r} is not one of {SCORINGS}")
  n = needles.tokens.shape[0]
  if batch_size is None:
    batch_size = n
  if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or (
      batch_size < 1):
    raise ValueError(f"batch_size={batch_size!r} must be an int >= 1")
  correct = []
  for lo in range(0, n, batch_size):
    tokens = needles.tokens[lo:lo + batch_size]
    correct.append(_answers_correct(logits_fn, tokens, needles.answer_start, scoring))
  correct = np.concatenate(correct)                                  # [N, answer_len]
  row = correct.mean(axis=1)
  return {"accuracy": float(correct.mean()), "exact": float(correct.all(axis=1).mean()),
          "chance": 1.0 / len(set(needles.alphabet)), "rows": int(n), "scoring": scoring,
          "row_accuracy": [float(r) for r in row]}


def _answers_correct(logits_fn, tokens, start, scoring):
  """bool [B, answer_len]: whether each answer token is predicted."""
  answer = tokens[:, start:]
  if scoring == "teacher_forced":
    logits = _checked_logits(logits_fn, tokens)
    return np.argmax(logits[:, start - 1:-1], axis=-1) == answer
  rows = tokens.copy()
  for i in range(answer.shape[1]):            # answer i from the model's answers before it
    logits = _checked_logits(logits_fn, rows)
    rows[:, start + i] = np.argmax(logits[:, start + i - 1], axis=-1)
  return rows[:, start:] == answer


def _checked_logits(logits_fn, tokens):
  logits = np.asarray(logits_fn(tokens))
  if logits.ndim != 3 or logits.shape[:2] != tokens.shape:
    raise ValueError(f"logits_fn must map tokens {tokens.shape} to logits [B, L, V]; got "
                     f"shape {logits.shape}")
  return logits


def forward_logits_fn(model_config, params) -> Callable:
  """`tokens [B, L] -> logits [B, L, V]` by the model's plain (training-time) forward pass,
  jitted once per shape: the reference scoring for a full-attention checkpoint."""
  import jax                                # noqa: PLC0415  (a numpy-only module otherwise)
  import jax.numpy as jnp                   # noqa: PLC0415
  import flax.linen as nn                   # noqa: PLC0415
  from jaxformer import models              # noqa: PLC0415

  model = models.build(model_config)
  if isinstance(params, dict) and "params" in params:
    params = params["params"]
  params = nn.unbox(params)
  apply = jax.jit(lambda p, t: model.apply({"params": p}, t))
  return lambda tokens: np.asarray(apply(params, jnp.asarray(tokens, jnp.int32)))


__all__ = ["Needles", "rare_tokens", "make_needles", "score_needles", "forward_logits_fn",
           "SCORINGS"]
