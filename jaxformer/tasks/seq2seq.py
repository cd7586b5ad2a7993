"""Teacher-forced sequence to sequence (the encoder-decoder families): a source sequence in,
the target tokens out, `tgt_in` the target shifted right.

Three registry entries share it: "seq2seq" (seq2seq, rnn_seq2seq) on the synthetic tasks
(`data/synthetic.py`; evals count whole sequences right too), "bart_denoising" (bart: the
original text from a corrupted copy, `data/denoising.py`) and "span_corruption" (t5: T5's
objective, `data/span_corruption.py`), both made from text.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.data import pipeline
from jaxformer.tasks.cross_entropy import CrossEntropyTask


def _spec(b: int, src_len: int, tgt_len: int) -> dict:
  return {"src": ((b, src_len), np.dtype(np.int32)),
          "src_mask": ((b, src_len), np.dtype(np.bool_)),
          "tgt_in": ((b, tgt_len), np.dtype(np.int32)),
          "tgt_out": ((b, tgt_len), np.dtype(np.int32)),
          "weights": ((b, tgt_len), np.dtype(np.float32))}


@dataclasses.dataclass(frozen=True)
class Synthetic(CrossEntropyTask):
  """The synthetic copy / reverse / recall tasks."""
  data_kind: str = "synthetic"

  def make_pipeline(self, config, settings, **kw):
    kw = pipeline.pipeline_kwargs(settings, **kw)
    data = self.data_settings(config, settings)
    source = data.source
    if not source.startswith("synthetic:"):
      raise ValueError(f"data.source={source!r}: seq2seq models train on the synthetic tasks "
                       "'synthetic:copy', 'synthetic:reverse' or 'synthetic:recall'")
    from jaxformer.data.synthetic import make_synthetic_pipeline
    return make_synthetic_pipeline(data, **kw)

  def batch_spec(self, config, settings, model):
    from jaxformer.data.synthetic import task_generator
    generator = task_generator(self.data_settings(config, settings))
    return _spec(settings.train.batch_size, generator.src_len, generator.tgt_len)


@dataclasses.dataclass(frozen=True)
class Denoising(CrossEntropyTask):
  """BART's text infilling + sentence permutation: windows of seq_len on both sides."""
  data_kind: str = "denoising"

  def make_pipeline(self, config, settings, **kw):
    from jaxformer.data.denoising import DenoisingPipeline
    return DenoisingPipeline(self.data_settings(config, settings),
                             **pipeline.pipeline_kwargs(settings, **kw))

  def batch_spec(self, config, settings, model):
    t = self.data_settings(config, settings).seq_len
    if t is None:
      raise ValueError("data.seq_len is not set; a text source needs it: set "
                       "--config.data.seq_len=<tokens per example>")
    b = settings.train.batch_size
    tokens = ((b, t), np.dtype(np.int32))
    return {"src": tokens, "src_mask": ((b, t), np.dtype(np.bool_)), "tgt_in": tokens,
            "tgt_out": tokens, "weights": ((b, t), np.dtype(np.float32))}


@dataclasses.dataclass(frozen=True)
class SpanCorruption(CrossEntropyTask):
  """T5's span corruption: noise spans of the text replaced by sentinels in, the spans out."""
  data_kind: str = "span_corruption"

  def make_pipeline(self, config, settings, **kw):
    from jaxformer.data.span_corruption import SpanCorruptionPipeline
    return SpanCorruptionPipeline(self.data_settings(config, settings),
                                  **pipeline.pipeline_kwargs(settings, **kw))

  def batch_spec(self, config, settings, model):
    from jaxformer.data import span_corruption
    data = self.data_settings(config, settings)
    if data.seq_len is None:
      raise ValueError("data.seq_len is not set; span corruption needs it: set "
                       "--config.data.seq_len=<text tokens per example>")
    src_len, tgt_len = span_corruption.lengths(data.seq_len, data.noise_density,
                                               data.mean_noise_span_length)
    return _spec(settings.train.batch_size, src_len, tgt_len)


_SEQ2SEQ = dict(inputs=("src", "tgt_in"), optional=(("src_mask", "src_mask"),),
                labels="tgt_out", counted="tgt_out", context=("src", "tgt_out"))
TASKS = (Synthetic("seq2seq", sequence_accuracy=True, **_SEQ2SEQ),
         Denoising("bart_denoising", text=True, **_SEQ2SEQ),
         SpanCorruption("span_corruption", text=True, **_SEQ2SEQ))
