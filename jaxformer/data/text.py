"""Character-level text corpora (tiny Shakespeare is bundled) and their LM batches.

A batch is a pure function of (seed, split, step): random windows of seq_len + 1 tokens drawn
with `np.random.default_rng([seed, split, step])`. The data position therefore *is* the step,
so a resumed run sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from jaxformer.data.tokenizers import CharTokenizer

BUNDLED = {"tinyshakespeare": pathlib.Path(__file__).parent / "assets" / "tinyshakespeare.txt"}
SPLITS = ("train", "validation")
_SPLIT_IDS = {"train": 0, "validation": 1}


class TextCorpus:
  """Encoded train/validation token arrays of one text file (first `train_fraction` of the
  characters is train, the rest validation: 90/10 as in nanoGPT's Shakespeare)."""

  def __init__(self, source: str, *, train_fraction: float = 0.9):
    path = BUNDLED.get(source, source)
    if not os.path.isfile(path):
      raise ValueError(f"data.source={source!r}: no such file (bundled sources: "
                       f"{sorted(BUNDLED)})")
    text = pathlib.Path(path).read_text(encoding="utf-8")
    if len(text) < 2:
      raise ValueError(f"data.source={source!r} is empty")
    if not 0.0 < train_fraction < 1.0:
      raise ValueError(f"data.train_fraction={train_fraction} must be in (0, 1)")
    self.tokenizer = CharTokenizer(text)
    ids = self.tokenizer.encode(text)
    n = int(len(ids) * train_fraction)
    self.splits = {"train": ids[:n], "validation": ids[n:]}

  def batch(self, split: str, step: int, *, batch_size: int, seq_len: int, seed: int) -> dict:
    """{'inputs': [B, T], 'targets': [B, T]} int32: next-token windows, deterministic."""
    if split not in self.splits:
      raise ValueError(f"split={split!r} is not one of {SPLITS}")
    ids = self.splits[split]
    if len(ids) <= seq_len + 1:
      raise ValueError(f"data.seq_len={seq_len} is longer than the {split} split "
                       f"({len(ids)} tokens)")
    rng = np.random.default_rng([seed, _SPLIT_IDS[split], step])
    starts = rng.integers(0, len(ids) - seq_len - 1, size=batch_size)
    windows = ids[starts[:, None] + np.arange(seq_len + 1)]
    return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
