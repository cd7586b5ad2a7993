"""The command line of `python -m jaxformer.serve` (its flags; the work is in
`jaxformer.serve`, importable without defining any flag)."""

from __future__ import annotations

import sys

from absl import flags

from jaxformer import cli, compilation, models
from jaxformer.inference import quantize
from jaxformer.serve import Server, check_run, engine_for, load, warmup_shapes

flags.DEFINE_string("workdir", None, "Training run directory (a decoder LM).")
flags.DEFINE_string("checkpoint", "latest", "latest | best (the params of the best eval) | a "
                    "step number (a kept checkpoint of that step).")
flags.DEFINE_bool("int8", False, "Serve the dense kernels as weight-only int8 "
                  "(per-output-channel scales).")
flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
flags.DEFINE_integer("port", 8000, "Port to listen on (0: any free one, printed).")
flags.DEFINE_integer("max_batch", 16, "Most requests decoded together.")
flags.DEFINE_float("batch_window_ms", 5.0, "How long a batch waits for more requests.")
flags.DEFINE_list("warmup", [], "PROMPT:NEW token counts (e.g. 64:1,32:32) to compile "
                  "before serving, for every batch size up to --max_batch (sampled requests "
                  "without top-k/top-p), so the first requests of those shapes are not slow.")
flags.DEFINE_bool("verbose", False, "Log every HTTP request.")
cli.define_compilation_cache_flag()
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not 0 <= FLAGS.port <= 65535:
    raise ValueError(f"--port={FLAGS.port} must be in [0, 65535]")
  saved = check_run(FLAGS.workdir, FLAGS.checkpoint)  # before restoring or compiling
  warmup = warmup_shapes(FLAGS.warmup, saved["model"].get("max_len"))
  compilation.enable_cache(FLAGS.compilation_cache)
  config, params, tokenizer, step = load(FLAGS.workdir, FLAGS.checkpoint, FLAGS.int8)
  engine = engine_for(config, params, tokenizer, max_batch=FLAGS.max_batch,
                      batch_window_s=FLAGS.batch_window_ms / 1e3)
  if warmup:
    seconds = engine.warm_up(warmup)
    print(f"compiled {len(warmup)} shape(s) x every batch size in {seconds:.1f} s",
          file=sys.stderr, flush=True)
  try:
    server = Server(engine, tokenizer, models.settings_of(config).name or "jaxformer",
                    host=FLAGS.host, port=FLAGS.port, verbose=FLAGS.verbose)
  except OSError as e:
    engine.close()
    raise ValueError(f"--host={FLAGS.host} --port={FLAGS.port}: cannot listen there "
                     f"({e.strerror or e})") from e
  print(f"serving the params of step {step} (--checkpoint={FLAGS.checkpoint}"
        f"{', int8 weights' if FLAGS.int8 else ''}: {quantize.param_bytes(params):,} bytes) "
        f"at http://{server.host}:{server.port}/v1", file=sys.stderr, flush=True)
  server.serve_forever()                # until SIGINT (Ctrl-C) or SIGTERM
  print("stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
  cli.run_absl(main)
