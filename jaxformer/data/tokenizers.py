"""Tokenizers. Each one saves itself to JSON so `sample` can decode with the run's vocabulary."""

from __future__ import annotations

import json
import os

import numpy as np


class CharTokenizer:
  """One id per distinct character of the training text, in sorted order (nanoGPT's scheme)."""
  kind = "char"

  def __init__(self, chars: str):
    if not chars:
      raise ValueError("CharTokenizer needs a non-empty character set")
    self.chars = "".join(sorted(set(chars)))
    self._index = {c: i for i, c in enumerate(self.chars)}

  @property
  def vocab_size(self) -> int:
    return len(self.chars)

  def encode(self, text: str) -> np.ndarray:
    unknown = sorted(set(text) - set(self._index))
    if unknown:
      raise ValueError(f"characters {unknown[:10]!r} are not in the tokenizer's vocabulary")
    return np.fromiter((self._index[c] for c in text), np.int32, len(text))

  def decode(self, ids) -> str:
    return "".join(self.chars[int(i)] for i in np.asarray(ids).reshape(-1))

  def save(self, path: str | os.PathLike):
    with open(path, "w") as f:
      json.dump({"kind": self.kind, "chars": self.chars}, f)

  @classmethod
  def load(cls, path: str | os.PathLike) -> "CharTokenizer":
    with open(path) as f:
      spec = json.load(f)
    if spec.get("kind") != cls.kind:
      raise ValueError(f"{path} holds a {spec.get('kind')!r} tokenizer, not {cls.kind!r}")
    return cls(spec["chars"])
