"""Sweeps: expand a grid of config overrides and train each point in its own workdir.

    python -m jaxformer.sweep --config=configs/sweeps/lr_width.py --workdir=DIR   # --help
    from jaxformer import sweep
    rows = sweep.run(sweep.load_sweep("configs/sweeps/lr_width.py"), "runs/lrw", parallel=2)

The sweep file format, the files written and the stop semantics are in `__main__.py`'s
docstring (the command's --help). One job a module:
  spec       a sweep file's `Sweep`, its `Point`s (names, flags, train commands), selection
  config     a point's training config, parsed and validated exactly as train does
  status     a point's status from the facts on disk, decided in one place
  summary    the files about the points: sweep.json, summary.json, summary.csv
  trainings  the driver's child trainings and how a stop signal reaches them
  runner     `run`: the points, `parallel` at a time, waiting for or skipping held ones
  branched   `run_branched`: warmup-stable-decay trunks, then their cooldown branches
  __main__   the command line

Importing this package loads the standard library only (the launchers import it to count a
sweep's points); absl, ml_collections and JAX are loaded on first use.
"""

from __future__ import annotations

from jaxformer.sweep.branched import run_branched
from jaxformer.sweep.config import REPO_ROOT, format_value, load_config, resolve_base
from jaxformer.sweep.runner import IF_RUNNING, process_index, run
from jaxformer.sweep.spec import (Point, Sweep, as_sweep, count_points, dry_run_commands, expand,
                                  load_sweep, point_name, select)
from jaxformer.sweep.status import is_finished, point_status, read_metrics
from jaxformer.sweep.summary import SUMMARY_FIELDS, summary_row, write_summary
from jaxformer.sweep.trainings import Interrupted, Runner, limit_xla_threads, subprocess_runner

__all__ = ["REPO_ROOT", "format_value", "load_config", "resolve_base", "IF_RUNNING",
           "process_index", "run", "run_branched", "Point", "Sweep", "as_sweep", "count_points",
           "dry_run_commands", "expand", "load_sweep", "point_name", "select", "is_finished",
           "point_status", "read_metrics", "SUMMARY_FIELDS", "summary_row", "write_summary",
           "Interrupted", "Runner", "limit_xla_threads", "subprocess_runner"]
