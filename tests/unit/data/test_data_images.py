"""Image classification data: sources, the ArrayRecord cache, standardisation, augmentation."""

from __future__ import annotations

import gzip
import os
import pathlib
import struct

import jax
import ml_collections
import numpy as np
import pytest
from PIL import Image

from jaxformer.data import batching
from jaxformer.data.images import cache as image_cache
from jaxformer.data.images.augment import translate
from jaxformer.data.images.pipeline import describe, make_image_pipeline
from jaxformer.data.images.stats import ChannelStats
from tests.user_errors import user_error as _user_error
from tests.repo_root import REPO

MNIST_DIR = REPO.parent / "shared" / "data" / "mnist"


def _config(source, **fields):
  return ml_collections.ConfigDict({"source": source, **fields})


def _pipeline(source, data_dir, *, batch=8, eval_batch=16, seed=0, process_index=0,
              process_count=1, **fields):
  return make_image_pipeline(
      _config(source, **fields), seed=seed, global_batch_size=batch,
      eval_batch_size=eval_batch, process_index=process_index, process_count=process_count,
      workdir="unused", data_dir=str(data_dir))


def _all_records(pipeline, split):
  dataset = pipeline.source.records(split)
  records = [dataset[i] for i in range(len(dataset))]
  return (np.stack([r["images"] for r in records]).astype(np.float64),
          np.array([r["labels"] for r in records]))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp("image_cache")


# --- digits ------------------------------------------------------------------------------------


def test_digits_split_stats_and_batches(cache):
  p = _pipeline("digits", cache)
  assert p.task == "classification"
  assert p.info == {"num_classes": 10, "image_shape": (8, 8, 1), "num_train": 1437,
                    "num_eval": 360}
  train, train_labels = _all_records(p, "train")
  _, test_labels = _all_records(p, "test")
  assert np.bincount(test_labels).min() >= 35, "the split is stratified (~36 per class)"
  pixels = train / 255.0
  np.testing.assert_allclose(p.mean, pixels.mean((0, 1, 2)), rtol=1e-6)
  np.testing.assert_allclose(p.std, pixels.std((0, 1, 2)), rtol=1e-6)
  from sklearn.datasets import load_digits
  digits = load_digits()
  test = _all_records(p, "test")[0]
  stored = np.concatenate([train, test]).reshape(len(digits.target), -1) * 16 / 255
  rows = lambda x, y: sorted(map(tuple, np.column_stack([np.round(x), y]).tolist()))
  assert rows(stored, np.concatenate([train_labels, test_labels])) == rows(
      digits.images.reshape(len(digits.target), -1), digits.target)
  batch = p.train_batch(4)
  assert batch["images"].dtype == np.float32 and batch["images"].shape == (8, 8, 8, 1)
  assert batch["labels"].dtype == np.int32 and batch["labels"].shape == (8,)
  assert sorted(set(train_labels.tolist())) == list(range(10))


def test_channel_stats_match_float64_reference():
  x = np.random.default_rng(0).integers(0, 256, size=(5, 7, 3, 3), dtype=np.uint8)
  x[..., 2] = 9                                          # a constant channel: std falls back to 1
  stats = ChannelStats(3)
  stats.add(x[:2])
  stats.add(x[2:])
  result = stats.result()
  np.testing.assert_allclose(result["mean"], (x / 255).mean((0, 1, 2)), rtol=1e-12)
  np.testing.assert_allclose(result["std"][:2], (x / 255).std((0, 1, 2))[:2], rtol=1e-12)
  assert result["std"][2] == 1.0


def test_standardised_batch_matches_float64_reference(cache):
  p = _pipeline("digits", cache, batch=5, seed=3)
  train, labels = _all_records(p, "train")
  mean, std = (train / 255).mean((0, 1, 2)), (train / 255).std((0, 1, 2))
  batch = p.train_batch(7)
  for image, label in zip(batch["images"], batch["labels"]):
    u8 = np.round((image * p.std + p.mean) * 255)    # find the record this row came from
    match = np.flatnonzero((train == u8).all((1, 2, 3)) & (labels == label))
    assert match.size >= 1
    np.testing.assert_allclose(image, (train[match[0]] / 255 - mean) / std, atol=1e-5)
  assert abs(float(np.mean([p.train_batch(s)["images"].mean() for s in range(40)]))) < 0.1


