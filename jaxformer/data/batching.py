"""Step-indexed batches over grain MapDatasets: the one batching scheme every pipeline uses.

`train_batches(records, ...)[step]` is this process's share of the global batch of optimizer
step `step`. The dataset is random access, so the data position *is* the step: a run resumed
at step k reads exactly the batches an uninterrupted run would, and there is no iterator state
to checkpoint beyond the step itself.

The global batch of a step does not depend on how many processes read it: step s is
elements [s*G, (s+1)*G) of one seeded, per-epoch-reshuffled order of the records, and process p
reads only rows [p*L, (p+1)*L) of it (G = global batch, L = G / process_count). So a run on
2 hosts sees the same data as a run on 1, and each host only reads (and decodes) its own rows.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol

import grain
import numpy as np

VALID = "valid"   # eval batches carry a 0/1 float32 row mask: 0 marks padding rows


class Pipeline(Protocol):
  """What the training loop needs from a data pipeline (text, images, synthetic tasks).

  `task`: 'lm' | 'mlm' | 'classification' | 'seq2seq' (selects the loss and eval metrics).
  `info`: what the model must match, e.g. {'vocab_size': 65} or
  {'num_classes': 10, 'image_shape': (28, 28, 1)}.
  """
  task: str
  info: dict[str, Any]

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    """This process's rows of the global batch of `step` (deterministic in seed and step)."""

  def eval_batches(self) -> Iterable[dict[str, np.ndarray]]:
    """This process's rows of the evaluation split, in order, padded with `valid` = 0."""


def local_batch_size(global_batch_size: int, process_count: int) -> int:
  if global_batch_size < 1:
    raise ValueError(f"train.batch_size={global_batch_size} must be >= 1")
  if global_batch_size % process_count:
    raise ValueError(f"train.batch_size={global_batch_size} is not divisible by the "
                     f"{process_count} processes; use a multiple of {process_count}")
  return global_batch_size // process_count


def _check_process(process_index: int, process_count: int):
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in [0, {process_count})")


def train_batches(records: grain.MapDataset, *, global_batch_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1,
                  shuffle: bool = True) -> grain.MapDataset:
  """Infinite MapDataset: [step] -> dict of arrays with leading dim G / process_count."""
  _check_process(process_index, process_count)
  local = local_batch_size(global_batch_size, process_count)
  if len(records) == 0:
    raise ValueError("the training split is empty")
  order = (records.shuffle(seed=seed) if shuffle else records).repeat(None)

  def fetch(i):                      # i-th row this process reads -> global element index
    step, row = divmod(int(i), local)
    return order[step * global_batch_size + process_index * local + row]

  return grain.MapDataset.range(0, 2**62).map(fetch).batch(local, drop_remainder=True)


def eval_batches(records: grain.MapDataset, *, global_batch_size: int,
                 process_index: int = 0, process_count: int = 1,
                 max_batches: int | None = None) -> grain.MapDataset:
  """Finite MapDataset over the split in order (or its first `max_batches` global batches).
  The last batch is padded with copies of a record whose `valid` is 0, so every batch has
  one shape (one compile) and padded rows drop out of the metrics."""
  _check_process(process_index, process_count)
  local = local_batch_size(global_batch_size, process_count)
  n = len(records)
  if n == 0:
    raise ValueError("the evaluation split is empty")
  if max_batches is not None:
    n = min(n, max_batches * global_batch_size)
  num_batches = -(-n // global_batch_size)

  def fetch(i):
    step, row = divmod(int(i), local)
    g = step * global_batch_size + process_index * local + row
    record = records[g if g < n else 0]
    return {**record, VALID: np.float32(g < n)}

  return grain.MapDataset.range(0, num_batches * local).map(fetch).batch(local)


class SplitPipeline:
  """`train_batch` / `eval_batches` of a pipeline whose train and eval splits are random-access
  records (generated tasks, post-training sets): a subclass builds its records, then calls
  `_batch_splits`."""

  def _batch_splits(self, train: grain.MapDataset, evaluation: grain.MapDataset, *, seed: int,
                    global_batch_size: int, eval_batch_size: int, process_index: int = 0,
                    process_count: int = 1, max_eval_batches: int | None = None):
    self._train = train_batches(train, global_batch_size=global_batch_size, seed=seed,
                                process_index=process_index, process_count=process_count)
    self._eval = eval_batches(evaluation, global_batch_size=eval_batch_size,
                              process_index=process_index, process_count=process_count,
                              max_batches=max_eval_batches)

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    return self._train[step]

  def eval_batches(self) -> Iterable[dict[str, np.ndarray]]:
    return self._eval
