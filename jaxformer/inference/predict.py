"""Predictions of a trained run, for every task: one table (`MODES`) from the run's task to
what `python -m jaxformer.predict` does with it.

    from jaxformer.inference import load_run, predict
    config, params, tokenizer = load_run(workdir)
    mode = predict.mode_for(config)                  # the task's default; or by name
    records = mode.run(predict.Request(config, params, tokenizer, texts=["To be"]))

| task (family)                          | modes (default first) | input  |
|----------------------------------------|-----------------------|--------|
| lm (decoder; SFT/DPO runs too)         | generate, score       | text   |
| seq2seq, bart_denoising, span_corruption | decode (greedy/beam) | text   |
| mlm (bert, roberta, deberta)           | fill_mask             | text   |
| classification (vit)                   | classify              | images |
| captioning (captioner)                 | caption (+ attention) | images |

Each mode returns one JSON-able record per input. Inputs are checked before anything is
compiled: a mode that takes text refuses images and the other way round, a fill-mask text
needs a mask symbol, an image must have the model's size and channel count, a text must fit
the model's position table. Special tokens a task appended after the tokenizer's vocabulary
are written in text by the names `jaxformer.export` gives them (`[MASK]`, BART's `<mask>`,
T5's `<extra_id_k>`, ...; `tokenizers.TASK_SPECIAL_NAMES`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import models, run_settings
from jaxformer.data import settings as source_settings, tokenizers
from jaxformer.inference import beam, captions
from jaxformer.inference.text import sample_text

TEXT, IMAGES = "text", "images"
DEFAULT_TOP_K = 5


@dataclasses.dataclass
class Request:
  """What one prediction call has: the run, its inputs (texts or images) and the options of
  every mode (each mode reads its own)."""
  config: Any
  params: Any
  tokenizer: Any
  texts: Sequence[str] = ()
  images: Any = None                     # uint8 [N, H, W, C]
  names: Sequence[str] = ()              # one per image: its file
  max_new_tokens: int = 200              # generate
  temperature: float = 0.8
  top_k: int | None = None               # generate: the sampling filter; else: k listed
  top_p: float | None = None
  seed: int = 0
  beam_size: int = 1                     # decode, caption
  max_len: int | None = None
  length_penalty: float = 0.0
  batch_size: int = 16                   # score
  attention_dir: str | None = None       # caption: <image name>_attention.png written here


@dataclasses.dataclass(frozen=True)
class Mode:
  name: str
  takes: str                             # TEXT or IMAGES
  what: str                              # one line: what it gives
  run: Callable[[Request], list[dict]]
  check: Callable[[Any, Any, Sequence[str]], None] | None = None   # texts, before compiling


def _task(config) -> str:
  return models.get(models.settings_of(config).family).task


def _data_task(config) -> str:
  """The task whose special tokens the run's data used (BERT with NSP: 'mlm_nsp')."""
  task = _task(config)
  return "mlm_nsp" if task == "mlm" and models.settings_of(config).get("nsp") else task


def mode_for(config, name: str | None = None) -> Mode:
  """The run's mode `name` (None or '': its task's default); a ValueError naming the modes
  the run has otherwise."""
  task = _task(config)
  family = models.settings_of(config).family
  if task not in MODES:
    known = ", ".join(f"{t} ({', '.join(m.name for m in ms)})" for t, ms in MODES.items())
    raise ValueError(f"this run is a model.family={family!r} model (task {task!r}), which "
                     f"predict has no mode for; the tasks it predicts: {known}")
  modes = MODES[task]
  if not name:
    return modes[0]
  for mode in modes:
    if mode.name == name:
      return mode
  raise ValueError(f"--mode={name!r} is not a mode of this model.family={family!r} run (task "
                   f"{task!r}); its modes: {', '.join(m.name for m in modes)}")


def check_inputs(mode: Mode, *, texts=None, images=None):
  """The inputs' kind against the mode's: text to an image model or images to a text model
  is a one-line error."""
  if mode.takes == TEXT and images is not None:
    raise ValueError(f"--image: this run's mode {mode.name!r} takes text, not images; pass "
                     "--input=TEXT or --input_file=PATH (one input per line)")
  if mode.takes == IMAGES and texts is not None:
    raise ValueError(f"--input/--input_file: this run's mode {mode.name!r} takes images, not "
                     "text; pass --image=PATH (an image file or a folder of them)")


