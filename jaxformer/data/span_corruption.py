"""T5's span-corruption objective (Raffel et al., 2020, Sec. 3.1.4 and 3.3.4) on text.

A window of `seq_len` tokens gets `round(seq_len * noise_density)` noise tokens in
`round(noise / mean_noise_span_length)` spans. Both the noise and the non-noise tokens are
split into that many spans at random: a uniformly random composition of each count into
positive parts ("random segmentation"), the spans then alternating non-noise, noise,
non-noise, ..., as T5 lays them out (so the window ends in a noise span). The encoder input
keeps the non-noise tokens with each noise span replaced by one sentinel; the target lists
every sentinel followed by the span it replaced; both end with EOS:

    tokens   Thank you for inviting me to your party last week
    inputs   Thank you <S0> me to your party <S1> week <EOS>
    targets  <S0> for inviting <S1> last <EOS>

The lengths are fixed by seq_len (`lengths`), so batches need no padding. Sentinels are the
top ids of the data's vocabulary: sentinel k is `vocab_size - 1 - k`, with `num_sentinels`
(T5: 100 "extra ids") ids appended after the tokenizer's vocabulary and, where the tokenizer
has none, a pad id (T5's decoder start id) and an EOS id before them. The decoder input is
the target shifted right behind the pad id (T5's `decoder_start_token_id`).

`data` keys (`settings.SpanCorruptionSettings`): `noise_density` (0.15),
`mean_noise_span_length` (3.0), `num_sentinels` (100), and the text source's keys. Batches: {'src', 'src_mask', 'tgt_in',
'tgt_out', 'weights'} (the seq2seq layout); a pure function of (seed, split, step, row).
"""

from __future__ import annotations

import numpy as np

from jaxformer.data import settings as source_settings
from jaxformer.data import tokenizers
from jaxformer.data.text import _KeyedWindowsMixin, _TextPipeline

_DEFAULTS = source_settings.defaults("span_corruption")
NOISE_DENSITY, MEAN_NOISE_SPAN_LENGTH, NUM_SENTINELS = (
    _DEFAULTS["noise_density"], _DEFAULTS["mean_noise_span_length"], _DEFAULTS["num_sentinels"])


def span_counts(length: int, noise_density: float = NOISE_DENSITY,
                mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> tuple[int, int]:
  """(noise tokens, noise spans) of a window of `length` tokens (length >= 2): at least one
  noise and one non-noise token, and no more spans than either count allows."""
  if length < 2:
    raise ValueError(f"span corruption needs windows of >= 2 tokens; got {length}")
  noise = min(max(int(round(length * noise_density)), 1), length - 1)
  spans = max(int(round(noise / mean_noise_span_length)), 1)
  return noise, min(spans, noise, length - noise)


def lengths(length: int, noise_density: float = NOISE_DENSITY,
            mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> tuple[int, int]:
  """(encoder input length, target length) of a window of `length` tokens: non-noise tokens +
  one sentinel per span + EOS, and noise tokens + one sentinel per span + EOS."""
  noise, spans = span_counts(length, noise_density, mean_noise_span_length)
  return length - noise + spans + 1, noise + spans + 1


def random_segmentation(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
  """`total` split into `parts` positive integers, every such composition equally likely:
  the parts - 1 cut points are a uniformly random subset of the total - 1 gaps."""
  if not 1 <= parts <= total:
    raise ValueError(f"cannot split {total} items into {parts} non-empty parts")
  cuts = np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False))
  return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int64)


