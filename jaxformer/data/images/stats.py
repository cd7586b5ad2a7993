"""Per-channel pixel mean and std, the statistics images are standardised with.

Both the cache (while it converts a split) and the TFDS reader (once per prepared split) need
them over a whole split, streamed in chunks: exact uint8 histograms keep the memory constant
and the result exact, however the images are chunked.
"""

from __future__ import annotations

import numpy as np


class ChannelStats:
  """Streaming per-channel mean/std of pixels scaled to [0, 1], from exact uint8 histograms."""

  def __init__(self, channels: int):
    self.channels = channels
    self.histogram = np.zeros((channels, 256), np.int64)

  def add(self, images: np.ndarray):
    for c in range(self.channels):
      self.histogram[c] += np.bincount(images[..., c].ravel(), minlength=256)

  def result(self) -> dict[str, list[float]]:
    levels = np.arange(256) / 255.0
    count = max(int(self.histogram[0].sum()), 1)
    mean = self.histogram @ levels / count
    var = (self.histogram * (levels - mean[:, None]) ** 2).sum(1) / count
    std = np.sqrt(var)
    return {"mean": mean.tolist(), "std": np.where(std > 0, std, 1.0).tolist()}
