"""ml_collections configs, big_vision style: `configs/<name>.py` has `get_config(arg=None)`.

By path (absl flags): `--config=configs/gpt2.py:small --config.model.dropout_rate=0.0`.
As modules: `configs.get_config("gpt2", "small")`, `configs.names("gpt2")`.
`arg=None` gives each file's `tiny` config (the one that runs on a laptop CPU).
"""

from __future__ import annotations

import importlib

# Config files with published sizes (each has SIZES: the valid `arg` names).
MODULES = ("gpt2", "gpt3", "llama", "mixtral", "bert", "roberta", "vit", "transformer",
           "t5", "bart", "deberta", "electra")


def _module(name: str):
  if name not in MODULES:
    raise ValueError(f"unknown config file {name!r}; valid names: {', '.join(MODULES)}")
  return importlib.import_module(f"configs.{name}")


def get_config(name: str, arg: str | None = None):
  """`configs/<name>.py:<arg>` as a ConfigDict (unlocked)."""
  return _module(name).get_config(arg)


def names(name: str) -> tuple[str, ...]:
  """The valid `arg` names of `configs/<name>.py`."""
  return tuple(_module(name).SIZES)