# --- text: special symbols ------------------------------------------------------------------


def special_symbols(config, tokenizer) -> dict[str, int]:
  """{name: id} of the special tokens a text may name for this run: those its task appended
  after the tokenizer's vocabulary (`tokenizers.TASK_SPECIAL_NAMES`; T5's sentinels
  `<extra_id_k>`), with `[MASK]` always naming a masked-LM run's mask id."""
  task = _data_task(config)
  ids, size = tokenizers.special_ids(tokenizer, tokenizers.TASK_SPECIAL_IDS.get(task, ()))
  names = tokenizers.TASK_SPECIAL_NAMES.get(task, {})
  out = {names[role]: i for role, i in ids.items() if role in names}
  if "mask_id" in ids:
    out["[MASK]"] = ids["mask_id"]
  if task == "span_corruption":
    from jaxformer.data import span_corruption
    count = span_corruption.options(config.data)[2]
    out.update({f"<extra_id_{k}>": size + count - 1 - k for k in range(count)})
  return out


def encode_text(text: str, tokenizer, symbols: dict[str, int]) -> list[int]:
  """`text` as ids, the names in `symbols` as their special ids, the rest by the tokenizer."""
  if not symbols:
    return tokenizer.encode(text).tolist()
  pattern = "(" + "|".join(re.escape(n) for n in sorted(symbols, key=len, reverse=True)) + ")"
  out = []
  for i, piece in enumerate(re.split(pattern, text)):
    if i % 2:
      out.append(symbols[piece])
    elif piece:
      out.extend(tokenizer.encode(piece).tolist())
  return out


def decode_ids(ids, tokenizer, symbols: dict[str, int]) -> str:
  """ids as text: runs of the tokenizer's ids decoded, special ids by their names."""
  names = {i: n for n, i in sorted(symbols.items(), key=lambda kv: kv[0] == "[MASK]")}
  out, run = [], []
  for i in map(int, ids):
    if i < tokenizer.vocab_size and i not in names:
      run.append(i)
      continue
    if run:
      out.append(tokenizer.decode(run))
      run = []
    out.append(names.get(i, f"<id_{i}>"))
  if run:
    out.append(tokenizer.decode(run))
  return "".join(out)


def _need_tokenizer(tokenizer):
  if tokenizer is None:
    raise ValueError("this run has no tokenizer (tokenizer.json is missing from its workdir); "
                     "rerun train on the workdir with the same data.source and data.tokenizer "
                     "to write it again")


def _bucket(n: int, cap: int | None) -> int:
  """A padded length >= n from few shapes (powers of two from 16), at most `cap`."""
  length = max(16, 1 << max(0, math.ceil(math.log2(max(n, 1)))))
  return length if cap is None else min(length, cap)


@functools.lru_cache(maxsize=32)
def _module(key: str):
  return models.build(json.loads(key))


def _key(model_config) -> str:
  cfg = models.with_defaults(model_config)
  return json.dumps(cfg, sort_keys=True)


# --- decoders: generate, score ----------------------------------------------------------------


def _generate(r: Request) -> list[dict]:
  return [{"input": t, "output": sample_text(
      r.config, r.params, r.tokenizer, prompt=t, max_new_tokens=r.max_new_tokens,
      temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, seed=r.seed)} for t in r.texts]


def _score_context(tokenizer) -> list[int]:
  """What each scored line is conditioned on: the tokenizer's EOS, where it has one (packed
  documents follow an EOS in training), so every token of the line is scored; else nothing,
  and the line's first token is context only."""
  return [] if tokenizer.eos_id is None else [int(tokenizer.eos_id)]


def _limit(config) -> int | None:
  m = models.settings_of(config)
  return m["max_len"] if m.get("positions", "learned") == "learned" else None


def _check_score(config, tokenizer, texts):
  _need_tokenizer(tokenizer)
  limit, context = _limit(config), _score_context(tokenizer)
  for i, text in enumerate(texts):
    n = len(context) + len(tokenizer.encode(text))
    if limit is not None and n > limit:
      raise ValueError(f"input line {i + 1} is {n} tokens, more than the model's learned "
                       f"positions (model.max_len={limit}); split the line")


