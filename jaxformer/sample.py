"""python -m jaxformer.sample --workdir=DIR --prompt="ROMEO:" --max_new_tokens=500

Samples text from the latest (or --checkpoint=best, or --checkpoint=STEP) checkpoint of a
training run with the KV cache (`jaxformer.inference`); seeded and reproducible (greedy with
--temperature=0). The step it loaded is printed to stderr.
"""

import sys

from absl import flags

from jaxformer import cli, compilation
from jaxformer.inference import load_run, sample_text
from jaxformer.inference.restore import checkpoint_step

flags.DEFINE_string("workdir", None, "Training run directory.")
flags.DEFINE_string("prompt", "\n", "Text to continue.")
flags.DEFINE_integer("max_new_tokens", 500, "Tokens to generate.")
flags.DEFINE_float("temperature", 0.8, "0 = greedy.")
flags.DEFINE_integer("top_k", None, "Keep the k most likely tokens.")
flags.DEFINE_float("top_p", None, "Nucleus sampling mass.")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_string("checkpoint", "latest", "latest | best (the params of the best eval) | a "
                    "step number (a kept checkpoint of that step).")
cli.define_compilation_cache_flag()
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  compilation.enable_cache(FLAGS.compilation_cache)
  config, params, tokenizer = load_run(FLAGS.workdir, which=FLAGS.checkpoint)
  step = checkpoint_step(FLAGS.workdir, FLAGS.checkpoint)
  print(f"sampling the params of step {step} (--checkpoint={FLAGS.checkpoint})",
        file=sys.stderr, flush=True)
  print(sample_text(config, params, tokenizer, prompt=FLAGS.prompt,
                    max_new_tokens=FLAGS.max_new_tokens, temperature=FLAGS.temperature,
                    top_k=FLAGS.top_k, top_p=FLAGS.top_p, seed=FLAGS.seed))


if __name__ == "__main__":
  cli.run_absl(main)
