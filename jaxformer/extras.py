"""Optional dependencies: each feature that needs one names the pip extra that installs it.

`pip install -e .` is enough for the README's main job; SentencePiece/Hugging Face tokenizers
(`[text]`), scikit-learn's bundled digits and sacrebleu's caption BLEU (`[vision]`), Hugging
Face checkpoints (`[hf]`), Parquet / saved Hugging Face dataset sources (`[corpora]`), the
W&B and MLflow trackers (`[wandb]`, `[mlflow]`) and lm-evaluation-harness (`[eval]`) come
with extras (`[test]` installs all of them).
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, *, extra: str, needed_for: str) -> ModuleType:
  """Import `module`, or raise an ImportError that says which extra installs it."""
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f"{needed_for} needs `{module.split('.')[0]}`: pip install "
                      f"'jaxformer[{extra}]'") from e
