"""Image captioning (task "captioning": captioner): an image in, its caption out,
teacher-forced like seq2seq (`data/images/captions.py`); the image grid is the encoder's
context (the family counts its tokens)."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.data import pipeline
from jaxformer.tasks.cross_entropy import CrossEntropyTask


@dataclasses.dataclass(frozen=True)
class Captioning(CrossEntropyTask):
  data_kind: str = "captions"

  def make_pipeline(self, config, settings, **kw):
    from jaxformer.data.images.captions import make_caption_pipeline
    return make_caption_pipeline(self.data_settings(config, settings),
                                 **pipeline.pipeline_kwargs(settings, **kw))

  def batch_spec(self, config, settings, model):
    b = settings.train.batch_size
    data = self.data_settings(config, settings)
    size, length = data.image_size, data.caption_length
    tokens = ((b, length), np.dtype(np.int32))
    return {"images": ((b, size, size, 1), np.dtype(np.float32)), "tgt_in": tokens,
            "tgt_out": tokens, "weights": ((b, length), np.dtype(np.float32))}


TASKS = (Captioning("captioning", inputs=("images", "tgt_in"), labels="tgt_out",
                    counted="tgt_out", context=("tgt_out",), sequence_accuracy=True),)
