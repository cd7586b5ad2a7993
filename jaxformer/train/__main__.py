"""python -m jaxformer.train --config=configs/<name>.py[:arg] --workdir=DIR [--config.a.b=v]
    [--fresh] [--data_changed_ok] [--branch_from=TRUNK_WORKDIR@STEP]
    [--plan_only [--topology=v5e:4x4 [--slices=N]]]"""

import jax
from absl import flags
from ml_collections import config_flags

from jaxformer import cli, compilation, console, parallel, tpu_flags
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
flags.DEFINE_bool("plan_only", False, "Compile the train step, print its per-chip memory and "
                  "estimated step time, and exit (refused if it does not fit); writes nothing.")
flags.DEFINE_string("topology", None, "With --plan_only: compile for this TPU topology "
                    "(e.g. v5e:4x4) instead of this machine's TPUs.")
flags.DEFINE_integer("slices", 1, "With --topology: the number of slices.")
cli.define_compilation_cache_flag()
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  f = flags.FLAGS
  tpu_flags.apply()    # the TPU compiler's overlap flags, before JAX initialises a backend
  # compile-only TPU executables cannot be cached
  compilation.enable_cache(None if f.plan_only and f.topology else f.compilation_cache)
  if f.plan_only:
    from jaxformer.plan import search
    search.plan_only(f.config, topology=f.topology, slices=f.slices)
    return
  if f.topology:
    raise ValueError(f"--topology={f.topology} is for --plan_only (a run trains on the "
                     "machine's own devices); add --plan_only or drop --topology")
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


if __name__ == "__main__":
  cli.run_absl(main)
