"""Experiment trackers (jaxformer/train/trackers.py), for real and offline: a tiny run logs to
W&B in offline mode and to a local MLflow store, read back with W&B's own record format and
`MlflowClient`; its resume continues the same tracker runs; a missing extra is one line
before anything is written; a sweep's points are grouped by the sweep's name."""

from __future__ import annotations

import glob
import json
import os
import sys

import pytest

from jaxformer import cli, run_settings
from jaxformer import sweep as sweep_lib
from jaxformer.train import loop, trackers
from jaxformer.train.metrics import read
from tests.runs import on_one_device, tiny_run_config

ALL = ("tensorboard", "jsonl", "wandb", "mlflow")


@pytest.fixture
def offline(tmp_path, monkeypatch):
  """W&B offline with its settings, cache and files under tmp_path, MLflow on a file store
  there: nothing reaches the network or the home directory."""
  for var in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_CONSOLE", "MLFLOW_EXPERIMENT_NAME"):
    monkeypatch.delenv(var, raising=False)
  for var, value in {
      "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false",
      "WANDB_X_DISABLE_STATS": "true", "WANDB_DISABLE_CODE": "true",
      "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
      "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
      "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
      "MLFLOW_TRACKING_URI": f"file://{tmp_path / 'mlruns'}",
      "MLFLOW_ALLOW_FILE_STORE": "true",     # MLflow 3 prefers SQLite; the client is the same
      "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}.items():
    monkeypatch.setenv(var, value)


def wandb_records(path: str) -> list:
  """The records of an offline W&B run file (`run-<id>.wandb`): a 7-byte header (":W&B",
  magic, version), then LevelDB-log blocks of 32 KiB whose chunks (7-byte header: CRC,
  length, type 1 full / 2 first / 3 middle / 4 last) carry `wandb_internal_pb2.Record`s."""
  from wandb.proto import wandb_internal_pb2
  data = open(path, "rb").read()
  assert data[:4] == b":W&B", data[:7]
  records, pos, pending, block = [], 7, b"", 1 << 15
  while pos + 7 <= len(data):
    left = block - pos % block
    length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
    if left < 7 or (kind == 0 and length == 0):      # the zero padding of a block's end
      pos += left
      continue
    pending += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      records.append(record)
      pending = b""
  return records


def wandb_run(run_file: str) -> dict:
  """An offline W&B run as {"run": its RunRecord, "config": {key: value}, "history":
  {step: {key: value}}} (values decoded from their JSON)."""
  out = {"config": {}, "history": {}}
  for record in wandb_records(run_file):
    kind = record.WhichOneof("record_type")
    if kind == "run":
      out["run"] = record.run
      out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    elif kind == "config":
      out["config"].update({i.key or ".".join(i.nested_key): json.loads(i.value_json)
                            for i in record.config.update})
    elif kind == "history":
      row = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
             for i in record.history.item}
      out["history"][row.pop("_step")] = row
  return out


