"""Image classification (task "classification": vit): an image in, its class out
(`data/images/`); each logged step records its accuracy."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.data import pipeline
from jaxformer.tasks.cross_entropy import CrossEntropyTask


@dataclasses.dataclass(frozen=True)
class Classification(CrossEntropyTask):
  data_kind: str = "images"

  def make_pipeline(self, config, settings, **kw):
    from jaxformer.data.images.pipeline import make_image_pipeline
    return make_image_pipeline(self.data_settings(config, settings),
                               **pipeline.pipeline_kwargs(settings, **kw))

  def batch_spec(self, config, settings, model):
    b, size, channels = settings.train.batch_size, model["image_size"], model.get("channels", 3)
    return {"images": ((b, size, size, channels), np.dtype(np.float32)),
            "labels": ((b,), np.dtype(np.int32))}


TASKS = (Classification("classification", unit="images", inputs=("images",), labels="labels",
                        step_accuracy=True),)
