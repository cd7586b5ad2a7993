"""Step-indexed batches over grain MapDatasets: the one batching scheme every pipeline uses.

`train_batches(records, ...)[step]` is the batch of optimizer step `step`. The dataset is
random access, so the data position is the step itself: a run resumed at step k reads exactly
the batches an uninterrupted run would, with no iterator to save. Each process reads its own
slice of the records (`shard_index::shard_count`) and batches `batch_size` of them (its share
of the global batch); each epoch is a fresh permutation of that slice.
"""

from __future__ import annotations

import grain
import numpy as np

VALID = "valid"   # eval batches carry a 0/1 float32 row mask: 0 marks padding rows


def _check(records, batch_size: int, shard_index: int, shard_count: int, what: str):
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1")
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index={shard_index} must be in [0, shard_count={shard_count})")
  if len(records) < shard_count:
    raise ValueError(f"{what} has {len(records)} records, fewer than the {shard_count} "
                     "data shards (processes)")


def train_batches(records: grain.MapDataset, *, batch_size: int, seed: int,
                  shard_index: int = 0, shard_count: int = 1,
                  shuffle: bool = True) -> grain.MapDataset:
  """Infinite MapDataset: [step] -> dict of arrays with leading dim `batch_size`."""
  _check(records, batch_size, shard_index, shard_count, "the training split")
  ds = records[shard_index::shard_count]
  if shuffle:
    ds = ds.shuffle(seed=seed)       # reshuffled every epoch (grain seeds per epoch)
  return ds.repeat(None).batch(batch_size, drop_remainder=True)


def eval_batches(records: grain.MapDataset, *, batch_size: int, shard_index: int = 0,
                 shard_count: int = 1, max_batches: int | None = None) -> grain.MapDataset:
  """Finite MapDataset over the split in order; the last batch is padded to `batch_size`
  with copies of a record whose `valid` is 0, so every batch has one shape (one compile)
  and padded rows can be excluded from the metrics."""
  _check(records, batch_size, shard_index, shard_count, "the evaluation split")
  ds = records[shard_index::shard_count]
  if max_batches is not None:
    ds = ds[:max_batches * batch_size]
  n = len(ds)
  padded = -(-n // batch_size) * batch_size
  ones = ds.map(lambda r: {**r, VALID: np.float32(1.0)})
  if padded == n:
    return ones.batch(batch_size)
  filler = ds[:1].map(lambda r: {**r, VALID: np.float32(0.0)}).repeat(padded - n)
  return grain.MapDataset.concatenate([ones, filler]).batch(batch_size)
