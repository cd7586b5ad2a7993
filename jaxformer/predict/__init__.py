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

import os
import sys
from typing import Sequence

from jaxformer import paths

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
