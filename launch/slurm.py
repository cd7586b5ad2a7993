"""Slurm launcher: render (and optionally submit) an sbatch script for multi-node GPU training.

    python -m launch.slurm --nodes=2 --gpus_per_node=8 --time=04:00:00 --partition=gpu \\
        --venv=.venv -- python -m jaxformer.train --config=configs/gpt2.py:small --workdir=DIR
    python -m launch.slurm --nodes=1 --out=sweep.sbatch --submit \\
        -- python -m jaxformer.sweep --config=configs/sweeps/lr_width.py --workdir=DIR

The script's last line is `srun --kill-on-bad-exit=1 <command>`: srun starts `nodes x
ntasks_per_node` copies of the command (and ends them all as soon as one exits non-zero, so a
failed process never leaves the others waiting in a collective), and in each one
`jaxformer.parallel.initialize()` (called by the train entry point) builds the
`jax.distributed` cluster from SLURM_NTASKS / SLURM_PROCID / SLURM_JOB_NODELIST.
The default is one task per node that drives all of the node's GPUs (JAX's usual layout);
`--ntasks_per_node=<gpus>` gives one process per GPU instead (every task sees all GPUs and
takes its share by SLURM_LOCALID), and `--gpus_per_task=G` asks Slurm to bind G GPUs to each
task. `--dry_run` prints how many processes the job starts and which GPUs each one drives,
computed by the same code the tasks run (`jaxformer.parallel.distributed`).

A `python -m jaxformer.sweep` command becomes a job array, `--array=0-(N-1)` with N the number
of points of the sweep file, each array task running one point (`--only_index=
$SLURM_ARRAY_TASK_ID`) on its own allocation; `--max_parallel=K` throttles it (`%K`). The
sweep writes DIR/<point>/ and DIR/summary.csv (atomically), so the array tasks share one DIR.

`--out=FILE` writes the script, `--submit` runs `sbatch` on it (log directory created first);
without either the script is printed. Only the standard library is needed (a sweep command
imports jaxformer.sweep to count its points).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence

from jaxformer import cli

_TIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")


def is_sweep(command: Sequence[str]) -> bool:
  return "jaxformer.sweep" in command


def _validate(args: argparse.Namespace, command: Sequence[str]):
  if not command:
    raise ValueError("give the command after `--`, e.g. -- python -m jaxformer.train "
                     "--config=configs/gpt2.py:small --workdir=DIR")
  for name in ("nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task"):
    value = getattr(args, name)
    if value < (0 if name == "gpus_per_node" else 1):
      raise ValueError(f"--{name}={value} must be >= {0 if name == 'gpus_per_node' else 1}")
  if args.gpus_per_task is not None:
    if args.gpus_per_task < 1:
      raise ValueError(f"--gpus_per_task={args.gpus_per_task} must be >= 1")
    if args.gpus_per_node and args.gpus_per_task * args.ntasks_per_node > args.gpus_per_node:
      raise ValueError(f"--gpus_per_task={args.gpus_per_task} x --ntasks_per_node="
                       f"{args.ntasks_per_node} needs more than --gpus_per_node="
                       f"{args.gpus_per_node} GPUs per node")
  elif args.gpus_per_node and args.ntasks_per_node > args.gpus_per_node:
    raise ValueError(f"--ntasks_per_node={args.ntasks_per_node} is more than --gpus_per_node="
                     f"{args.gpus_per_node}: at most one task per GPU")
  if not _TIME.match(args.time):
    raise ValueError(f"--time={args.time!r} is not a Slurm time (e.g. 04:00:00 or 1-00:00:00)")
  if args.max_parallel is not None and args.max_parallel < 1:
    raise ValueError(f"--max_parallel={args.max_parallel} must be >= 1")
  if is_sweep(command) and any(a.startswith("--only_index") for a in command):
    raise ValueError("the job array sets --only_index itself; remove it from the command")


def directives(args: argparse.Namespace, array_size: int | None) -> list[str]:
  """The `#SBATCH` lines."""
  log_name = "%x-%A_%a.out" if array_size else "%x-%j.out"
  lines = [f"--job-name={args.job_name}", f"--nodes={args.nodes}",
           f"--ntasks-per-node={args.ntasks_per_node}", f"--cpus-per-task={args.cpus_per_task}",
           f"--time={args.time}", f"--output={os.path.join(args.log_dir, log_name)}"]
  if args.gpus_per_task:
    lines.insert(3, f"--gpus-per-task={args.gpus_per_task}")
  elif args.gpus_per_node:
    lines.insert(3, f"--gpus-per-node={args.gpus_per_node}")
  for name in ("partition", "account", "chdir"):
    if getattr(args, name):
      lines.append(f"--{name}={getattr(args, name)}")
  if array_size:
    throttle = f"%{args.max_parallel}" if args.max_parallel else ""
    lines.append(f"--array=0-{array_size - 1}{throttle}")
  return [f"#SBATCH {line}" for line in lines]


def render(args: argparse.Namespace, command: Sequence[str],
           array_size: int | None = None) -> str:
  """The sbatch script running `command` under srun (a job array for a sweep command;
  `array_size` defaults to the sweep's point count)."""
  _validate(args, command)
  if is_sweep(command) and array_size is None:
    from jaxformer import sweep
    array_size = sweep.count_points(command)
  env = [f"module load {shlex.quote(m)}" for m in args.module]
  if args.venv:
    env.append(f"source {shlex.quote(os.path.join(args.venv, 'bin', 'activate'))}")
  env += [f"export {_env_assignment(e)}" for e in args.env]
  run = "srun --kill-on-bad-exit=1 " + shlex.join(command)
  if is_sweep(command):
    run += ' --only_index="$SLURM_ARRAY_TASK_ID"'
  lines = ["#!/bin/bash", *directives(args, array_size if is_sweep(command) else None), "",
           "# Rendered by `python -m launch.slurm`. Every task runs the command below;",
           "# jaxformer.parallel.initialize() joins them from the SLURM_* variables.",
           "set -eo pipefail", *env, run]
  return "\n".join(lines) + "\n"


def layout(args: argparse.Namespace) -> str:
  """What the job will run: processes, and the GPU ids each task on a node drives, from the
  environment Slurm gives the tasks in this layout, through the tasks' own rule."""
  from jaxformer.parallel.distributed import slurm_local_device_ids
  tasks, nodes = args.ntasks_per_node, args.nodes
  processes = f"{nodes} node(s) x {tasks} task(s) = {nodes * tasks} process(es)"
  if not args.gpus_per_node and not args.gpus_per_task:
    return f"{processes}, CPU only (no GPUs requested)"
  per_node = args.gpus_per_task * tasks if args.gpus_per_task else args.gpus_per_node
  owned, used = [], 0
  for local in range(tasks):
    env = {"SLURM_STEP_TASKS_PER_NODE": f"{tasks}(x{nodes})", "SLURM_LOCALID": str(local),
           "SLURM_GPUS_ON_NODE": str(per_node)}
    if args.gpus_per_task:                    # Slurm binds each task's GPUs
      first = local * args.gpus_per_task
      env.update(SLURM_GPUS_PER_TASK=str(args.gpus_per_task), CUDA_VISIBLE_DEVICES=",".join(
          str(g) for g in range(first, first + args.gpus_per_task)))
    else:
      env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(per_node))
    ids = slurm_local_device_ids(env)
    seen = f" (of its visible GPUs {env['CUDA_VISIBLE_DEVICES']})" if args.gpus_per_task else ""
    owned.append(f"  task {local}: local_device_ids={ids}{seen}")
    used += len(ids)
  lines = [f"{processes}, {per_node // tasks} GPU(s) per process, {per_node} GPU(s) per node",
           *owned]
  if used < per_node:
    lines.append(f"warning: {per_node - used} of {per_node} GPUs per node drive no process")
  return "\n".join(lines)


