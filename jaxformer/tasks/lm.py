"""Next-token prediction (task "lm": the decoder families): a text stream or packed
documents in, each position's next token out (`data/text.py`)."""

from __future__ import annotations

import dataclasses

from jaxformer.data import batch_spec, pipeline, text
from jaxformer.tasks.cross_entropy import CrossEntropyTask


@dataclasses.dataclass(frozen=True)
class NextToken(CrossEntropyTask):
  data_kind: str = "text"

  def make_pipeline(self, config, settings, **kw):
    return text.make_text_pipeline(self.data_settings(config, settings), "lm",
                                   **pipeline.pipeline_kwargs(settings, **kw))

  def batch_spec(self, config, settings, model):
    del model
    return batch_spec.text_batch_spec(self.data_settings(config, settings),
                                      settings.train.batch_size, "lm")


TASKS = (NextToken("lm", inputs=("inputs",),
                   optional=(("segment_ids", "segment_ids"), ("positions", "positions")),
                   counted="inputs", context=("inputs",), text=True, samples=True),)
