"""A point's status, decided in one place from the facts on disk (its metrics, its workdir
lock, what sweep.json keeps of its last attempt), so that the runner, sweep.json and the
summary files always agree."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from jaxformer import paths, workdir_layout


def read_metrics(point_dir: str) -> list[dict]:
  from jaxformer.train import metrics       # light: no JAX
  path = os.path.join(point_dir, workdir_layout.METRICS)
  return metrics.read(path) if paths.path(path).exists() else []


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


def lock_holder(point_dir: str) -> str | None:
  from jaxformer.train import workdir      # light: no JAX
  return workdir.holder(point_dir) if paths.path(point_dir).is_dir() else None


def state(point_dir: str, steps: int | None, records: Sequence[Mapping[str, Any]],
          record: Mapping[str, Any], *, running_here: bool = False) -> tuple[str, str | None]:
  """(status, lock holder) of a point: `point_status` of the facts on disk. The lock is asked
  only about an unfinished point that is not this sweep's own running training."""
  finished = steps is not None and _finished(records, steps)
  owner = None
  if not finished:
    owner = "this sweep" if running_here else lock_holder(point_dir)
  return point_status(finished=finished, owner=owner, record=record,
                      trained=bool(records)), owner