@pytest.mark.slow
def test_a_run_logs_to_wandb_offline_and_mlflow_and_its_resume_continues_them(
    tmp_path, offline, monkeypatch):
  """20 steps of a 24-step run (stopped as if preempted), then its last checkpoint lost, so
  the resume redoes steps 17-20 before finishing: one W&B run (two offline files, one per
  start, synced into one run) and one MLflow run, each with every step once."""
  from mlflow.tracking import MlflowClient
  on_one_device(monkeypatch)
  workdir = tmp_path / "run"
  cfg = tiny_run_config(trackers=ALL, tracker_group="grp")
  loop.train(cfg, str(workdir), stop_after=20)
  ids = json.loads((workdir / "trackers.json").read_text())
  first = {r["step"]: r for r in read(workdir / "metrics.jsonl") if "loss" in r}
  assert sorted(first) == [4, 8, 12, 16, 20]
  (eval_12,) = [r for r in read(workdir / "metrics.jsonl") if "eval_loss" in r]
  commit, dirty = trackers.git_state()

  (run_file,) = glob.glob(str(workdir / "wandb" / "offline-run-*" / "run-*.wandb"))
  wb = wandb_run(run_file)
  assert (wb["run"].run_id, wb["run"].run_group, wb["run"].display_name,
          wb["run"].project) == (ids["wandb"]["id"], "grp", "run", "jaxformer")
  config = wb["config"]
  assert config["model"]["d_model"] == cfg.model.d_model and config["train"]["steps"] == 24
  assert config["train"]["trackers"] == list(ALL)
  run_info = config["run"]
  assert (run_info["git_commit"], run_info["git_dirty"]) == (commit, dirty)
  assert run_info["params"] > 0 and run_info["devices"] >= 1 and "data" in run_info["mesh"]
  assert run_info["jax_version"] and run_info["jaxformer_version"]
  assert sorted(wb["history"]) == [4, 8, 12, 16, 20]
  for step, record in first.items():
    assert wb["history"][step]["loss"] == pytest.approx(record["loss"], rel=1e-6)
  assert wb["history"][12]["eval_loss"] == pytest.approx(eval_12["eval_loss"], rel=1e-6)
  assert wb["history"][20]["curves/_type"] == "image-file"       # the curves plot
  assert os.path.isfile(os.path.join(os.path.dirname(run_file), "files",
                                     wb["history"][20]["curves/path"]))

  client = MlflowClient()                              # MLFLOW_TRACKING_URI
  run_id = ids["mlflow"]["run_id"]
  ml = client.get_run(run_id)
  assert ml.info.status == "FINISHED" and ml.info.run_name == "run"
  assert ml.data.tags["group"] == "grp" and ml.data.params["model.d_model"] == str(
      cfg.model.d_model)
  if commit:
    assert ml.data.tags["mlflow.source.git.commit"] == commit
    assert ml.data.params["run.git_commit"] == commit
  history = {m.step: m.value for m in client.get_metric_history(run_id, "loss")}
  assert history == pytest.approx({s: r["loss"] for s, r in first.items()}, rel=1e-6)
  images = [f.path for f in client.list_artifacts(run_id, "images")]
  assert any("curves" in p for p in images), images

  # the step-20 checkpoint lost: the resume starts at 16 and redoes 17-20, then 21-24
  import shutil
  shutil.rmtree(workdir / "checkpoints" / "20")
  loop.train(cfg, str(workdir))
  assert json.loads((workdir / "trackers.json").read_text()) == ids    # the same runs
  runs = sorted(glob.glob(str(workdir / "wandb" / "offline-run-*" / "run-*.wandb")))
  assert len(runs) == 2 and run_file in runs
  resumed = wandb_run(next(r for r in runs if r != run_file))
  assert resumed["run"].run_id == ids["wandb"]["id"]
  assert sorted(resumed["history"]) == [24]            # 20 was sent before: not again
  final = {r["step"]: r for r in read(workdir / "metrics.jsonl") if "loss" in r}
  assert sorted(final) == [4, 8, 12, 16, 20, 24]
  assert resumed["history"][24]["loss"] == pytest.approx(final[24]["loss"], rel=1e-6)
  history = client.get_metric_history(run_id, "loss")
  assert [m.step for m in history] == [4, 8, 12, 16, 20, 24]   # each step once
  assert client.get_run(run_id).info.status == "FINISHED"
  evals = {m.step for m in client.get_metric_history(run_id, "eval_loss")}
  assert evals == {12, 24}


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_missing_extra_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys,
                                                                name):
  monkeypatch.setitem(sys.modules, name, None)       # `import name` fails: not installed
  cfg = tiny_run_config(trackers=("tensorboard", name))
  with pytest.raises(SystemExit) as exit_info:
    cli.user_errors(loop.train)(cfg, str(tmp_path / "run"))
  assert exit_info.value.code == cli.EXIT_USER_ERROR
  assert capsys.readouterr().err.strip() == (
      f"error: train.trackers names '{name}', which needs `{name}`: pip install "
      f"'jaxformer[{name}]', or leave '{name}' out of train.trackers")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", [("tensorbord",), ("jsonl", "jsonl"), "wandb"])
def test_bad_tracker_names_are_refused(value):
  with pytest.raises(ValueError, match=r"train\.trackers=.* must be a tuple of distinct names "
                                       r"from 'tensorboard', 'jsonl', 'wandb', 'mlflow'"):
    run_settings.parse_section("train", dict(steps=1, batch_size=1, trackers=value))
  assert run_settings.defaults("train")["trackers"] == ("tensorboard", "jsonl")


def test_sweep_points_that_report_to_a_tracker_are_grouped_by_the_sweep_name(tmp_path):
  base = "configs/shakespeare_char.py:tiny"
  def command(**overrides):
    (point,) = sweep_lib.expand(dict(base=base, product={"optim.lr": [1e-3]},
                                     overrides=overrides))
    return point.command(base, str(tmp_path / "lr_sweep"))
  assert "--config.train.tracker_group=lr_sweep" in command(
      **{"train.trackers": ("jsonl", "mlflow")})
  assert not any("tracker_group" in a for a in command())              # nothing to group
  named = command(**{"train.trackers": ("wandb",), "train.tracker_group": "mine"})
  assert [a for a in named if "tracker_group" in a] == ["--config.train.tracker_group=mine"]
