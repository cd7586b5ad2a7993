"""Captioned digit composites: captions, pixels and held-out digits against NumPy
re-computations, determinism, the pipeline's batches and the config errors."""

from __future__ import annotations

import dataclasses
import pathlib
import types

import ml_collections
import numpy as np
import pytest

from jaxformer.data import batching
from jaxformer import tasks
from jaxformer.data.images import captions
from jaxformer.data.images.captions import BOS, EOS, PAD
from jaxformer.data.images.pipeline import open_source
from tests.repo_root import REPO

MNIST_DIR = REPO.parent / "shared" / "data" / "mnist"
NAMES = "zero one two three four five six seven eight nine".split()


def _config(source="digits", **fields):
  return ml_collections.ConfigDict({"source": source, **fields})


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("caption_cache"))


@pytest.fixture(scope="module")
def digit_splits(cache):
  """{'train' | 'test': (uint8 [N, 8, 8], labels [N])}, read record by record."""
  source = open_source(_config(), data_dir=cache)
  out = {}
  for split in ("train", "test"):
    records = source.records(split)
    rows = [records[i] for i in range(len(records))]
    out[split] = (np.stack([r["images"][..., 0] for r in rows]),
                  np.array([int(r["labels"]) for r in rows]))
  return out


def _pipeline(cache, *, seed=0, batch=6, eval_batch=4, process_index=0, process_count=1,
              **fields):
  return captions.make_caption_pipeline(
      _config(**fields), seed=seed, global_batch_size=batch, eval_batch_size=eval_batch,
      process_index=process_index, process_count=process_count, workdir="unused",
      data_dir=cache)


def _reference_words(labels, cells):
  """The caption, written out: sort the cells row-major, join with the row relation."""
  order = sorted(range(len(labels)), key=lambda i: (cells[i][0], cells[i][1]))
  words, prev_row = [], None
  for i in order:
    if prev_row is not None:
      words += ["left", "of"] if cells[i][0] == prev_row else ["above"]
    words.append(NAMES[labels[i]])
    prev_row = cells[i][0]
  return words


# --- captions ---------------------------------------------------------------------------------


def test_caption_words_hand_checked():
  assert captions.caption_words([7, 3, 5], [(0, 0), (0, 2), (2, 1)]) == \
      "seven left of three above five".split()
  assert captions.caption_words([5, 7, 3], [(2, 1), (0, 0), (0, 2)]) == \
      "seven left of three above five".split()             # any order in, reading order out
  assert captions.caption_words([4, 9], [(0, 1), (2, 0)]) == ["four", "above", "nine"]
  assert captions.caption_words([2], [(1, 1)]) == ["two"]
  full = [(r, c) for r in range(3) for c in range(3)]
  assert " ".join(captions.caption_words(list(range(9)), full)) == (
      "zero left of one left of two above three left of four left of five above six left of "
      "seven left of eight")
  with pytest.raises(ValueError, match="repeat"):
    captions.caption_words([1, 2], [(0, 0), (0, 0)])


def test_vocabulary_encode_and_decode():
  assert captions.WORDS == tuple(NAMES) + ("left", "of", "above")
  assert (PAD, BOS, EOS, captions.VOCAB_SIZE) == (0, 1, 2, 16)
  ids = captions.encode("seven left of three above five".split())
  assert ids.dtype == np.int32 and ids.tolist() == [10, 13, 14, 6, 15, 8]
  assert captions.decode([BOS, 10, 13, 14, 6, 15, 8, EOS, 4, PAD]) == \
      "seven left of three above five".split()
  assert captions.decode(np.array([[3, PAD, 4]])) == ["zero", "one"]
  with pytest.raises(ValueError, match="caption word"):
    captions.encode(["below"])


# --- composites -------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [{}, dict(grid=4, jitter=3, min_digits=1, max_digits=16)])
def test_examples_match_a_numpy_recomputation(cache, digit_splits, fields):
  task = captions.CaptionTask(_config(**fields), seed=5, data_dir=cache)
  grid, jitter = fields.get("grid", 3), fields.get("jitter", 2)
  lo, hi = fields.get("min_digits", 2), fields.get("max_digits", 6)
  cell, length = 8 + jitter, 3 * hi - 1
  assert captions.image_size(_config(**fields)) == grid * cell
  assert captions.caption_length(_config(**fields)) == length
  counts, offsets = np.zeros(hi + 1, int), set()
  for split, source_split in (("train", "train"), ("eval", "test")):
    images, labels = digit_splits[source_split]
    for index in range(120):
      forced = 1 + index % hi if index % 4 == 3 else None
      ex = task.example(split, index, num_digits=forced)
      n = len(ex["labels"])
      if forced is None:
        assert lo <= n <= hi
        counts[n] += 1
      else:
        assert n == forced
      cells = ex["cells"].tolist()
      assert len(set(map(tuple, cells))) == n and all(0 <= r < grid and 0 <= c < grid
                                                      for r, c in cells)
      offsets.update(ex["offsets"].reshape(-1).tolist())
      np.testing.assert_array_equal(ex["labels"], labels[ex["digit_indices"]])
      canvas = np.zeros((grid * cell, grid * cell), np.float32)
      for (r, c), (dy, dx), k in zip(cells, ex["offsets"].tolist(), ex["digit_indices"]):
        canvas[r * cell + dy:r * cell + dy + 8, c * cell + dx:c * cell + dx + 8] = \
            images[k] / np.float32(255)
      assert ex["image"].shape == (grid * cell, grid * cell, 1) and ex["image"].dtype == np.float32
      np.testing.assert_array_equal(ex["image"][..., 0], canvas)   # digits exact, rest 0
      words = _reference_words(ex["labels"].tolist(), cells)
      assert ex["words"] == words
      ids = [3 + captions.WORDS.index(w) for w in words]
      m = len(ids)
      np.testing.assert_array_equal(ex["tgt_in"], [BOS] + ids + [PAD] * (length - m - 1))
      np.testing.assert_array_equal(ex["tgt_out"], ids + [EOS] + [PAD] * (length - m - 1))
      np.testing.assert_array_equal(ex["weights"], [1.0] * (m + 1) + [0.0] * (length - m - 1))
  assert (counts[lo:] > 0).all(), counts                   # every n of the range occurs
  assert offsets == set(range(jitter + 1))                 # offsets: all of [0, jitter]