def test_deterministic_shuffled_and_process_independent(cache):
  whole = _pipeline("digits", cache, batch=8, augment="shift", shift_pixels=2)
  again = _pipeline("digits", cache, batch=8, augment="shift", shift_pixels=2)
  parts = [_pipeline("digits", cache, batch=8, augment="shift", shift_pixels=2,
                     process_index=i, process_count=2) for i in range(2)]
  for step in (0, 9):
    batch = whole.train_batch(step)
    np.testing.assert_array_equal(batch["images"], again.train_batch(step)["images"])
    for key in ("images", "labels"):
      np.testing.assert_array_equal(
          batch[key], np.concatenate([q.train_batch(step)[key] for q in parts]))
  assert not np.array_equal(whole.train_batch(0)["labels"], whole.train_batch(1)["labels"])


def test_eval_covers_split_once_with_padding(cache):
  p = _pipeline("digits", cache, eval_batch=64)
  batches = list(p.eval_batches())
  assert len(batches) == 6                                       # ceil(360 / 64)
  valid = np.concatenate([b[batching.VALID] for b in batches])
  np.testing.assert_array_equal(valid, [1] * 360 + [0] * 24)
  _, labels = _all_records(p, "test")
  np.testing.assert_array_equal(np.concatenate([b["labels"] for b in batches])[:360], labels)


def test_shift_augmentation_matches_translate(cache):
  plain = _pipeline("digits", cache, batch=6, seed=1)
  shifted = _pipeline("digits", cache, batch=6, seed=1, augment="shift", shift_pixels=3)
  offsets = shifted.shifts(2)
  assert offsets.shape == (6, 2) and np.abs(offsets).max() <= 3 and np.abs(offsets).max() > 0
  u8 = np.round((plain.train_batch(2)["images"] * plain.std + plain.mean) * 255)
  expected = np.stack([translate(x, int(dy), int(dx)) for x, (dy, dx) in zip(u8, offsets)])
  np.testing.assert_allclose(shifted.train_batch(2)["images"],
                             (expected / 255 - plain.mean) / plain.std, atol=1e-5)
  for a, b in zip(plain.eval_batches(), shifted.eval_batches()):   # eval is never augmented
    np.testing.assert_array_equal(a["images"], b["images"])


@pytest.mark.parametrize("dy, dx", [(0, 0), (2, -1), (-3, 4), (7, 0), (-1, -9)])
def test_translate_reference(dy, dx):
  image = np.random.default_rng(0).integers(1, 255, size=(7, 5, 3), dtype=np.uint8)
  h, w = 7, 5
  ref = np.zeros_like(image)
  for y in range(h):
    for x in range(w):
      if 0 <= y - dy < h and 0 <= x - dx < w:
        ref[y, x] = image[y - dy, x - dx]
  np.testing.assert_array_equal(translate(image, dy, dx), ref)


def test_batches_feed_the_vit(cache):
  from jaxformer import models
  p = _pipeline("digits", cache, batch=4)
  h, w, c = p.info["image_shape"]
  model = models.build(dict(family="vit", num_classes=p.info["num_classes"], patch_size=4,
                           image_size=h, d_model=16, num_layers=1, num_heads=2, mlp_dim=32,
                           channels=c))
  batch = p.train_batch(0)

  def logits(key):                   # traced only (eval_shape): shapes and dtypes, no compile
    return model.apply(model.init(key, batch["images"]), batch["images"])

  assert jax.eval_shape(logits, jax.random.key(0)).shape == (4, 10)


# --- the cache -----------------------------------------------------------------------------------


def test_cache_is_reused_and_conversion_is_atomic(tmp_path, monkeypatch):
  real_write = image_cache._write_split
  calls = []

  def failing_write(path, examples, channels):
    calls.append(path.name)
    if len(calls) == 2:
      raise RuntimeError("killed mid-conversion")
    return real_write(path, examples, channels)

  monkeypatch.setattr(image_cache, "_write_split", failing_write)
  with pytest.raises(RuntimeError, match="killed"):
    _pipeline("digits", tmp_path)
  assert os.listdir(tmp_path) == [], "a failed conversion leaves nothing behind"
  _pipeline("digits", tmp_path)
  assert len(calls) == 4
  (done,) = os.listdir(tmp_path)
  assert sorted(os.listdir(tmp_path / done)) == ["meta.json", "test.array_record",
                                                  "train.array_record"]
  _pipeline("digits", tmp_path)
  assert len(calls) == 4, "a finished conversion is reused"


