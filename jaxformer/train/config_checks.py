"""Config checks, run before a training writes anything, so a rejected config leaves no trace.

`validate` needs neither data nor compilation (ranges, the task, the model's own fields via
`models.build`); `check_model_matches_data` compares the model with what the pipeline
produces; `check_workdir_config` refuses to resume a workdir holding a different model.
"""

from __future__ import annotations

import json
import math

import jax

from jaxformer import models
from jaxformer.train import profiling, state, tasks


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# (field, check, what it must be); a None value means "not set" and passes where it is optional
RANGES = (
    ("train.steps", lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    ("train.batch_size", lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    ("train.log_every", lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    ("train.eval_every", lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    ("train.checkpoint_every", lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    ("train.seed", _is_int, "an int"),
    ("train.eval_batch_size", lambda v: v is None or _is_int(v) and v >= 1, "an int >= 1"),
    ("train.keep_checkpoints", lambda v: v is None or _is_int(v) and v >= 1, "an int >= 1"),
    ("train.keep_best", lambda v: v is None or _is_int(v) and v >= 0, "an int >= 0 (0: off)"),
    ("train.max_skipped_steps", lambda v: v is None or _is_int(v) and v >= 1, "an int >= 1"),
    ("train.sample_tokens", lambda v: v is None or _is_int(v) and v >= 0, "an int >= 0"),
    ("train.sample_every", lambda v: v is None or _is_int(v) and v >= 0,
     "an int >= 0 (0: only at the end)"),
    ("train.label_smoothing", lambda v: v is None or _is_number(v) and 0 <= v < 1,
     "a number in [0, 1)"),
    ("train.z_loss", lambda v: v is None or _is_number(v) and v >= 0, "a number >= 0"),
    ("optim.lr", lambda v: _is_number(v) and v > 0, "a finite number > 0"),
    ("optim.warmup_steps", lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    ("optim.decay_steps", lambda v: v is None or _is_int(v) and v >= 1, "an int >= 1"),
    ("optim.min_lr_ratio", lambda v: v is None or _is_number(v) and 0 <= v <= 1,
     "a number in [0, 1]"),
    ("optim.weight_decay", lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    ("optim.clip", lambda v: v is None or _is_number(v) and v >= 0, "a number >= 0 (0: off)"),
    ("optim.b1", lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    ("optim.b2", lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    ("optim.eps", lambda v: v is None or _is_number(v) and v > 0, "a number > 0"),
    ("optim.grad_accum", lambda v: v is None or _is_int(v) and v >= 1, "an int >= 1"),
    ("data.seq_len", lambda v: v is None or _is_int(v) and v >= 1, "an int >= 1"),
)


def validate(config):
  """Config checks that need no data and no compilation (the model's own via models.build)."""
  tasks.task_for(config.model)
  for field, ok, want in RANGES:
    section, key = field.split(".")
    value = config[section].get(key) if section in config else None
    if not ok(value):
      raise ValueError(f"{field}={value!r} must be {want}; set --config.{field}=<value>")
  t = config.train
  accum = config.optim.get("grad_accum", 1) or 1
  if t.batch_size % (accum * jax.process_count()):
    raise ValueError(f"train.batch_size={t.batch_size} must be divisible by "
                     f"optim.grad_accum={accum} x {jax.process_count()} processes")
  metric = t.get("best_metric", "eval_loss")
  if metric not in ("eval_loss", "eval_accuracy"):
    raise ValueError(f"train.best_metric={metric!r} must be 'eval_loss' or 'eval_accuracy'")
  profiling.parse_profile_steps(t.get("profile_steps"))
  models.build(config.model)              # every model field is checked here


def check_model_matches_data(config, info: dict):
  """The model must fit what the data pipeline produces (named fields, before compiling)."""
  m = config.model
  if "num_classes" in info and m.get("num_classes") != info["num_classes"]:
    raise ValueError(f"model.num_classes={m.get('num_classes')} but the data "
                     f"({config.data.source!r}) has {info['num_classes']} classes; set "
                     f"--config.model.num_classes={info['num_classes']}")
  # A larger vocabulary is allowed: padding it to a multiple of mesh.model (tensor
  # parallelism) or of 64 (faster matmuls) only adds never-targeted logits.
  if "vocab_size" in info and m.get("vocab_size") is not None and (
      m.vocab_size < info["vocab_size"]):
    raise ValueError(f"model.vocab_size={m.vocab_size} but the data ({config.data.source!r}) "
                     f"has {info['vocab_size']} symbols; set "
                     f"--config.model.vocab_size={info['vocab_size']} (or larger)")
  if "image_shape" in info and m.get("image_size") is not None:
    h, w, c = info["image_shape"]
    if (h, w) != (m.image_size, m.image_size) or c != m.get("channels", c):
      raise ValueError(f"images are {h}x{w}x{c} but model.image_size={m.image_size}, "
                       f"model.channels={m.get('channels')}; set them to {h} and {c}")
  learned = m.get("positions", "learned") == "learned" and m.get("max_len") is not None
  lengths = {"data.seq_len": config.data.get("seq_len"), "source length": info.get("src_len"),
             "target length": info.get("tgt_len")}
  for name, length in lengths.items():
    if learned and length is not None and length > m.max_len:
      raise ValueError(f"{name}={length} exceeds model.max_len={m.max_len} (the learned "
                       "position table); lower the length or raise model.max_len")


# Model fields that change how the model is computed, not its parameters or function: a run
# may resume with them changed (e.g. attention_impl="pallas" on a GPU, "xla" on a laptop).
EXECUTION_FIELDS = ("attention_impl", "attention_block_sizes", "remat_policy", "dtype",
                    "moe_grouped_matmul")


def _with_defaults(model: dict) -> dict:
  """The model section with every config key, so a run saved before a key existed compares
  equal at that key's default (an unknown family is compared as it is)."""
  try:
    return models.with_defaults(model)
  except ValueError:
    return model


def check_workdir_config(config, workdir: str, fresh: bool):
  """Refuse to resume a run whose model differs from the saved one (unless `fresh`)."""
  saved = None if fresh else state.read_config(workdir)
  if saved is None:
    return
  model = _with_defaults(saved.get("model", {}))
  current = _with_defaults(json.loads(config.model.to_json()))
  changed = sorted(k for k in set(model) | set(current)
                   if model.get(k) != current.get(k) and k not in EXECUTION_FIELDS)
  if changed:
    raise ValueError(f"{workdir} holds a run with a different model (fields {changed}); "
                     "use a new --workdir, or --fresh to discard its checkpoints")
