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

  def check_split(self, split: str, field: str):
    if split not in self.split_sizes:
      raise ValueError(f"{field}={split!r} does not exist in data.source={self.name!r}; "
                       f"available splits: {sorted(self.split_sizes)}")