def noise_mask(length: int, rng: np.random.Generator, *,
               noise_density: float = NOISE_DENSITY,
               mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> np.ndarray:
  """bool [length], True at noise tokens: spans alternate non-noise, noise, ... (see module)."""
  noise, spans = span_counts(length, noise_density, mean_noise_span_length)
  noise_lengths = random_segmentation(noise, spans, rng)
  keep_lengths = random_segmentation(length - noise, spans, rng)
  span_lengths = np.stack([keep_lengths, noise_lengths], axis=1).reshape(-1)
  is_noise = np.tile([False, True], spans)
  return np.repeat(is_noise, span_lengths)


def corrupt(tokens: np.ndarray, mask: np.ndarray, *, vocab_size: int,
            eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """(inputs, targets) of `tokens` with noise `mask`: each noise span -> one sentinel in the
  inputs; the targets list each sentinel then its span; both end with `eos_id`. Sentinel k
  (k-th span) is `vocab_size - 1 - k`."""
  tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
  starts = mask & ~np.concatenate([[False], mask[:-1]])       # first token of each noise span
  sentinels = vocab_size - 1 - np.arange(int(starts.sum()))
  inputs = tokens.copy()
  inputs[starts] = sentinels
  inputs = inputs[~mask | starts]
  # the noise tokens, with each span's sentinel inserted before its first token
  targets = np.insert(tokens[mask], np.flatnonzero(starts[mask]), sentinels)
  eos = np.asarray([eos_id], tokens.dtype)
  return (np.concatenate([inputs, eos]).astype(np.int32),
          np.concatenate([targets, eos]).astype(np.int32))


def reconstruct(inputs, targets, *, vocab_size: int, num_sentinels: int,
                eos_id: int) -> np.ndarray:
  """The original tokens from (inputs, targets): each sentinel of the inputs replaced by the
  tokens that follow it in the targets (the inverse of `corrupt`)."""
  is_sentinel = lambda i: vocab_size - num_sentinels <= i < vocab_size
  spans, current = {}, None
  for i in map(int, targets):
    if i == eos_id:
      break
    if is_sentinel(i):
      current = spans.setdefault(i, [])
    elif current is not None:
      current.append(i)
  out = []
  for i in map(int, inputs):
    if i == eos_id:
      break
    out.extend(spans.get(i, []) if is_sentinel(i) else [i])
  return np.asarray(out, np.int32)


def example(tokens: np.ndarray, rng: np.random.Generator, *, vocab_size: int, eos_id: int,
            pad_id: int, noise_density: float = NOISE_DENSITY,
            mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH) -> dict[str, np.ndarray]:
  """One seq2seq example of the window `tokens`: src, src_mask, tgt_in (pad id + target[:-1]),
  tgt_out, weights."""
  mask = noise_mask(len(tokens), rng, noise_density=noise_density,
                    mean_noise_span_length=mean_noise_span_length)
  src, tgt = corrupt(tokens, mask, vocab_size=vocab_size, eos_id=eos_id)
  return {"src": src, "src_mask": np.ones(src.shape, bool),
          "tgt_in": np.concatenate([[pad_id], tgt[:-1]]).astype(np.int32), "tgt_out": tgt,
          "weights": np.ones(tgt.shape, np.float32)}


def options(data) -> tuple[float, float, int]:
  """(noise_density, mean_noise_span_length, num_sentinels) of the typed settings (or a data
  section, parsed)."""
  data = source_settings.coerce("span_corruption", data)
  return data.noise_density, data.mean_noise_span_length, data.num_sentinels


class SpanCorruptionPipeline(_KeyedWindowsMixin, _TextPipeline):
  """T5 span corruption on random stream windows of `data.seq_len` tokens (see module)."""
  task = "span_corruption"
  data_kind = "span_corruption"

  def __init__(self, data, **kw):
    super().__init__(data, **kw)
    self.noise_density, self.mean_span, self.num_sentinels = options(self.data)
    noise, spans = span_counts(self.seq_len, self.noise_density, self.mean_span)
    if spans > self.num_sentinels:
      raise ValueError(f"data.num_sentinels={self.num_sentinels} is fewer than the {spans} "
                       f"noise spans of a data.seq_len={self.seq_len} window; raise it to "
                       f">= {spans}")
    ids, next_id = tokenizers.special_ids(self.tokenizer,
                                          tokenizers.TASK_SPECIAL_IDS[self.task])
    self.pad_id, self.eos_id = ids["pad_id"], ids["eos_id"]
    self.vocab_size = next_id + self.num_sentinels
    src_len, tgt_len = lengths(self.seq_len, self.noise_density, self.mean_span)
    self.info = {"vocab_size": self.vocab_size, "src_len": src_len, "tgt_len": tgt_len}
    self._load_streams(self.seq_len)

  def _transform(self, window: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return example(window, rng, vocab_size=self.vocab_size, eos_id=self.eos_id,
                   pad_id=self.pad_id, noise_density=self.noise_density,
                   mean_noise_span_length=self.mean_span)
