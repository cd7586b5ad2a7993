"""Planning a run without its data or its chips: the batch layout a plan compiles must be the
one the real pipelines produce (`jaxformer.data.batch_spec`), and the plan's step is the
trainer's own."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import bert_mlm_shakespeare, seq2seq_synthetic, shakespeare_char, vit_tiny
from jaxformer import models
from jaxformer.data.batch_spec import train_batch_spec
from jaxformer.data.pipeline import make_pipeline
from jaxformer.train import config_checks, tasks


def _docs_dir(tmp_path):
  docs = tmp_path / "docs"
  docs.mkdir()
  with open(docs / "a.jsonl", "w") as f:
    for i in range(40):
      f.write(json.dumps({"text": f"document {i} " + "words and more words " * (i % 7 + 1)})
              + "\n")
  return str(docs)


def _configs(tmp_path):
  packed = shakespeare_char.get_config("tiny")
  packed.data.source = _docs_dir(tmp_path)
  return {
      "lm stream": shakespeare_char.get_config("tiny"),
      "lm packed": packed,
      "mlm": bert_mlm_shakespeare.get_config("tiny"),
      "classification": vit_tiny.get_config("digits"),
      "seq2seq": seq2seq_synthetic.get_config(),
  }


@pytest.mark.parametrize("name", ["lm stream", "lm packed", "mlm", "classification",
                                  "seq2seq"])
def test_batch_spec_matches_the_pipelines_first_batch(name, tmp_path):
  cfg = _configs(tmp_path)[name]
  cfg.train.batch_size = 4
  settings = config_checks.validate(cfg)
  task = tasks.task_for(cfg.model)
  pipeline = make_pipeline(cfg, settings, task.name, workdir=str(tmp_path / "run"))
  batch = pipeline.train_batch(0)
  spec = train_batch_spec(cfg, settings, task.name, models.with_defaults(cfg.model))
  got = {k: (tuple(v.shape), np.asarray(v).dtype) for k, v in batch.items()}
  assert spec == got
