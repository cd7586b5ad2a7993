"""Shared section builders for the configs in this directory (big_vision style).

Every training config has the top-level sections `model`, `data`, `train`, `optim`, `mesh`
(see /work/shared/DESIGN.md) and, for published models, `reference` (numbers quoted from the
paper or the reference implementation: parameter counts, batch sizes, learning rates).

`model(family, name, **fields)` fills in *every* config key of the family
(`models.config_fields`: the module's own fields and the shared block settings) from its
defaults, and `train`, `optim`, `data` and `mesh` every key of their typed settings
(`jaxformer.run_settings`, where the defaults and ranges live), so any key can be overridden
on the command line (`config_flags` only overrides keys that exist in the locked config).
Optional fields whose default is None become typed `placeholder`s, so
`--config.model.window=4096` parses as an int. Values are checked when a command reads the
config (`run_settings.parse`, `models.build`), not here.

Configs are loaded by path (`--config=configs/gpt2.py:small`) or imported as modules
(`from configs import gpt2`); `configs.get_config("gpt2", "small")` does the latter.
The `data.source` / `data.tokenizer` names are the ones the data module will resolve
(tiny Shakespeare char-level for the tiny LMs, so everything runs offline on a laptop).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ml_collections import config_dict

from jaxformer import models, run_settings

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "tuple": tuple}


def _placeholder_type(annotation: Any):
  """'int | None' -> int, 'tuple[int, int] | None' -> tuple (annotations are strings under
  `from __future__ import annotations`)."""
  if isinstance(annotation, str):
    parts = [p.strip() for p in annotation.split("|") if p.strip() != "None"]
    return _TYPES.get(parts[0].split("[")[0]) if len(parts) == 1 else None
  return annotation if annotation in _TYPES.values() else None


def model(family: str, name: str, **fields) -> config_dict.ConfigDict:
  """`model` section: family, name, then all fields of the family's module (given or default).

  A field given as None (or defaulting to None) is stored as a typed placeholder.
  """
  known = models.config_fields(family)
  unknown = sorted(set(fields) - set(known))
  if unknown:
    raise ValueError(f"model.{unknown[0]} is not a field of the {family!r} model; known "
                     f"fields: {sorted(known)}")
  defaults = models.with_defaults({"family": family})      # dtypes by name
  cfg = config_dict.ConfigDict()
  cfg.family = family
  cfg.name = name
  for key, field in known.items():
    value = fields[key] if key in fields else defaults.get(key)
    if value is None:
      kind = _placeholder_type(field.type)
      value = config_dict.placeholder(kind) if kind is not None else None
    cfg[key] = value
  return cfg


def _section(name: str, values: dict, *, own_keys: bool = False) -> config_dict.ConfigDict:
  """The `name` section: every key of its typed settings (`jaxformer.run_settings`) at its
  default unless given. Floats stay floats (`lr=1` is 1.0, so `--config.optim.lr=0.5` parses);
  keys left None become typed placeholders (`--config.data.data_dir=/x` parses). A key the
  settings do not name is a typo, except in `data` (`own_keys`: a source's own keys)."""
  kind = run_settings.SECTIONS[name]
  fields = {f.name: f for f in dataclasses.fields(kind)}
  unknown = sorted(set(values) - set(fields))
  if unknown and not own_keys:
    raise ValueError(f"{name}.{unknown[0]} is not a {name} setting; the settings are "
                     f"{sorted(fields)}")
  merged = {**run_settings.defaults(name), **values}
  cfg = config_dict.ConfigDict()
  for key in [*fields, *unknown]:
    value = merged.get(key)
    if key in fields and "float" in str(fields[key].type) and isinstance(value, int):
      value = float(value)
    cfg[key] = value
  for key, kind in run_settings.optional_keys(name).items():
    if cfg[key] is None:
      cfg[key] = config_dict.placeholder(kind)
  return cfg


def data(source: str, tokenizer: str | None, seq_len: int | None, **own
         ) -> config_dict.ConfigDict:
  """`data` section: where examples come from (see jaxformer.data.pipeline), how they are
  tokenized, the sequence length, the settings every source shares (`DataSettings`) and the
  source's own keys (`own`: e.g. `packing`, `augment`, `vocab_size`)."""
  return _section("data", dict(source=source, tokenizer=tokenizer, seq_len=seq_len, **own),
                  own_keys=True)


def train(steps: int, batch_size: int, **settings) -> config_dict.ConfigDict:
  """`train` section (`run_settings.TrainSettings`): batch_size counts sequences (or images)
  per optimizer step."""
  return _section("train", dict(steps=steps, batch_size=batch_size, **settings))


def optim(lr: float, **settings) -> config_dict.ConfigDict:
  """`optim` section (`run_settings.OptimSettings`): AdamW; `lr` is the peak learning rate of
  `schedule`."""
  return _section("optim", dict(lr=lr, **settings))


def mesh(**sizes) -> config_dict.ConfigDict:
  """`mesh` section (`run_settings.MeshSettings`): device-mesh axis sizes; -1 takes all
  remaining devices."""
  return _section("mesh", sizes)


def reference(params: int | float | None = None, *, source: str = "", **extra
              ) -> config_dict.ConfigDict:
  """`reference` section: published numbers (not read by training code)."""
  ref = config_dict.ConfigDict(dict(source=source, **extra))
  ref.params = config_dict.placeholder(int) if params is None else params
  return ref


def config(*, model: config_dict.ConfigDict, data: config_dict.ConfigDict,
           train: config_dict.ConfigDict, optim: config_dict.ConfigDict,
           mesh: config_dict.ConfigDict | None = None,
           reference: config_dict.ConfigDict | None = None) -> config_dict.ConfigDict:
  """The full training config from its sections."""
  cfg = config_dict.ConfigDict()
  cfg.model, cfg.data, cfg.train, cfg.optim = model, data, train, optim
  cfg.mesh = mesh if mesh is not None else globals()["mesh"]()
  if reference is not None:
    cfg.reference = reference
  return cfg


def select(module_name: str, arg: str | None, table: Mapping[str, Any], default: str = "tiny"):
  """The entry of `table` named `arg` (None -> `default`); a ValueError lists the names."""
  key = default if arg is None or arg == "" else arg
  if key not in table:
    raise ValueError(f"unknown {module_name} config {arg!r}; valid names: "
                     f"{', '.join(table)}")
  return key, table[key]
