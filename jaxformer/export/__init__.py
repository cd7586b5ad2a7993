"""A training run as a Hugging Face checkpoint that transformers uses as it is.

    python -m jaxformer.export --workdir=DIR --out=HFDIR [--checkpoint=latest|best|STEP]

    from jaxformer.export import export_run
    export_run("runs/shakespeare", "hf/shakespeare")          # -> Exported(...)

writes into HFDIR:
- config.json + model.safetensors (`jaxformer.convert.hf.save`), with the token ids of the
  run's tokenizer (None where its vocabulary has none: a char vocabulary has no bos/eos/pad);
- tokenizer.json + tokenizer_config.json (`jaxformer.convert.hf.tokenizer`) for runs with a
  tokenizer (char, SentencePiece, Hugging Face), encoding as the run did, with the special
  tokens the run's task appended after the vocabulary (MLM's [MASK], NSP's [CLS]/[SEP], BART's
  <mask>/<s>/<pad>, T5's <pad>/</s> and sentinels <extra_id_k>) named;
- generation_config.json for the generative families (decoder, BART, T5): the same token ids,
  and `suppress_tokens` for ids of a padded model vocabulary no token has (jaxformer's
  sampling never emits them either),

so that `AutoTokenizer.from_pretrained(HFDIR)`, `AutoModelForCausalLM.from_pretrained(HFDIR)
.generate(...)` (or AutoModelForMaskedLM, AutoModelForSeq2SeqLM, ...) and
`transformers.pipeline(task, model=HFDIR)` work. Families without a Hugging Face converter
(captioner, seq2seq, rnn_seq2seq) are refused by name. HFDIR must not hold a training run; an
earlier export there is replaced only with overwrite=True (--overwrite), which also removes
its files this export does not write.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from ml_collections import ConfigDict

from jaxformer import models, paths
from jaxformer.convert import hf
from jaxformer.convert.hf import core as hf_core, io as hf_io, tokenizer as hf_tokenizer
from jaxformer.data import tokenizers
from jaxformer.extras import require
from jaxformer.inference import load_run
from jaxformer.inference.restore import checkpoint_choice
from jaxformer.state import train_state

GENERATION_CONFIG = "generation_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"       # not written; an old one is stale
# The files an export writes besides hf.save's config.json and weights.
FILES = hf_tokenizer.FILES + (GENERATION_CONFIG, SPECIAL_TOKENS_MAP)
GENERATIVE = ("lm", "bart_denoising", "span_corruption")
# The names of the special tokens a task appends after the vocabulary (by tokenizer role:
# `tokenizers.TASK_SPECIAL_NAMES`), and the transformers attribute each role is (NSP's bos/eos
# are BERT's [CLS]/[SEP]).
_APPENDED_NAMES = tokenizers.TASK_SPECIAL_NAMES
_ATTRIBUTES = {"bos_id": "bos_token", "eos_id": "eos_token", "pad_id": "pad_token",
               "mask_id": "mask_token"}
_NSP_ATTRIBUTES = dict(_ATTRIBUTES, bos_id="cls_token", eos_id="sep_token")


class Exported(NamedTuple):
  out: str
  architecture: str                    # the Hugging Face class written (config.json)
  files: tuple[str, ...]               # the files written into `out`
  tokenizer: str | None                # the run tokenizer's kind; None: the run has none
  token_ids: dict                      # config.json's token ids (None: no such token)


def exportable_families() -> list[str]:
  return sorted(hf_core.converters())


def data_task(model_config) -> str:
  """The data task a run of `model_config` trained on (which fixes its special tokens):
  the family's task, 'mlm_nsp' for BERT with its next-sentence head, 'mlm' for ELECTRA."""
  task = models.get(model_config.get("family")).task
  if task == "mlm" and model_config.get("nsp"):
    return "mlm_nsp"
  return "mlm" if task == "rtd" else task