def _check_generate(config, tokenizer, texts):
  _need_tokenizer(tokenizer)
  if any(not t for t in texts):
    raise ValueError("an input to continue is empty; give a non-empty --input (or remove the "
                     "empty lines of --input_file)")


def score_texts(config, params, tokenizer, texts: Sequence[str], *, batch_size: int = 16
                ) -> list[dict]:
  """Per text: {"input", "tokens" (the text's), "scored" (tokens whose log-probability is
  counted), "log_likelihood" (natural log, summed), "nll_per_token"}. Conditioned on the
  tokenizer's EOS where it has one (`_score_context`); ids past the tokenizer's vocabulary (a
  padded model vocabulary) get no probability, as in sampling."""
  _check_score(config, tokenizer, texts)
  m = models.settings_of(config)
  context = _score_context(tokenizer)
  rows = [context + tokenizer.encode(t).tolist() for t in texts]
  limit = min(tokenizer.vocab_size, m["vocab_size"])
  fn = _score_fn(_key(models.settings_of(config)), limit)
  out = []
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    length = _bucket(max(len(r) for r in chunk), _limit(config))
    tokens = np.zeros((batch_size, length), np.int32)
    mask = np.zeros((batch_size, length), np.float32)
    for b, r in enumerate(chunk):
      tokens[b, :len(r)] = r
      mask[b, 1:len(r)] = 1.0                # position t predicted from tokens[:t]
    logp = np.asarray(fn(params, jnp.asarray(tokens)))          # [B, L]: log p(tokens[t])
    for b, (text, r) in enumerate(zip(texts[start:start + batch_size], chunk)):
      total = float(np.sum(logp[b] * mask[b], dtype=np.float64))
      scored = max(len(r) - 1, 0)
      out.append({"input": text, "tokens": len(r) - len(context), "scored": scored,
                  "log_likelihood": total,
                  "nll_per_token": -total / scored if scored else None})
  return out


@functools.lru_cache(maxsize=32)
def _score_fn(key: str, vocab_limit: int):
  module = _module(key)

  @jax.jit
  def run(params, tokens):
    logits = module.apply({"params": params}, tokens).astype(jnp.float32)
    logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits, -jnp.inf)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.concatenate([jnp.zeros_like(picked[:, :1]), picked], axis=1)
  return run


def _score(r: Request) -> list[dict]:
  return score_texts(r.config, r.params, r.tokenizer, r.texts, batch_size=r.batch_size)


# --- sequence to sequence: decode ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Seq2SeqSpec:
  """How a seq2seq run's source is written and its decoder starts and stops."""
  start: int                 # the decoder's first input
  eos: int                   # generation stops after it (-1: the task has none: BART)
  pad: int
  banned: tuple[int, ...]    # ids never generated
  src_len: int | None        # the source is padded to this (synthetic: the trained length)
  max_src: int | None        # longest source
  max_len: int               # default decoded length
  symbols: dict              # special names (text runs)


def seq2seq_spec(config, tokenizer) -> Seq2SeqSpec:
  """The decoding conventions of the run's data task (see `data/synthetic.py`,
  `data/denoising.py`, `data/span_corruption.py`)."""
  task, m = _task(config), models.settings_of(config)
  position_limit = m.get("max_len") if m["family"] in ("bart", "seq2seq") else None
  if task == "seq2seq":
    from jaxformer.data import synthetic
    generator = synthetic.task_generator(config.data)
    return Seq2SeqSpec(synthetic.BOS, synthetic.EOS, synthetic.PAD,
                       (synthetic.PAD, synthetic.BOS), generator.src_len, generator.src_len,
                       generator.tgt_len, {})
  _need_tokenizer(tokenizer)
  seq_len = run_settings.parse(config).data.seq_len
  ids, size = tokenizers.special_ids(tokenizer, tokenizers.TASK_SPECIAL_IDS[task])
  symbols = special_symbols(config, tokenizer)
  padded = tuple(range(max(symbols.values(), default=size - 1) + 1, m["vocab_size"]))
  if task == "bart_denoising":
    return Seq2SeqSpec(ids["bos_id"], -1, ids["pad_id"],
                       (ids["pad_id"], ids["bos_id"], ids["mask_id"]) + padded, None,
                       position_limit, min(seq_len or position_limit, position_limit), symbols)
  from jaxformer.data import span_corruption
  density, mean, _ = span_corruption.options(config.data)
  tgt_len = span_corruption.lengths(seq_len, density, mean)[1] if seq_len else 32
  return Seq2SeqSpec(ids["pad_id"], ids["eos_id"], ids["pad_id"], (ids["pad_id"],) + padded,
                     None, position_limit, tgt_len, symbols)


