"""`make_pipeline(config)`: the data pipeline a training config asks for.

The model family's registry entry fixes the task (`jaxformer.models.get(family).task`, see
`jaxformer.train.tasks`); `data.source` picks where the examples come from:
- text (tasks lm, mlm): "tinyshakespeare" (bundled), a path to a .txt file, or "tfds:<name>"
  with a text feature (e.g. "tfds:lm1b");
- images (classification): "digits" (scikit-learn's bundled 8x8 digits), "mnist:<dir>" (IDX
  files), "images:<root>" (root/<split>/<class>/*.png), or "tfds:<name>" (e.g. "tfds:mnist");
- synthetic sequence tasks (seq2seq): "synthetic:copy" | "synthetic:reverse" | "synthetic:recall".
"""

from __future__ import annotations

from jaxformer import models
from jaxformer.data.batching import Pipeline


def make_pipeline(config, *, workdir: str, process_index: int = 0,
                  process_count: int = 1) -> Pipeline:
  task, data, train = models.get(config.model.get("family")).task, config.data, config.train
  source = data.get("source")
  if not isinstance(source, str) or not source:
    raise ValueError(f"data.source={source!r} must name a dataset (see jaxformer.data.pipeline)")
  kw = dict(seed=train.seed, global_batch_size=train.batch_size,
            eval_batch_size=train.get("eval_batch_size") or train.batch_size,
            process_index=process_index, process_count=process_count, workdir=workdir,
            data_dir=data.get("data_dir"))
  if task in ("lm", "mlm"):
    from jaxformer.data.text import make_text_pipeline
    return make_text_pipeline(data, task, **kw)
  if task == "classification":
    from jaxformer.data.images.pipeline import make_image_pipeline
    return make_image_pipeline(data, **kw)
  if not source.startswith("synthetic:"):
    raise ValueError(f"data.source={source!r}: seq2seq models train on the synthetic tasks "
                     "'synthetic:copy', 'synthetic:reverse' or 'synthetic:recall'")
  from jaxformer.data.synthetic import make_synthetic_pipeline
  return make_synthetic_pipeline(data, **kw)