# --- MNIST IDX -----------------------------------------------------------------------------------


def _write_idx(path, array, magic, compress):
  data = struct.pack(f">{1 + array.ndim}I", magic, *array.shape) + array.tobytes()
  (gzip.open if compress else open)(path, "wb").write(data)


def _fake_mnist(directory, *, n_train=12, n_test=5, size=(6, 4), compress=True):
  directory.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(0)
  arrays = {}
  for prefix, n in (("train", n_train), ("t10k", n_test)):
    x = rng.integers(0, 256, size=(n, *size), dtype=np.uint8)
    y = (np.arange(n) % 10).astype(np.uint8)
    suffix = ".gz" if compress else ""
    _write_idx(directory / f"{prefix}-images-idx3-ubyte{suffix}", x, 0x803, compress)
    _write_idx(directory / f"{prefix}-labels-idx1-ubyte{suffix}", y, 0x801, compress)
    arrays[prefix] = (x, y)
  return arrays


@pytest.mark.parametrize("compress", [True, False])
def test_idx_files_roundtrip(tmp_path, compress):
  arrays = _fake_mnist(tmp_path / "mnist", compress=compress)
  p = _pipeline(f"mnist:{tmp_path / 'mnist'}", tmp_path / "cache", batch=4, eval_batch=4)
  assert p.info == {"num_classes": 10, "image_shape": (6, 4, 1), "num_train": 12,
                    "num_eval": 5}
  x, y = _all_records(p, "test")
  np.testing.assert_array_equal(x[..., 0], arrays["t10k"][0])
  np.testing.assert_array_equal(y, arrays["t10k"][1])


def test_idx_cache_key_follows_file_changes(tmp_path):
  source = tmp_path / "mnist"
  _fake_mnist(source)
  _pipeline(f"mnist:{source}", tmp_path / "cache", batch=4)
  arrays = _fake_mnist(source, n_train=14)
  p = _pipeline(f"mnist:{source}", tmp_path / "cache", batch=4)
  assert p.info["num_train"] == 14 and len(os.listdir(tmp_path / "cache")) == 2
  np.testing.assert_array_equal(_all_records(p, "train")[0][..., 0], arrays["train"][0])


@pytest.mark.parametrize("corrupt, match", [
    ("magic", "magic number"), ("truncate", "truncated or corrupt"),
    ("count", "labels"), ("missing", "t10k-labels-idx1-ubyte")])
def test_idx_errors(tmp_path, corrupt, match):
  source = tmp_path / "mnist"
  arrays = _fake_mnist(source, compress=False)
  labels = source / "t10k-labels-idx1-ubyte"
  if corrupt == "magic":
    _write_idx(labels, arrays["t10k"][1], 0x803, False)
  elif corrupt == "truncate":
    labels.write_bytes(labels.read_bytes()[:-2])
  elif corrupt == "count":
    _write_idx(labels, arrays["t10k"][1][:3], 0x801, False)
  else:
    labels.unlink()
  with pytest.raises(ValueError, match=match):
    _pipeline(f"mnist:{source}", tmp_path / "cache")
  assert not list((tmp_path / "cache").glob("mnist-*")), "no cache entry for bad data"


@pytest.mark.parametrize("damage, match", [
    (lambda good: b"not gzip at all", "not a readable gzip file (Not a gzipped file"),
    (lambda good: good[:-12], "not a readable gzip file (Compressed file ended"),
    (lambda good: good[:-8] + bytes(8), "not a readable gzip file (CRC check failed"),
    (None, "the header gives the shape [5, 0, 4], which holds no images")],
    ids=["not_gzip", "truncated_gzip", "bad_crc", "zero_size_images"])
