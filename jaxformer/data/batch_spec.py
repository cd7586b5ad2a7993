"""The shapes and dtypes of a training batch, without reading any data.

Planning a pod run (`jaxformer.plan`) compiles the train step on a machine that has neither
the corpus nor the images; it needs only the batch's layout, which follows from the config.
This module states that layout per task, and a test checks it against the first batch of
every real pipeline (tests/test_plan.py), so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer import run_settings

# The LM batch of packed documents adds where each document starts (data/text.py).
_PACKED_KEYS = ("segment_ids", "positions")


def lm_packing(config) -> str:
  """'stream' or 'packed': `data.packing`, else what the source implies (a single text file
  streams). A source this machine cannot reach (a bucket, a cluster path) is taken as a
  document corpus, which packs."""
  mode = config.data.get("packing")
  if mode is not None:
    return mode
  from jaxformer.data.corpus import sources
  try:
    return "stream" if sources.resolve(config.data.get("source")).one_text else "packed"
  except ValueError:
    return "packed"


def train_batch_spec(config, settings: run_settings.RunSettings, task: str,
                     model: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """{key: (global shape, dtype)} of the train batch of `task` for `config`; `model` is the
  model config with its defaults filled in (image size and channels for images)."""
  b = settings.train.batch_size
  if task in ("lm", "mlm", "mlm_nsp"):
    t = settings.data.seq_len
    if t is None:
      raise ValueError("data.seq_len is not set; a text source needs it: set "
                       "--config.data.seq_len=<tokens per example>")
    tokens = ((b, t), np.dtype(np.int32))
    spec = {"inputs": tokens, "targets": tokens}
    if task in ("mlm", "mlm_nsp"):
      spec["weights"] = ((b, t), np.dtype(np.float32))
    if task == "mlm_nsp":                        # sentence pairs (data/text.py NSPPipeline)
      spec.update(token_type_ids=tokens, nsp_labels=((b,), np.dtype(np.int32)))
    elif lm_packing(config) == "packed":
      spec.update({k: tokens for k in _PACKED_KEYS}, weights=((b, t), np.dtype(np.float32)))
    return spec
  if task in ("sft", "dpo"):            # post-training (posttrain/data.py)
    t = settings.data.seq_len
    if t is None:
      raise ValueError("data.seq_len is not set: set --config.data.seq_len=<tokens per row>")
    tokens, weights = ((b, t), np.dtype(np.int32)), ((b, t), np.dtype(np.float32))
    if task == "sft":                   # packed prompt/response rows
      return {"inputs": tokens, "targets": tokens, "weights": weights,
              "segment_ids": tokens, "positions": tokens}
    return {"pairs": ((b,), np.dtype(np.float32)),
            **{f"{side}_{k}": (weights if k == "weights" else tokens)
               for side in ("chosen", "rejected") for k in ("inputs", "targets", "weights")}}
  if task == "bart_denoising":          # data/denoising.py: windows of seq_len, both sides
    t = settings.data.seq_len
    if t is None:
      raise ValueError("data.seq_len is not set; a text source needs it: set "
                       "--config.data.seq_len=<tokens per example>")
    tokens = ((b, t), np.dtype(np.int32))
    return {"src": tokens, "src_mask": ((b, t), np.dtype(np.bool_)), "tgt_in": tokens,
            "tgt_out": tokens, "weights": ((b, t), np.dtype(np.float32))}
  if task == "classification":
    size, channels = model["image_size"], model.get("channels", 3)
    return {"images": ((b, size, size, channels), np.dtype(np.float32)),
            "labels": ((b,), np.dtype(np.int32))}
  if task == "captioning":              # data/images/captions.py
    from jaxformer.data.images import captions
    size, length = captions.image_size(config.data), captions.caption_length(config.data)
    tokens = ((b, length), np.dtype(np.int32))
    return {"images": ((b, size, size, 1), np.dtype(np.float32)), "tgt_in": tokens,
            "tgt_out": tokens, "weights": ((b, length), np.dtype(np.float32))}
  if task in ("seq2seq", "span_corruption"):
    if task == "seq2seq":
      from jaxformer.data.synthetic import task_generator
      generator = task_generator(config.data)
      src_len, tgt_len = generator.src_len, generator.tgt_len
    else:
      from jaxformer.data import span_corruption
      if settings.data.seq_len is None:
        raise ValueError("data.seq_len is not set; span corruption needs it: set "
                         "--config.data.seq_len=<text tokens per example>")
      density, mean, _ = span_corruption.options(config.data)
      src_len, tgt_len = span_corruption.lengths(settings.data.seq_len, density, mean)
    return {"src": ((b, src_len), np.dtype(np.int32)),
            "src_mask": ((b, src_len), np.dtype(np.bool_)),
            "tgt_in": ((b, tgt_len), np.dtype(np.int32)),
            "tgt_out": ((b, tgt_len), np.dtype(np.int32)),
            "weights": ((b, tgt_len), np.dtype(np.float32))}
  raise ValueError(f"task={task!r} has no batch layout; one of lm, mlm, classification, "
                   "seq2seq, bart_denoising, span_corruption, captioning, sft, dpo")