def test_eval_composites_hold_out_the_test_digits(cache, digit_splits):
  task = captions.CaptionTask(_config(), seed=1, data_dir=cache)
  sets = {s: {img.tobytes() for img in digit_splits[s][0]} for s in ("train", "test")}
  also_in_other = 0
  for split, own, other in (("train", "train", "test"), ("eval", "test", "train")):
    for index in range(60):
      ex = task.example(split, index)
      image = np.round(ex["image"][..., 0] * 255).astype(np.uint8)
      for (r, c), (dy, dx) in zip(ex["cells"].tolist(), ex["offsets"].tolist()):
        patch = image[r * 10 + dy:r * 10 + dy + 8, c * 10 + dx:c * 10 + dx + 8].tobytes()
        assert patch in sets[own], f"a {split} composite holds a digit not in {own}"
        also_in_other += patch in sets[other]
  assert also_in_other < 10, "the check must tell the splits apart"


def test_split_arrays_match_the_records(cache, digit_splits):
  source = open_source(_config(), data_dir=cache)
  slow = dataclasses.replace(source, arrays=None)          # the per-record fallback
  for split in ("train", "test"):
    for src in (source, slow):
      images, labels = src.split_arrays(split)
      assert images.dtype == np.uint8 and labels.dtype == np.int32
      np.testing.assert_array_equal(images[..., 0], digit_splits[split][0])
      np.testing.assert_array_equal(labels, digit_splits[split][1])


def test_resize_area_against_block_means():
  x = np.random.default_rng(0).integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
  np.testing.assert_array_equal(captions.resize_area(x, 14),
                                (x / 255.0).reshape(3, 14, 2, 14, 2).mean((2, 4))
                                .astype(np.float32))
  odd = captions.resize_area(x, 10)                        # 2.8 input pixels per output pixel
  assert odd.shape == (3, 10, 10)
  np.testing.assert_allclose(odd.mean((1, 2)), (x / 255.0).mean((1, 2)), atol=1e-6)
  np.testing.assert_allclose(odd[:, 0, 0], (x[:, :2, :2].sum((1, 2)) + 0.8 * (
      x[:, 2, :2].sum(1) + x[:, :2, 2].sum(1)) + 0.64 * x[:, 2, 2]) / (2.8 ** 2 * 255),
      rtol=1e-6)


def test_deterministic_and_seed_dependent(cache):
  a, b = (captions.CaptionTask(_config(), seed=3, data_dir=cache) for _ in range(2))
  c = captions.CaptionTask(_config(), seed=4, data_dir=cache)
  for split in ("train", "eval"):
    for index in (0, 17):
      x, y = a.example(split, index), b.example(split, index)
      for key in ("image", "labels", "cells", "tgt_out"):
        np.testing.assert_array_equal(x[key], y[key])
  differ = lambda s, t, i, j=None: not np.array_equal(s.example("train", i)["image"],
                                                      t.example("train", i if j is None else j)
                                                      ["image"])
  assert differ(a, c, 7) and differ(a, a, 7, 8)
  assert not np.array_equal(a.example("train", 7)["image"], a.example("eval", 7)["image"])


# --- pipeline ---------------------------------------------------------------------------------


def test_train_batches_match_the_batch_spec(cache):
  p = _pipeline(cache, batch=8, seed=2)
  assert p.task == "captioning"
  assert p.info == {"vocab_size": 16, "image_size": 30, "caption_length": 17}
  config = ml_collections.ConfigDict({"data": _config()})
  settings = types.SimpleNamespace(train=types.SimpleNamespace(batch_size=8))
  spec = tasks.get("captioning").batch_spec(config, settings, {})
  for step in (0, 3):
    batch = p.train_batch(step)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == spec
    tgt_in, tgt_out = batch["tgt_in"], batch["tgt_out"]
    np.testing.assert_array_equal(batch["weights"], (tgt_out != PAD).astype(np.float32))
    np.testing.assert_array_equal(tgt_in[:, 0], BOS)
    np.testing.assert_array_equal(tgt_in[:, 1:], np.where(tgt_out[:, :-1] == EOS, PAD,
                                                          tgt_out[:, :-1]))
    assert (tgt_out == EOS).sum(1).tolist() == [1] * 8
    assert 0 <= batch["images"].min() and batch["images"].max() <= 1
  again = _pipeline(cache, batch=8, seed=2).train_batch(3)
  for key, value in p.train_batch(3).items():
    np.testing.assert_array_equal(value, again[key])