def test_damaged_idx_file_names_the_file(tmp_path, damage, match):
  """Corrupt or cut-off gzip streams, and an IDX header that describes no data."""
  source = tmp_path / "mnist"
  arrays = _fake_mnist(source)
  if damage is None:
    path = source / "t10k-images-idx3-ubyte.gz"
    _write_idx(path, arrays["t10k"][0][:, :0], 0x803, True)
  else:
    path = source / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(damage(path.read_bytes()))
  _user_error(lambda: _pipeline(f"mnist:{source}", tmp_path / "cache"), path, match,
              "download it again")
  assert not list((tmp_path / "cache").glob("mnist-*")), "no cache entry for bad data"


@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason="real MNIST not available")
def test_real_mnist(cache):
  p = _pipeline(f"mnist:{MNIST_DIR}", cache, batch=4, image_size=28)
  assert p.info == {"num_classes": 10, "image_shape": (28, 28, 1), "num_train": 60000,
                    "num_eval": 10000}
  np.testing.assert_allclose(p.mean, [0.1307], atol=1e-4)       # the well-known statistics
  np.testing.assert_allclose(p.std, [0.3081], atol=1e-4)
  first = p.source.records("train")[0]
  assert first["labels"] == 5 and first["images"].max() == 255  # the first MNIST digit is a 5


# --- image folders -------------------------------------------------------------------------------


def _folder(root, *, mode="L", size=(5, 3), splits=("train", "test"), classes=("cat", "ant"),
            per_class=3):
  rng = np.random.default_rng(1)
  written = {}
  channels = {"L": (), "RGB": (3,)}[mode]
  for split in splits:
    for name in classes:
      (root / split / name).mkdir(parents=True, exist_ok=True)
      for i in range(per_class):
        pixels = rng.integers(0, 256, size=(size[1], size[0], *channels), dtype=np.uint8)
        path = root / split / name / f"{i}.png"
        Image.fromarray(pixels, mode).save(path)
        written[path] = pixels
  return written


@pytest.mark.parametrize("mode, channels", [("L", 1), ("RGB", 3)])
def test_image_folder(tmp_path, mode, channels):
  written = _folder(tmp_path / "root", mode=mode)
  p = _pipeline(f"images:{tmp_path / 'root'}", tmp_path / "cache", batch=2, eval_batch=4,
                image_size=(3, 5))
  assert p.info == {"num_classes": 2, "image_shape": (3, 5, channels), "num_train": 6,
                    "num_eval": 6}
  x, y = _all_records(p, "test")
  np.testing.assert_array_equal(y, [0, 0, 0, 1, 1, 1])           # classes sorted: ant, cat
  expected = [written[tmp_path / "root" / "test" / c / f"{i}.png"] for c in ("ant", "cat")
              for i in range(3)]
  np.testing.assert_array_equal(x, np.stack(expected).reshape(x.shape))
  train = _all_records(p, "train")[0] / 255
  np.testing.assert_allclose(p.mean, train.mean((0, 1, 2)), rtol=1e-6)


def test_image_folder_errors(tmp_path):
  root = tmp_path / "root"
  _folder(root)
  odd = root / "test" / "cat" / "odd.png"
  Image.fromarray(np.zeros((4, 5), np.uint8), "L").save(odd)
  with pytest.raises(ValueError, match=r"odd.png: image is 4x5x1 .* is 3x5x1"):
    _pipeline(f"images:{root}", tmp_path / "cache")
  odd.unlink()
  (root / "test" / "bee").mkdir()
  with pytest.raises(ValueError, match="every split needs the same set"):
    _pipeline(f"images:{root}", tmp_path / "cache")
  (root / "test" / "bee").rmdir()
  with pytest.raises(ValueError, match=r"data.eval_split='val'.*\['test', 'train'\]"):
    _pipeline(f"images:{root}", tmp_path / "cache", eval_split="val")
  with pytest.raises(ValueError, match=r"data.image_size=32 .* 3x5"):
    _pipeline(f"images:{root}", tmp_path / "cache", image_size=32)


