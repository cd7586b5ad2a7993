"""Synthetic seq2seq tasks (copy, reverse, associative recall) generated on the fly.

Why: they test an encoder-decoder end to end in seconds, with known answers and no files.
Example `index` of a split is a pure function of `np.random.default_rng([seed, split_id, index])`;
the train and eval splits use different split ids, so no eval example reuses a train example's
random stream, and the eval set is the same in every run with that seed. Batches go through
`jaxformer.data.batching` like every other pipeline (global batch independent of process count).

Token ids: PAD=0, BOS=1, EOS=2, symbols 3 .. vocab_size + 2. Every batch has the same padded
shapes (src [B, S], targets [B, T]) so the model compiles once.
- copy:    target = source
- reverse: target = source reversed
- recall:  source = k (key, value) pairs then a query key (distinct keys); target = its value.
  Source lengths are 2k + 1 within [min_len, max_len].
"""

from __future__ import annotations

import math

import grain
import numpy as np

from jaxformer.data import batching
from jaxformer.data import settings as source_settings

PAD, BOS, EOS = 0, 1, 2
NUM_SPECIAL = 3
TASKS = ("copy", "reverse", "recall")
_SPLIT_IDS = {"train": 0, "eval": 1}
DEFAULTS = source_settings.defaults("synthetic")     # settings.SyntheticSettings


def _parse_task(source) -> str:
  kind, _, task = str(source).partition(":")
  if kind != "synthetic" or task not in TASKS:
    raise ValueError(f"data.source={source!r} must be one of "
                     f"{['synthetic:' + t for t in TASKS]}")
  return task


def task_generator(data, seed: int = 0) -> "SyntheticTask":
  """The example generator the typed settings `data` (`settings.SyntheticSettings`, or a data
  section to parse) describe (its lengths fix the batch shapes)."""
  data = source_settings.coerce("synthetic", data)
  return SyntheticTask(_parse_task(data.source), vocab_size=data.vocab_size,
                       min_len=data.min_len, max_len=data.max_len, seed=seed)


class SyntheticTask:
  """One task's example generator: (split, index) -> source and target symbol arrays."""

  def __init__(self, task: str, *, vocab_size: int, min_len: int, max_len: int, seed: int):
    if min_len > max_len:
      raise ValueError(f"data.min_len={min_len} > data.max_len={max_len}; lower data.min_len")
    self.task, self.vocab_size, self.seed = task, vocab_size, seed
    self.min_len, self.max_len = min_len, max_len
    if task == "recall":
      self.min_pairs = max(1, math.ceil((min_len - 1) / 2))
      self.max_pairs = (max_len - 1) // 2
      if self.min_pairs > self.max_pairs:
        raise ValueError(f"data.min_len={min_len}, data.max_len={max_len} leave no source "
                         "length 2k+1 (k >= 1 key-value pairs plus a query) for "
                         "synthetic:recall; use data.max_len >= 3 and >= data.min_len")
      if self.max_pairs > vocab_size:
        raise ValueError(f"synthetic:recall needs distinct keys but data.max_len={max_len} "
                         f"allows {self.max_pairs} pairs > data.vocab_size={vocab_size}; "
                         f"raise data.vocab_size to >= {self.max_pairs} or lower data.max_len")

  @property
  def src_len(self) -> int:
    return self.max_len

  @property
  def tgt_len(self) -> int:
    return (1 if self.task == "recall" else self.max_len) + 1    # + EOS (or BOS)

  def example(self, split: str, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) symbol ids (>= 3) of example `index` of `split`; deterministic."""
    rng = np.random.default_rng([self.seed, _SPLIT_IDS[split], index])
    if self.task == "recall":
      return self._recall(rng)
    length = int(rng.integers(self.min_len, self.max_len + 1))
    source = rng.integers(NUM_SPECIAL, NUM_SPECIAL + self.vocab_size, size=length)
    return source, (source if self.task == "copy" else source[::-1])

  def _recall(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    pairs = int(rng.integers(self.min_pairs, self.max_pairs + 1))
    keys = NUM_SPECIAL + rng.choice(self.vocab_size, size=pairs, replace=False)
    values = rng.integers(NUM_SPECIAL, NUM_SPECIAL + self.vocab_size, size=pairs)
    query = int(rng.integers(pairs))
    source = np.concatenate([np.stack([keys, values], 1).reshape(-1), keys[query:query + 1]])
    return source, values[query:query + 1]

  def record(self, split: str, index: int) -> dict[str, np.ndarray]:
    """Padded model inputs of one example (see `pad_example`)."""
    source, target = self.example(split, index)
    return pad_example(source, target, src_len=self.src_len, tgt_len=self.tgt_len)


def pad_example(source: np.ndarray, target: np.ndarray, *, src_len: int,
                tgt_len: int) -> dict[str, np.ndarray]:
  """src/src_mask [S] padded with PAD / 0 to src_len, and the target's `pad_target`."""
  n = len(source)
  src = np.full(src_len, PAD, np.int32)
  src[:n] = source
  return {"src": src, "src_mask": np.arange(src_len) < n, **pad_target(target, tgt_len)}


