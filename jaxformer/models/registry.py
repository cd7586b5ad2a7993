"""The model-family registry and `build(config.model)`: the one place that maps
`model.family` to everything known about it (see `family.Family`)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import block_settings as settings_lib
from jaxformer.models.family import Family, module_fields

_FAMILIES: dict[str, Family] = {}
_DTYPES = ("float32", "bfloat16", "float16")
# Module fields that are not config keys: `block` is given as its flat keys, `decode` is the
# inference-time variant (`generate` sets it), `kv_cache` its compressed cache (layers/kv_cache).
_NOT_CONFIG = ("block", "decode", "kv_cache")


def register(family: Family, *, replace: bool = False) -> Family:
  """Add `family` to the registry (a test or plugin can add its own)."""
  if not isinstance(family, Family):
    raise TypeError(f"register() takes a models.Family; got {type(family).__name__}")
  if family.name in _FAMILIES and not replace:
    raise ValueError(f"model family {family.name!r} is already registered (replace=True to "
                     "override it)")
  _FAMILIES[family.name] = family
  return family


def unregister(name: str):
  _FAMILIES.pop(name, None)


def get(name: Any) -> Family:
  """The entry of `model.family=name`; a ValueError listing the known families otherwise."""
  if name not in _FAMILIES:
    raise ValueError(f"model.family={name!r} is not one of {sorted(_FAMILIES)}")
  return _FAMILIES[name]


def names() -> tuple[str, ...]:
  return tuple(_FAMILIES)


class ConfigField(NamedTuple):
  """A `model.*` config key: its default (`dataclasses.MISSING` if required) and type (the
  annotation string, e.g. 'int | None')."""
  default: Any
  type: Any


def config_fields(family: str) -> dict[str, ConfigField]:
  """Every config key of `model.family=family` (besides `family` and `name`), in order: the
  module's own fields, then the shared block settings with the family's defaults."""
  entry = get(family)
  out = {k: ConfigField(f.default, f.type) for k, f in module_fields(entry.module).items()
         if k not in _NOT_CONFIG}
  if entry.has_blocks:
    for key, (default, kind) in settings_lib.config_fields(entry.block_defaults).items():
      out[key] = ConfigField(default, kind)
  return out


def config_as_dict(model_config: Any) -> dict:
  """A model config (ConfigDict or mapping) as a plain dict."""
  if hasattr(model_config, "to_dict"):
    model_config = model_config.to_dict()
  if not isinstance(model_config, Mapping):
    raise ValueError(f"model_config must be a dict or ConfigDict; got {type(model_config)}")
  return dict(model_config)


def with_defaults(model_config: Any) -> dict:
  """The model config as a dict with every config key of its family, absent ones at the
  family's default (dtypes by name, so the result is JSON data like a saved config.json)."""
  cfg = config_as_dict(model_config)
  defaults = {k: _dtype_name(f.default) if k in ("dtype", "param_dtype") else f.default
              for k, f in config_fields(get(cfg.get("family")).name).items()
              if f.default is not dataclasses.MISSING}
  return {**defaults, **cfg}


def build(model_config: Any) -> nn.Module:
  """The linen Module described by `model_config` (a ConfigDict, dict or the run's typed
  `ModelSettings` with `family`), validated before anything is traced: errors name the
  `model.*` key and the fix."""
  cfg = config_as_dict(model_config)
  decode = cfg.pop("decode", None)
  entry, _, own = _checked(cfg)
  for key in ("dtype", "param_dtype"):
    if key in own:
      own[key] = jnp.dtype(own[key])
  if decode is not None:
    own["decode"] = decode
  return entry.module(**own)


def validated(model_config: Any) -> dict:
  """`with_defaults(model_config)` after every check of `build` (errors name the `model.*`
  key and the fix), without building the module: what `models.settings` types."""
  cfg = config_as_dict(model_config)
  entry, full, _ = _checked(cfg)
  name = cfg.get("name")
  return {"family": entry.name, **({"name": name} if name is not None else {}), **full}


def _checked(cfg: dict) -> tuple[Family, dict, dict]:
  """The family of the model config `cfg` (a dict, without `decode`), its fields with the
  family's defaults (`with_defaults` less `family` and `name`) and the module's arguments
  (`block` the typed block settings), every field checked."""
  cfg = dict(cfg)
  entry = get(cfg.pop("family", None))
  cfg.pop("name", None)
  fields = config_fields(entry.name)
  for key in cfg:
    if key not in fields:
      near = difflib.get_close_matches(key, fields, n=1)
      hint = f" (did you mean model.{near[0]}?)" if near else ""
      raise ValueError(f"model.{key} is not a field of the {entry.name!r} model{hint}; known "
                       f"fields: {sorted(fields)}")
  missing = [k for k, f in fields.items() if k not in cfg and f.default is dataclasses.MISSING]
  if missing:
    raise ValueError(f"model.{missing[0]} is required for model.family={entry.name!r}")
  full = with_defaults(dict(cfg, family=entry.name))
  del full["family"]
  own = {k: v for k, v in full.items() if k not in settings_lib.CONFIG_KEYS}
  _check_module_fields(entry, own)
  if entry.has_blocks:
    block = settings_lib.from_config({k: full[k] for k in settings_lib.CONFIG_KEYS})
    if "d_model" in own:
      block.check_width(own["d_model"])
    own["block"] = block
  if entry.validate is not None:
    entry.validate(full)
  return entry, full, own


def _check_module_fields(entry: Family, c: dict):
  """Checks every family shares: ints > 0 (>= 0 for an int field whose default is 0, an
  off switch such as DeBERTa's emd_layers), dtypes."""
  fields = module_fields(entry.module)
  types = {k: f.type for k, f in fields.items()}
  for key, value in c.items():
    kind = str(types.get(key, ""))
    if kind in ("int", "int | None"):
      settings_lib.check_positive_int(value, key, optional=kind == "int | None",
                                      zero="off" if fields[key].default == 0 else None)
    if key in ("dtype", "param_dtype") and _dtype_name(value) not in _DTYPES:
      raise ValueError(f"model.{key}={value!r} is not one of {_DTYPES}")


def _dtype_name(value) -> str:
  try:
    return value if isinstance(value, str) else jnp.dtype(value).name
  except TypeError:
    return repr(value)
