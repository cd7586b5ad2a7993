"""The image classification pipeline: `data.source` -> standardised, augmented batches.

Batches follow `jaxformer.data.batching`: `images` float32 [B, H, W, C] ((uint8 / 255 - mean)
/ std) and `labels` int32 [B]; eval batches add the `valid` row mask. The mean and std are the
train split's (stats.py); only training batches are augmented (augment.py). The `data` keys
are typed in `jaxformer.data.settings.ImageSettings`.
"""

from __future__ import annotations

import os
import pathlib
from typing import Iterable

import numpy as np

from jaxformer.data import batching
from jaxformer.data import settings as source_settings
from jaxformer.data.images.augment import draw_shifts, shift_images
from jaxformer.data.images.cache import DEFAULT_DATA_DIR
from jaxformer.data.images.digits import digits_source
from jaxformer.data.images.folders import folder_source
from jaxformer.data.images.mnist import mnist_source
from jaxformer.data.images.source import ImageSource
from jaxformer.data.images.tfds import tfds_source

SOURCE_FORMS = "'digits', 'mnist:<dir>', 'images:<root>' or 'tfds:<name>[/<config>][:<version>]'"


def open_source(data, *, data_dir: str | None = None) -> ImageSource:
  """`data.source` -> a prepared ImageSource (converting into the cache on first use); `data`
  is the typed settings of an image source (`ImageSettings`, or `CaptionSettings`, whose
  split and feature keys are the defaults), or a data section, whose image keys are read
  (others ignored)."""
  if not isinstance(data, (source_settings.ImageSettings, source_settings.CaptionSettings)):
    data = source_settings.coerce("images", data, strict=False)
  source = data.source
  cache_root = pathlib.Path(os.path.expanduser(data_dir or DEFAULT_DATA_DIR))
  kind, _, arg = source.partition(":")
  if source == "digits":
    return digits_source(cache_root)
  if kind == "mnist" and not arg:
    raise ValueError("data.source='mnist:' names no directory: give the one holding the MNIST "
                     "IDX files, --config.data.source=mnist:/path/to/mnist (configs/vit_tiny.py "
                     "also reads $MNIST_DIR), or use a prepared TFDS copy: `tfds build mnist "
                     "--file_format=array_record`, then --config.data.source=tfds:mnist")
  if kind in ("mnist", "images", "tfds") and arg:
    if kind == "mnist":
      return mnist_source(pathlib.Path(arg), cache_root)
    if kind == "images":
      return folder_source(pathlib.Path(arg), getattr(data, "train_split", _IMAGE.train_split),
                           cache_root)
    return tfds_source(arg, data_dir, cache_root,
                       image_key=getattr(data, "image_key", _IMAGE.image_key),
                       label_key=getattr(data, "label_key", _IMAGE.label_key))
  raise ValueError(f"data.source={source!r} must be one of {SOURCE_FORMS}")


_IMAGE = source_settings.ImageSettings(source="-")     # the defaults of the image keys


def _expected_size(data: source_settings.ImageSettings) -> tuple[int, int] | None:
  size = data.image_size
  if size is None:
    return None
  if isinstance(size, int):
    return (size, size)
  return tuple(int(s) for s in size)


class ImagePipeline:
  """Classification batches over a prepared image source (see the module docstring)."""
  task = "classification"

  def __init__(self, data, *, seed: int, global_batch_size: int, eval_batch_size: int,
               process_index: int = 0, process_count: int = 1, workdir: str | None = None,
               data_dir: str | None = None):
    del workdir                          # the cache lives under data_dir, shared across runs
    data = self.data = source_settings.coerce("images", data)
    self.augment, self.shift_pixels = data.augment, data.shift_pixels
    train_split, eval_split = data.train_split, data.eval_split
    self.source = open_source(data, data_dir=data_dir)
    self.source.check_split(train_split, "data.train_split")
    self.source.check_split(eval_split, "data.eval_split")
    expected = _expected_size(data)
    h, w, c = self.source.image_shape
    if expected is not None and expected != (h, w):
      raise ValueError(f"data.image_size={data.image_size!r} but the images of "
                       f"data.source={self.source.name!r} are {h}x{w} (HxW); set "
                       f"data.image_size to {h if h == w else (h, w)}")
    self.seed, self.global_batch_size = seed, global_batch_size
    self.process_index = process_index
    self.local_batch_size = batching.local_batch_size(global_batch_size, process_count)
    self.mean, self.std = self.source.stats(train_split)
    self.info = {"num_classes": self.source.num_classes, "image_shape": (h, w, c),
                 "num_train": self.source.split_sizes[train_split],
                 "num_eval": self.source.split_sizes[eval_split]}
    self._train = batching.train_batches(
        self.source.records(train_split), global_batch_size=global_batch_size, seed=seed,
        process_index=process_index, process_count=process_count
    ).map_with_index(self._finish_train)
    self._eval = batching.eval_batches(
        self.source.records(eval_split), global_batch_size=eval_batch_size,
        process_index=process_index, process_count=process_count).map(self._standardise)

  def _standardise(self, batch: dict) -> dict:
    images = (batch["images"].astype(np.float32) / 255.0 - self.mean) / self.std
    return {**batch, "images": images.astype(np.float32),
            "labels": batch["labels"].astype(np.int32)}

  def shifts(self, step: int) -> np.ndarray:
    """[local B, 2] (dy, dx) of this process's rows at `step`, drawn for the global batch."""
    offsets = draw_shifts(self.seed, step, self.shift_pixels, self.global_batch_size)
    start = self.process_index * self.local_batch_size
    return offsets[start:start + self.local_batch_size]

  def _finish_train(self, step: int, batch: dict) -> dict:
    if self.augment == "shift":
      batch = {**batch, "images": shift_images(batch["images"], self.shifts(step))}
    return self._standardise(batch)

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    return self._train[step]

  def eval_batches(self) -> Iterable[dict[str, np.ndarray]]:
    return self._eval


def make_image_pipeline(data, *, seed: int, global_batch_size: int,
                        eval_batch_size: int, process_index: int = 0, process_count: int = 1,
                        workdir: str | None = None, data_dir: str | None = None) -> ImagePipeline:
  return ImagePipeline(data, seed=seed, global_batch_size=global_batch_size,
                       eval_batch_size=eval_batch_size, process_index=process_index,
                       process_count=process_count, workdir=workdir, data_dir=data_dir)


def describe(pipeline: ImagePipeline) -> str:
  info = pipeline.info
  h, w, c = info["image_shape"]
  return (f"{pipeline.source.name}: {info['num_train']} train / {info['num_eval']} eval "
          f"images {h}x{w}x{c}, {info['num_classes']} classes, augment={pipeline.augment}")
