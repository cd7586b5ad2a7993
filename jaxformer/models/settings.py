"""The typed `model` section of a run: one frozen object with the family's name and every
field of that family at its resolved default, made from the registry's `config_fields`
(a new family needs no code here).

    m = run_settings.parse(config).model      # or config_checks.validate(config).model
    m = models.settings_of(config)             # the model section alone, parsed
    m.family, m.d_model, m.vocab_size          # attribute access; hashable, immutable
    models.build(m)                            # the linen Module (any model config works)

`parse` runs every check of `models.build` (errors name the `model.*` key and the fix, an
unknown key with the nearest known one), then the type of each field from its annotation.
Values are JSON data: dtypes by name, lists as tuples. The object is also a read-only
mapping (`m["d_model"]`, `m.get`, `dict(m)`, `m.to_dict()`), so it goes wherever a model
config did (`inference.generate(m, params, ...)`). `jaxformer.models` registers `parse`
with `run_settings`, which imports nothing of jaxformer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from jaxformer import run_settings
from jaxformer.models import registry

# names a model field may not take: the mapping view's own
_RESERVED = ("get", "keys", "items", "values", "to_dict")


class ModelSettings(Mapping):
  """The base of every family's settings class (`settings_class`): a frozen dataclass of
  `family`, `name` (a label, None unless set) and the family's fields."""

  def to_dict(self) -> dict:
    """The fields as a dict (what `models.build` and `config_as_dict` read)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  def __getitem__(self, key: str) -> Any:
    if key not in self.__dataclass_fields__:
      raise KeyError(key)
    return getattr(self, key)

  def __iter__(self):
    return iter(self.__dataclass_fields__)

  def __len__(self) -> int:
    return len(self.__dataclass_fields__)

  def __reduce__(self):
    # the classes are made at run time: pickled (a spawned worker, a deepcopy) as the fields
    return parse, (self.to_dict(),)


_CLASSES: dict[str, tuple[Any, type]] = {}


def settings_class(family: str) -> type[ModelSettings]:
  """The frozen settings dataclass of `model.family=family`, made from its `config_fields`
  (remade when the family is registered again)."""
  entry = registry.get(family)
  cached = _CLASSES.get(family)
  if cached is not None and cached[0] is entry:
    return cached[1]
  fields = [("family", str, dataclasses.field(default=family)),
            ("name", "str | None", dataclasses.field(default=None))]
  for key, f in registry.config_fields(family).items():
    if key in _RESERVED or key in ("family", "name"):
      raise ValueError(f"model family {family!r}: a field may not be named {key!r}")
    default = f.default
    if default is not dataclasses.MISSING:
      default = _frozen(registry._dtype_name(default) if key in ("dtype", "param_dtype")
                        else default)
    fields.append((key, f.type, dataclasses.field(default=default)))
  camel = "".join(part.title() for part in family.split("_"))
  cls = dataclasses.make_dataclass(f"{camel}ModelSettings", fields, bases=(ModelSettings,),
                                   frozen=True, kw_only=True, namespace={"__module__": __name__})
  _CLASSES[family] = (entry, cls)
  return cls


def parse(model_config: Any) -> ModelSettings:
  """`model_config` (a ConfigDict, a dict of a saved config.json, or settings already) as
  the family's frozen settings: every check of `models.build`, then each field's type."""
  if isinstance(model_config, ModelSettings):
    return model_config
  values = registry.validated(model_config)
  cls = settings_class(values["family"])
  kinds = {f.name: f.type for f in dataclasses.fields(cls)}
  for key, value in list(values.items()):
    value = _frozen(registry._dtype_name(value) if key in ("dtype", "param_dtype") else value)
    values[key] = _typed(key, value, kinds[key])
  return cls(**values)


def settings_of(config: Any) -> ModelSettings:
  """The typed `model` section of a full config (a ConfigDict or the dict of a saved
  config.json): `parse(config.model)`, for code that has a config but no `RunSettings`."""
  model = run_settings._section(config, "model")
  if model is None:
    raise ValueError("the config has no model section; set --config.model.family=<family>")
  return parse(model)


def _frozen(value: Any) -> Any:
  """Lists as tuples (a saved config.json's), so the settings are hashable."""
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


_KINDS = {
    "int": (_is_int, "an int"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
              and math.isfinite(v), "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "tuple[int, int]": (lambda v: isinstance(v, tuple) and len(v) == 2
                        and all(map(_is_int, v)), "a pair of ints, e.g. (512, 512)"),
    "tuple[int, ...]": (lambda v: isinstance(v, tuple) and all(map(_is_int, v)),
                        "a tuple of ints"),
}


def _typed(key: str, value: Any, kind: Any) -> Any:
  """`value` checked against the annotation `kind` of `model.<key>` (an int is a float where
  a float is wanted); annotations it does not know (`Any`: the dtypes `build` checks) pass."""
  kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
  optional = kind.endswith(" | None")
  base = kind[:-len(" | None")] if optional else kind
  if base not in _KINDS or (value is None and optional):
    return value
  check, want = _KINDS[base]
  if not check(value):
    raise ValueError(f"model.{key}={value!r} must be {want}{' or None' if optional else ''}; "
                     f"set --config.model.{key}=<value>")
  return float(value) if base == "float" else value


run_settings.register_model_parser(parse)