def _source_ids(text: str, config, tokenizer, spec: Seq2SeqSpec) -> list[int]:
  if tokenizer is None:                  # synthetic: the ids themselves
    vocab = models.settings_of(config)["vocab_size"]
    try:
      ids = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
      raise ValueError(f"input {text!r}: this synthetic-task run reads token ids separated by "
                       "spaces (symbols are ids 3 .. vocab_size - 1)") from None
    if not ids or any(not 3 <= i < vocab for i in ids):
      raise ValueError(f"input {text!r}: give symbol ids in [3, {vocab}) separated by spaces "
                       "(0, 1, 2 are PAD, BOS, EOS)")
    return ids
  ids = encode_text(text, tokenizer, spec.symbols)
  return ids + ([spec.eos] if spec.eos >= 0 else [])      # T5's source ends with EOS


def _check_decode(config, tokenizer, texts):
  spec = seq2seq_spec(config, tokenizer)
  for i, text in enumerate(texts):
    n = len(_source_ids(text, config, tokenizer, spec))
    if spec.max_src is not None and n > spec.max_src:
      raise ValueError(f"input {i + 1} is {n} source tokens, more than this run takes "
                       f"({spec.max_src}); shorten it")


def decode_texts(config, params, tokenizer, texts: Sequence[str], *, beam_size: int = 1,
                 max_len: int | None = None, length_penalty: float = 0.0) -> list[dict]:
  """Per text: {"input", "output" (text, or ids for a synthetic-task run), "tokens" (the
  generated ids, up to and including EOS), "score" (the best beam's log-prob sum, GNMT
  length-penalised when length_penalty > 0)}: `beam.beam_search` (beam_size=1: greedy) over
  the decoder re-run on the padded prefix at each step, the source encoded once."""
  _check_decode(config, tokenizer, texts)
  spec = seq2seq_spec(config, tokenizer)
  max_len = spec.max_len if max_len is None else max_len
  if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
    raise ValueError(f"--max_len={max_len!r} must be an int >= 1")
  rows = [_source_ids(t, config, tokenizer, spec) for t in texts]
  length = spec.src_len or _bucket(max(len(r) for r in rows), spec.max_src)
  src = np.full((len(rows), length), spec.pad, np.int32)
  for b, r in enumerate(rows):
    src[b, :len(r)] = r
  src_mask = np.arange(length)[None] < np.array([len(r) for r in rows])[:, None]
  fn = _decode_fn(_key(models.settings_of(config)), beam_size, max_len, float(length_penalty),
                  spec.start, spec.eos, spec.pad, spec.banned)
  tokens, scores = (np.asarray(x) for x in fn(params, jnp.asarray(src), jnp.asarray(src_mask)))
  out = []
  for text, ids, score in zip(texts, tokens, scores):
    ids = ids.tolist()
    ids = ids[:ids.index(spec.eos) + 1] if spec.eos in ids else ids
    body = [i for i in ids if i != spec.eos]
    output = (" ".join(map(str, body)) if tokenizer is None
              else decode_ids(body, tokenizer, spec.symbols))
    out.append({"input": text, "output": output, "tokens": ids, "score": float(score)})
  return out


@functools.lru_cache(maxsize=32)
def _decode_fn(key: str, beam_size: int, max_len: int, length_penalty: float, start: int,
               eos: int, pad: int, banned: tuple):
  module = _module(key)
  split = hasattr(module, "encode") and hasattr(module, "decode")

  @jax.jit
  def run(params, src, src_mask):
    variables = {"params": params}
    src = jnp.repeat(src, beam_size, axis=0)                   # row b * K + k
    src_mask = jnp.repeat(src_mask, beam_size, axis=0)
    memory = (module.apply(variables, src, src_mask=src_mask, method=type(module).encode)
              if split else None)

    def log_prob_fn(tokens, t):
      if split:
        logits = module.apply(variables, memory, tokens, src_mask=src_mask,
                              method=type(module).decode)
      else:
        logits = module.apply(variables, src, tokens, src_mask=src_mask)
      logp = jax.nn.log_softmax(
          jax.lax.dynamic_index_in_dim(logits, t - 1, 1, False).astype(jnp.float32), -1)
      return logp.at[:, jnp.array(banned, jnp.int32)].set(-jnp.inf) if banned else logp

    tokens, scores = beam.beam_search(log_prob_fn, src.shape[0] // beam_size,
                                      beam_size=beam_size, max_len=max_len, bos_id=start,
                                      eos_id=eos, pad_id=pad, length_penalty=length_penalty)
    return tokens[:, 0], scores[:, 0]
  return run


