"""`ImageSource`: what every reader of a `data.source` gives the pipeline.

Digits, MNIST IDX files, image folders and TFDS datasets are stored differently; each reader
turns its kind into this one description (split sizes, image shape, classes, per-split pixel
statistics, a grain dataset of records per split), so the pipeline treats them all alike.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import grain
import numpy as np


@dataclasses.dataclass(frozen=True)
class ImageSource:
  """A prepared dataset: split sizes, shapes, per-split pixel stats and a record reader."""
  name: str
  split_sizes: dict[str, int]
  image_shape: tuple[int, int, int]
  num_classes: int
  stats: Callable[[str], tuple[np.ndarray, np.ndarray]]   # split -> (mean [C], std [C])
  records: Callable[[str], grain.MapDataset]              # split -> {'images', 'labels'}
  # split -> (uint8 images [N, H, W, C], int32 labels [N]) in one read; None where the source
  # has no faster way than its records (grain's per-record map costs ~0.2 ms a record)
  arrays: Callable[[str], tuple[np.ndarray, np.ndarray]] | None = None

  def split_arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A whole split in memory: (uint8 images [N, H, W, C], int32 labels [N])."""
    if self.arrays is not None:
      return self.arrays(split)
    dataset = self.records(split)
    rows = [dataset[i] for i in range(len(dataset))]
    return (np.stack([r["images"] for r in rows]).reshape(-1, *self.image_shape),
            np.array([r["labels"] for r in rows], np.int32))

  def check_split(self, split: str, field: str):
    if split not in self.split_sizes:
      raise ValueError(f"{field}={split!r} does not exist in data.source={self.name!r}; "
                       f"available splits: {sorted(self.split_sizes)}")
