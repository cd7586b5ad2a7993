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

# The docstring above is the command's --help (absl prints the main module's); `__init__.py`
# says which module does what.

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from jaxformer.sweep import runner, spec, trainings


def main(argv: Sequence[str]):
  import shlex

  from absl import flags

  del argv
  f = flags.FLAGS
  sweep = spec.load_sweep(f.config)
  if f.dry_run:
    for command in spec.dry_run_commands(sweep, f.workdir, only=f.only, only_index=f.only_index):
      print(shlex.join(command))
    return
  summary = f"[sweep] summary: {os.path.join(f.workdir, 'summary.csv')}"
  try:
    rows = runner.run(sweep, f.workdir, parallel=f.parallel, only=f.only, only_index=f.only_index,
                      if_running=f.if_running)
  except trainings.Interrupted:
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
  flags.DEFINE_enum("if_running", "wait", runner.IF_RUNNING,
                    "A point another process is training (e.g. one left running by a killed "
                    "sweep): wait for it to exit, or skip it; it is never started twice.")
  flags.mark_flags_as_required(["config", "workdir"])


if __name__ == "__main__":
  from jaxformer import cli

  _define_flags()
  cli.run_absl(main)