def pad_target(target: np.ndarray, tgt_len: int) -> dict[str, np.ndarray]:
  """Teacher-forced decoder rows of a target (a seq2seq target, a caption): tgt_in = BOS +
  target, tgt_out = target + EOS, weights 1 on tgt_out's real tokens (EOS included); padded
  with PAD / 0 to tgt_len."""
  m = len(target)
  if m + 1 > tgt_len:
    raise ValueError(f"a target of {m} tokens needs {m + 1} decoder positions > {tgt_len}")
  tgt_in = np.full(tgt_len, PAD, np.int32)
  tgt_in[0], tgt_in[1:m + 1] = BOS, target
  tgt_out = np.full(tgt_len, PAD, np.int32)
  tgt_out[:m], tgt_out[m] = target, EOS
  return {"tgt_in": tgt_in, "tgt_out": tgt_out,
          "weights": (np.arange(tgt_len) <= m).astype(np.float32)}


class SyntheticPipeline(batching.SplitPipeline):
  """Seq2seq batches of a synthetic task (see the module docstring)."""
  task = "seq2seq"

  def __init__(self, data, *, seed: int, global_batch_size: int, eval_batch_size: int,
               process_index: int = 0, process_count: int = 1, workdir: str | None = None,
               data_dir: str | None = None):
    del workdir, data_dir                # generated on the fly: nothing to read or cache
    self.data = source_settings.coerce("synthetic", data)
    self.source = self.data.source
    self.generator = task_generator(self.data, seed)
    self.num_train, self.num_eval = self.data.num_train, self.data.num_eval
    self.info = {"vocab_size": self.generator.vocab_size + NUM_SPECIAL,
                 "src_len": self.generator.src_len, "tgt_len": self.generator.tgt_len}
    kw = dict(seed=seed, global_batch_size=global_batch_size, eval_batch_size=eval_batch_size,
              process_index=process_index, process_count=process_count)
    self._batch_splits(self._records("train", self.num_train),
                       self._records("eval", self.num_eval), **kw)

  def _records(self, split: str, size: int) -> grain.MapDataset:
    return grain.MapDataset.range(size).map(lambda i: self.generator.record(split, int(i)))


def make_synthetic_pipeline(data, *, seed: int, global_batch_size: int,
                            eval_batch_size: int, process_index: int = 0,
                            process_count: int = 1, workdir: str | None = None,
                            data_dir: str | None = None) -> SyntheticPipeline:
  return SyntheticPipeline(data, seed=seed, global_batch_size=global_batch_size,
                           eval_batch_size=eval_batch_size, process_index=process_index,
                           process_count=process_count, workdir=workdir, data_dir=data_dir)


def describe(pipeline: SyntheticPipeline) -> str:
  g, info = pipeline.generator, pipeline.info
  return (f"{pipeline.source}: {pipeline.num_train} train / {pipeline.num_eval} eval examples, "
          f"source lengths {g.min_len}..{g.max_len}, vocab {info['vocab_size']} "
          f"(src_len {info['src_len']}, tgt_len {info['tgt_len']})")
