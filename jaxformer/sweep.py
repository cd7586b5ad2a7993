"""Sweeps: expand a grid of config overrides and train each point in its own workdir.

    python -m jaxformer.sweep --config=configs/sweeps/lr_width.py --workdir=DIR
        [--parallel=N] [--dry_run] [--only=GLOB] [--only_index=I]

A sweep file `configs/sweeps/<name>.py` has `get_sweep(arg=None)` returning a `Sweep` or a dict
with the same fields:
  base       training config, `path.py[:arg]`, relative to the repo root (or the cwd) or absolute
  product    {field: [values]}: every combination (first field varies slowest)
  zip        {field: [values]} of equal lengths: row i of every list together
  name       optional point-directory template, `str.format` with dotted fields and `index`,
             e.g. "w{model.d_model}_lr{optim.lr:g}"; default: the overrides joined by commas
  overrides  optional {field: value} applied to every point
With both `product` and `zip`, the points are every product combination times every zip row.

Why subprocesses: each point is exactly `python -m jaxformer.train --config=BASE
--workdir=DIR/<point> --config.field=value ...`, the command a user would type, so a point can
be rerun or debugged by hand, a crash cannot take the sweep down, and resuming needs nothing
new: rerunning train on an interrupted workdir resumes it, a finished one is skipped.
Every point is validated in-process first (the same `config_flags` parsing train does, then
train's own `config_checks.validate`: ranges, the task, the model), so every mistake train
would refuse fails before any point runs.

Files: DIR/<point>/train.log (the run's output), DIR/<point>/sweep.json (status, return code,
wall time), DIR/summary.csv and DIR/summary.json (one row per point, rewritten atomically after
every point). Under Slurm or with JAXFORMER_PROCESS_ID (multi-process runs of the same point)
only process 0 writes the sweep files; process i logs to train.<i>.log.
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import fnmatch
import importlib.util
import io
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY_FIELDS = ("name", "status", "final_step", "loss", "eval_loss", "eval_accuracy",
                  "params", "params_total", "tokens", "wall_time_s", "log")
_SWEEP_KEYS = ("base", "product", "zip", "name", "overrides")

Runner = Callable[[Sequence[str], str], int]


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A sweep definition (see the module docstring)."""
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

  def flags(self) -> list[str]:
    return [f"--config.{key}={format_value(value)}" for key, value in self.overrides.items()]

  def command(self, base: str, workdir: str) -> list[str]:
    """The train command of this point, writing to `workdir/<name>`."""
    return [sys.executable, "-m", "jaxformer.train", f"--config={resolve_base(base)}",
            f"--workdir={os.path.join(workdir, self.name)}", *self.flags()]


def limit_xla_threads(threads: int) -> None:
  """Give every point started from now on `threads` XLA:CPU threads (through XLA_FLAGS, which
  the subprocesses inherit): on a small CPU, several single-threaded points at once train
  faster in total than one multi-threaded point (measured 1.2-1.3x on 2 cores)."""
  if threads < 1:
    raise ValueError(f"threads={threads} must be >= 1")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_cpu_multi_thread_eigen=false "
                             f"intra_op_parallelism_threads={threads}").strip()


def format_value(value: Any) -> str:
  """A Python value as `config_flags` parses it back (strings bare, bools lower-case)."""
  if isinstance(value, str):
    return value
  if isinstance(value, bool):
    return str(value).lower()
  return repr(tuple(value) if isinstance(value, list) else value)


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
  module = _load_module(_resolve_path(path, "--config"))
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"--config={path_and_arg}: {path} defines no get_sweep(arg=None)")
  return as_sweep(module.get_sweep(arg or None))


def _load_module(path: str) -> types.ModuleType:
  name = "jaxformer_sweep_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _resolve_path(path: str, what: str) -> str:
  """An absolute path: as given, else relative to the cwd, else to the repo root."""
  for candidate in (path, os.path.join(REPO_ROOT, path)):
    if os.path.isfile(candidate):
      return os.path.abspath(candidate)
  raise ValueError(f"{what}={path!r}: no such file (relative paths are tried from the "
                   f"current directory and from the repo root {REPO_ROOT})")


