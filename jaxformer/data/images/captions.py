"""Captioned digit composites (task 'captioning'): digits on a grid, described in words.

Why: a captioning task with known answers that still needs the image. Each image is a G x G
grid of cells (`data.grid`) of `digit_size + jitter` pixels; n of the cells (n uniform in
[`data.min_digits`, `data.max_digits`], cells without replacement) each hold one source digit,
resized to `data.digit_size` by area averaging and placed at a random offset in [0, jitter]
inside its cell. The caption reads the digits in reading order (row-major over cells), with a
relation between consecutive digits: "left of" when the next one is in the same row, "above"
when it is in a lower row, e.g. "seven left of three above five".

Train composites draw digit images from the source's train split only and eval composites
from its test split only, so eval digits are held out. Example `index` of a split is a pure
function of `np.random.default_rng([seed, split_id, index])` (as in `jaxformer.data.synthetic`),
so batches are a function of (seed, step) and a resumed run reads what an uninterrupted one
would. Sources: 'mnist:<dir>' (28x28, digit_size 14 by default: an exact 2x2 mean) or 'digits'
(scikit-learn's 8x8 digits, kept at their native 8 by default).

Tokens: PAD=0, BOS=1, EOS=2, then `WORDS`; tgt_in = BOS + words, tgt_out = words + EOS, both
PAD-padded to `caption_length` = 3 * max_digits - 1 (the longest caption, 3n - 2 words, + EOS).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import grain
import numpy as np

from jaxformer.data import batching
from jaxformer.data import settings as source_settings
from jaxformer.data.synthetic import BOS, EOS, NUM_SPECIAL, PAD, pad_target

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
WORDS = DIGIT_WORDS + ("left", "of", "above")
VOCAB_SIZE = NUM_SPECIAL + len(WORDS)
SAME_ROW, LOWER_ROW = ("left", "of"), ("above",)
_WORD_IDS = {word: NUM_SPECIAL + i for i, word in enumerate(WORDS)}
_SPLITS = {"train": (0, "train"), "eval": (1, "test")}     # split -> (rng split id, source split)
SOURCE_FORMS = source_settings.CAPTION_SOURCES


# --- captions ---------------------------------------------------------------------------------


def caption_words(labels: Sequence[int], cells: Sequence[tuple[int, int]]) -> list[str]:
  """The caption of digits `labels` at grid `cells` ((row, col) each, in any order)."""
  if len(labels) != len(cells):
    raise ValueError(f"{len(labels)} labels but {len(cells)} cells")
  placed = sorted((int(r), int(c), int(d)) for d, (r, c) in zip(labels, cells))
  if len({(r, c) for r, c, _ in placed}) != len(placed):
    raise ValueError(f"cells {list(cells)} repeat a cell; each cell holds one digit")
  words = []
  for i, (row, _, digit) in enumerate(placed):
    if i:
      words.extend(SAME_ROW if row == placed[i - 1][0] else LOWER_ROW)
    words.append(DIGIT_WORDS[digit])
  return words


def encode(words: Iterable[str]) -> np.ndarray:
  """Word ids (int32, no BOS/EOS) of `words`."""
  try:
    return np.array([_WORD_IDS[w] for w in words], np.int32)
  except KeyError as e:
    raise ValueError(f"{e.args[0]!r} is not a caption word; the words are {WORDS}") from None


def decode(token_ids: Iterable[int]) -> list[str]:
  """The words of a token sequence: PAD and BOS skipped, stopping at the first EOS (so a
  model's greedy output or a padded tgt_out reads back directly)."""
  words = []
  for t in np.asarray(token_ids).reshape(-1).tolist():
    if t == EOS:
      break
    if t in (PAD, BOS):
      continue
    if not NUM_SPECIAL <= t < VOCAB_SIZE:
      raise ValueError(f"token id {t} is outside the caption vocabulary [0, {VOCAB_SIZE})")
    words.append(WORDS[t - NUM_SPECIAL])
  return words


# --- config -----------------------------------------------------------------------------------


# The checked `data.*` fields of a captioning config: `settings.CaptionSettings` (its defaults,
# ranges and checks across fields; digit_size resolved from the source when None).
CaptionOptions = source_settings.CaptionSettings
_source_kind = source_settings.caption_source_kind


def options(data) -> CaptionOptions:
  """The typed caption settings of `data` (returned as they are, or a data section parsed):
  a ValueError names the first bad field."""
  return source_settings.coerce("captions", data)


def image_size(data) -> int:
  """Side of the square composite: grid * (digit_size + jitter)."""
  return options(data).image_size


def caption_length(data) -> int:
  """Tokens of tgt_in / tgt_out: the longest caption (3 * max_digits - 2 words) + EOS."""
  return options(data).caption_length


# --- composites -------------------------------------------------------------------------------


def resize_area(images: np.ndarray, size: int) -> np.ndarray:
  """uint8 [N, H, W] -> float32 [N, size, size] in [0, 1], by area averaging: each output
  pixel is the mean of the input area it covers (an exact k x k mean when size divides H)."""
  n, h, w = images.shape
  if h % size == 0 and w % size == 0:        # integer sums, one rounding: exact means
    sums = images.reshape(n, size, h // size, size, w // size).sum((2, 4), dtype=np.int64)
    return (sums / (255.0 * (h // size) * (w // size))).astype(np.float32)
  rows, cols = _area_weights(h, size), _area_weights(w, size)
  return np.concatenate([                    # in chunks: float64 copies of 60k images are big
      np.einsum("oh,nhw,pw->nop", rows, chunk / 255.0, cols).astype(np.float32)
      for chunk in np.array_split(images, max(1, n // 4096))])


def _area_weights(n_in: int, n_out: int) -> np.ndarray:
  """[n_out, n_in]: the share of output pixel o's interval [o, o+1) * n_in / n_out that input
  pixel i covers (rows sum to 1)."""
  scale = n_in / n_out
  lo = np.arange(n_out)[:, None] * scale
  i = np.arange(n_in)[None, :]
  return np.clip(np.minimum(lo + scale, i + 1) - np.maximum(lo, i), 0, None) / scale


class CaptionTask:
  """The example generator `data.*` describes: (split, index) -> composite and its caption."""

  def __init__(self, data, *, seed: int = 0, data_dir: str | None = None):
    from jaxformer.data.images.pipeline import open_source
    self.options, self.seed = options(data), seed
    _source_kind(self.options.source)
    source = open_source(self.options, data_dir=data_dir)
    if source.image_shape[-1] != 1:
      raise ValueError(f"data.source={source.name!r} has {source.image_shape[-1]} channels; "
                       "captioning composes grayscale digits")
    self.source_name = source.name
    self.digits, self.labels = {}, {}          # split -> float32 [N, d, d], int32 [N]
    for split, (_, source_split) in _SPLITS.items():
      images, labels = source.split_arrays(source_split)
      self.digits[split] = resize_area(images[..., 0], self.options.digit_size)
      self.labels[split] = labels.astype(np.int32)

  def example(self, split: str, index: int, num_digits: int | None = None) -> dict:
    """Composite `index` of `split` ("train" | "eval"): image float32 [S, S, 1]; labels [n],
    cells [n, 2] (row, col) and offsets [n, 2] (dy, dx in the cell) in reading order;
    digit_indices [n] into the split's digits; words; and the padded tgt_in / tgt_out /
    weights. `num_digits` forces n (1 .. data.max_digits), e.g. for an eval set of one n."""
    o = self.options
    if split not in _SPLITS:
      raise ValueError(f"split={split!r} must be one of {sorted(_SPLITS)}")
    rng = np.random.default_rng([self.seed, _SPLITS[split][0], index])
    n = int(rng.integers(o.min_digits, o.max_digits + 1))   # drawn always: same stream after
    if num_digits is not None:
      if isinstance(num_digits, bool) or not isinstance(num_digits, (int, np.integer)) or not (
          1 <= num_digits <= o.max_digits):
        raise ValueError(f"num_digits={num_digits!r} must be an int in [1, {o.max_digits}] "
                         "(data.max_digits: the captions must fit caption_length)")
      n = int(num_digits)
    flat = np.sort(rng.choice(o.grid * o.grid, size=n, replace=False))
    cells = np.stack(np.divmod(flat, o.grid), 1)
    digit_indices = rng.integers(len(self.labels[split]), size=n)
    offsets = rng.integers(0, o.jitter + 1, size=(n, 2))
    image = np.zeros((o.image_size, o.image_size), np.float32)
    d = o.digit_size
    for (row, col), (dy, dx), k in zip(cells, offsets, digit_indices):
      y, x = row * o.cell_size + dy, col * o.cell_size + dx
      image[y:y + d, x:x + d] = np.maximum(image[y:y + d, x:x + d], self.digits[split][k])
    labels = self.labels[split][digit_indices]
    words = caption_words(labels, cells)
    return {"image": image[..., None], "labels": labels, "cells": cells, "offsets": offsets,
            "digit_indices": digit_indices, "words": words,
            **pad_target(encode(words), o.caption_length)}

  def record(self, split: str, index: int) -> dict[str, np.ndarray]:
    """The batch keys of one example: images, tgt_in, tgt_out, weights."""
    ex = self.example(split, index)
    return {"images": ex["image"], **{k: ex[k] for k in ("tgt_in", "tgt_out", "weights")}}


# --- pipeline ---------------------------------------------------------------------------------


class CaptionPipeline(batching.SplitPipeline):
  """Captioning batches: images [B, S, S, 1] float32 in [0, 1], tgt_in / tgt_out [B, L] int32,
  weights [B, L] float32 (eval batches add `valid`)."""
  task = "captioning"

  def __init__(self, data, *, seed: int, global_batch_size: int, eval_batch_size: int,
               process_index: int = 0, process_count: int = 1, workdir: str | None = None,
               data_dir: str | None = None):
    del workdir                          # the source's cache lives under data_dir
    self.generator = CaptionTask(data, seed=seed, data_dir=data_dir)
    o = self.generator.options
    self.num_train, self.num_eval = o.num_train, o.num_eval
    self.info = {"vocab_size": VOCAB_SIZE, "image_size": o.image_size,
                 "caption_length": o.caption_length}
    kw = dict(seed=seed, global_batch_size=global_batch_size, eval_batch_size=eval_batch_size,
              process_index=process_index, process_count=process_count)
    self._batch_splits(self._records("train", self.num_train),
                       self._records("eval", self.num_eval), **kw)

  def _records(self, split: str, size: int) -> grain.MapDataset:
    return grain.MapDataset.range(size).map(lambda i: self.generator.record(split, int(i)))


def make_caption_pipeline(data, *, seed: int, global_batch_size: int,
                          eval_batch_size: int, process_index: int = 0, process_count: int = 1,
                          workdir: str | None = None,
                          data_dir: str | None = None) -> CaptionPipeline:
  return CaptionPipeline(data, seed=seed, global_batch_size=global_batch_size,
                         eval_batch_size=eval_batch_size, process_index=process_index,
                         process_count=process_count, workdir=workdir, data_dir=data_dir)


def describe(pipeline: CaptionPipeline) -> str:
  o, info = pipeline.generator.options, pipeline.info
  return (f"{pipeline.generator.source_name} captions: {pipeline.num_train} train / "
          f"{pipeline.num_eval} eval composites of {o.min_digits}..{o.max_digits} digits on a "
          f"{o.grid}x{o.grid} grid, {info['image_size']}x{info['image_size']} images, vocab "
          f"{info['vocab_size']} (caption_length {info['caption_length']})")
