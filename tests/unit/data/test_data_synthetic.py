"""Synthetic seq2seq tasks: exact targets, padding, determinism, process slicing, errors."""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
import pytest

from jaxformer.data import batching, synthetic
from jaxformer.data.synthetic import BOS, EOS, PAD


def _config(task, **fields):
  return ml_collections.ConfigDict({"source": f"synthetic:{task}", **fields})


def _pipeline(task, *, seed=0, batch=6, eval_batch=8, process_index=0, process_count=1,
              **fields):
  return synthetic.make_synthetic_pipeline(
      _config(task, **fields), seed=seed, global_batch_size=batch, eval_batch_size=eval_batch,
      process_index=process_index, process_count=process_count, workdir="unused")


def _unpad(batch, row):
  """(source, target) symbols of one row, read back from the padded batch."""
  source = batch["src"][row][batch["src_mask"][row]]
  n = int(batch["weights"][row].sum())
  assert batch["tgt_out"][row, n - 1] == EOS
  return source, batch["tgt_out"][row, :n - 1]


def test_pad_example_hand_checked():
  out = synthetic.pad_example(np.array([5, 3, 4]), np.array([4, 3, 5]), src_len=5, tgt_len=6)
  np.testing.assert_array_equal(out["src"], [5, 3, 4, PAD, PAD])
  np.testing.assert_array_equal(out["src_mask"], [True, True, True, False, False])
  np.testing.assert_array_equal(out["tgt_in"], [BOS, 4, 3, 5, PAD, PAD])
  np.testing.assert_array_equal(out["tgt_out"], [4, 3, 5, EOS, PAD, PAD])
  np.testing.assert_array_equal(out["weights"], [1, 1, 1, 1, 0, 0])
  assert out["src"].dtype == out["tgt_in"].dtype == out["tgt_out"].dtype == np.int32
  assert out["src_mask"].dtype == bool and out["weights"].dtype == np.float32


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_copy_and_reverse_targets(task):
  p = _pipeline(task, vocab_size=7, min_len=2, max_len=9, batch=16)
  assert p.info == {"vocab_size": 10, "src_len": 9, "tgt_len": 10}
  batch = p.train_batch(3)
  assert batch["src"].shape == (16, 9) and batch["tgt_in"].shape == (16, 10)
  for row in range(16):
    source, target = _unpad(batch, row)
    assert 2 <= len(source) <= 9 and source.min() >= 3 and source.max() <= 9
    np.testing.assert_array_equal(target, source if task == "copy" else source[::-1])
    np.testing.assert_array_equal(batch["tgt_in"][row, :len(target) + 1], [BOS, *target])
    assert (batch["src"][row, len(source):] == PAD).all()
    assert (batch["tgt_in"][row, len(target) + 1:] == PAD).all()


def test_recall_hand_checked_and_generated():
  task = synthetic.SyntheticTask("recall", vocab_size=6, min_len=1, max_len=9, seed=0)
  assert (task.min_pairs, task.max_pairs, task.tgt_len) == (1, 4, 2)
  hand = synthetic.pad_example(np.array([4, 7, 5, 3, 5]), np.array([3]), src_len=9, tgt_len=2)
  np.testing.assert_array_equal(hand["tgt_out"], [3, EOS])
  p = _pipeline("recall", vocab_size=6, min_len=4, max_len=9, batch=32)
  batch = p.train_batch(0)
  lengths = set()
  for row in range(32):
    source, target = _unpad(batch, row)
    keys, values = source[:-1:2], source[1:-1:2]
    assert len(set(keys.tolist())) == len(keys), "keys must be distinct"
    assert target.tolist() == [values[keys.tolist().index(source[-1])]]
    lengths.add(len(source))
  assert lengths <= {5, 7, 9} and len(lengths) > 1


def test_lengths_cover_the_range_uniformly():
  task = synthetic.SyntheticTask("copy", vocab_size=4, min_len=3, max_len=6, seed=1)
  lengths = np.array([len(task.example("train", i)[0]) for i in range(800)])
  counts = np.bincount(lengths, minlength=7)[3:]
  assert lengths.min() == 3 and lengths.max() == 6
  assert counts.min() > 150, counts            # ~200 each if uniform


