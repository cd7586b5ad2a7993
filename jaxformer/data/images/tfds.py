"""data.source='tfds:<name>[/<config>][:<version>]': TFDS datasets prepared as ArrayRecord.

They are read in place (random access, no conversion into the cache); only their per-channel
statistics are computed once per split and kept under `data_dir`/tfds-stats.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import uuid

import grain
import numpy as np

from jaxformer.data.images.cache import CACHE_FORMAT
from jaxformer.data.images.source import ImageSource
from jaxformer.data.images.stats import ChannelStats


def _tfds_builder(name: str, data_dir: str | None):
  import tensorflow_datasets as tfds

  from jaxformer.data.tfds_catalog import quiet_tfds
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
  stats = ChannelStats(channels)
  for batch in records.batch(256):
    stats.add(batch["images"])
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")
  tmp.write_text(json.dumps(stats.result()))
  os.replace(tmp, path)
  return stats.result()


def tfds_source(name: str, data_dir: str | None, cache_root: pathlib.Path, *, image_key: str,
                label_key: str) -> ImageSource:
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
