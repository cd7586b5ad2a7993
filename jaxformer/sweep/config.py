"""A point's training config, exactly as train's command line gives it: the `--config.*` flag
of a value, the base config's path, and the config parsed by `config_flags` and checked by
train's own `config_checks.validate`, so every mistake train would refuse fails before any
point runs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jaxformer.cli import format_value

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_path(path: str, what: str) -> str:
  """An absolute path: as given, else relative to the cwd, else to the repo root."""
  for candidate in (path, os.path.join(REPO_ROOT, path)):
    if os.path.isfile(candidate):
      return os.path.abspath(candidate)
  raise ValueError(f"{what}={path!r}: no such file (relative paths are tried from the "
                   f"current directory and from the repo root {REPO_ROOT})")


def resolve_base(base: str) -> str:
  """`base` ('path.py[:arg]') with an absolute path, so points run from any directory."""
  path, sep, arg = base.partition(":")
  return resolve_path(path, "sweep base") + sep + arg


def load_config(base: str, overrides: Mapping[str, Any]):
  """The training config `base` with `overrides`, parsed exactly as train's command line."""
  from absl import flags

  argv = ["sweep", f"--config={resolve_base(base)}",
          *(f"--config.{k}={format_value(v)}" for k, v in overrides.items())]
  _check_fields(_parse_config_flags(argv[:2]), overrides)
  try:
    config = _parse_config_flags(argv)
  except flags.Error as e:
    raise ValueError(f"sweep override does not parse: {e}") from e
  _check_values(config, overrides)
  return config


def _parse_config_flags(argv: list[str]):
  """The config that `--config=... --config.x=v` in `argv` gives (fresh flag registry)."""
  from absl import flags
  from ml_collections import config_flags

  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "training config", flag_values=flag_values,
                                  lock_config=True, sys_argv=argv)
  flag_values(argv)
  return flag_values.config


def _lookup(config, key: str):
  node = config
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node:
      raise KeyError(part)
    node = node[part]
  return node


def _check_fields(config, overrides: Mapping[str, Any]):
  for key in overrides:
    try:
      _lookup(config, key)
    except KeyError:
      parent = key.rpartition(".")[0]
      try:
        known = sorted(_lookup(config, parent).keys()) if parent else sorted(config.keys())
      except KeyError:
        known = sorted(config.keys())
      raise ValueError(f"sweep field {key!r} is not in the base config; fields of "
                       f"{parent or 'the config'}: {known}") from None


def _check_values(config, overrides: Mapping[str, Any]):
  """Guard against silent coercion (e.g. an int given for a str field)."""
  for key, value in overrides.items():
    parsed = _lookup(config, key)
    expected = tuple(value) if isinstance(value, list) else value
    if parsed != expected or type(parsed) is str and not isinstance(value, str):
      raise ValueError(f"sweep field {key!r}={value!r} becomes {parsed!r} "
                       f"({type(parsed).__name__}) in the config; give a value of that type")


def validated(base: str, overrides: Mapping[str, Any], name: str):
  """(config, its typed settings, `scaling.count_params` of its model) of the point `name`; a
  ValueError names the point when train would refuse its config."""
  from jaxformer import scaling
  from jaxformer.train import config_checks

  config = load_config(base, overrides)
  try:
    settings = config_checks.validate(config)   # exactly what train checks before it writes
    params = scaling.count_params(settings.model)
  except ValueError as e:
    raise ValueError(f"sweep point {name!r}: {e}") from e
  return config, settings, params
