"""Sweeps: expand a grid of config overrides and train each point in its own workdir.

    python -m jaxformer.sweep --config=configs/sweeps/lr_width.py --workdir=DIR
        [--parallel=N] [--dry_run] [--only=GLOB] [--only_index=I] [--if_running=wait|skip]

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

The driver owns its trainings. Each runs in its own session, so a terminal's Ctrl-C reaches
the driver alone; SIGINT, SIGTERM or SIGHUP to the driver is forwarded once to every running
training (SIGHUP as SIGTERM), which saves a checkpoint and exits; no new point starts; once
they have exited each is recorded "interrupted" and the sweep exits with 128 + the signal
(130 for Ctrl-C, 143 for SIGTERM). A second signal while stopping kills them (they resume
from their last complete checkpoint). A training outliving its driver (the driver alone was
SIGKILLed) still holds its workdir lock: a rerun finds it there, says so in one line (pid and
how to stop it), and waits for it (`--if_running=skip`: leaves it), never starting a second
training on the point and never calling it failed.

Files: DIR/<point>/train.log (the run's output), DIR/<point>/sweep.json (the last finished
attempt: status, return code, the stop signal, wall time; removed when an attempt starts),
DIR/summary.csv and DIR/summary.json (one row per point, rewritten atomically after every
point). Both take the status from `point_status`, so they agree. Under Slurm or with
JAXFORMER_PROCESS_ID (multi-process runs of the same point) only process 0 writes the sweep
files and asks the lock; process i logs to train.<i>.log.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import dataclasses
import fnmatch
import importlib.util
import io
import itertools
import json
import os
import re
import signal
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
IF_RUNNING = ("wait", "skip")       # what `run` does about a point another process is training
WAIT_POLL_S = 2.0                   # how often it asks whether that process is done

# (train command, log path) -> exit status; a stop signal reaches `subprocess_runner`'s only.
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


def _finished(records: Sequence[Mapping[str, Any]], steps: int) -> bool:
  at_end = [r for r in records if r.get("step") == steps]
  return any("loss" in r for r in at_end) and any("eval_loss" in r for r in at_end)


def is_finished(point_dir: str, steps: int) -> bool:
  """True when metrics.jsonl has a train record and an eval record at step `steps`."""
  return _finished(read_metrics(point_dir), steps)


def point_status(*, finished: bool, owner: str | None, record: Mapping[str, Any],
                 trained: bool) -> str:
  """A point's status from the facts about it. The one place it is decided: sweep.json and
  the summary files both come from it, so they cannot disagree.

  finished: metrics.jsonl has the last step's train and eval records; owner: who holds the
  point's workdir lock (a training of this sweep or of another process), else None; record:
  the facts sweep.json keeps about the last attempt that ended (`returncode`, `signal` when
  the sweep's stop signal ended it); trained: metrics.jsonl has records.

    done         finished (whatever happened after, e.g. a stop during the final sample)
    running      a training holds the lock, here or elsewhere (an orphan of a killed sweep)
    interrupted  the sweep was stopped while it trained: it saved and exited (or was killed
                 at a second signal); rerunning the sweep resumes it
    failed       its training exited non-zero on its own
    incomplete   trained part way otherwise (the training itself was stopped); resumable
    pending      never started
  """
  if finished:
    return "done"
  if owner is not None:
    return "running"
  if record.get("signal"):
    return "interrupted"
  if record.get("returncode") not in (None, 0):
    return "failed"
  return "incomplete" if trained or record else "pending"


def _lock_holder(point_dir: str) -> str | None:
  from jaxformer.train import workdir      # light: no JAX
  return workdir.holder(point_dir) if os.path.isdir(point_dir) else None


def _state(point_dir: str, steps: int | None, records: Sequence[Mapping[str, Any]],
           record: Mapping[str, Any], *, running_here: bool = False) -> tuple[str, str | None]:
  """(status, lock holder) of a point: `point_status` of the facts on disk. The lock is asked
  only about an unfinished point that is not this sweep's own running training."""
  finished = steps is not None and _finished(records, steps)
  owner = None
  if not finished:
    owner = "this sweep" if running_here else _lock_holder(point_dir)
  return point_status(finished=finished, owner=owner, record=record,
                      trained=bool(records)), owner


class _NotStarted(Exception):
  """A point's training was not started: the sweep is stopping."""


class Interrupted(SystemExit):
  """The sweep was stopped by SIGINT, SIGTERM or SIGHUP, after its trainings exited. A
  SystemExit with the shell's code for the signal (128 + signal: 130 for Ctrl-C, 143 for
  SIGTERM, 129 for SIGHUP), so an uncaught one ends the program with that code and no
  traceback; `rows` are the selected points' summary rows."""

  def __init__(self, signum: int, rows: list[dict[str, Any]]):
    super().__init__(128 + signum)
    self.signum, self.rows = signum, rows


def _say(line: str):
  """Print from a signal handler: never let a closed terminal or an interrupted print of the
  main thread turn the stop into a crash that would orphan the trainings."""
  try:
    print(line, flush=True)
  except (OSError, RuntimeError):
    pass


class _Stop:
  """A running sweep's trainings and its stop request.

  Each training runs in its own session, so a terminal's Ctrl-C (sent to the foreground
  process group) reaches the driver only, and the driver decides what each training gets:
  the first SIGINT/SIGTERM is forwarded once to every running training (SIGHUP, the terminal
  going away, as SIGTERM: train saves on SIGTERM/SIGINT), no new point starts, and the driver
  waits for them; a second signal kills their process groups (each resumes from its last
  complete checkpoint).
  """

  def __init__(self):
    self.signum: int | None = None
    self.event = threading.Event()           # set at the first signal: wakes waiting points
    self._lock = threading.Lock()            # taken by pool threads and the handler only
    self._children: set[subprocess.Popen] = set()

  def spawn(self, command: Sequence[str], log) -> subprocess.Popen:
    with self._lock:
      if self.signum is not None:
        raise _NotStarted
      proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
      self._children.add(proc)
    return proc

  def wait(self, proc: subprocess.Popen) -> int:
    try:
      return proc.wait()
    finally:
      with self._lock:
        self._children.discard(proc)

  def handle(self, signum: int, frame=None):
    del frame
    with self._lock:
      first = self.signum is None
      if first:
        self.signum = signum
      children = [p for p in self._children if p.poll() is None]
      for proc in children:
        try:
          if first:
            proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)
          else:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:           # exited meanwhile
          pass
    self.event.set()
    name = signal.Signals(signum).name
    if first:
      _say(f"[sweep] {name}: stopping: {len(children)} running training(s) told to save a "
           f"checkpoint and exit, no new point starts ({name} again kills them)")
    else:
      _say(f"[sweep] {name} again: killing {len(children)} training(s); each resumes from "
           "its last complete checkpoint")

  @contextlib.contextmanager
  def on_signals(self):
    """Handle SIGINT/SIGTERM/SIGHUP while the sweep runs (main thread only; a signal the
    process ignores, e.g. SIGHUP under nohup, stays ignored)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
          previous[sig] = signal.signal(sig, self.handle)
    try:
      yield self
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)


_active: _Stop | None = None     # the running sweep's (signals are process-wide)


def subprocess_runner(command: Sequence[str], log_path: str) -> int:
  """Run `command`, stdout and stderr appended to `log_path`; returns the exit status. Under
  `run`, the training runs in its own session and the sweep's stop signal reaches it (see
  `_Stop`)."""
  stop = _active
  with open(log_path, "a") as log:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    if stop is None:
      return subprocess.run(list(command), stdout=log, stderr=subprocess.STDOUT,
                            check=False).returncode
    return stop.wait(stop.spawn(command, log))


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


def _write_record(point_dir: str, record: Mapping[str, Any]):
  _atomic_write(os.path.join(point_dir, "sweep.json"), json.dumps(dict(record), indent=2))


def summary_row(point: Point, workdir: str, *, running_here: bool = False) -> dict[str, Any]:
  """The summary of one point, from its workdir (metrics.jsonl, sweep.json, the lock);
  `running_here`: this process is running its training."""
  point_dir = os.path.join(workdir, point.name)
  records = read_metrics(point_dir)
  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_loss" in r]
  steps = point.config.train.steps if point.config is not None else None
  record = _point_record(point_dir)
  status, _ = _state(point_dir, steps, records, record, running_here=running_here)
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


def _summarize(points: Sequence[Point], workdir: str, running: set[str]):
  """Rewrite the summary files, and the status of any sweep.json the facts have moved on from
  (a point finished or resumed by hand since), so the two always agree. A point's own
  training is never racing this: its sweep.json is removed when it starts and written after
  it exits."""
  rows = []
  for point in points:
    row = summary_row(point, workdir, running_here=point.name in running)
    point_dir = os.path.join(workdir, point.name)
    record = _point_record(point_dir)
    if record and record.get("status") != row["status"] and point.name not in running:
      _write_record(point_dir, dict(record, status=row["status"]))
    rows.append(row)
  write_summary(workdir, rows)


def _held_line(name: str, owner: str, what: str) -> str:
  """One line about a point another process is training: who, and `what` the sweep does
  (`{kill}` in it: how to stop that training)."""
  pid = re.match(r"pid (\d+)", owner)
  kill = f"`kill {pid.group(1)}` on its host" if pid else "stop it"
  return (f"[sweep] {name}: trained by another process ({owner}), e.g. one left running by a "
          "killed sweep; " + what.format(kill=kill))


def run(sweep: Sweep | Mapping[str, Any], workdir: str, *, parallel: int = 1,
        runner: Runner = subprocess_runner, only: str | None = None,
        only_index: int | None = None, if_running: str = "wait") -> list[dict[str, Any]]:
  """Train every (selected) point not finished yet, `parallel` at a time; returns the summary
  rows of the selected points (the summary files list all). A failing point is recorded and
  the others go on.

  A point whose workdir lock another process holds (a training left running by a killed
  sweep, or started by hand) is never started twice: with `if_running="wait"` the sweep says
  so in one line and waits for it to exit (then skips the point if it finished, else resumes
  it); with "skip" it says so and leaves the point "running". SIGINT/SIGTERM/SIGHUP stop the
  sweep as `_Stop` says and raise `Interrupted` once every training has exited.
  """
  global _active
  if not isinstance(parallel, int) or parallel < 1:
    raise ValueError(f"--parallel={parallel!r} must be an int >= 1")
  if if_running not in IF_RUNNING:
    raise ValueError(f"--if_running={if_running!r} must be one of {', '.join(IF_RUNNING)}")
  sweep = as_sweep(sweep)
  points = expand(sweep)
  chosen = select(points, only=only, only_index=only_index)
  primary = process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  lock = threading.Lock()                  # sweep.json and summary writes, `running`
  running: set[str] = set()                # trained by this process right now
  started: set[str] = set()                # started by this run (for the stop message)
  stop = _Stop()

  def summarize():
    if primary:
      with lock:
        _summarize(points, workdir, running)

  def may_start(point: Point, point_dir: str) -> bool:
    """False when another process holds the point's lock (after waiting, if asked, for it
    to finish the point); process 0's training takes the lock, so only process 0 asks."""
    owner = _lock_holder(point_dir) if primary else None
    if owner is None:
      return True
    if if_running == "skip":
      print(_held_line(point.name, owner, "not started (--if_running=skip): wait for it to "
                       "exit, or {kill} (it saves a checkpoint), then rerun the sweep"),
            flush=True)
      return False
    print(_held_line(point.name, owner, "waiting for it to exit (to stop it instead: {kill}; "
                     "it saves a checkpoint and this sweep resumes the point)"), flush=True)
    record = {"trained_by": owner}
    while owner is not None:
      if stop.event.wait(WAIT_POLL_S):
        return False
      owner = _lock_holder(point_dir)
    steps = point.config.train.steps
    with lock:
      status, _ = _state(point_dir, steps, read_metrics(point_dir), record)
      if status == "done":
        _write_record(point_dir, dict(status=status, **record))
        _summarize(points, workdir, running)
    print(f"[sweep] {point.name}: " + ("finished by the other training, skipped"
                                       if status == "done" else "the other training exited "
                                       "before the end; resuming the point here"), flush=True)
    return status != "done"

  def run_point(point: Point):
    point_dir = os.path.join(workdir, point.name)
    steps = point.config.train.steps
    if stop.signum is not None:
      return
    if is_finished(point_dir, steps):
      print(f"[sweep] {point.name}: finished, skipped", flush=True)
      return
    if not may_start(point, point_dir) or stop.signum is not None:
      return
    os.makedirs(point_dir, exist_ok=True)
    log = _log_path(point_dir)
    command = point.command(sweep.base, workdir)
    with lock:
      running.add(point.name)
      started.add(point.name)
      if primary and os.path.exists(os.path.join(point_dir, "sweep.json")):
        os.remove(os.path.join(point_dir, "sweep.json"))      # about an earlier attempt
    print(f"[sweep] {point.name}: running, log {log}", flush=True)
    start = time.perf_counter()
    try:
      code = runner(command, log)
    except _NotStarted:
      with lock:
        running.discard(point.name)
      return
    wall = time.perf_counter() - start
    record = {"returncode": code, "wall_time_s": round(wall, 3), "command": command}
    if stop.signum is not None:                # it was running when the sweep was stopped
      record["signal"] = signal.Signals(stop.signum).name     # returncode -9: killed
    with lock:
      running.discard(point.name)
      status, owner = _state(point_dir, steps, read_metrics(point_dir), record)
      if primary and status != "running":      # "running": another process holds it
        _write_record(point_dir, dict(status=status, **record))
      if primary:
        _summarize(points, workdir, running)
    if status == "running" and primary:
      print(_held_line(point.name, owner, f"the training started here exited ({code}) "
                       "without training it; wait for the other one or {kill}, then rerun "
                       "the sweep"), flush=True)
    else:
      print(f"[sweep] {point.name}: {status} (exit {code}, {wall:.1f}s)", flush=True)

  summarize()
  _active = stop
  try:
    with stop.on_signals(), concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
      list(pool.map(run_point, chosen))
  finally:
    _active = None
  summarize()
  rows = [summary_row(p, workdir) for p in chosen]
  if stop.signum is not None:
    name = signal.Signals(stop.signum).name
    stopped = sum(r["status"] == "interrupted" for r in rows)
    unstarted = sum(r["name"] not in started and r["status"] != "done" for r in rows)
    print(f"[sweep] stopped by {name}: {stopped} point(s) interrupted, {unstarted} not "
          "started; rerun the same command to resume", flush=True)
    raise Interrupted(stop.signum, rows)
  return rows


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
  summary = f"[sweep] summary: {os.path.join(f.workdir, 'summary.csv')}"
  try:
    rows = run(sweep, f.workdir, parallel=f.parallel, only=f.only, only_index=f.only_index,
               if_running=f.if_running)
  except Interrupted:
    print(summary, flush=True)
    raise                                  # exits 128 + signal, no traceback
  bad = [r for r in rows if r["status"] != "done"]
  print(summary)
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
  flags.DEFINE_enum("if_running", "wait", IF_RUNNING,
                    "A point another process is training (e.g. one left running by a killed "
                    "sweep): wait for it to exit, or skip it; it is never started twice.")
  flags.mark_flags_as_required(["config", "workdir"])


if __name__ == "__main__":
  from jaxformer import cli

  _define_flags()
  cli.run_absl(main)
