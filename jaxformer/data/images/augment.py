"""Training augmentation of images, in pixel space before standardisation.

"shift" translates each training image by up to `data.shift_pixels` pixels with zero (black)
fill; the shifts of a step are drawn for the whole global batch from (seed, step), so they do
not depend on the process count.
"""

from __future__ import annotations

import numpy as np

from jaxformer.data.settings import AUGMENTATIONS     # data.augment's values (ImageSettings)
_SHIFT_STREAM = 0x5348           # separates augmentation draws from other seeded streams


def translate(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
  """Shift an [H, W, C] image down by dy and right by dx pixels, filling with zeros."""
  h, w = image.shape[:2]
  out = np.zeros_like(image)
  if abs(dy) < h and abs(dx) < w:
    out[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        image[max(-dy, 0):h - max(dy, 0), max(-dx, 0):w - max(dx, 0)]
  return out


def draw_shifts(seed: int, step: int, shift_pixels: int, global_batch_size: int) -> np.ndarray:
  """[global B, 2] (dy, dx), each in [-shift_pixels, shift_pixels], for the batch of `step`."""
  rng = np.random.default_rng([seed, _SHIFT_STREAM, step])
  return rng.integers(-shift_pixels, shift_pixels + 1, size=(global_batch_size, 2))


def shift_images(images: np.ndarray, offsets: np.ndarray) -> np.ndarray:
  """[B, H, W, C] images, each translated by its row of `offsets` [B, 2] (dy, dx)."""
  return np.stack([translate(image, int(dy), int(dx)) for image, (dy, dx)
                   in zip(images, offsets)])
