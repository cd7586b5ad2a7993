"""Image classification data: bundled digits, MNIST IDX files, image folders and TFDS datasets.

Why a cache: decoding PNGs or gzipped IDX files on every step is slow and not random access.
Non-TFDS sources are therefore converted once into ArrayRecord files (one uint8 image + int32
label per record) under `data_dir`, keyed by the source's paths, sizes and mtimes, and read
with grain like any prepared TFDS dataset. A conversion is written into a temporary directory
and renamed into place only when complete, so a killed conversion is never mistaken for a
finished one and concurrent processes cannot corrupt each other's output. The train split's
per-channel mean and std are computed during the same pass and stored next to the records.

Batches follow `jaxformer.data.batching`: `images` float32 [B, H, W, C] ((uint8 / 255 - mean)
/ std) and `labels` int32 [B]; eval batches add the `valid` row mask.

Augmentation "shift" translates each training image by up to `data.shift_pixels` pixels with
zero (black) fill in pixel space, before standardisation; the shifts of a step are drawn for
the whole global batch from (seed, step), so they do not depend on the process count.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import json
import os
import pathlib
import shutil
import struct
import uuid
import zlib
from typing import Any, Callable, Iterable, Iterator

import grain
import numpy as np

from jaxformer import console
from jaxformer.data import batching
from jaxformer.optional import require

DEFAULT_DATA_DIR = "~/.cache/jaxformer/data"
CACHE_FORMAT = 1                 # bump when the record layout or meta.json changes
DIGITS_TEST_SIZE = 360           # digits: 1,437 train / 360 test, stratified by class
DIGITS_SPLIT_SEED = 0
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
AUGMENTATIONS = ("none", "shift")
SOURCE_FORMS = "'digits', 'mnist:<dir>', 'images:<root>' or 'tfds:<name>[/<config>][:<version>]'"
_IDX_IMAGES_MAGIC = 0x00000803
_IDX_LABELS_MAGIC = 0x00000801
_LABEL_DTYPE = np.dtype("<i4")
_SHIFT_STREAM = 0x5348           # separates augmentation draws from other seeded streams
_CHANNELS = {"L": 1, "RGB": 3}
_STATS_CHUNK = 4096              # images per vectorised statistics update


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


def _field(data_config, name: str, default):
  """`data.<name>`, with unset and None both meaning the default."""
  value = data_config.get(name)
  return default if value is None else value


# ---------------------------------------------------------------------------------------------
# Pixel statistics and records


class _ChannelStats:
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


def _encode_record(image: np.ndarray, label: int) -> bytes:
  return image.tobytes() + np.asarray(label, _LABEL_DTYPE).tobytes()


def _decode_record(record: bytes, *, shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
  raw = np.frombuffer(record, np.uint8)
  return {"images": raw[:-_LABEL_DTYPE.itemsize].reshape(shape),
          "labels": raw[-_LABEL_DTYPE.itemsize:].view(_LABEL_DTYPE)[0].astype(np.int32)}


def _write_split(path: pathlib.Path, examples: Iterable[tuple[np.ndarray, int]],
                 channels: int) -> tuple[int, dict]:
  from array_record.python.array_record_module import ArrayRecordWriter
  stats = _ChannelStats(channels)
  writer = ArrayRecordWriter(str(path), "group_size:1,snappy")
  count, pending = 0, []
  try:
    for image, label in examples:
      writer.write(_encode_record(image, label))
      pending.append(image)
      if len(pending) == _STATS_CHUNK:
        stats.add(np.stack(pending))
        pending.clear()
      count += 1
  finally:
    writer.close()
  if pending:
    stats.add(np.stack(pending))
  return count, stats.result()


# ---------------------------------------------------------------------------------------------
# The ArrayRecord cache


def _cache_dir(root: pathlib.Path, kind: str, fingerprint: Any) -> pathlib.Path:
  blob = json.dumps([CACHE_FORMAT, kind, fingerprint], sort_keys=True).encode()
  return root / f"{kind}-{hashlib.sha256(blob).hexdigest()[:16]}"


def _convert_atomically(final: pathlib.Path, splits: dict[str, Iterable], *,
                        image_shape: tuple[int, int, int], num_classes: int):
  """Write every split and meta.json into a temporary dir, then rename it to `final`."""
  final.parent.mkdir(parents=True, exist_ok=True)
  tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
  tmp.mkdir()
  try:
    meta = {"image_shape": list(image_shape), "num_classes": num_classes, "splits": {}}
    for split, examples in splits.items():
      count, stats = _write_split(tmp / f"{split}.array_record", examples, image_shape[-1])
      meta["splits"][split] = {"size": count, **stats}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
      os.rename(tmp, final)
    except OSError:
      if not (final / "meta.json").exists():   # a finished copy from another process is fine
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _cached_source(name: str, directory: pathlib.Path) -> ImageSource:
  meta = json.loads((directory / "meta.json").read_text())
  shape = tuple(meta["image_shape"])
  splits = meta["splits"]

  def stats(split):
    return (np.asarray(splits[split]["mean"], np.float32),
            np.asarray(splits[split]["std"], np.float32))

  def records(split):
    source = grain.sources.ArrayRecordDataSource([str(directory / f"{split}.array_record")])
    return grain.MapDataset.source(source).map(functools.partial(_decode_record, shape=shape))

  return ImageSource(name, {s: v["size"] for s, v in splits.items()}, shape,
                     meta["num_classes"], stats, records)


def _prepare_cached(name: str, root: pathlib.Path, kind: str, fingerprint: Any,
                    convert: Callable[[], tuple[dict[str, Iterable], tuple, int]]) -> ImageSource:
  directory = _cache_dir(root, kind, fingerprint)
  if not (directory / "meta.json").exists():
    with console.announce(f"preparing data.source={name!r} once, into "
                          f"{console.short_path(directory)}") as note:
      splits, shape, num_classes = convert()
      _convert_atomically(directory, splits, image_shape=shape, num_classes=num_classes)
      sizes = json.loads((directory / "meta.json").read_text())["splits"]
      note.details = ", ".join(f"{split} {v['size']:,} images" for split, v in sizes.items())
  return _cached_source(name, directory)


def _file_fingerprint(paths: Iterable[pathlib.Path]) -> list:
  return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]


# ---------------------------------------------------------------------------------------------
# digits (scikit-learn)


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


def _digits_source(root: pathlib.Path) -> ImageSource:
  sklearn = require("sklearn", extra="vision", needed_for="data.source='digits'")
  fingerprint = [sklearn.__version__, DIGITS_TEST_SIZE, DIGITS_SPLIT_SEED]
  return _prepare_cached("digits", root, "digits", fingerprint, _digits_splits)


# ---------------------------------------------------------------------------------------------
# MNIST IDX files


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


def _mnist_source(directory: pathlib.Path, root: pathlib.Path) -> ImageSource:
  paths = _mnist_paths(directory)
  fingerprint = _file_fingerprint(p for pair in paths.values() for p in pair)
  return _prepare_cached(f"mnist:{directory}", root, "mnist", fingerprint,
                         lambda: _mnist_splits(paths))


# ---------------------------------------------------------------------------------------------
# Image folders: root/<split>/<class>/*.png|jpg|jpeg


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


def _folder_source(root: pathlib.Path, train_split: str, cache_root: pathlib.Path) -> ImageSource:
  layout = _folder_layout(root, train_split)
  files = [f for by_class in layout.values() for fs in by_class.values() for f in fs]
  fingerprint = [str(root.resolve()), train_split, _file_fingerprint(files)]
  return _prepare_cached(f"images:{root}", cache_root, "images", fingerprint,
                         lambda: _folder_splits(layout, train_split))


# ---------------------------------------------------------------------------------------------
# TFDS (prepared in ArrayRecord format; read directly)


def _tfds_builder(name: str, data_dir: str | None):
  import tensorflow_datasets as tfds

  from jaxformer.data.text_builder import quiet_tfds
  build = (f"tfds build {name.split('/')[0].split(':')[0]} --file_format=array_record"
           f"{f' --data_dir={data_dir}' if data_dir else ''}")
  try:
    with quiet_tfds():
      builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:      # tfds raises several types for unknown names/configs/versions
    raise ValueError(f"data.source='tfds:{name}': {e}") from e
  if not builder.is_prepared():
    raise ValueError(f"data.source='tfds:{name}' is not prepared in "
                     f"{data_dir or 'the default TFDS data_dir'}; prepare it once with `{build}`")
  if "array_record" not in str(builder.info.file_format).lower():
    raise ValueError(f"data.source='tfds:{name}' is stored as {builder.info.file_format}, which "
                     f"is not random access; re-prepare it with `{build}`")
  return builder


def _tfds_records(name: str, data_dir: str | None, split: str, image_key: str, label_key: str):
  import tensorflow_datasets as tfds
  source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)

  def to_example(example):
    image = np.asarray(example[image_key], np.uint8)
    return {"images": image.reshape(*image.shape[:2], -1),
            "labels": np.int32(example[label_key])}

  return grain.MapDataset.source(source).map(to_example)


def _tfds_stats(records: grain.MapDataset, channels: int, path: pathlib.Path) -> dict:
  if path.exists():
    return json.loads(path.read_text())
  stats = _ChannelStats(channels)
  for batch in records.batch(256):
    stats.add(batch["images"])
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")
  tmp.write_text(json.dumps(stats.result()))
  os.replace(tmp, path)
  return stats.result()


def _tfds_source(name: str, data_dir: str | None, cache_root: pathlib.Path,
                 data_config) -> ImageSource:
  image_key = _field(data_config, "image_key", "image")
  label_key = _field(data_config, "label_key", "label")
  builder = _tfds_builder(name, data_dir)
  features = builder.info.features
  for field, key in (("data.image_key", image_key), ("data.label_key", label_key)):
    if key not in features:
      raise ValueError(f"{field}={key!r} is not a feature of tfds:{name}; features: "
                       f"{sorted(features.keys())}")
  shape = tuple(features[image_key].shape)
  if len(shape) not in (2, 3) or None in shape:
    raise ValueError(f"tfds:{name} feature {image_key!r} has shape {shape}; a fixed "
                     "[H, W] or [H, W, C] image size is required")
  shape = shape if len(shape) == 3 else (*shape, 1)
  records = functools.partial(_tfds_records, name, data_dir, image_key=image_key,
                              label_key=label_key)
  stats_dir = cache_root / "tfds-stats"
  key = json.dumps([CACHE_FORMAT, name, str(builder.data_dir), image_key]).encode()

  def stats(split):
    path = stats_dir / f"{hashlib.sha256(key).hexdigest()[:16]}-{split}.json"
    result = _tfds_stats(records(split), shape[-1], path)
    return np.asarray(result["mean"], np.float32), np.asarray(result["std"], np.float32)

  return ImageSource(f"tfds:{name}", {s: info.num_examples for s, info in
                                      builder.info.splits.items()},
                     shape, int(features[label_key].num_classes), stats, records)


# ---------------------------------------------------------------------------------------------
# Pipeline


def open_source(data_config, *, data_dir: str | None = None) -> ImageSource:
  """`data.source` -> a prepared ImageSource (converting into the cache on first use)."""
  source = data_config.get("source")
  if not isinstance(source, str) or not source:
    raise ValueError(f"data.source={source!r} must be one of {SOURCE_FORMS}")
  cache_root = pathlib.Path(os.path.expanduser(data_dir or DEFAULT_DATA_DIR))
  kind, _, arg = source.partition(":")
  if source == "digits":
    return _digits_source(cache_root)
  if kind == "mnist" and not arg:
    raise ValueError("data.source='mnist:' names no directory: give the one holding the MNIST "
                     "IDX files, --config.data.source=mnist:/path/to/mnist (configs/vit_tiny.py "
                     "also reads $MNIST_DIR), or use a prepared TFDS copy: `tfds build mnist "
                     "--file_format=array_record`, then --config.data.source=tfds:mnist")
  if kind in ("mnist", "images", "tfds") and arg:
    if kind == "mnist":
      return _mnist_source(pathlib.Path(arg), cache_root)
    if kind == "images":
      return _folder_source(pathlib.Path(arg), _field(data_config, "train_split", "train"),
                            cache_root)
    return _tfds_source(arg, data_dir, cache_root, data_config)
  raise ValueError(f"data.source={source!r} must be one of {SOURCE_FORMS}")


def translate(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
  """Shift an [H, W, C] image down by dy and right by dx pixels, filling with zeros."""
  h, w = image.shape[:2]
  out = np.zeros_like(image)
  if abs(dy) < h and abs(dx) < w:
    out[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        image[max(-dy, 0):h - max(dy, 0), max(-dx, 0):w - max(dx, 0)]
  return out


def _expected_size(data_config) -> tuple[int, int] | None:
  size = data_config.get("image_size")
  if size is None:
    return None
  if isinstance(size, int):
    return (size, size)
  if len(size) != 2:
    raise ValueError(f"data.image_size={size!r} must be an int or (height, width)")
  return tuple(int(s) for s in size)


class ImagePipeline:
  """Classification batches over a prepared image source (see the module docstring)."""
  task = "classification"

  def __init__(self, data_config, *, seed: int, global_batch_size: int, eval_batch_size: int,
               process_index: int = 0, process_count: int = 1, workdir: str | None = None,
               data_dir: str | None = None):
    del workdir                          # the cache lives under data_dir, shared across runs
    self.augment = _field(data_config, "augment", "none")
    self.shift_pixels = _field(data_config, "shift_pixels", 2)
    if self.augment not in AUGMENTATIONS:
      raise ValueError(f"data.augment={self.augment!r} must be one of {AUGMENTATIONS}")
    if not isinstance(self.shift_pixels, int) or self.shift_pixels < 0:
      raise ValueError(f"data.shift_pixels={self.shift_pixels!r} must be an int >= 0")
    train_split = _field(data_config, "train_split", "train")
    eval_split = _field(data_config, "eval_split", "test")
    self.source = open_source(data_config, data_dir=data_dir)
    self.source.check_split(train_split, "data.train_split")
    self.source.check_split(eval_split, "data.eval_split")
    expected = _expected_size(data_config)
    h, w, c = self.source.image_shape
    if expected is not None and expected != (h, w):
      raise ValueError(f"data.image_size={data_config.get('image_size')!r} but the images of "
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
    rng = np.random.default_rng([self.seed, _SHIFT_STREAM, step])
    k = self.shift_pixels
    offsets = rng.integers(-k, k + 1, size=(self.global_batch_size, 2))
    start = self.process_index * self.local_batch_size
    return offsets[start:start + self.local_batch_size]

  def _finish_train(self, step: int, batch: dict) -> dict:
    if self.augment == "shift":
      batch = {**batch, "images": np.stack([translate(image, int(dy), int(dx)) for image, (dy, dx)
                                            in zip(batch["images"], self.shifts(step))])}
    return self._standardise(batch)

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    return self._train[step]

  def eval_batches(self) -> Iterable[dict[str, np.ndarray]]:
    return self._eval


def make_image_pipeline(data_config, *, seed: int, global_batch_size: int,
                        eval_batch_size: int, process_index: int = 0, process_count: int = 1,
                        workdir: str | None = None, data_dir: str | None = None) -> ImagePipeline:
  return ImagePipeline(data_config, seed=seed, global_batch_size=global_batch_size,
                       eval_batch_size=eval_batch_size, process_index=process_index,
                       process_count=process_count, workdir=workdir, data_dir=data_dir)


def describe(pipeline: ImagePipeline) -> str:
  info = pipeline.info
  h, w, c = info["image_shape"]
  return (f"{pipeline.source.name}: {info['num_train']} train / {info['num_eval']} eval "
          f"images {h}x{w}x{c}, {info['num_classes']} classes, augment={pipeline.augment}")
