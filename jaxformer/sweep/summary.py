"""The files a sweep writes about its points, each written atomically: DIR/<point>/sweep.json
(the last finished attempt) and DIR/summary.json and DIR/summary.csv (one row per point),
their statuses all taken from `status.point_status`."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jaxformer import paths
from jaxformer.sweep import config as config_lib, spec, status as status_lib

SUMMARY_FIELDS = ("name", "status", "final_step", "loss", "eval_loss", "eval_accuracy",
                  "params", "params_total", "tokens", "wall_time_s", "log")


def read_record(point_dir: str) -> dict:
  path = paths.path(os.path.join(point_dir, "sweep.json"))
  return json.loads(path.read_text()) if path.exists() else {}


def write_record(point_dir: str, record: Mapping[str, Any]):
  paths.write_text(os.path.join(point_dir, "sweep.json"), json.dumps(dict(record), indent=2))


def summary_row(point: spec.Point, workdir: str, *, running_here: bool = False) -> dict[str, Any]:
  """The summary of one point, from its workdir (metrics.jsonl, sweep.json, the lock);
  `running_here`: this process is running its training."""
  point_dir = os.path.join(workdir, point.name)
  records = status_lib.read_metrics(point_dir)
  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_loss" in r]
  settings = point.settings
  steps = settings.train.steps if settings is not None else None
  record = read_record(point_dir)
  status, _ = status_lib.state(point_dir, steps, records, record, running_here=running_here)
  final_step = max((r["step"] for r in train), default=None)
  tokens = None          # sequence tasks only (images have no data.seq_len)
  if settings is not None and final_step is not None and settings.data.seq_len:
    tokens = final_step * settings.train.batch_size * settings.data.seq_len
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
  paths.write_text(os.path.join(workdir, "summary.json"), json.dumps(list(rows), indent=2) + "\n")
  fields = list(dict.fromkeys(k for row in rows for k in row["overrides"]))
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  writer.writerow(["name", *fields, *SUMMARY_FIELDS[1:]])
  for row in rows:
    writer.writerow([row["name"], *(config_lib.format_value(row["overrides"][f])
                                    if f in row["overrides"] else "" for f in fields),
                     *("" if row[k] is None else row[k] for k in SUMMARY_FIELDS[1:])])
  paths.write_text(os.path.join(workdir, "summary.csv"), buffer.getvalue())


def summarize(points: Sequence[spec.Point], workdir: str, running: set[str]):
  """Rewrite the summary files, and the status of any sweep.json the facts have moved on from
  (a point finished or resumed by hand since), so the two always agree. A point's own
  training is never racing this: its sweep.json is removed when it starts and written after
  it exits."""
  rows = []
  for point in points:
    row = summary_row(point, workdir, running_here=point.name in running)
    point_dir = os.path.join(workdir, point.name)
    record = read_record(point_dir)
    if record and record.get("status") != row["status"] and point.name not in running:
      write_record(point_dir, dict(record, status=row["status"]))
    rows.append(row)
  write_summary(workdir, rows)