def _env_assignment(entry: str) -> str:
  name, sep, value = entry.partition("=")
  if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
    raise ValueError(f"--env={entry!r} must be NAME=VALUE")
  return f"{name}={shlex.quote(value)}"


def parser() -> cli.ArgumentParser:
  p = cli.ArgumentParser(prog="python -m launch.slurm", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--job_name", "--job-name", default="jaxformer")
  p.add_argument("--nodes", type=int, default=1)
  p.add_argument("--ntasks_per_node", "--ntasks-per-node", type=int, default=1,
                 help="processes per node (1: one process drives all local GPUs)")
  p.add_argument("--gpus_per_node", "--gpus-per-node", type=int, default=8,
                 help="0 leaves the directive out (CPU partitions)")
  p.add_argument("--gpus_per_task", "--gpus-per-task", type=int, default=None,
                 help="Slurm binds this many GPUs to each task (replaces --gpus_per_node)")
  p.add_argument("--cpus_per_task", "--cpus-per-task", type=int, default=8)
  p.add_argument("--time", default="01:00:00", help="wall-clock limit, [D-]HH:MM:SS")
  p.add_argument("--partition", default=None)
  p.add_argument("--account", default=None)
  p.add_argument("--chdir", default=None, help="job working directory (default: submit dir)")
  p.add_argument("--log_dir", default="slurm_logs", help="directory of the --output files")
  p.add_argument("--module", action="append", default=[], help="`module load` this (repeat)")
  p.add_argument("--venv", default=None, help="virtualenv to activate")
  p.add_argument("--env", action="append", default=[], help="export NAME=VALUE (repeat)")
  p.add_argument("--max_parallel", type=int, default=None,
                 help="sweeps: at most this many array tasks at once")
  p.add_argument("--out", default=None, help="write the script here instead of printing it")
  p.add_argument("--submit", action="store_true", help="sbatch the script (needs --out)")
  p.add_argument("--dry_run", action="store_true",
                 help="print the processes and the GPUs of each, then the script; submit nothing")
  return p


def main(argv: Sequence[str] | None = None):
  argv = list(sys.argv[1:] if argv is None else argv)
  own, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
      else (argv, [])
  p = parser()
  args = p.parse_args(own)
  if args.submit and not args.out:
    p.error("--submit needs --out=FILE (the script sbatch reads)")
  try:
    script = render(args, command)
  except ValueError as e:
    p.error(str(e))
  if args.dry_run:
    print(layout(args))
    print(script, end="")
    return
  if not args.out:
    print(script, end="")
    return
  with open(args.out, "w") as f:
    f.write(script)
  print(f"wrote {args.out}")
  if args.submit:
    os.makedirs(os.path.join(args.chdir or ".", args.log_dir), exist_ok=True)
    subprocess.run(["sbatch", args.out], check=True)


if __name__ == "__main__":
  main()
