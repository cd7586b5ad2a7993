"""python -m jaxformer.train --config=configs/<name>.py[:arg] --workdir=DIR [--config.a.b=v]
    [--fresh] [--data_changed_ok] [--branch_from=TRUNK_WORKDIR@STEP] [--print_config]

Planning is `python -m jaxformer.plan` (`--plan_only`, `--topology` and `--slices` are refused
here with that command line); on a TPU a run checks that its step fits before it writes
anything (`jaxformer.train.program.require_fit`)."""

import shlex
import sys

import jax
from absl import flags
from ml_collections import config_flags

from jaxformer import cli, compilation, console, parallel, tpu_flags
from jaxformer.train import config_checks
from jaxformer.train import workdir as workdir_lib
from jaxformer.train.loop import train

config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics); reruns resume.")
flags.DEFINE_bool("fresh", False, "Discard the workdir's checkpoints and metrics first.")
flags.DEFINE_bool("data_changed_ok", False, "Resume although data.source changed since the run "
                  "recorded it (the remaining steps train on the new data; recorded in "
                  "data.json).")
flags.DEFINE_string("branch_from", None, "TRUNK_WORKDIR@STEP: start --workdir as a cooldown "
                    "branch of that run's checkpoint (optim.schedule=wsd; a rerun resumes it; "
                    "with --fresh, whatever --workdir held is discarded first).")
# planning moved to `python -m jaxformer.plan`: these are refused with its command line
flags.DEFINE_bool("plan_only", False, "Moved: use python -m jaxformer.plan (refused here).")
flags.DEFINE_string("topology", None, "Moved: use python -m jaxformer.plan (refused here).")
flags.DEFINE_integer("slices", None, "Moved: use python -m jaxformer.plan (refused here).")
flags.DEFINE_bool("print_config", False, "Check the config (with its --config.* overrides) and "
                  "print it as the run would save it in config.json, then exit; trains nothing.")
cli.define_compilation_cache_flag()
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  f = flags.FLAGS
  if f.plan_only or f.topology or f.slices is not None:
    raise ValueError(planning_moved(sys.argv[1:], f.topology, f.slices))
  if f.print_config:         # checked as a run checks it first, no --workdir needed
    config_checks.validate(f.config)
    print(f.config.to_json(indent=2))
    return
  tpu_flags.apply()    # the TPU compiler's overlap flags, before JAX initialises a backend
  compilation.enable_cache(f.compilation_cache)
  if f.workdir is None:
    raise ValueError("--workdir is not set; pass --workdir=DIR (the run directory: "
                     "checkpoints, metrics; a rerun resumes)")
  parallel.initialize()      # multi-host (TPU pod, Slurm, JAXFORMER_* env); no-op otherwise
  if f.branch_from:
    trunk, step = workdir_lib.parse_branch(f.branch_from)
    workdir_lib.train_branch(f.config, f.workdir, trunk, step, fresh=f.fresh,
                             data_changed_ok=f.data_changed_ok)
    return
  parallel.process_zero_first(       # before process i > 0 writes its log into it
      lambda: workdir_lib.check_members(f.workdir, fresh=f.fresh) if jax.process_index() == 0
      else None, "checking --workdir")
  console.route_process_output(jax.process_index(), jax.process_count(), f.workdir)
  train(f.config, f.workdir, fresh=f.fresh, data_changed_ok=f.data_changed_ok)


def planning_moved(argv: list[str], topology: str | None, slices: int | None) -> str:
  """The refusal of `--plan_only` / `--topology` / `--slices`: the planner's equivalent
  command line (this one's --config and --config.* flags, its topology)."""
  kept = []
  for i, a in enumerate(argv):
    if a.startswith(("--config=", "--config.")):
      kept.append(a)
    elif a == "--config" and i + 1 < len(argv):          # absl's "--config FILE" spelling
      kept.append(f"--config={argv[i + 1]}")
  where = [f"--topology={topology or '<a TPU topology, e.g. v5e:4x4>'}"]
  if slices is not None and slices != 1:
    where.append(f"--slices={slices}")
  command = shlex.join(["python", "-m", "jaxformer.plan", *kept, *where])
  return (f"planning is `python -m jaxformer.plan`, not a flag of jaxformer.train: run "
          f"`{command}` (add --nearest for the nearest change that fits, --search for the "
          "fastest sharding); on a TPU, training checks that its step fits before it writes "
          "anything")


if __name__ == "__main__":
  cli.run_absl(main)