def _decode(r: Request) -> list[dict]:
  return decode_texts(r.config, r.params, r.tokenizer, r.texts, beam_size=r.beam_size,
                      max_len=r.max_len, length_penalty=r.length_penalty)


# --- masked LMs: fill_mask ---------------------------------------------------------------------


def _mlm_layout(config, tokenizer, text: str) -> tuple[list[int], int]:
  """(the model input of `text`: [CLS] text [SEP] for a BERT with next-sentence prediction,
  as it trained; the mask id)."""
  symbols = special_symbols(config, tokenizer)
  ids = encode_text(text, tokenizer, symbols)
  if _data_task(config) == "mlm_nsp":
    ids = [symbols["[CLS]"]] + ids + [symbols["[SEP]"]]
  return ids, symbols["[MASK]"]


def _check_fill_mask(config, tokenizer, texts):
  _need_tokenizer(tokenizer)
  m = models.settings_of(config)
  limit = m["max_len"] - (m["pad_id"] + 1 if m.get("pad_id") is not None else 0)
  for i, text in enumerate(texts):
    ids, mask_id = _mlm_layout(config, tokenizer, text)
    if mask_id not in ids:
      names = sorted(n for n, v in special_symbols(config, tokenizer).items() if v == mask_id)
      raise ValueError(f"input {i + 1} ({text[:40]!r}) has no mask token; write "
                       f"{' or '.join(names)} where a token is to be filled")
    if len(ids) > limit:
      raise ValueError(f"input {i + 1} is {len(ids)} tokens, more than the model's "
                       f"positions allow ({limit}); shorten it")


def fill_masks(config, params, tokenizer, texts: Sequence[str], *, top_k: int = DEFAULT_TOP_K
               ) -> list[dict]:
  """Per text: {"input", "masks": [{"position" (token index in the model input), "fills":
  [{"token" (text), "id", "probability"}] (top_k, most likely first)}], "filled" (the text
  with every mask replaced by its most likely fill)}. Probabilities are the softmax of the
  model's MLM logits over the tokenizer's own ids (special ids get none)."""
  _check_fill_mask(config, tokenizer, texts)
  layouts = [_mlm_layout(config, tokenizer, t) for t in texts]
  mask_id = layouts[0][1]
  m = models.settings_of(config)
  pad = m.get("pad_id") if m.get("pad_id") is not None else 0
  length = _bucket(max(len(ids) for ids, _ in layouts), None)
  length = min(length, m["max_len"] - (m["pad_id"] + 1 if m.get("pad_id") is not None else 0))
  tokens = np.full((len(texts), length), pad, np.int32)
  attention = np.zeros((len(texts), length), np.int32)
  for b, (ids, _) in enumerate(layouts):
    tokens[b, :len(ids)], attention[b, :len(ids)] = ids, 1
  probs = np.asarray(_mlm_fn(_key(models.settings_of(config)), tokenizer.vocab_size)(
      params, jnp.asarray(tokens), jnp.asarray(attention)))
  out = []
  symbols = special_symbols(config, tokenizer)
  for b, (text, (ids, _)) in enumerate(zip(texts, layouts)):
    masks, filled = [], list(ids)
    for pos in [i for i, t in enumerate(ids) if t == mask_id]:
      order = np.argsort(-probs[b, pos], kind="stable")[:top_k]
      masks.append({"position": pos, "fills": [
          {"token": tokenizer.decode([int(i)]), "id": int(i),
           "probability": float(probs[b, pos, i])} for i in order]})
      filled[pos] = int(order[0])
    body = filled[1:-1] if _data_task(config) == "mlm_nsp" else filled
    out.append({"input": text, "masks": masks,
                "filled": decode_ids(body, tokenizer, symbols)})
  return out