def test_deterministic_and_seed_dependent():
  a, b = _pipeline("copy", seed=3), _pipeline("copy", seed=3)
  c = _pipeline("copy", seed=4)
  for key in ("src", "tgt_out", "weights"):
    np.testing.assert_array_equal(a.train_batch(11)[key], b.train_batch(11)[key])
  assert not np.array_equal(a.train_batch(11)["src"], c.train_batch(11)["src"])
  assert not np.array_equal(a.train_batch(11)["src"], a.train_batch(12)["src"])


def test_eval_is_fixed_and_not_a_train_stream():
  task = synthetic.SyntheticTask("copy", vocab_size=16, min_len=5, max_len=12, seed=0)
  same = sum(np.array_equal(task.example("train", i)[0], task.example("eval", i)[0])
             for i in range(100))
  assert same == 0
  first = list(_pipeline("reverse", num_eval=13, eval_batch=4).eval_batches())
  again = list(_pipeline("reverse", num_eval=13, eval_batch=8, batch=2).eval_batches())
  assert len(first) == 4 and len(again) == 2
  valid = np.concatenate([b[batching.VALID] for b in first])
  np.testing.assert_array_equal(valid, [1] * 13 + [0] * 3)
  for key in ("src", "tgt_out"):
    np.testing.assert_array_equal(np.concatenate([b[key] for b in first])[:13],
                                  np.concatenate([b[key] for b in again])[:13])


def test_process_slicing_matches_single_process():
  whole = _pipeline("recall", batch=8, eval_batch=4, num_eval=6)
  parts = [_pipeline("recall", batch=8, eval_batch=4, num_eval=6, process_index=i,
                     process_count=2) for i in range(2)]
  for step in (0, 5):
    for key, value in whole.train_batch(step).items():
      np.testing.assert_array_equal(
          value, np.concatenate([p.train_batch(step)[key] for p in parts]))
  for full, *halves in zip(whole.eval_batches(), *(p.eval_batches() for p in parts)):
    for key, value in full.items():
      np.testing.assert_array_equal(value, np.concatenate([h[key] for h in halves]))


def test_batches_feed_the_encoder_decoder():
  from jaxformer import models
  p = _pipeline("reverse", vocab_size=5, max_len=7, batch=3)
  batch = p.train_batch(0)
  model = models.build(dict(family="seq2seq", vocab_size=p.info["vocab_size"], d_model=16,
                           num_encoder_layers=1, num_decoder_layers=1, num_heads=2, mlp_dim=32,
                           dropout_rate=0.0))
  def logits(key):                   # traced only (eval_shape): shapes and dtypes, no compile
    params = model.init(key, batch["src"], batch["tgt_in"], src_mask=batch["src_mask"])
    return model.apply(params, batch["src"], batch["tgt_in"], src_mask=batch["src_mask"])

  out = jax.eval_shape(logits, jax.random.key(0))
  assert out.shape == (3, p.info["tgt_len"], p.info["vocab_size"])


@pytest.mark.parametrize("fields, match", [
    (dict(source="synthetic:sort"), "data.source"),
    (dict(source="copy"), "data.source"),
    (dict(source="synthetic:copy", min_len=5, max_len=4), "data.min_len"),
    (dict(source="synthetic:copy", max_len=0), "data.max_len"),
    (dict(source="synthetic:copy", num_train=0), "data.num_train"),
    (dict(source="synthetic:copy", vocab_size=2.5), "data.vocab_size"),
    (dict(source="synthetic:recall", max_len=2), "data.max_len"),
    (dict(source="synthetic:recall", vocab_size=3, max_len=9), "data.vocab_size"),
])
def test_bad_config_raises(fields, match):
  with pytest.raises(ValueError, match=match):
    synthetic.make_synthetic_pipeline(ml_collections.ConfigDict(fields), seed=0,
                                      global_batch_size=4, eval_batch_size=4, workdir="w")


def test_batch_size_not_divisible_by_processes():
  with pytest.raises(ValueError, match="train.batch_size"):
    _pipeline("copy", batch=5, process_count=2)


def test_describe_is_one_line():
  line = synthetic.describe(_pipeline("copy", max_len=5))
  assert "synthetic:copy" in line and "\n" not in line and "vocab 19" in line
