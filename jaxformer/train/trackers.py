"""Where a run reports: metrics.jsonl, TensorBoard, Weights & Biases and MLflow, behind one
small interface that the run calls in one place (`run_builder.Writers`).

    --config.train.trackers="('tensorboard', 'jsonl', 'wandb', 'mlflow')"

A `Tracker` gets the run's hyperparameters once per start (`log_hparams`: the resolved config,
the git commit and dirty flag of the code, the jaxformer/JAX versions, the devices and the
mesh, the parameter count: `run_hparams`), every record metrics.jsonl gets, at the same step
(`log_metrics`), the plots (`log_image`: the attention map at each eval, the curves at the
end) and `close`, with the exception that ended the run if one did. Only process 0 opens
trackers. metrics.jsonl is always written ("jsonl" may be named, or not): resume, sweeps and
the plots read it.

W&B and MLflow come with extras (`[wandb]`, `[mlflow]`); a tracker whose package is missing
is refused with the extra to install before anything is written or compiled
(`check_installed`). Each keeps the id of its run in `<workdir>/trackers.json`, so a resumed
run continues the same tracker run (--fresh removes the file: a new run). The steps a resume
redoes (logged after the checkpoint it resumes from) are not sent again to a resumed W&B or
MLflow run, which keep the values they got first (the same losses: a resumed run recomputes
them exactly); TensorBoard drops and rewrites them (`tensorboard.SummaryWriter`'s purge_step).

- W&B: `wandb.init(id=..., resume="allow")`, project `train.tracker_project` (else
  $WANDB_PROJECT, else "jaxformer"), group `train.tracker_group`, name the workdir's last
  component; its files go to `<workdir>/wandb/` ($WANDB_DIR if set; W&B's default for a remote
  workdir). Offline with WANDB_MODE=offline (`wandb sync <workdir>/wandb/offline-run-*`).
  Console capture is off unless $WANDB_CONSOLE says otherwise (the run's own console output
  is routed per process, `jaxformer.console`).
- MLflow: `MlflowClient` on $MLFLOW_TRACKING_URI, else the URI the run started with, else
  MLflow's default (`sqlite:///mlflow.db` in the current directory); experiment
  `train.tracker_project` (else $MLFLOW_EXPERIMENT_NAME, else "jaxformer"), the group as the
  tag `group`, the commit as `mlflow.source.git.commit`. Parameters are the hyperparameters
  flattened (`model.d_model`, `run.git_commit`); MLflow's are write-once, so a resume adds the new keys
  and records a changed value (a longer `train.steps`, another mesh) as the tag
  `changed.<key>`. Images are `log_image(key=..., step=...)` artifacts.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import math
import os
import secrets
import string
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxformer import extras, paths, workdir_layout
from jaxformer.train.metrics import MetricsWriter
from jaxformer.train.tensorboard import SummaryWriter

# the trackers that need a package of their own: name -> (module, pip extra)
PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}
DEFAULT_PROJECT = "jaxformer"


def check_installed(names: Sequence[str]) -> None:
  """A ValueError naming the extra to install for the first tracker of `names` whose package
  is missing (no import: the sweep driver checks every point)."""
  for name in names:
    if name not in PACKAGES:
      continue
    module, extra = PACKAGES[name]
    try:
      found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
      found = False
    if not found:
      raise ValueError(f"train.trackers names {name!r}, which needs `{module}`: pip install "
                       f"'jaxformer[{extra}]', or leave {name!r} out of train.trackers")


class Tracker:
  """What a run reports to (every method may do nothing)."""

  def log_hparams(self, hparams: dict) -> None:
    """Once per start: nested {section: {key: value}} (`run_hparams`)."""

  def log_metrics(self, step: int, record: dict) -> None:
    """A metrics.jsonl record (its "step" is `step`; a list value is per expert)."""

  def log_image(self, step: int, name: str, png: bytes) -> None:
    """A plot, as PNG bytes."""

  def close(self, error: BaseException | None = None) -> None:
    """End of the run (`error`: what ended it, None when it ended normally or was stopped
    to be resumed)."""


def scalars(record: dict) -> dict:
  """The scalars of a metrics record: "step" left out, a list (per-expert load) as key/i."""
  out = {}
  for key, value in record.items():
    if key == "step":
      continue
    if isinstance(value, list):
      out.update({f"{key}/{i}": v for i, v in enumerate(value)})
    else:
      out[key] = value
  return out


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
  """{"a": {"b": 1}} -> {"a.b": 1}."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


