"""data.source='digits': scikit-learn's bundled 8x8 digits, split once into train and test.

The only image source that needs no download, so tests and the tiny configs run anywhere;
the split is stratified by class and seeded, so every machine converts the same one.
"""

from __future__ import annotations

import pathlib
from typing import Iterable

import numpy as np

from jaxformer.data.images.cache import prepare_cached
from jaxformer.data.images.source import ImageSource
from jaxformer.extras import require

DIGITS_TEST_SIZE = 360           # digits: 1,437 train / 360 test, stratified by class
DIGITS_SPLIT_SEED = 0


def _digits_splits() -> tuple[dict[str, Iterable], tuple, int]:
  datasets = require("sklearn.datasets", extra="vision", needed_for="data.source='digits'")
  from sklearn.model_selection import train_test_split
  digits = datasets.load_digits()
  images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]  # 0..16 -> u8
  x_train, x_test, y_train, y_test = train_test_split(
      images, digits.target, test_size=DIGITS_TEST_SIZE, stratify=digits.target,
      random_state=DIGITS_SPLIT_SEED)
  return ({"train": zip(x_train, y_train), "test": zip(x_test, y_test)},
          images.shape[1:], int(digits.target.max()) + 1)


def digits_source(root: pathlib.Path) -> ImageSource:
  sklearn = require("sklearn", extra="vision", needed_for="data.source='digits'")
  fingerprint = [sklearn.__version__, DIGITS_TEST_SIZE, DIGITS_SPLIT_SEED]
  return prepare_cached("digits", root, "digits", fingerprint, _digits_splits)
