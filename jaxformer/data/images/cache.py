"""The prepared-data cache: non-TFDS sources converted once into ArrayRecord files.

Why a cache: decoding PNGs or gzipped IDX files on every step is slow and not random access.
Non-TFDS sources are therefore converted once into ArrayRecord files (one uint8 image + int32
label per record) under `data_dir`, keyed by the source's paths, sizes and mtimes, and read
with grain like any prepared TFDS dataset. A conversion is written into a temporary directory
and renamed into place only when complete, so a killed conversion is never mistaken for a
finished one and concurrent processes cannot corrupt each other's output. The train split's
per-channel mean and std are computed during the same pass and stored next to the records.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import shutil
import uuid
from typing import Any, Callable, Iterable

import grain
import numpy as np

from jaxformer import console
from jaxformer.data.corpus import sources
from jaxformer.data.images.source import ImageSource
from jaxformer.data.images.stats import ChannelStats

DEFAULT_DATA_DIR = "~/.cache/jaxformer/data"
CACHE_FORMAT = 1                 # bump when the record layout or meta.json changes
_LABEL_DTYPE = np.dtype("<i4")
_STATS_CHUNK = 4096              # images per vectorised statistics update


def _encode_record(image: np.ndarray, label: int) -> bytes:
  return image.tobytes() + np.asarray(label, _LABEL_DTYPE).tobytes()


def _decode_record(record: bytes, *, shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
  raw = np.frombuffer(record, np.uint8)
  return {"images": raw[:-_LABEL_DTYPE.itemsize].reshape(shape),
          "labels": raw[-_LABEL_DTYPE.itemsize:].view(_LABEL_DTYPE)[0].astype(np.int32)}


def _decode_records(records: list[bytes], *, shape: tuple[int, int, int]
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Many records at once: (uint8 images [N, *shape], int32 labels [N])."""
  size = int(np.prod(shape))
  raw = np.frombuffer(b"".join(records), np.uint8).reshape(len(records), size + 4)
  labels = np.ascontiguousarray(raw[:, size:]).view(_LABEL_DTYPE)[:, 0].astype(np.int32)
  return raw[:, :size].reshape(len(records), *shape), labels


def _write_split(path: pathlib.Path, examples: Iterable[tuple[np.ndarray, int]],
                 channels: int) -> tuple[int, dict]:
  from array_record.python.array_record_module import ArrayRecordWriter
  stats = ChannelStats(channels)
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

  def arrays(split):                   # one batched read, decoded with NumPy
    source = grain.sources.ArrayRecordDataSource([str(directory / f"{split}.array_record")])
    return _decode_records(source.__getitems__(range(len(source))), shape=shape)

  return ImageSource(name, {s: v["size"] for s, v in splits.items()}, shape,
                     meta["num_classes"], stats, records, arrays)


def prepare_cached(name: str, root: pathlib.Path, kind: str, fingerprint: Any,
                    convert: Callable[[], tuple[dict[str, Iterable], tuple, int]]) -> ImageSource:
  directory = _cache_dir(root, kind, fingerprint)
  if not (directory / "meta.json").exists():
    sources.require_writable_data_dir(root)
    with console.announce(f"preparing data.source={name!r} once, into "
                          f"{console.short_path(directory)}") as note:
      splits, shape, num_classes = convert()
      _convert_atomically(directory, splits, image_shape=shape, num_classes=num_classes)
      sizes = json.loads((directory / "meta.json").read_text())["splits"]
      note.details = ", ".join(f"{split} {v['size']:,} images" for split, v in sizes.items())
  return _cached_source(name, directory)


def file_fingerprint(paths: Iterable[pathlib.Path]) -> list:
  return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]