class JsonlTracker(Tracker):
  """metrics.jsonl (`metrics.MetricsWriter`)."""

  def __init__(self, writer: MetricsWriter):
    self.writer = writer

  def log_metrics(self, step: int, record: dict) -> None:
    self.writer.write(record)


class TensorBoardTracker(Tracker):
  """TensorBoard event files in the workdir (`tensorboard.SummaryWriter`: a resume purges
  the steps it rewrites); no hyperparameters (TensorBoard's hparams plugin would add an
  event file per start)."""

  def __init__(self, workdir: str, start: int):
    self.writer = SummaryWriter(workdir, purge_step=start + 1 if start else None)

  def log_metrics(self, step: int, record: dict) -> None:
    self.writer.scalars(scalars(record), step)

  def log_image(self, step: int, name: str, png: bytes) -> None:
    self.writer.image(name, png, step)

  def close(self, error: BaseException | None = None) -> None:
    self.writer.close()


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


class WandbTracker(Tracker):
  """A W&B run (see the module docstring); `saved`: its entry in trackers.json."""

  def __init__(self, workdir: str, saved: dict | None, *, project: str | None,
               group: str | None, save: Callable[[dict], None]):
    wandb = extras.require("wandb", extra="wandb", needed_for="train.trackers 'wandb'")
    self.resumed = bool(saved and saved.get("id"))
    run_id = saved["id"] if self.resumed else "".join(
        secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    save({"id": run_id})                     # before the run exists: a crash keeps the id
    directory = None
    if "WANDB_DIR" not in os.environ and not paths.is_remote(workdir):
      directory = workdir
    settings = {} if "WANDB_CONSOLE" in os.environ else {"console": "off"}
    # wandb.init installs an excepthook that prints a traceback and then calls the one before
    # it, which prints it again; `close` tells W&B of a failure itself, so ours is put back
    excepthook = sys.excepthook
    try:
      self.run = wandb.init(
          id=run_id, resume="allow", dir=directory, group=group,
          project=project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
          name=_run_name(workdir), settings=wandb.Settings(**settings))
    except Exception as e:  # noqa: BLE001  (wandb raises its own types: no login, no network)
      raise ValueError(f"train.trackers: W&B could not start its run ({_first_line(e)}); "
                       "log in with `wandb login`, or set WANDB_MODE=offline to write it to "
                       "the workdir and `wandb sync` it later") from e
    finally:
      sys.excepthook = excepthook
    self._wandb = wandb

  def log_hparams(self, hparams: dict) -> None:
    self.run.config.update(hparams, allow_val_change=True)

  def log_metrics(self, step: int, record: dict) -> None:
    self.run.log(scalars(record), step=step)

  def log_image(self, step: int, name: str, png: bytes) -> None:
    from PIL import Image
    self.run.log({name: self._wandb.Image(Image.open(io.BytesIO(png)))}, step=step)

  def close(self, error: BaseException | None = None) -> None:
    self.run.finish(exit_code=0 if error is None else 1)


class MlflowTracker(Tracker):
  """An MLflow run (see the module docstring); `saved`: its entry in trackers.json."""

  def __init__(self, workdir: str, saved: dict | None, *, project: str | None,
               group: str | None, save: Callable[[dict], None]):
    mlflow = extras.require("mlflow", extra="mlflow", needed_for="train.trackers 'mlflow'")
    from mlflow.tracking import MlflowClient
    saved = saved or {}
    uri = (os.environ.get("MLFLOW_TRACKING_URI") or saved.get("tracking_uri")
           or mlflow.get_tracking_uri())
    experiment = project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
    try:
      self.client = MlflowClient(tracking_uri=uri)
      self.run_id = self._resume(saved.get("run_id")) if saved.get("tracking_uri") == uri \
          else None
      if self.run_id is None:
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = (found.experiment_id if found is not None
                         else self.client.create_experiment(experiment))
        tags = {"jaxformer.workdir": paths.absolute(workdir)}
        if group:
          tags["group"] = group
        self.run_id = self.client.create_run(experiment_id, run_name=_run_name(workdir),
                                             tags=tags).info.run_id
    except Exception as e:  # noqa: BLE001  (MlflowException, a store that does not open)
      raise ValueError(f"train.trackers: MLflow could not start its run at {uri} "
                       f"({_first_line(e)}); set MLFLOW_TRACKING_URI to a store or server "
                       "you can write to") from e
    self.resumed = self.run_id == saved.get("run_id")
    save({"run_id": self.run_id, "tracking_uri": uri})

  def _resume(self, run_id: str | None) -> str | None:
    """`run_id` set running again, or None (with a warning) when the store lacks it."""
    if not run_id:
      return None
    from mlflow.exceptions import MlflowException
    try:
      self.client.get_run(run_id)
    except MlflowException as e:
      logging.warning("MLflow run %s is not in its store (%s): starting a new run", run_id,
                      _first_line(e))
      return None
    self.client.update_run(run_id, status="RUNNING")
    return run_id

  def log_hparams(self, hparams: dict) -> None:
    from mlflow.entities import Param, RunTag
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH
    values = {k: str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in flatten(hparams).items()}
    logged = self.client.get_run(self.run_id).data.params
    params = [Param(k, v) for k, v in values.items() if k not in logged]
    tags = [RunTag(f"changed.{k}", v) for k, v in values.items() if k in logged
            and logged[k] != v]
    commit = hparams.get("run", {}).get("git_commit")
    if commit:
      tags.append(RunTag("mlflow.source.git.commit", commit))
    for i in range(0, max(len(params), len(tags)), MAX_PARAMS_TAGS_PER_BATCH):
      self.client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS_TAGS_PER_BATCH],
                            tags=tags[i:i + MAX_PARAMS_TAGS_PER_BATCH])

  def log_metrics(self, step: int, record: dict) -> None:
    from mlflow.entities import Metric
    now = int(time.time() * 1000)
    self.client.log_batch(self.run_id, metrics=[
        Metric(key, float(value), now, step) for key, value in scalars(record).items()
        if isinstance(value, (int, float))])

  def log_image(self, step: int, name: str, png: bytes) -> None:
    from PIL import Image
    self.client.log_image(self.run_id, Image.open(io.BytesIO(png)), key=name, step=step)

  def close(self, error: BaseException | None = None) -> None:
    status = ("FINISHED" if error is None else
              "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
    self.client.set_terminated(self.run_id, status=status)


def _run_name(workdir: str) -> str:
  """A tracker run's name: the workdir's last component (a sweep point's name)."""
  return os.path.basename(os.path.normpath(workdir)) or workdir


class Trackers:
  """The run's trackers, called together, in order (metrics.jsonl first). Records at steps a
  resumed W&B or MLflow run already has (<= `logged_through`) are not sent to it again."""

  def __init__(self, trackers: Sequence[Tracker] = (), logged_through: int = 0):
    self.trackers = list(trackers)
    self.logged_through = logged_through

  def _at(self, step: int):
    return [t for t in self.trackers
            if not (getattr(t, "resumed", False) and step <= self.logged_through)]

  def log_hparams(self, hparams: dict) -> None:
    for t in self.trackers:
      t.log_hparams(hparams)

  def log_metrics(self, record: dict) -> None:
    for t in self._at(record["step"]):
      t.log_metrics(record["step"], record)

  def log_image(self, step: int, name: str, png: bytes) -> None:
    for t in self._at(step):
      t.log_image(step, name, png)

  def close(self, error: BaseException | None = None) -> None:
    """Close every tracker, even after one fails to (the first failure is raised)."""
    failure = None
    for t in reversed(self.trackers):
      try:
        t.close(error)
      except Exception as e:  # noqa: BLE001  (raised below, after the others closed)
        failure = failure or e
    self.trackers = []
    if failure is not None:
      raise failure

  def exit(self, kind, error, traceback) -> None:
    """`close` as an ExitStack exit callback (it sees the exception ending the run)."""
    del kind, traceback
    self.close(error)


def _state_path(workdir: str) -> str:
  return os.path.join(workdir, workdir_layout.TRACKERS)


def read_state(workdir: str) -> dict:
  """trackers.json: {tracker name: what resumes its run} ({} when there is none)."""
  p = paths.path(_state_path(workdir))
  if not p.exists():
    return {}
  try:
    state = json.loads(p.read_text())
  except ValueError:
    state = None
  if not isinstance(state, dict):
    logging.warning("%s is not a JSON object: the trackers start new runs", p)
    return {}
  return state


_OPENERS = {"wandb": WandbTracker, "mlflow": MlflowTracker}


def open_trackers(names: Sequence[str], workdir: str, *, metrics: MetricsWriter, start: int,
                  logged_through: int = 0, project: str | None = None,
                  group: str | None = None, hparams: Callable[[], dict] | None = None
                  ) -> Trackers:
  """The trackers of `names` (train.trackers) for the run in `workdir` starting at step
  `start`; metrics.jsonl always. `hparams()` is called once if a tracker takes them. A tracker
  that fails to open closes those already open and raises."""
  opened = Trackers([JsonlTracker(metrics)], logged_through)
  state = read_state(workdir)

  def saver(name):
    def save(entry):
      state[name] = entry
      paths.write_text(_state_path(workdir), json.dumps(state, indent=2) + "\n")
    return save
  try:
    for name in names:
      if name == "tensorboard":
        opened.trackers.append(TensorBoardTracker(workdir, start))
      elif name in _OPENERS:
        opened.trackers.append(_OPENERS[name](workdir, state.get(name), project=project,
                                              group=group, save=saver(name)))
    if hparams is not None and any(name in _OPENERS for name in names):
      opened.log_hparams(hparams())
  except BaseException as e:
    opened.close(e)
    raise
  return opened


def _git(directory: str, *args: str) -> str | None:
  try:
    result = subprocess.run(["git", "-C", directory, *args], capture_output=True, text=True,
                            timeout=30)
  except (OSError, subprocess.SubprocessError):
    return None
  return result.stdout if result.returncode == 0 else None


def git_state(directory: str | None = None) -> tuple[str | None, bool | None]:
  """(commit, dirty) of the git checkout holding `directory` (default: this package's);
  (None, None) outside one. Dirty: a tracked file differs from the commit (untracked files,
  such as workdirs inside the checkout, do not count)."""
  if directory is None:
    directory = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  commit = _git(directory, "rev-parse", "HEAD")
  if commit is None:
    return None, None
  status = _git(directory, "status", "--porcelain", "--untracked-files=no")
  return commit.strip(), None if status is None else bool(status.strip())


def run_hparams(config, *, mesh_shape: Mapping[str, int], params) -> dict:
  """A run's hyperparameters: the config's sections as they are saved in config.json, and
  under "run" the code (git commit, dirty flag, versions), the topology (platform, device
  kind and count, processes, mesh) and the parameter count."""
  import jax
  import jaxlib

  import jaxformer
  commit, dirty = git_state()
  devices = jax.devices()
  count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
  return {**json.loads(config.to_json()), "run": {
      "git_commit": commit, "git_dirty": dirty, "jaxformer_version": jaxformer.__version__,
      "jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
      "platform": devices[0].platform, "device_kind": devices[0].device_kind,
      "devices": len(devices), "processes": jax.process_count(),
      "mesh": {k: int(v) for k, v in mesh_shape.items()}, "params": int(count)}}
