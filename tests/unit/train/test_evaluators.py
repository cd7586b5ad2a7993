"""train.evaluators (jaxformer/train/evaluators.py): the specs checked before anything compiles,
one-line errors naming the entry and the fix; a short run logging each evaluator's metrics with
the eval metrics, computed by the `jaxformer.evaluate` functions themselves."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from configs import bert_mlm_shakespeare as bert_mlm
from jaxformer import run_settings
from jaxformer.train import config_checks, evaluators
from tests.runs import on_one_device, tiny_run_config
from tests.user_errors import user_error

ITEM = {"context": "To be", "choices": [" or", " zq"], "answer": 0}


def _items(tmp_path, n=3) -> str:
  path = tmp_path / "items.jsonl"
  path.write_text("".join(json.dumps(ITEM) + "\n" for _ in range(n)))
  return str(path)


@pytest.mark.parametrize("entries,parts", [
    (("head",), ["train.evaluators entry 'head'", "did you mean 'heads'?",
                 "the evaluators are perplexity, choices, probe, heads"]),
    (("choices",), ["'choices' needs an argument: 'choices:<a JSONL file of multiple-choice"]),
    (("heads:x",), ["'heads:x': 'heads' takes no argument; write 'heads'"]),
    (("perplexity:",), ["'perplexity:' has an empty argument after ':'"]),
    (("heads", "heads"), ["train.evaluators=('heads', 'heads') must be a tuple of distinct "
                          "evaluator specs", "set --config.train.evaluators=<value>"]),
    ("heads", ["train.evaluators='heads' must be a tuple"]),
])
def test_a_bad_spec_is_one_line_naming_the_entry_and_the_fix(entries, parts):
  cfg = tiny_run_config().to_dict()
  cfg["train"]["evaluators"] = entries           # a dict: a config.json may hold anything
  message = user_error(lambda: run_settings.parse(cfg), *parts)
  assert "\n" not in message


def test_what_a_spec_names_is_checked_before_compiling(tmp_path):
  items = _items(tmp_path)
  settings = config_checks.validate(tiny_run_config(evaluators=("heads", f"choices:{items}",
                                                                "perplexity")))
  assert [s.name for s in evaluators.specs(settings.train)] == [
      "heads", "choices-items", "perplexity"]
  for entries, parts in [
      ((f"choices:{tmp_path / 'nope.jsonl'}",), ["--data=", "nope.jsonl' is not a file"]),
      (("perplexity:a/x.txt", "perplexity:b/x.txt"),
       ["entries 'perplexity:a/x.txt' and 'perplexity:b/x.txt' would both log as "
        "eval_perplexity-x/"]),
      (("probe:x.jsonl",), ["a linear probe reads an encoder", "model.family='decoder'"]),
  ]:
    user_error(lambda: config_checks.validate(tiny_run_config(evaluators=entries)), *parts)
  (tmp_path / "bad.jsonl").write_text(json.dumps(ITEM) + "\n{\n")
  user_error(lambda: config_checks.validate(tiny_run_config(
      evaluators=(f"choices:{tmp_path / 'bad.jsonl'}",))), "bad.jsonl:2: not JSON")
  bert = bert_mlm.get_config("tiny")
  bert.train.evaluators = ("choices:" + items,)
  user_error(lambda: config_checks.validate(bert), "scores text with a decoder LM",
             "model.family='bert'", "use 'probe' for an encoder")
  bert.train.evaluators = ("probe",)
  user_error(lambda: config_checks.validate(bert), "a 'bert' run is probed on labelled text",
             "'probe:<JSONL of")


@pytest.mark.slow
def test_a_run_logs_each_evaluators_metrics_with_the_eval_metrics(tmp_path, monkeypatch):
  """12 steps, one eval: the record holds eval_heads/*, eval_choices-items/* and
  eval_perplexity/*; the perplexity is `evaluate.perplexity.evaluate` of the run's final
  params; the heads' arrays are in heads/step_000012.json and their scalars are the record's."""
  from jaxformer.evaluate import perplexity
  from jaxformer.inference import load_run
  from jaxformer.train import loop
  from jaxformer.train.metrics import read
  on_one_device(monkeypatch)
  cfg = tiny_run_config(steps=12, eval_every=12, checkpoint_every=12,
                        evaluators=("heads", f"choices:{_items(tmp_path)}", "perplexity"))
  workdir = str(tmp_path / "run")
  record = loop.train(cfg, workdir)
  assert [r for r in read(os.path.join(workdir, "metrics.jsonl")) if "eval_loss" in r] == [record]
  assert {k for k in record if k.startswith("eval_choices-items/")} == {
      "eval_choices-items/acc", "eval_choices-items/acc_norm"}
  config, params, tokenizer = load_run(workdir)
  want = perplexity.evaluate(config, params, tokenizer, workdir,
                             max_tokens=2 * cfg.train.batch_size * cfg.data.seq_len,
                             batch_size=cfg.train.batch_size)
  for key in evaluators.LOGGED["perplexity"]:
    assert record[f"eval_perplexity/{key}"] == pytest.approx(want[key], rel=1e-6), key
  with open(os.path.join(workdir, "heads", "step_000012.json")) as f:
    heads = json.load(f)
  assert heads["layers"] == ["decoder/layers_0/self_attention",
                             "decoder/layers_1/self_attention"]
  assert {f"eval_heads/{k}": v for k, v in heads["scalars"].items()} == {
      k: v for k, v in record.items() if k.startswith("eval_heads/")}
  norm = np.array([h["normalized_entropy"] for h in heads["heads"]])
  assert norm.shape == (2, 4) and np.all((norm > 0) & (norm <= 1))


def test_evaluators_may_change_when_a_run_resumes():
  """What is evaluated does not change the steps: a resume may add or drop evaluators."""
  saved = json.loads(tiny_run_config().to_json())
  config_checks.check_continues(tiny_run_config(evaluators=("heads",)), saved, 12, where="w")