def check(workdir: str, out: str, *, which="latest", overwrite: bool = False) -> ConfigDict:
  """Everything export refuses, checked before any params are read: the flags, the run (a
  family with a Hugging Face architecture, settings it can express), the extras, and `out`
  (no training run; an earlier export only with overwrite). Returns the run's config."""
  checkpoint_choice(which)
  if not workdir:
    raise ValueError("--workdir is not set; pass --workdir=DIR, a training run's directory")
  if not out:
    raise ValueError("--out is not set; pass --out=DIR, the directory to write the Hugging "
                     "Face checkpoint into")
  saved = train_state.read_config(workdir)
  if saved is None:
    raise ValueError(f"--workdir={workdir!r} holds no training run (no config.json); pass "
                     "the directory a `python -m jaxformer.train` run wrote")
  config = ConfigDict(saved)
  model = models.settings_of(config)
  family = model.family
  families = exportable_families()
  if family not in families:
    raise ValueError(f"--workdir={workdir!r} holds a model.family={family!r} run, which has no "
                     f"Hugging Face architecture to export to; the families that export: "
                     f"{', '.join(families)}")
  for _, part, _ in parts(model):        # a setting the architecture lacks: refused
    hf_core.architecture(part)
  try:
    hf_io.require_safetensors()
    if paths.path(os.path.join(workdir, tokenizers.TOKENIZER_FILE)).exists():
      require("tokenizers", extra="text", needed_for="exporting the run's tokenizer")
  except ImportError as e:
    raise ValueError(str(e)) from None
  for sub, _, _ in parts(model):
    where = os.path.join(out, sub) if sub else out
    hf_core.check_out_dir(where, overwrite=overwrite, name=f"--out={where}",
                          overwrite_flag="--overwrite", files=FILES)
  return config


def parts(model_config, params=None) -> list[tuple[str, object, object]]:
  """The Hugging Face models a run exports as, [(subdirectory, model config, params)]: the
  model itself in '' , or for an ELECTRA pre-training run (generator and discriminator
  trained together) the discriminator (ElectraForPreTraining) in '' and the generator
  (ElectraForMaskedLM) in 'generator'."""
  cfg = models.with_defaults(model_config)
  if cfg["family"] != "electra" or cfg["role"] != "pretraining":
    return [("", model_config, params)]
  from jaxformer.models import electra
  if params is None:
    return [("", electra.role_config(cfg, "discriminator"), None),
            ("generator", electra.role_config(cfg, "generator"), None)]
  split = electra.split_pretraining(cfg, params)
  return [("", *split["discriminator"]), ("generator", *split["generator"])]


def special_tokens(tokenizer, task: str, data, model_vocab: int
                   ) -> tuple[dict, int, list[str], list[str]]:
  """What the exported tokenizer adds to the run's: ({role: id} of bos/eos/pad/mask, None
  where the run has none; the vocabulary size with the ids the task appends; the names of
  those ids in id order; the names among them that are T5's sentinels). `data`: the run's
  typed data settings (a span-corruption run's give its sentinels; a saved data section is
  read as they were, `strict=False`)."""
  ids = {role: getattr(tokenizer, role) for role in _ATTRIBUTES}
  task_ids, size = tokenizers.special_ids(tokenizer, tokenizers.TASK_SPECIAL_IDS.get(task, ()))
  ids.update(task_ids)
  names = _APPENDED_NAMES.get(task, {})
  appended = [names[role] for role, i in sorted(task_ids.items(), key=lambda kv: kv[1])
              if i >= tokenizer.vocab_size]
  sentinels = []
  if task == "span_corruption":             # sentinel k is the k-th id from the top
    from jaxformer.data import settings as source_settings
    count = source_settings.coerce("span_corruption", data, strict=False).num_sentinels
    sentinels = [f"<extra_id_{count - 1 - k}>" for k in range(count)]
    size += count
  if size > model_vocab:
    raise ValueError(f"the run's tokenizer ({tokenizer.vocab_size} ids, {size} with the "
                     f"special tokens its task appends) does not fit model.vocab_size="
                     f"{model_vocab}: the tokenizer does not belong to this model")
  return ids, size, appended + sentinels, sentinels


