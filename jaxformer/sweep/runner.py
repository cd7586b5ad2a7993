"""Running a sweep: every selected point not finished yet, `parallel` at a time, each as a
training the driver owns (`trainings`); a point another process is training is waited for or
skipped (`--if_running`), never started twice. The runner records each attempt in sweep.json
and rewrites the summary files after every point."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from jaxformer import paths
from jaxformer.sweep import spec, status as status_lib, summary as summary_lib, trainings

IF_RUNNING = ("wait", "skip")       # what `run` does about a point another process is training
WAIT_POLL_S = 2.0                   # how often it asks whether that process is done


def process_index() -> int:
  """This process's index in a multi-process launch (0 when launched alone)."""
  for var in ("JAXFORMER_PROCESS_ID", "SLURM_PROCID"):
    if os.environ.get(var, "").isdigit():
      return int(os.environ[var])
  return 0


def _log_path(point_dir: str) -> str:
  """The training's console log: in the point's directory (a remote one: in its local
  mirror, uploaded when the training ends, as the child appends to it line by line)."""
  index = process_index()
  directory = paths.local_mirror(point_dir, "sweep")
  os.makedirs(directory, exist_ok=True)
  return os.path.join(directory, "train.log" if index == 0 else f"train.{index}.log")


def _held_line(name: str, owner: str, what: str) -> str:
  """One line about a point another process is training: who, and `what` the sweep does
  (`{kill}` in it: how to stop that training)."""
  pid = re.match(r"pid (\d+)", owner)
  kill = f"`kill {pid.group(1)}` on its host" if pid else "stop it"
  return (f"[sweep] {name}: trained by another process ({owner}), e.g. one left running by a "
          "killed sweep; " + what.format(kill=kill))


def run(sweep: spec.Sweep | Mapping[str, Any], workdir: str, *, parallel: int = 1,
        runner: trainings.Runner = trainings.subprocess_runner, only: str | None = None,
        only_index: int | None = None, if_running: str = "wait") -> list[dict[str, Any]]:
  """Train every (selected) point not finished yet, `parallel` at a time; returns the summary
  rows of the selected points (the summary files list all). A failing point is recorded and
  the others go on.

  A point whose workdir lock another process holds (a training left running by a killed
  sweep, or started by hand) is never started twice: with `if_running="wait"` the sweep says
  so in one line and waits for it to exit (then skips the point if it finished, else resumes
  it); with "skip" it says so and leaves the point "running". SIGINT/SIGTERM/SIGHUP stop the
  sweep as `trainings.Stop` says and raise `Interrupted` once every training has exited.
  """
  if not isinstance(parallel, int) or parallel < 1:
    raise ValueError(f"--parallel={parallel!r} must be an int >= 1")
  if if_running not in IF_RUNNING:
    raise ValueError(f"--if_running={if_running!r} must be one of {', '.join(IF_RUNNING)}")
  sweep = spec.as_sweep(sweep)
  points = spec.expand(sweep)
  chosen = spec.select(points, only=only, only_index=only_index)
  primary = process_index() == 0
  paths.path(workdir, "--workdir").mkdir(parents=True, exist_ok=True)
  lock = threading.Lock()                  # sweep.json and summary writes, `running`
  running: set[str] = set()                # trained by this process right now
  started: set[str] = set()                # started by this run (for the stop message)
  stop = trainings.Stop()

  def summarize():
    if primary:
      with lock:
        summary_lib.summarize(points, workdir, running)

  def may_start(point: spec.Point, point_dir: str) -> bool:
    """False when another process holds the point's lock (after waiting, if asked, for it
    to finish the point); process 0's training takes the lock, so only process 0 asks."""
    owner = status_lib.lock_holder(point_dir) if primary else None
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
      owner = status_lib.lock_holder(point_dir)
    steps = point.settings.train.steps
    with lock:
      status, _ = status_lib.state(point_dir, steps, status_lib.read_metrics(point_dir), record)
      if status == "done":
        summary_lib.write_record(point_dir, dict(status=status, **record))
        summary_lib.summarize(points, workdir, running)
    print(f"[sweep] {point.name}: " + ("finished by the other training, skipped"
                                       if status == "done" else "the other training exited "
                                       "before the end; resuming the point here"), flush=True)
    return status != "done"

  def run_point(point: spec.Point):
    point_dir = os.path.join(workdir, point.name)
    steps = point.settings.train.steps
    if stop.signum is not None:
      return
    if status_lib.is_finished(point_dir, steps):
      print(f"[sweep] {point.name}: finished, skipped", flush=True)
      return
    if not may_start(point, point_dir) or stop.signum is not None:
      return
    paths.path(point_dir).mkdir(parents=True, exist_ok=True)
    log = _log_path(point_dir)
    command = point.command(sweep.base, workdir)
    with lock:
      running.add(point.name)
      started.add(point.name)
      record = paths.path(os.path.join(point_dir, "sweep.json"))
      if primary and record.exists():
        record.unlink()                                       # about an earlier attempt
    print(f"[sweep] {point.name}: running, log {log}", flush=True)
    start = time.perf_counter()
    try:
      code = runner(command, log)
    except trainings.NotStarted:
      with lock:
        running.discard(point.name)
      return
    wall = time.perf_counter() - start
    paths.upload(os.path.dirname(log), point_dir)
    record = {"returncode": code, "wall_time_s": round(wall, 3), "command": command}
    if stop.signum is not None:                # it was running when the sweep was stopped
      record["signal"] = signal.Signals(stop.signum).name     # returncode -9: killed
    with lock:
      running.discard(point.name)
      status, owner = status_lib.state(point_dir, steps, status_lib.read_metrics(point_dir),
                                       record)
      if primary and status != "running":      # "running": another process holds it
        summary_lib.write_record(point_dir, dict(status=status, **record))
      if primary:
        summary_lib.summarize(points, workdir, running)
    if status == "running" and primary:
      print(_held_line(point.name, owner, f"the training started here exited ({code}) "
                       "without training it; wait for the other one or {kill}, then rerun "
                       "the sweep"), flush=True)
    else:
      print(f"[sweep] {point.name}: {status} (exit {code}, {wall:.1f}s)", flush=True)

  summarize()
  with stop.active(), concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
    list(pool.map(run_point, chosen))
  summarize()
  rows = [summary_lib.summary_row(p, workdir) for p in chosen]
  if stop.signum is not None:
    name = signal.Signals(stop.signum).name
    stopped = sum(r["status"] == "interrupted" for r in rows)
    unstarted = sum(r["name"] not in started and r["status"] != "done" for r in rows)
    print(f"[sweep] stopped by {name}: {stopped} point(s) interrupted, {unstarted} not "
          "started; rerun the same command to resume", flush=True)
    raise trainings.Interrupted(stop.signum, rows)
  return rows
