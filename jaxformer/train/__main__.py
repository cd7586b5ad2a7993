"""python -m jaxformer.train --config=configs/<name>.py[:arg] --workdir=DIR [--config.a.b=v]"""

import jax
from absl import flags
from ml_collections import config_flags

from jaxformer import cli, compilation, console, parallel
from jaxformer.train.loop import train

config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics); reruns resume.")
flags.DEFINE_bool("fresh", False, "Discard the workdir's checkpoints and metrics first.")
cli.define_compilation_cache_flag()
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  compilation.enable_cache(flags.FLAGS.compilation_cache)
  parallel.initialize()      # multi-host (TPU pod, Slurm, JAXFORMER_* env); no-op otherwise
  console.route_process_output(jax.process_index(), jax.process_count(), flags.FLAGS.workdir)
  train(flags.FLAGS.config, flags.FLAGS.workdir, fresh=flags.FLAGS.fresh)


if __name__ == "__main__":
  cli.run_absl(main)