def resolve_base(base: str) -> str:
  """`base` ('path.py[:arg]') with an absolute path, so points run from any directory."""
  path, sep, arg = base.partition(":")
  return _resolve_path(path, "sweep base") + sep + arg


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
    name = ",".join(f"{key}={format_value(value)}" for key, value in swept.items())
    return name.replace("/", "_").replace(" ", "")
  try:
    name = template.format_map(dict(_nested(swept), index=index))
  except (KeyError, AttributeError, IndexError, ValueError) as e:
    raise ValueError(f"sweep name template {template!r} does not format with the swept "
                     f"fields {sorted(swept)} and `index`: {e!r}") from e
  if "/" in name or name in ("", ".", ".."):
    raise ValueError(f"sweep name template {template!r} gives {name!r}, not a directory name")
  return name


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


def expand(sweep: Sweep | Mapping[str, Any], *, validate: bool = True) -> list[Point]:
  """The points of `sweep` in order. With `validate`, each point's config is loaded with
  its overrides and its model built (and counted) before anything runs."""
  sweep = as_sweep(sweep)
  rows = _axis_rows(sweep)
  points = []
  for index, swept in enumerate(rows):
    overrides = dict(sweep.overrides, **swept)
    name = point_name(sweep.name, swept, index)
    config = params = None
    if validate:
      config, params = _validated(sweep.base, overrides, name)
    points.append(Point(index, name, overrides, swept, config, params))
  names = [p.name for p in points]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"sweep point names {duplicates} repeat; make the `name` template "
                     "use every swept field (or {index})")
  return points


def _validated(base: str, overrides: Mapping[str, Any], name: str):
  from jaxformer import scaling
  from jaxformer.train import config_checks

  config = load_config(base, overrides)
  try:
    config_checks.validate(config)           # exactly what train checks before it writes
    params = scaling.count_params(config.model)
  except ValueError as e:
    raise ValueError(f"sweep point {name!r}: {e}") from e
  return config, params


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


def read_metrics(point_dir: str) -> list[dict]:
  from jaxformer.train import metrics       # light: no JAX
  path = os.path.join(point_dir, "metrics.jsonl")
  return metrics.read(path) if os.path.exists(path) else []


def is_finished(point_dir: str, steps: int) -> bool:
  """True when metrics.jsonl has a train record and an eval record at step `steps`."""
  records = [r for r in read_metrics(point_dir) if r.get("step") == steps]
  return any("loss" in r for r in records) and any("eval_loss" in r for r in records)


def subprocess_runner(command: Sequence[str], log_path: str) -> int:
  """Run `command`, stdout and stderr appended to `log_path`; returns the exit status."""
  with open(log_path, "a") as log:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    return subprocess.run(list(command), stdout=log, stderr=subprocess.STDOUT,
                          check=False).returncode


def process_index() -> int:
  """This process's index in a multi-process launch (0 when launched alone)."""
  for var in ("JAXFORMER_PROCESS_ID", "SLURM_PROCID"):
    if os.environ.get(var, "").isdigit():
      return int(os.environ[var])
  return 0


def _log_path(point_dir: str) -> str:
  index = process_index()
  return os.path.join(point_dir, "train.log" if index == 0 else f"train.{index}.log")