def config_token_ids(task: str, ids: dict) -> dict:
  """config.json's token ids for a run of `task` with the special ids `ids` (by role)."""
  if task == "lm":
    return dict(bos_token_id=ids["bos_id"], eos_token_id=ids["eos_id"],
                pad_token_id=ids["pad_id"])
  if task == "bart_denoising":              # the decoder starts from the bos (start) id
    return dict(bos_token_id=ids["bos_id"], eos_token_id=ids["eos_id"],
                pad_token_id=ids["pad_id"], decoder_start_token_id=ids["bos_id"],
                forced_eos_token_id=ids["eos_id"])
  if task == "span_corruption":             # T5: the decoder starts from the pad id
    return dict(eos_token_id=ids["eos_id"], pad_token_id=ids["pad_id"],
                decoder_start_token_id=ids["pad_id"])
  return dict(pad_token_id=ids["pad_id"])


def export_run(workdir: str, out: str, *, which="latest", overwrite: bool = False
               ) -> Exported:
  """Export the run in `workdir` (its `which` checkpoint: 'latest', 'best' or a step) to the
  Hugging Face checkpoint directory `out` (see the module docstring)."""
  config = check(workdir, out, which=which, overwrite=overwrite)
  workdir, out = os.fspath(workdir), os.fspath(out)
  config, params, tokenizer = load_run(workdir, which=which)
  model = models.settings_of(config)
  task = data_task(model)
  from jaxformer import tasks
  data = tasks.saved_run_data(config)
  written = []
  for sub, model_config, model_params in parts(model, params):
    where = os.path.join(out, sub) if sub else out
    files, token_ids = _export_model(model_config, model_params, tokenizer, task, data,
                                     where, overwrite)
    written += [os.path.join(sub, f) for f in files]
    if not sub:
      architecture, ids = hf_core.architecture(model_config), token_ids
  return Exported(out, architecture, tuple(written),
                  None if tokenizer is None else tokenizer.kind, ids)


def _export_model(model_config, params, tokenizer, task: str, data, out: str,
                  overwrite: bool) -> tuple[list[str], dict]:
  """One model (and the run's tokenizer) into `out`: (the files written, the token ids)."""
  m = models.with_defaults(model_config)
  size, token_ids = m.get("vocab_size"), {}
  if tokenizer is not None:
    ids, size, appended, sentinels = special_tokens(tokenizer, task, data,
                                                    m["vocab_size"])
    token_ids = config_token_ids(task, ids)
  hf.save(model_config, params, out, overwrite=overwrite, token_ids=token_ids)
  written = ["config.json", hf_io.SAFE]
  saved = json.loads(paths.path(os.path.join(out, "config.json")).read_text())
  token_ids = {k: saved[k] for k in hf_core.TOKEN_ID_KEYS if k in saved}   # as written
  if tokenizer is not None:
    attributes = _NSP_ATTRIBUTES if task == "mlm_nsp" else _ATTRIBUTES
    special = {attributes[role]: i for role, i in ids.items()}
    special["unk_token"] = hf_tokenizer.unk_id(tokenizer)
    written += hf_tokenizer.save(
        tokenizer, out, special=special, appended=appended, extra_special=sentinels,
        model_max_length=m.get("max_len"),
        pair_template=(ids["bos_id"], ids["eos_id"]) if task == "mlm_nsp" else None)
  if task in GENERATIVE:
    generation = dict(token_ids)
    if size < m["vocab_size"]:              # a padded vocabulary: ids no token has
      generation["suppress_tokens"] = list(range(size, m["vocab_size"]))
    paths.write_text(os.path.join(out, GENERATION_CONFIG), json.dumps(generation, indent=2))
    written.append(GENERATION_CONFIG)
  for name in FILES:                           # an earlier export's files this one replaced
    stale = paths.path(out, "--out") / name
    if name not in written and stale.exists():
      stale.unlink()
  return written, token_ids
