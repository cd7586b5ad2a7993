"""What a sweep is: a sweep file's `get_sweep` as a `Sweep`, expanded into its `Point`s (their
names, overrides and train commands), and the points a run selects. Nothing here runs or
writes; the format of a sweep file is in `python -m jaxformer.sweep --help`."""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
import itertools
import os
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

from jaxformer import paths, run_settings
from jaxformer.sweep import config as config_lib

_SWEEP_KEYS = ("base", "product", "zip", "name", "overrides")


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A sweep definition (see `python -m jaxformer.sweep --help`)."""
  base: str
  product: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
  zip: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
  name: str | None = None
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Point:
  """One training run of a sweep.

  `overrides` holds the fixed and swept fields (the `--config.*` flags), `swept` only the
  swept ones. `config` is the validated training config (None when expanded without
  validation); `params` its `scaling.count_params`.
  """
  index: int
  name: str
  overrides: dict[str, Any]
  swept: dict[str, Any]
  config: Any = dataclasses.field(default=None, compare=False, repr=False)
  params: dict[str, int] | None = dataclasses.field(default=None, compare=False)
  # the typed settings of `config` (`run_settings.parse`, as train reads them)
  settings: run_settings.RunSettings | None = dataclasses.field(default=None, compare=False,
                                                                repr=False)

  def flags(self) -> list[str]:
    return [f"--config.{key}={config_lib.format_value(value)}"
            for key, value in self.overrides.items()]

  def command(self, base: str, workdir: str) -> list[str]:
    """The train command of this point, writing to `workdir/<name>`; a point that reports to
    W&B or MLflow is put in the group of the sweep's name (`sweep_name`) unless its config
    names a `train.tracker_group`."""
    group = []
    train = self.settings.train if self.settings is not None else None
    if train is not None and {"wandb", "mlflow"} & set(train.trackers) and not train.tracker_group:
      group = [f"--config.train.tracker_group={sweep_name(workdir)}"]
    return [sys.executable, "-m", "jaxformer.train", f"--config={config_lib.resolve_base(base)}",
            f"--workdir={os.path.join(workdir, self.name)}", *group, *self.flags()]


def sweep_name(workdir: str) -> str:
  """A sweep's name: the last component of its --workdir (where its points and summary are;
  rerunning the sweep there resumes it)."""
  return os.path.basename(os.path.normpath(paths.absolute(workdir))) or workdir


def as_sweep(spec: Sweep | Mapping[str, Any]) -> Sweep:
  """`spec` (a Sweep or dict) as a Sweep; unknown keys or a missing `base` are ValueErrors."""
  if isinstance(spec, Sweep):
    return spec
  if not isinstance(spec, Mapping):
    raise ValueError(f"get_sweep() must return a Sweep or a dict; got {type(spec).__name__}")
  unknown = sorted(set(spec) - set(_SWEEP_KEYS))
  if unknown:
    raise ValueError(f"sweep keys {unknown} are unknown; valid keys: {', '.join(_SWEEP_KEYS)}")
  if not spec.get("base"):
    raise ValueError("sweep `base` is missing: give the training config, e.g. "
                     "'configs/shakespeare_char.py:tiny'")
  return Sweep(**spec)


def load_sweep(path_and_arg: str) -> Sweep:
  """The Sweep of `configs/sweeps/<name>.py[:arg]` (its `get_sweep(arg)`)."""
  path, _, arg = path_and_arg.partition(":")
  module = _load_module(config_lib.resolve_path(path, "--config"))
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"--config={path_and_arg}: {path} defines no get_sweep(arg=None)")
  return as_sweep(module.get_sweep(arg or None))


def _load_module(path: str) -> types.ModuleType:
  name = "jaxformer_sweep_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _axis_rows(sweep: Sweep) -> list[dict[str, Any]]:
  """The swept overrides of every point: product combinations x zip rows."""
  for kind, axes in (("product", sweep.product), ("zip", sweep.zip)):
    for key, values in axes.items():
      if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"sweep {kind}[{key!r}] must be a non-empty list of values; "
                         f"got {values!r}")
  if not sweep.product and not sweep.zip:
    raise ValueError("sweep is empty: give `product` and/or `zip` ({field: [values]})")
  lengths = {key: len(values) for key, values in sweep.zip.items()}
  if len(set(lengths.values())) > 1:
    raise ValueError(f"sweep zip lists must have equal lengths; got {lengths}")
  shared = sorted((set(sweep.product) & set(sweep.zip)) |
                  ((set(sweep.product) | set(sweep.zip)) & set(sweep.overrides)))
  if shared:
    raise ValueError(f"sweep fields {shared} are given twice (product / zip / overrides); "
                     "give each field in one place")
  combos = [dict(zip(sweep.product, values))
            for values in itertools.product(*sweep.product.values())]
  rows = [dict(zip(sweep.zip, values)) for values in zip(*sweep.zip.values())] or [{}]
  return [dict(combo, **row) for combo in combos for row in rows]


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
  """{'a.b': 1} -> {'a': namespace(b=1)} so "{a.b}" formats with str.format_map."""
  tree: dict[str, Any] = {}
  for key, value in flat.items():
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value

  def wrap(node):
    return types.SimpleNamespace(**{k: wrap(v) for k, v in node.items()}) \
        if isinstance(node, dict) else node
  return {k: wrap(v) for k, v in tree.items()}


def point_name(template: str | None, swept: Mapping[str, Any], index: int) -> str:
  """The directory name of a point: `template` formatted, or 'field=value,...'."""
  if template is None:
    name = ",".join(f"{key}={config_lib.format_value(value)}" for key, value in swept.items())
    return name.replace("/", "_").replace(" ", "")
  try:
    name = template.format_map(dict(_nested(swept), index=index))
  except (KeyError, AttributeError, IndexError, ValueError) as e:
    raise ValueError(f"sweep name template {template!r} does not format with the swept "
                     f"fields {sorted(swept)} and `index`: {e!r}") from e
  if "/" in name or name in ("", ".", ".."):
    raise ValueError(f"sweep name template {template!r} gives {name!r}, not a directory name")
  return name


def expand(sweep: Sweep | Mapping[str, Any], *, validate: bool = True) -> list[Point]:
  """The points of `sweep` in order. With `validate`, each point's config is loaded with
  its overrides and its model built (and counted) before anything runs."""
  sweep = as_sweep(sweep)
  rows = _axis_rows(sweep)
  points = []
  for index, swept in enumerate(rows):
    overrides = dict(sweep.overrides, **swept)
    name = point_name(sweep.name, swept, index)
    config = params = settings = None
    if validate:
      config, settings, params = config_lib.validated(sweep.base, overrides, name)
    points.append(Point(index, name, overrides, swept, config, params, settings))
  names = [p.name for p in points]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"sweep point names {duplicates} repeat; make the `name` template "
                     "use every swept field (or {index})")
  return points


def count_points(command: Sequence[str]) -> int:
  """The number of points run by a `python -m jaxformer.sweep --config=FILE ...` argv
  (launchers use it to size job arrays; the points are not validated here)."""
  configs = [a.split("=", 1)[1] for a in command if a.startswith("--config=")]
  if "jaxformer.sweep" not in command or len(configs) != 1:
    raise ValueError("expected a `python -m jaxformer.sweep --config=FILE ...` command with "
                     f"one --config=FILE; got {' '.join(command)!r}")
  return len(expand(load_sweep(configs[0]), validate=False))


def select(points: Sequence[Point], *, only: str | None = None,
           only_index: int | None = None) -> list[Point]:
  """The points named by the glob `only` and/or at position `only_index` of the expansion."""
  if only_index is not None:
    if not 0 <= only_index < len(points):
      raise ValueError(f"--only_index={only_index} is out of range: the sweep has "
                       f"{len(points)} points (0..{len(points) - 1})")
    points = [points[only_index]]
  if only is not None:
    points = [p for p in points if fnmatch.fnmatchcase(p.name, only)]
    if not points:
      raise ValueError(f"--only={only!r} matches no point name")
  return list(points)


def dry_run_commands(sweep: Sweep | Mapping[str, Any], workdir: str, *,
                     only: str | None = None, only_index: int | None = None) -> list[list[str]]:
  """The train command of every selected point (validated, nothing written)."""
  sweep = as_sweep(sweep)
  chosen = select(expand(sweep), only=only, only_index=only_index)
  return [p.command(sweep.base, workdir) for p in chosen]
