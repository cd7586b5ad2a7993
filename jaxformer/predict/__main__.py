"""The command line of `python -m jaxformer.predict` (its flags; the work is
`jaxformer.predict.predict`, importable without defining any flag)."""

from __future__ import annotations

import json

from absl import flags

from jaxformer import cli, compilation, paths
from jaxformer.predict import predict

flags.DEFINE_string("workdir", None, "Training run directory.")
flags.DEFINE_string("checkpoint", "latest", "latest | best (the params of the best eval) | a "
                    "step number (a kept checkpoint of that step).")
flags.DEFINE_string("mode", "", "What to predict (default: the run's task's first mode): "
                    "generate | score (decoders), decode (seq2seq, BART, T5), fill_mask (BERT "
                    "family), classify (ViT), caption (captioner).")
flags.DEFINE_string("input", None, "One text input.")
flags.DEFINE_string("input_file", None, "A text file: one input per line.")
flags.DEFINE_string("image", None, "An image file, or a folder (searched recursively) of "
                    ".png/.jpg/.jpeg files.")
flags.DEFINE_string("output", None, "Write the JSON records here (default: stdout).")
flags.DEFINE_integer("max_new_tokens", 200, "generate: tokens to add.")
flags.DEFINE_float("temperature", 0.8, "generate: 0 = greedy.")
flags.DEFINE_integer("top_k", None, "generate: keep the k most likely tokens; fill_mask, "
                     "classify: how many fills / labels to list (default 5).")
flags.DEFINE_float("top_p", None, "generate: nucleus sampling mass.")
flags.DEFINE_integer("seed", 0, "generate: sampling seed.")
flags.DEFINE_integer("beam_size", 1, "decode, caption: beams (1 = greedy).")
flags.DEFINE_integer("max_len", None, "decode, caption: longest output in tokens (default: "
                     "the run's target length).")
flags.DEFINE_float("length_penalty", 0.0, "decode, caption: GNMT length penalty alpha.")
flags.DEFINE_integer("batch_size", 16, "score: lines per forward pass.")
flags.DEFINE_string("attention_dir", ".", "caption: where <image name>_attention.png goes.")
cli.define_compilation_cache_flag()
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS

def main(argv):
  del argv
  compilation.enable_cache(FLAGS.compilation_cache)
  mode, records = predict(
      FLAGS.workdir, checkpoint=FLAGS.checkpoint, mode=FLAGS.mode, input=FLAGS.input,
      input_file=FLAGS.input_file, image=FLAGS.image, attention_dir=FLAGS.attention_dir,
      max_new_tokens=FLAGS.max_new_tokens, temperature=FLAGS.temperature, top_k=FLAGS.top_k,
      top_p=FLAGS.top_p, seed=FLAGS.seed, beam_size=FLAGS.beam_size, max_len=FLAGS.max_len,
      length_penalty=FLAGS.length_penalty, batch_size=FLAGS.batch_size)
  from jaxformer.inference.predict import GENERATE
  if mode is GENERATE and FLAGS.input is not None:
    text = records[0]["output"]              # one text continued: the text, as `sample`
  else:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).rstrip("\n")
  if FLAGS.output:
    paths.write_text(FLAGS.output, text + "\n")
  else:
    print(text)


if __name__ == "__main__":
  cli.run_absl(main)