@functools.lru_cache(maxsize=32)
def _mlm_fn(key: str, vocab_limit: int):
  module = _module(key)

  @jax.jit
  def run(params, tokens, attention_mask):
    logits = module.apply({"params": params}, tokens, attention_mask=attention_mask)
    logits = logits["mlm"] if isinstance(logits, dict) else logits
    logits = logits.astype(jnp.float32)
    logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)
  return run


def _fill_mask(r: Request) -> list[dict]:
  return fill_masks(r.config, r.params, r.tokenizer, r.texts, top_k=r.top_k or DEFAULT_TOP_K)


# --- images: classify, caption --------------------------------------------------------------


def image_shape(config) -> tuple[int, int]:
  """(side, channels) of the images the run's model takes."""
  m = models.settings_of(config)
  return m["image_size"], m.get("channels", 3)


def check_images(config, images: np.ndarray, names: Sequence[str]):
  """Every image [H, W, C] has the model's size and channel count (training refuses other
  sizes too: nothing is resized)."""
  size, channels = image_shape(config)
  for image, name in zip(images, names):
    if image.shape != (size, size, channels):
      h, w, c = image.shape
      kind = {1: "grayscale", 3: "RGB"}.get(channels, f"{channels}-channel")
      raise ValueError(f"{name}: image is {h}x{w} with {c} channel{'s' * (c != 1)} but this "
                       f"run's model takes {size}x{size} {kind} images ({channels} "
                       f"channel{'s' * (channels != 1)}); convert it to that size and mode")


def class_names(config) -> list[str] | None:
  """The label names of a classification run, where its data source knows them: the class
  folders of 'images:<root>' (sorted, as the source numbers them), the digits of 'digits'
  and 'mnist:<dir>'; None otherwise (labels are then their numbers)."""
  source = run_settings.parse(config).data.source
  kind, _, arg = source.partition(":")
  if source == "digits" or kind == "mnist":
    return [str(d) for d in range(10)]
  if kind == "images" and arg:
    split = os.path.join(os.path.expanduser(arg),
                         source_settings.parse("images", config, strict=False).train_split)
    if os.path.isdir(split):
      return sorted(d for d in os.listdir(split) if os.path.isdir(os.path.join(split, d)))
  return None


def standardisation(config) -> tuple[np.ndarray, np.ndarray]:
  """(mean [C], std [C]) the run's training standardised images with: its data source's
  train-split statistics, read as the training pipeline reads them (the prepared cache;
  a first use prepares it)."""
  from jaxformer.data.images.pipeline import open_source
  data = source_settings.parse("images", config, strict=False)
  source = open_source(data, data_dir=data.data_dir)
  split = data.train_split
  source.check_split(split, "data.train_split")
  return source.stats(split)


def classify_images(config, params, images: np.ndarray, *, top_k: int = DEFAULT_TOP_K,
                    names: Sequence[str] | None = None, stats=None) -> list[dict]:
  """Per image (uint8 [N, H, W, C]): {"image", "top": [{"label", "class", "probability"}]
  (top_k, most likely first)}. Images are standardised as the training pipeline does,
  ((x / 255 - mean) / std with the train split's statistics; `stats` = (mean, std) skips
  reading them)."""
  names = list(names) if names is not None else [str(i) for i in range(len(images))]
  check_images(config, images, names)
  mean, std = standardisation(config) if stats is None else stats
  x = ((np.asarray(images, np.float32) / 255.0 - mean) / std).astype(np.float32)
  probs = np.asarray(_classify_fn(_key(models.settings_of(config)))(params, jnp.asarray(x)))
  labels = class_names(config)
  out = []
  for name, p in zip(names, probs):
    order = np.argsort(-p, kind="stable")[:top_k]
    out.append({"image": name, "top": [
        {"label": labels[i] if labels and i < len(labels) else str(int(i)), "class": int(i),
         "probability": float(p[i])} for i in order]})
  return out


@functools.lru_cache(maxsize=32)
def _classify_fn(key: str):
  module = _module(key)
  return jax.jit(lambda params, x: jax.nn.softmax(
      module.apply({"params": params}, x).astype(jnp.float32), axis=-1))


