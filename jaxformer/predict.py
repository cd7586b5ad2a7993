"""python -m jaxformer.predict --workdir=DIR [--checkpoint=latest|best|STEP] [--mode=NAME]
    (--input=TEXT | --input_file=PATH | --image=FILE_OR_FOLDER) [--output=PATH] [options]

Predictions of a trained run of any family, by its task (`jaxformer.inference.predict.MODES`):
- decoders: `generate` (default: the text continued, as `python -m jaxformer.sample`) or
  `score` (each line's log-likelihood);
- seq2seq, BART, T5: `decode` (greedy, or beam search with --beam_size);
- BERT, RoBERTa, DeBERTa: `fill_mask` ([MASK], or the task's mask name, in the text);
- ViT: `classify` (an image file or a folder of them; top-k labels);
- captioner: `caption` (greedy or beam) and a PNG of each caption's attention maps in
  --attention_dir.

One JSON record per input on stdout (or --output); `generate` with --input prints the text.
Inputs that do not fit the run (an image to a text model, text to an image model, no mask
token, a missing file, another image size or channel count) are one `error:` line, exit 2,
before anything is compiled. The step whose params are used is printed to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from absl import flags

from jaxformer import cli, compilation, paths

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

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def read_lines(path: str) -> list[str]:
  """The lines of a text file (without their newlines; a last empty line dropped)."""
  found = paths.path(path, "--input_file")
  if not found.is_file():
    raise ValueError(f"--input_file={path!r}: no such file")
  lines = found.read_text().split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  if not lines:
    raise ValueError(f"--input_file={path!r} is empty; give one input per line")
  return lines


def image_files(path: str) -> list[str]:
  """`path` if it is a file, else the image files under the folder `path`, sorted."""
  if os.path.isfile(path):
    return [path]
  if not os.path.isdir(path):
    raise ValueError(f"--image={path!r}: no such file or folder")
  found = sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names
                 if n.lower().endswith(IMAGE_SUFFIXES) and not n.startswith("."))
  if not found:
    raise ValueError(f"--image={path!r} is a folder without {'/'.join(IMAGE_SUFFIXES)} files")
  return found


def read_images(files: Sequence[str]):
  import numpy as np
  from jaxformer.data.images.folders import read_image
  return np.stack([read_image(f) for f in files])


def predict(workdir: str, *, checkpoint: str = "latest", mode: str = "",
            input: str | None = None, input_file: str | None = None,  # noqa: A002
            image: str | None = None, attention_dir: str = ".", **options):
  """(the mode, its records) of `python -m jaxformer.predict` (see the module docstring);
  `options` are `predict.Request`'s fields. Every input mistake raises before the params are
  read."""
  from ml_collections import ConfigDict
  from jaxformer.inference import load_run, predict as lib
  from jaxformer.inference.restore import checkpoint_choice, checkpoint_step
  from jaxformer.state import train_state

  checkpoint_choice(checkpoint)
  if not workdir:
    raise ValueError("--workdir is not set; pass --workdir=DIR, a training run's directory")
  saved = train_state.read_config(workdir)
  if saved is None:
    raise ValueError(f"--workdir={workdir!r} holds no training run (no config.json)")
  config = ConfigDict(saved)
  chosen = lib.mode_for(config, mode)
  given = [name for name, v in (("--input", input), ("--input_file", input_file),
                                ("--image", image)) if v is not None]
  if len(given) != 1:
    raise ValueError(f"give exactly one of --input, --input_file and --image (got "
                     f"{', '.join(given) or 'none'}); this run's mode {chosen.name!r} takes "
                     f"{'an --image' if chosen.takes == lib.IMAGES else '--input or --input_file'}")
  texts = None if input_file is None and input is None else (
      [input] if input is not None else read_lines(input_file))
  files = None if image is None else image_files(image)
  lib.check_inputs(chosen, texts=texts, images=files)
  images = None
  if files is not None:
    images = read_images(files)
    lib.check_images(config, images, files)
  if chosen.check is not None:                 # text checks need the tokenizer only
    from jaxformer.data import tokenizers
    has = paths.path(os.path.join(workdir, tokenizers.TOKENIZER_FILE)).exists()
    chosen.check(config, tokenizers.load_tokenizer(workdir) if has else None, texts)
  step = checkpoint_step(workdir, checkpoint)
  config, params, tokenizer = load_run(workdir, which=checkpoint)
  print(f"predicting with the params of step {step} (--checkpoint={checkpoint}, mode "
        f"{chosen.name})", file=sys.stderr, flush=True)
  request = lib.Request(config, params, tokenizer, texts=texts or (), images=images,
                        names=files or (), attention_dir=attention_dir, **options)
  return chosen, chosen.run(request)


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
