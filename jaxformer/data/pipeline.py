"""What every data pipeline's constructor shares, and which sources each batch layout reads.

The task (`jaxformer.tasks`: each task's `make_pipeline`) picks the pipeline that builds its
batches; `data.source` picks where the examples come from:
- text (tasks lm, mlm, mlm_nsp, rtd): "tinyshakespeare" (bundled), a file, directory or glob
  of .txt / .jsonl / .parquet (optionally .gz), a saved Hugging Face dataset, or
  "tfds:<name>" with a text feature (e.g. "tfds:lm1b"), see `jaxformer.data.corpus`;
- images (classification): "digits" (scikit-learn's bundled 8x8 digits), "mnist:<dir>" (IDX
  files), "images:<root>" (root/<split>/<class>/*.png), or "tfds:<name>" (e.g. "tfds:mnist");
- synthetic sequence tasks (seq2seq): "synthetic:copy" | "synthetic:reverse" | "synthetic:recall";
- BART's denoising (bart_denoising): a text source as for lm/mlm (data/denoising.py);
- T5's span corruption (span_corruption): the text sources, see `jaxformer.data.span_corruption`;
- image captioning (captioning): "mnist:<dir>" or "digits", digits composed into captioned
  images (`jaxformer.data.images.captions`);
- post-training (sft, dpo): JSONL records (`jaxformer.posttrain.data`).
Each task's kind of source (`Task.data_kind`) types its `data` keys: `jaxformer.data.settings`.
"""

from __future__ import annotations

from jaxformer import run_settings


def pipeline_kwargs(settings: run_settings.RunSettings, *, workdir: str, process_index: int = 0,
                    process_count: int = 1) -> dict:
  """The keyword arguments of every pipeline constructor, from the run's typed settings."""
  train = settings.train
  return dict(seed=train.seed, global_batch_size=train.batch_size,
              eval_batch_size=train.eval_batch_size or train.batch_size,
              process_index=process_index, process_count=process_count, workdir=workdir,
              data_dir=settings.data.data_dir)