@pytest.mark.parametrize("name, damage, match", [
    ("test/cat/empty.png", lambda good: b"", "(0 bytes, not an image format PIL recognises)"),
    ("test/cat/text.jpg", lambda good: b"hello", "not an image format PIL recognises"),
    ("train/cat/cut.png", lambda good: good[:len(good) - 30], "image file is truncated"),
    ("train/ant/gone.png", None, "is not a file (a broken link or a directory)"),
    ("train/ant", "webp", "is a class folder without .png/.jpg/.jpeg images (it holds only "
     "['.webp'])"),
    ("test/cat", "webp", "is a class folder without .png/.jpg/.jpeg images")],
    ids=["zero_bytes", "not_an_image", "truncated", "broken_link", "empty_train_class",
         "empty_test_class"])
def test_unreadable_image_or_empty_class_folder_names_it(tmp_path, name, damage, match):
  root = tmp_path / "root"
  _folder(root, per_class=1)
  path = root / name
  if damage == "webp":                   # a format the folder reader does not read
    for f in path.iterdir():
      f.rename(f.with_suffix(".webp"))
  elif damage is None:
    path.symlink_to(tmp_path / "nowhere.png")
  else:
    path.write_bytes(damage((root / "test" / "cat" / "0.png").read_bytes()))
  _user_error(lambda: _pipeline(f"images:{root}", tmp_path / "cache", batch=2, eval_batch=2),
              path, match)


# --- TFDS ----------------------------------------------------------------------------------------


def test_tfds_not_prepared_says_how(tmp_path):
  with pytest.raises(ValueError, match="tfds build mnist --file_format=array_record"):
    _pipeline("tfds:mnist", tmp_path)


def test_tfds_prepared_array_record(tmp_path):
  import tensorflow_datasets as tfds

  class JaxformerTinyImages(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "pixels": tfds.features.Tensor(shape=(4, 6, 1), dtype=np.uint8),
          "label": tfds.features.ClassLabel(num_classes=3)}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(9), "test": self._generate_examples(4)}

    def _generate_examples(self, n):
      rng = np.random.default_rng(n)
      for i in range(n):
        yield i, {"pixels": rng.integers(0, 256, (4, 6, 1), dtype=np.uint8), "label": i % 3}

  data_dir = str(tmp_path / "tfds")
  JaxformerTinyImages(data_dir=data_dir, file_format="array_record").download_and_prepare()
  p = make_image_pipeline(
      _config("tfds:jaxformer_tiny_images", image_key="pixels"), seed=0, global_batch_size=3,
      eval_batch_size=3, workdir="unused", data_dir=data_dir)
  assert p.info == {"num_classes": 3, "image_shape": (4, 6, 1), "num_train": 9, "num_eval": 4}
  train = _all_records(p, "train")[0] / 255
  np.testing.assert_allclose(p.mean, train.mean((0, 1, 2)), rtol=1e-6)
  np.testing.assert_allclose(p.std, train.std((0, 1, 2)), rtol=1e-6)
  assert p.train_batch(2)["images"].shape == (3, 4, 6, 1)
  assert sum(b[batching.VALID].sum() for b in p.eval_batches()) == 4
  with pytest.raises(ValueError, match=r"data.eval_split='validation'.*\['test', 'train'\]"):
    make_image_pipeline(
        _config("tfds:jaxformer_tiny_images", image_key="pixels", eval_split="validation"),
        seed=0, global_batch_size=3, eval_batch_size=3, data_dir=data_dir)


# --- configuration errors ------------------------------------------------------------------------


@pytest.mark.parametrize("fields, match", [
    (dict(source="cifar"), "data.source"),
    (dict(source="mnist:"), r"data.source='mnist:' names no directory.*mnist:/path/to/mnist.*tfds:mnist"),
    (dict(source="digits", augment="flip"), "data.augment"),
    (dict(source="digits", shift_pixels=-1), "data.shift_pixels"),
    (dict(source="digits", train_split="training"), "data.train_split"),
    (dict(source="digits", image_size=28), r"data.image_size=28 .* 8x8"),
])
def test_bad_config_raises(cache, fields, match):
  with pytest.raises(ValueError, match=match):
    make_image_pipeline(ml_collections.ConfigDict(fields), seed=0, global_batch_size=4,
                        eval_batch_size=4, data_dir=str(cache))


def test_describe_is_one_line(cache):
  line = describe(_pipeline("digits", cache))
  assert line.startswith("digits: 1437 train / 360 eval") and "10 classes" in line
