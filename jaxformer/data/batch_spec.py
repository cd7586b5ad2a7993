"""What the shapes of a training batch depend on, without reading any data.

Planning a pod run (`jaxformer.plan`) compiles the train step on a machine that has neither
the corpus nor the images; it needs only the batch's layout, which follows from the config.
Each task states its layout (`Task.batch_spec`, `jaxformer.tasks`); tests check it against
the first batch of every real pipeline (tests/tpu_compile/test_plan.py), so the two cannot drift apart.
"""

from __future__ import annotations

import numpy as np

from jaxformer.data import settings as source_settings

# The LM batch of packed documents adds where each document starts (data/text.py).
_PACKED_KEYS = ("segment_ids", "positions")


def lm_packing(data: source_settings.TextSettings) -> str:
  """'stream' or 'packed': `data.packing`, else what the source implies (a single text file
  streams). A source this machine cannot reach (a bucket, a cluster path) is taken as a
  document corpus, which packs."""
  if data.packing is not None:
    return data.packing
  from jaxformer.data.corpus import sources
  try:
    return "stream" if sources.resolve(data.source).one_text else "packed"
  except ValueError:
    return "packed"


def text_batch_spec(data: source_settings.TextSettings, batch_size: int,
                    kind: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """{key: (global shape, dtype)} of the train batch of `text.make_text_pipeline(data, kind)`
  (kind 'lm' | 'mlm' | 'mlm_nsp') for a global batch of `batch_size` rows."""
  b = batch_size
  t = data.seq_len
  if t is None:
    raise ValueError("data.seq_len is not set; a text source needs it: set "
                     "--config.data.seq_len=<tokens per example>")
  tokens = ((b, t), np.dtype(np.int32))
  spec = {"inputs": tokens, "targets": tokens}
  if kind in ("mlm", "mlm_nsp"):
    spec["weights"] = ((b, t), np.dtype(np.float32))
  if kind == "mlm_nsp":                        # sentence pairs (data/text.py NSPPipeline)
    spec.update(token_type_ids=tokens, nsp_labels=((b,), np.dtype(np.int32)))
  elif lm_packing(data) == "packed":
    spec.update({k: tokens for k in _PACKED_KEYS}, weights=((b, t), np.dtype(np.float32)))
  return spec
