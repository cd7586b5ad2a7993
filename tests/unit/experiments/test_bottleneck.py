"""The bottleneck experiment's per-length evaluation and a tiny end-to-end run of its code path."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from experiments import bottleneck
from jaxformer import models
from jaxformer.data.synthetic import BOS, EOS, NUM_SPECIAL, PAD


def _tiny(task: str = "copy", max_len: int = 13):
  """The no-attention RNN of the experiment, shrunk to a few hidden units and short sources."""
  config = bottleneck.experiment_configs(task, ["rnn"], steps=2)["rnn"]
  config.data.max_len, config.data.num_eval = max_len, 16
  config.train.batch_size, config.train.eval_batch_size, config.train.log_every = 8, 16, 1
  config.train.keep_best = 0
  config.model.update(embed_dim=8, hidden_dim=16)
  return config


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_length_batch_has_exactly_that_length(task):
  config = _tiny(task)
  batch = bottleneck.length_batch(config, 7, 5)
  assert batch["src"].shape == (5, 13) and batch["tgt_out"].shape == (5, 14)
  assert (batch["src_mask"].sum(1) == 7).all() and (batch["src"][:, 7:] == PAD).all()
  source = batch["src"][:, :7]
  assert (source >= NUM_SPECIAL).all()
  expected = source if task == "copy" else source[:, ::-1]
  np.testing.assert_array_equal(batch["tgt_out"][:, :7], expected)
  assert (batch["tgt_out"][:, 7] == EOS).all() and (batch["tgt_in"][:, 0] == BOS).all()
  np.testing.assert_array_equal(batch["weights"].sum(1), 8)
  assert len({tuple(row) for row in source}) == 5         # distinct examples


def test_evaluate_by_length_matches_numpy():
  config = _tiny()
  module = models.build(config.model)
  probe = bottleneck.length_batch(config, 5, 2)
  params = module.init(jax.random.key(1), probe["src"], probe["tgt_in"])["params"]
  got = bottleneck.evaluate_by_length(config, params, [5, 8, 13], 9)
  assert sorted(got) == [5, 8, 13]
  apply = jax.jit(lambda b: module.apply({"params": params}, b["src"], b["tgt_in"],
                                         src_mask=b["src_mask"]))
  for length, metrics in got.items():
    batch = bottleneck.length_batch(config, length, 9)
    logits = np.asarray(apply(batch), np.float64)
    w = batch["weights"].astype(bool)
    right = logits.argmax(-1) == batch["tgt_out"]
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_p, batch["tgt_out"][..., None], -1)[..., 0]
    assert metrics["token_accuracy"] == pytest.approx(right[w].mean(), abs=1e-6)
    assert metrics["sequence_accuracy"] == pytest.approx((right | ~w).all(1).mean(), abs=1e-6)
    assert metrics["loss"] == pytest.approx(nll[w].mean(), rel=1e-5)


def test_bad_arguments_raise_value_error():
  config = _tiny()
  with pytest.raises(ValueError, match="--lengths"):
    bottleneck.check_lengths(config, [5, 14])
  with pytest.raises(ValueError, match="--task"):
    bottleneck.experiment_configs("recall")
  with pytest.raises(ValueError, match="--models"):
    bottleneck.experiment_configs("copy", ["lstm"])
  with pytest.raises(ValueError, match="--steps"):
    bottleneck.experiment_configs("copy", steps=0)


@pytest.mark.slow
def test_train_evaluate_and_write_results(tmp_path, monkeypatch):
  from tests.runs import on_one_device
  on_one_device(monkeypatch)
  configs = {"rnn": _tiny(max_len=9)}
  results = bottleneck.train_and_evaluate(configs, str(tmp_path / "runs"), [5, 9], 4)
  assert results["rnn"]["steps"] == 2 and results["rnn"]["params"] > 0
  out = str(tmp_path / "bottleneck")
  bottleneck.write_results(results, "copy", 4, out)
  saved = json.loads((tmp_path / "bottleneck.json").read_text())
  assert set(saved["models"]["rnn"]["by_length"]) == {"5", "9"}
  table = (tmp_path / "bottleneck.md").read_text()
  assert "len 5" in table and "len 9" in table and bottleneck.LABELS["rnn"] in table
  assert (tmp_path / "bottleneck.png").stat().st_size > 0
