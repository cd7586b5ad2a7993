"""`make_pipeline(config, settings, task)`: the data pipeline a training config asks for.

The task (the model family's registry entry names it, see `jaxformer.train.tasks`) fixes the
batch layout; `data.source` picks where the examples come from:
- text (tasks lm, mlm, mlm_nsp): "tinyshakespeare" (bundled), a file, directory or glob of .txt /
  .jsonl / .parquet (optionally .gz), a saved Hugging Face dataset, or "tfds:<name>" with a
  text feature (e.g. "tfds:lm1b"), see `jaxformer.data.corpus`;
- images (classification): "digits" (scikit-learn's bundled 8x8 digits), "mnist:<dir>" (IDX
  files), "images:<root>" (root/<split>/<class>/*.png), or "tfds:<name>" (e.g. "tfds:mnist");
- synthetic sequence tasks (seq2seq): "synthetic:copy" | "synthetic:reverse" | "synthetic:recall";
- BART's denoising (bart_denoising): a text source as for lm/mlm (data/denoising.py).
- T5's span corruption (span_corruption): the text sources, see `jaxformer.data.span_corruption`.
- image captioning (captioning): "mnist:<dir>" or "digits", digits composed into captioned
  images (`jaxformer.data.images.captions`).
"""

from __future__ import annotations

from jaxformer import run_settings
from jaxformer.data.batching import Pipeline


def make_pipeline(config, settings: run_settings.RunSettings, task: str, *, workdir: str,
                  process_index: int = 0, process_count: int = 1) -> Pipeline:
  """The pipeline of `task` ("lm" | "mlm" | "classification" | "seq2seq") for `config`, whose
  typed sections are `settings` (`config.data` also holds the source's own keys, which its
  pipeline reads)."""
  data, train, source = config.data, settings.train, settings.data.source
  kw = dict(seed=train.seed, global_batch_size=train.batch_size,
            eval_batch_size=train.eval_batch_size or train.batch_size,
            process_index=process_index, process_count=process_count, workdir=workdir,
            data_dir=settings.data.data_dir)
  if task in ("lm", "mlm", "mlm_nsp"):
    from jaxformer.data.text import make_text_pipeline
    return make_text_pipeline(data, task, **kw)
  if task == "bart_denoising":                # BART's text infilling + sentence permutation
    from jaxformer.data.denoising import DenoisingPipeline
    return DenoisingPipeline(data, **kw)
  if task == "span_corruption":
    from jaxformer.data.span_corruption import SpanCorruptionPipeline
    return SpanCorruptionPipeline(data, **kw)
  if task == "captioning":
    from jaxformer.data.images.captions import make_caption_pipeline
    return make_caption_pipeline(data, **kw)
  if task == "classification":
    from jaxformer.data.images.pipeline import make_image_pipeline
    return make_image_pipeline(data, **kw)
  if not source.startswith("synthetic:"):
    raise ValueError(f"data.source={source!r}: seq2seq models train on the synthetic tasks "
                     "'synthetic:copy', 'synthetic:reverse' or 'synthetic:recall'")
  from jaxformer.data.synthetic import make_synthetic_pipeline
  return make_synthetic_pipeline(data, **kw)
