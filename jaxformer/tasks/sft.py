"""Supervised fine-tuning (task "sft", `posttrain.method='sft'`): the lm objective on packed
prompt/response rows whose weights are 1 on response tokens only; segment ids keep examples
apart (`posttrain/data.py`, with the tokenizer of the run it starts from)."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.data import pipeline
from jaxformer.tasks.lm import NextToken


def posttrain_pipeline(config, settings, method: str, data, **kw):
  """The post-training pipeline of `method` ('sft' | 'dpo' | 'grpo') on the typed `data`
  settings, `posttrain/data.py`."""
  from jaxformer.posttrain import data as posttrain_data
  return posttrain_data.make_pipeline(config, method, data=data, posttrain=settings.posttrain,
                                      **pipeline.pipeline_kwargs(settings, **kw))


def seq_len(settings) -> int:
  t = settings.data.seq_len
  if t is None:
    raise ValueError("data.seq_len is not set: set --config.data.seq_len=<tokens per row>")
  return t


@dataclasses.dataclass(frozen=True)
class SupervisedFineTuning(NextToken):
  data_kind: str = "posttrain_records"

  def make_pipeline(self, config, settings, **kw):
    return posttrain_pipeline(config, settings, "sft", self.data_settings(config, settings),
                              **kw)

  def batch_spec(self, config, settings, model):
    b, t = settings.train.batch_size, seq_len(settings)
    tokens, weights = ((b, t), np.dtype(np.int32)), ((b, t), np.dtype(np.float32))
    return {"inputs": tokens, "targets": tokens, "weights": weights,
            "segment_ids": tokens, "positions": tokens}


TASKS = (SupervisedFineTuning("sft", inputs=("inputs",),
                              optional=(("segment_ids", "segment_ids"),
                                        ("positions", "positions")),
                              counted="inputs", context=("inputs",), text=True, samples=True),)