def _classify(r: Request) -> list[dict]:
  return classify_images(r.config, r.params, r.images, top_k=r.top_k or DEFAULT_TOP_K,
                         names=r.names)


def caption_image_files(config, params, images: np.ndarray, *, beam_size: int = 1,
                        max_len: int | None = None, length_penalty: float = 0.0,
                        names: Sequence[str] | None = None) -> tuple[list[dict], np.ndarray]:
  """(per image (uint8 [N, H, W, C], scaled to [0, 1] as the composites trained are):
  {"image", "caption", "tokens", "score"}; the attention maps [N, T, rows, cols] of the
  captions, `captions.attention_maps`)."""
  from jaxformer.data.images import captions as caption_data
  names = list(names) if names is not None else [str(i) for i in range(len(images))]
  check_images(config, images, names)
  x = np.asarray(images, np.float32) / 255.0
  model = models.settings_of(config)
  tokens, scores = captions.caption_images(model, params, x, beam_size=beam_size,
                                           max_len=max_len, length_penalty=length_penalty)
  tokens = np.asarray(tokens)
  maps = np.asarray(captions.attention_maps(model, params, x, tokens))
  out = [{"image": name, "caption": " ".join(caption_data.decode(t)),
          "tokens": [int(i) for i in t if i != caption_data.PAD], "score": float(s)}
         for name, t, s in zip(names, tokens, np.asarray(scores))]
  return out, maps


def _caption(r: Request) -> list[dict]:
  records, maps = caption_image_files(r.config, r.params, r.images, beam_size=r.beam_size,
                                      max_len=r.max_len, length_penalty=r.length_penalty,
                                      names=r.names)
  if r.attention_dir is not None:
    write_attention_maps(records, r.images, maps, r.attention_dir)
  return records


def write_attention_maps(records: list[dict], images: np.ndarray, maps: np.ndarray,
                         directory: str) -> None:
  """Each caption's attention maps (`captions.draw_attention`) as <image name>_attention.png
  in `directory`; each record gets its path as "attention_png"."""
  from jaxformer import paths
  from jaxformer.data.images import captions as caption_data
  if not paths.is_remote(directory):
    os.makedirs(os.path.expanduser(directory), exist_ok=True)
  for record, image, amap in zip(records, images, maps):
    stem = os.path.splitext(os.path.basename(record["image"]))[0]
    out = os.path.join(directory, f"{stem}_attention.png")
    captions.draw_attention(np.asarray(image, np.float32)[None] / 255.0,
                            [caption_data.decode(record["tokens"])], amap[None], out,
                            title=record["caption"])
    record["attention_png"] = out


# --- the table --------------------------------------------------------------------------------

GENERATE = Mode("generate", TEXT, "the text continued (sampled, or greedy with "
                "--temperature=0; KV cache)", _generate, _check_generate)
SCORE = Mode("score", TEXT, "each line's log-likelihood and token counts", _score, _check_score)
DECODE = Mode("decode", TEXT, "the decoded output (greedy, or beam search with --beam_size)",
              _decode, _check_decode)
FILL_MASK = Mode("fill_mask", TEXT, "the top-k fills of each mask token", _fill_mask,
                 _check_fill_mask)
CLASSIFY = Mode("classify", IMAGES, "the top-k labels with their probabilities", _classify)
CAPTION = Mode("caption", IMAGES, "a caption (greedy or beam) and a PNG of its attention maps",
               _caption)

# The run's task (its model family's registry entry: `models.get(family).task`) -> its modes,
# the default first. A task without a row (ELECTRA's replaced-token detection) is refused by
# name; adding a row is all a new task needs when an existing mode fits it.
MODES: dict[str, tuple[Mode, ...]] = {
    "lm": (GENERATE, SCORE),
    "seq2seq": (DECODE,),
    "bart_denoising": (DECODE,),
    "span_corruption": (DECODE,),
    "mlm": (FILL_MASK,),
    "classification": (CLASSIFY,),
    "captioning": (CAPTION,),
}


__all__ = ["MODES", "Mode", "Request", "mode_for", "check_inputs", "score_texts",
           "decode_texts", "fill_masks", "classify_images", "caption_image_files",
           "special_symbols", "encode_text", "decode_ids", "class_names", "standardisation",
           "check_images", "seq2seq_spec"]
