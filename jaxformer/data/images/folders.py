"""data.source='images:<root>': image folders laid out as root/<split>/<class>/*.png|jpg|jpeg.

Scanning checks the layout (the same classes in every split, no empty class, every image
readable and of one size and mode) before anything is converted, and each error names the
folder or file to fix.
"""

from __future__ import annotations

import pathlib
from typing import Iterator

import numpy as np

from jaxformer.data.images.cache import file_fingerprint, prepare_cached
from jaxformer.data.images.source import ImageSource

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_CHANNELS = {"L": 1, "RGB": 3}


def _folder_layout(root: pathlib.Path, train_split: str) -> dict[str, dict[str, list]]:
  """{split: {class: [files]}}; every split must have the train split's classes."""
  if not root.is_dir():
    raise ValueError(f"data.source='images:{root}': not a directory")
  layout = {}
  for split_dir in sorted(p for p in root.iterdir() if p.is_dir()):
    layout[split_dir.name] = {c.name: _class_files(c)
                              for c in sorted(p for p in split_dir.iterdir() if p.is_dir())}
  if train_split not in layout:
    raise ValueError(f"data.train_split={train_split!r} does not exist in data.source="
                     f"'images:{root}'; available splits: {sorted(layout)}")
  classes = sorted(layout[train_split])
  if not classes:
    raise ValueError(f"images:{root}/{train_split} has no class directories")
  for split, by_class in layout.items():
    if sorted(by_class) != classes:
      raise ValueError(f"images:{root}/{split} has classes {sorted(by_class)} but the train "
                       f"split {train_split!r} has {classes}; every split needs the same set")
    for name, files in by_class.items():
      _check_not_empty(root / split / name, files)
  return layout


def _class_files(directory: pathlib.Path) -> list[pathlib.Path]:
  """The image files of one class folder, sorted; an image name that is not a file (a broken
  link, a directory) is a ValueError naming it."""
  files = sorted(f for f in directory.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
  for f in files:
    if not f.is_file():
      raise ValueError(f"{f} is not a file (a broken link or a directory); remove it or put "
                       "the image there")
  return files


def _check_not_empty(directory: pathlib.Path, files: list):
  """A class folder without images (e.g. only .webp files, which are not read) would be a
  class with no examples: refused, as torchvision's ImageFolder does."""
  if not files:
    others = sorted({f.suffix.lower() or f.name for f in directory.iterdir()})
    found = f" (it holds only {others[:5]})" if others else ""
    raise ValueError(f"{directory} is a class folder without {'/'.join(IMAGE_SUFFIXES)} "
                     f"images{found}; add its images or remove the folder")


def _load_image(path: pathlib.Path, expected: tuple[pathlib.Path, tuple] | None) -> np.ndarray:
  """[H, W, C] uint8 pixels; `expected` = (first file, its shape) that every image must match."""
  from PIL import Image, UnidentifiedImageError
  try:
    with Image.open(path) as image:
      image.load()                # decode now: a truncated file fails here
      mode = image.mode
      pixels = np.asarray(image, np.uint8) if mode in _CHANNELS else None
  except Exception as e:  # noqa: BLE001  (PIL raises OSError, SyntaxError, ValueError, ...)
    why = ("not an image format PIL recognises" if isinstance(e, UnidentifiedImageError) else
           str(e).splitlines()[0] if str(e) else type(e).__name__)
    raise ValueError(f"{path}: not a readable image ({path.stat().st_size} bytes, {why}); "
                     "replace or remove the file") from None
  if pixels is None:
    raise ValueError(f"{path}: image mode {mode!r} is not supported; convert the folder to "
                     "grayscale ('L') or RGB")
  pixels = pixels.reshape(*pixels.shape[:2], _CHANNELS[mode])
  if expected is not None and pixels.shape != expected[1]:
    raise ValueError(f"{path}: image is {_hwc(pixels.shape)} but {expected[0]} is "
                     f"{_hwc(expected[1])}; all images must have one size and mode")
  return pixels


def read_image(path: pathlib.Path) -> np.ndarray:
  """One image file as [H, W, C] uint8 pixels, read as the folder source reads its images
  (grayscale 'L' or 'RGB'); a ValueError naming the file otherwise."""
  return _load_image(pathlib.Path(path), None)


def _hwc(shape: tuple) -> str:
  return f"{shape[0]}x{shape[1]}x{shape[2]} (HxWxC)"


def _folder_examples(by_class: dict[str, list], classes: list[str],
                     expected: tuple) -> Iterator[tuple[np.ndarray, int]]:
  for label, name in enumerate(classes):
    for path in by_class[name]:
      yield _load_image(path, expected), label


def _folder_splits(layout: dict[str, dict[str, list]], train_split: str):
  classes = sorted(layout[train_split])
  first = next((f for name in classes for f in layout[train_split][name]), None)
  if first is None:
    raise ValueError(f"the {train_split!r} split of the image folder has no "
                     f"{'/'.join(IMAGE_SUFFIXES)} files")
  expected = (first, _load_image(first, None).shape)
  return ({s: _folder_examples(by_class, classes, expected) for s, by_class in layout.items()},
          expected[1], len(classes))


def folder_source(root: pathlib.Path, train_split: str, cache_root: pathlib.Path) -> ImageSource:
  layout = _folder_layout(root, train_split)
  files = [f for by_class in layout.values() for fs in by_class.values() for f in fs]
  fingerprint = [str(root.resolve()), train_split, file_fingerprint(files)]
  return prepare_cached(f"images:{root}", cache_root, "images", fingerprint,
                         lambda: _folder_splits(layout, train_split))