def test_eval_batches_and_process_slicing(cache):
  first = list(_pipeline(cache, num_eval=10, eval_batch=4).eval_batches())
  assert len(first) == 3
  np.testing.assert_array_equal(np.concatenate([b[batching.VALID] for b in first]),
                                [1] * 10 + [0] * 2)
  whole = _pipeline(cache, batch=4, eval_batch=4, num_eval=6)
  parts = [_pipeline(cache, batch=4, eval_batch=4, num_eval=6, process_index=i,
                     process_count=2) for i in range(2)]
  for key, value in whole.train_batch(1).items():
    np.testing.assert_array_equal(value, np.concatenate([q.train_batch(1)[key] for q in parts]))
  for full, *halves in zip(whole.eval_batches(), *(q.eval_batches() for q in parts)):
    for key, value in full.items():
      np.testing.assert_array_equal(value, np.concatenate([h[key] for h in halves]))


def test_describe_is_one_line(cache):
  line = captions.describe(_pipeline(cache, num_eval=10))
  assert line.startswith("digits captions: 1000000 train / 10 eval") and "\n" not in line


@pytest.mark.parametrize("fields, match", [
    (dict(max_digits=10), r"data\.max_digits=10 > data\.grid\*\*2=9"),
    (dict(grid=2), r"data\.max_digits=6 > data\.grid\*\*2=4"),
    (dict(min_digits=4, max_digits=3), r"data\.min_digits=4 > data\.max_digits=3"),
    (dict(source="tfds:mnist"), r"data\.source='tfds:mnist'.*'mnist:<dir>' or 'digits'"),
    (dict(source="synthetic:copy"), r"data\.source"),
    (dict(jitter=-1), r"data\.jitter=-1"),
    (dict(digit_size=2.5), r"data\.digit_size=2\.5"),
    (dict(num_eval=0), r"data\.num_eval=0"),
    (dict(grids=4), r"data\.grids is not a captioning data setting \(did you mean data\.grid\?\)"),
])
def test_bad_fields_are_value_errors_naming_them(cache, fields, match):
  for call in (lambda: captions.image_size(_config(**fields)),
               lambda: _pipeline(cache, **fields)):
    with pytest.raises(ValueError, match=match) as info:
      call()
    assert "\n" not in str(info.value)


def test_mnist_without_a_directory_has_sizes_but_does_not_open(cache):
  """A config built before the user named the MNIST directory (configs/captioning.py with no
  $MNIST_DIR) still has its shapes; opening it is the error."""
  assert captions.image_size(_config(source="mnist:", digit_size=14)) == 48
  with pytest.raises(ValueError, match=r"data\.source='mnist:'.*'mnist:<dir>'"):
    _pipeline(cache, source="mnist:")


def test_num_digits_beyond_the_caption_length_is_refused(cache):
  task = captions.CaptionTask(_config(max_digits=4), data_dir=cache)
  with pytest.raises(ValueError, match=r"num_digits=5 .*data\.max_digits"):
    task.example("eval", 0, num_digits=5)


# --- real MNIST -------------------------------------------------------------------------------


@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason="real MNIST not available")
def test_mnist_composites_use_2x2_means_of_held_out_digits(cache):
  from jaxformer.data.images.mnist import read_idx
  def idx(stem, images):
    path = next(p for p in (MNIST_DIR / stem, MNIST_DIR / f"{stem}.gz") if p.is_file())
    return read_idx(path, expect_images=images)
  test_images = idx("t10k-images-idx3-ubyte", True)
  test_labels = idx("t10k-labels-idx1-ubyte", False)
  config = _config(f"mnist:{MNIST_DIR}")
  assert captions.image_size(config) == 48 and captions.caption_length(config) == 17
  task = captions.CaptionTask(config, seed=0, data_dir=cache)
  small = (test_images / 255.0).reshape(-1, 14, 2, 14, 2).mean((2, 4))
  for index in range(20):
    ex = task.example("eval", index)
    canvas = np.zeros((48, 48))
    for (r, c), (dy, dx), k in zip(ex["cells"].tolist(), ex["offsets"].tolist(),
                                   ex["digit_indices"]):
      canvas[r * 16 + dy:r * 16 + dy + 14, c * 16 + dx:c * 16 + dx + 14] = small[k]
    np.testing.assert_allclose(ex["image"][..., 0], canvas, atol=1e-7)
    np.testing.assert_array_equal(ex["labels"], test_labels[ex["digit_indices"]])
    assert ex["words"] == _reference_words(ex["labels"].tolist(), ex["cells"].tolist())
