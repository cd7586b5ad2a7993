"""python -m jaxformer.export --workdir=DIR --out=HFDIR [--checkpoint=latest|best|STEP]
    [--overwrite]

Writes the run's model and tokenizer as a Hugging Face checkpoint directory that transformers'
`from_pretrained` and `pipeline` load (see `jaxformer.export`)."""

from absl import flags

from jaxformer import cli
from jaxformer.export import export_run

flags.DEFINE_string("workdir", None, "Training run directory.")
flags.DEFINE_string("out", None, "Directory to write the Hugging Face checkpoint into.")
flags.DEFINE_string("checkpoint", "latest", "latest | best (the best eval's params) | a step "
                    "number (a kept checkpoint of that step).")
flags.DEFINE_bool("overwrite", False, "Replace an earlier export (or Hugging Face checkpoint) "
                  "in --out.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  done = export_run(FLAGS.workdir, FLAGS.out, which=FLAGS.checkpoint, overwrite=FLAGS.overwrite)
  tokenizer = (f"with its {done.tokenizer!r} tokenizer" if done.tokenizer else
               "without a tokenizer (the run has none)")
  print(f"exported --workdir={FLAGS.workdir} (--checkpoint={FLAGS.checkpoint}) as "
        f"{done.architecture} {tokenizer} to {done.out}: {', '.join(done.files)}")


if __name__ == "__main__":
  cli.run_absl(main)