def _atomic_write(path: str, text: str):
  tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def _point_record(point_dir: str) -> dict:
  path = os.path.join(point_dir, "sweep.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def summary_row(point: Point, workdir: str) -> dict[str, Any]:
  """The summary of one point, from its workdir (metrics.jsonl, sweep.json)."""
  point_dir = os.path.join(workdir, point.name)
  records = read_metrics(point_dir)
  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_loss" in r]
  steps = point.config.train.steps if point.config is not None else None
  record = _point_record(point_dir)
  if steps is not None and is_finished(point_dir, steps):
    status = "done"
  else:
    status = record.get("status") or ("incomplete" if records else "pending")
  final_step = max((r["step"] for r in train), default=None)
  tokens = None          # sequence tasks only (images have no data.seq_len)
  if point.config is not None and final_step is not None and point.config.data.get("seq_len"):
    tokens = final_step * point.config.train.batch_size * point.config.data.seq_len
  return {
      "name": point.name, "overrides": dict(point.overrides), "status": status,
      "final_step": final_step, "loss": train[-1]["loss"] if train else None,
      "eval_loss": evals[-1]["eval_loss"] if evals else None,
      "eval_accuracy": evals[-1].get("eval_accuracy") if evals else None,
      "params": point.params["non_embedding"] if point.params else None,
      "params_total": point.params["total"] if point.params else None,
      "tokens": tokens, "wall_time_s": record.get("wall_time_s"),
      "log": os.path.join(point_dir, "train.log"),
  }


def write_summary(workdir: str, rows: Sequence[Mapping[str, Any]]):
  """DIR/summary.json (rows as given) and DIR/summary.csv (one column per override field)."""
  _atomic_write(os.path.join(workdir, "summary.json"), json.dumps(list(rows), indent=2) + "\n")
  fields = list(dict.fromkeys(k for row in rows for k in row["overrides"]))
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  writer.writerow(["name", *fields, *SUMMARY_FIELDS[1:]])
  for row in rows:
    writer.writerow([row["name"], *(format_value(row["overrides"][f])
                                    if f in row["overrides"] else "" for f in fields),
                     *("" if row[k] is None else row[k] for k in SUMMARY_FIELDS[1:])])
  _atomic_write(os.path.join(workdir, "summary.csv"), buffer.getvalue())


def run(sweep: Sweep | Mapping[str, Any], workdir: str, *, parallel: int = 1,
        runner: Runner = subprocess_runner, only: str | None = None,
        only_index: int | None = None) -> list[dict[str, Any]]:
  """Train every (selected) point not finished yet, `parallel` at a time; returns the summary
  rows of the selected points (the summary files list all). A failing point is recorded and
  the others go on."""
  if not isinstance(parallel, int) or parallel < 1:
    raise ValueError(f"--parallel={parallel!r} must be an int >= 1")
  sweep = as_sweep(sweep)
  points = expand(sweep)
  chosen = select(points, only=only, only_index=only_index)
  primary = process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  lock = threading.Lock()

  def summarize():
    if primary:
      with lock:
        write_summary(workdir, [summary_row(p, workdir) for p in points])

  def run_point(point: Point):
    point_dir = os.path.join(workdir, point.name)
    if is_finished(point_dir, point.config.train.steps):
      print(f"[sweep] {point.name}: finished, skipped", flush=True)
      return
    os.makedirs(point_dir, exist_ok=True)
    log = _log_path(point_dir)
    print(f"[sweep] {point.name}: running, log {log}", flush=True)
    start = time.perf_counter()
    code = runner(point.command(sweep.base, workdir), log)
    wall = time.perf_counter() - start
    status = "failed" if code != 0 else (
        "done" if is_finished(point_dir, point.config.train.steps) else "incomplete")
    if primary:
      record = {"status": status, "returncode": code, "wall_time_s": round(wall, 3),
                "command": point.command(sweep.base, workdir)}
      _atomic_write(os.path.join(point_dir, "sweep.json"), json.dumps(record, indent=2))
    print(f"[sweep] {point.name}: {status} (exit {code}, {wall:.1f}s)", flush=True)
    summarize()

  summarize()
  with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
    list(pool.map(run_point, chosen))
  summarize()
  return [summary_row(p, workdir) for p in chosen]


def dry_run_commands(sweep: Sweep | Mapping[str, Any], workdir: str, *,
                     only: str | None = None, only_index: int | None = None) -> list[list[str]]:
  """The train command of every selected point (validated, nothing written)."""
  sweep = as_sweep(sweep)
  chosen = select(expand(sweep), only=only, only_index=only_index)
  return [p.command(sweep.base, workdir) for p in chosen]


def main(argv: Sequence[str]):
  import shlex

  from absl import flags

  del argv
  f = flags.FLAGS
  sweep = load_sweep(f.config)
  if f.dry_run:
    for command in dry_run_commands(sweep, f.workdir, only=f.only, only_index=f.only_index):
      print(shlex.join(command))
    return
  rows = run(sweep, f.workdir, parallel=f.parallel, only=f.only, only_index=f.only_index)
  bad = [r for r in rows if r["status"] != "done"]
  print(f"[sweep] summary: {os.path.join(f.workdir, 'summary.csv')}")
  if bad:
    lines = "\n".join(f"  {r['name']}: {r['status']}, log {r['log']}" for r in bad)
    sys.exit(f"[sweep] {len(bad)} point(s) did not finish:\n{lines}")


def _define_flags():
  from absl import flags

  flags.DEFINE_string("config", None, "Sweep file, configs/sweeps/<name>.py[:arg].")
  flags.DEFINE_string("workdir", None, "Sweep directory: one subdirectory per point.")
  flags.DEFINE_integer("parallel", 1, "Points trained at the same time.")
  flags.DEFINE_bool("dry_run", False, "Print every point's train command; run and write nothing.")
  flags.DEFINE_string("only", None, "Run only the points whose name matches this glob.")
  flags.DEFINE_integer("only_index", None, "Run only the point at this index (Slurm arrays).")
  flags.mark_flags_as_required(["config", "workdir"])


if __name__ == "__main__":
  from jaxformer import cli

  _define_flags()
  cli.run_absl(main)
