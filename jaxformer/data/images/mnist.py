"""data.source='mnist:<dir>': MNIST's four IDX files (raw or gzipped), parsed and checked.

The IDX format is read here without any dataset library; a truncated, corrupt or misnamed
file is a ValueError that names it and says what to do, not a reshape error later.
"""

from __future__ import annotations

import gzip
import pathlib
import struct
import zlib

import numpy as np

from jaxformer.data.images.cache import file_fingerprint, prepare_cached
from jaxformer.data.images.source import ImageSource

_IDX_IMAGES_MAGIC = 0x00000803
_IDX_LABELS_MAGIC = 0x00000801


def _idx_path(directory: pathlib.Path, stem: str) -> pathlib.Path:
  for path in (directory / stem, directory / f"{stem}.gz"):
    if path.is_file():
      return path
  raise ValueError(f"data.source='mnist:{directory}': missing {stem} (or {stem}.gz); the "
                   "directory must hold train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                   "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, raw or gzipped")


_IDX_FIX = "download it again"


def _read_idx_bytes(path: pathlib.Path) -> bytes:
  """The file's bytes, gunzipped for .gz; a damaged gzip stream is a ValueError naming it."""
  if path.suffix != ".gz":
    return path.read_bytes()
  try:
    with gzip.open(path, "rb") as f:
      return f.read()
  except (OSError, EOFError, zlib.error) as e:   # a cut-off stream is an EOFError
    raise ValueError(f"{path}: not a readable gzip file ({e}); it is truncated or "
                     f"corrupt: {_IDX_FIX}") from None


def read_idx(path: pathlib.Path, *, expect_images: bool) -> np.ndarray:
  """An IDX file (raw or .gz) -> uint8 [N, rows, cols] images or [N] labels, fully checked."""
  data = _read_idx_bytes(path)
  magic, ndim = (_IDX_IMAGES_MAGIC, 3) if expect_images else (_IDX_LABELS_MAGIC, 1)
  header = 4 * (1 + ndim)
  if len(data) < header:
    raise ValueError(f"{path}: truncated IDX header ({len(data)} bytes); {_IDX_FIX}")
  found, *dims = struct.unpack(f">{1 + ndim}I", data[:header])
  if found != magic:
    raise ValueError(f"{path}: IDX magic number {found:#010x}, expected {magic:#010x} "
                     f"({'images' if expect_images else 'labels'} file); check that the file "
                     f"names match their contents, or {_IDX_FIX}")
  if len(data) - header != int(np.prod(dims)):
    raise ValueError(f"{path}: header says {dims} = {int(np.prod(dims))} bytes of data but "
                     f"the file holds {len(data) - header}; the file is truncated or corrupt: "
                     f"{_IDX_FIX}")
  if 0 in dims:
    raise ValueError(f"{path}: the header gives the shape {dims}, which holds no "
                     f"{'images' if expect_images else 'labels'}; {_IDX_FIX}")
  return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def _mnist_paths(directory: pathlib.Path) -> dict[str, tuple[pathlib.Path, pathlib.Path]]:
  if not directory.is_dir():
    raise ValueError(f"data.source='mnist:{directory}': not a directory")
  return {split: (_idx_path(directory, f"{prefix}-images-idx3-ubyte"),
                  _idx_path(directory, f"{prefix}-labels-idx1-ubyte"))
          for split, prefix in (("train", "train"), ("test", "t10k"))}


def _mnist_splits(paths: dict[str, tuple[pathlib.Path, pathlib.Path]]):
  arrays = {}
  for split, (image_path, label_path) in paths.items():
    images = read_idx(image_path, expect_images=True)
    labels = read_idx(label_path, expect_images=False)
    if len(images) != len(labels):
      raise ValueError(f"{image_path} holds {len(images)} images but {label_path} holds "
                       f"{len(labels)} labels")
    arrays[split] = (images[..., None], labels)
  shapes = {images.shape[1:] for images, _ in arrays.values()}
  if len(shapes) != 1:
    raise ValueError(f"MNIST splits have different image sizes {sorted(shapes)}")
  num_classes = max(int(labels.max(initial=0)) for _, labels in arrays.values()) + 1
  return ({s: zip(*arrays[s]) for s in arrays}, shapes.pop(), num_classes)


def mnist_source(directory: pathlib.Path, root: pathlib.Path) -> ImageSource:
  paths = _mnist_paths(directory)
  fingerprint = file_fingerprint(p for pair in paths.values() for p in pair)
  return prepare_cached(f"mnist:{directory}", root, "mnist", fingerprint,
                         lambda: _mnist_splits(paths))
