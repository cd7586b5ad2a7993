"""Shared section builders for the configs in this directory (big_vision style).

Every training config has the top-level sections `model`, `data`, `train`, `optim`, `mesh`
(see /work/shared/DESIGN.md) and, for published models, `reference` (numbers quoted from the
paper or the reference implementation: parameter counts, batch sizes, learning rates).

`model(family, name, **fields)` fills in *every* config key of the family
(`models.config_fields`: the module's own fields and the shared block settings) from its
defaults (so any key can be overridden on the command line: `config_flags` only overrides
keys that exist in the locked config). Optional fields whose default is None become typed
`placeholder`s, so `--config.model.window=4096` parses as an int.

Configs are loaded by path (`--config=configs/gpt2.py:small`) or imported as modules
(`from configs import gpt2`); `configs.get_config("gpt2", "small")` does the latter.
The `data.source` / `data.tokenizer` names are the ones the data module will resolve
(tiny Shakespeare char-level for the tiny LMs, so everything runs offline on a laptop).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
from ml_collections import config_dict

from jaxformer import models

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "tuple": tuple}


def _placeholder_type(annotation: Any):
  """'int | None' -> int, 'tuple[int, int] | None' -> tuple (annotations are strings under
  `from __future__ import annotations`)."""
  if isinstance(annotation, str):
    parts = [p.strip() for p in annotation.split("|") if p.strip() != "None"]
    return _TYPES.get(parts[0].split("[")[0]) if len(parts) == 1 else None
  return annotation if annotation in _TYPES.values() else None


def _default(field: models.ConfigField):
  if field.default is dataclasses.MISSING:
    return None
  value = field.default
  if value is jnp.float32 or value is jnp.bfloat16 or value is jnp.float16:
    return jnp.dtype(value).name
  return value


def model(family: str, name: str, **fields) -> config_dict.ConfigDict:
  """`model` section: family, name, then all fields of the family's module (given or default).

  A field given as None (or defaulting to None) is stored as a typed placeholder.
  """
  models.build(dict(fields, family=family))     # unknown, missing or invalid fields fail here
  known = models.config_fields(family)
  cfg = config_dict.ConfigDict()
  cfg.family = family
  cfg.name = name
  for key, field in known.items():
    value = fields[key] if key in fields else _default(field)
    if value is None:
      kind = _placeholder_type(field.type)
      value = config_dict.placeholder(kind) if kind is not None else None
    cfg[key] = value
  return cfg


def _with_placeholders(fields: dict, typed: dict) -> config_dict.ConfigDict:
  """ConfigDict of `fields`; optional fields left None become typed placeholders so they can
  still be set from the command line (`--config.data.data_dir=/x`)."""
  cfg = config_dict.ConfigDict(fields)
  for key, kind in typed.items():
    if cfg.get(key) is None:
      cfg[key] = config_dict.placeholder(kind)
  return cfg


def data(source: str, tokenizer: str | None, seq_len: int | None, **extra
         ) -> config_dict.ConfigDict:
  """`data` section: where examples come from (see jaxformer.data.pipeline), how they are
  tokenized, sequence length; `data_dir` (prepared-data cache; default under ~/.cache) and
  `eval_batches` (text: eval windows; None = whole split) are optional."""
  return _with_placeholders(dict(dict(data_dir=None, eval_batches=None), source=source,
                                 tokenizer=tokenizer, seq_len=seq_len, **extra),
                            {"data_dir": str, "eval_batches": int, "tokenizer": str,
                             "seq_len": int})


def train(steps: int, batch_size: int, *, seed: int = 0, eval_every: int = 500,
          log_every: int = 50, checkpoint_every: int = 1000, **extra
          ) -> config_dict.ConfigDict:
  """`train` section: batch_size counts sequences (or images) per optimizer step. The loop's
  optional settings all have a default here so any can be set on the command line."""
  fields = dict(
      steps=steps, batch_size=batch_size, seed=seed, eval_every=eval_every,
      log_every=log_every, checkpoint_every=checkpoint_every,
      eval_batch_size=None,         # None: batch_size
      keep_checkpoints=3,           # last N Orbax checkpoints
      keep_best=1,                  # params of the N best evals (0: off)
      best_metric="eval_loss",      # or "eval_accuracy"
      label_smoothing=0.0, z_loss=0.0,
      max_skipped_steps=5,          # non-finite steps in a row before stopping
      profile_steps="",             # e.g. "10-12": jax.profiler trace into <workdir>/profile
      attention_maps=True,          # heatmaps + entropy of a fixed eval example at each eval
      sample_tokens=0, sample_prompt="\n",
      sample_every=0)               # LMs: also sample at evals every N steps; 0: end only
  fields.update(extra)
  return _with_placeholders(fields, {"eval_batch_size": int})


def optim(lr: float, *, schedule: str = "cosine", warmup_steps: int = 0,
          weight_decay: float = 0.1, clip: float = 1.0, grad_accum: int = 1, b1: float = 0.9,
          b2: float = 0.95, eps: float = 1e-8, min_lr_ratio: float = 0.1,
          decay_steps: int | None = None, **extra) -> config_dict.ConfigDict:
  """`optim` section: AdamW by default; `lr` is the peak learning rate of `schedule`
  ("cosine" | "linear" | "constant" | "rsqrt"), reached after `warmup_steps`; cosine and
  linear decay to `min_lr_ratio * lr` at `decay_steps` (None: `train.steps`) and stay there.
  "rsqrt" is Vaswani et al.'s lr * min(step / warmup, sqrt(warmup / step))."""
  cfg = config_dict.ConfigDict(dict(
      name="adamw", lr=float(lr), schedule=schedule, warmup_steps=int(warmup_steps),
      weight_decay=float(weight_decay), clip=float(clip), grad_accum=int(grad_accum),
      b1=float(b1), b2=float(b2), eps=float(eps), min_lr_ratio=float(min_lr_ratio), **extra))
  cfg.decay_steps = config_dict.placeholder(int) if decay_steps is None else int(decay_steps)
  return cfg


def mesh(data: int = -1, model: int = 1, expert: int = 1, fsdp: bool = False
         ) -> config_dict.ConfigDict:
  """`mesh` section: device-mesh axis sizes; -1 takes all remaining devices."""
  return config_dict.ConfigDict(dict(data=data, model=model, expert=expert, fsdp=fsdp))


def reference(params: int | float | None = None, *, source: str = "", **extra
              ) -> config_dict.ConfigDict:
  """`reference` section: published numbers (not read by training code)."""
  ref = config_dict.ConfigDict(dict(source=source, **extra))
  ref.params = config_dict.placeholder(int) if params is None else params
  return ref


def config(*, model: config_dict.ConfigDict, data: config_dict.ConfigDict,
           train: config_dict.ConfigDict, optim: config_dict.ConfigDict,
           mesh: config_dict.ConfigDict | None = None,
           reference: config_dict.ConfigDict | None = None) -> config_dict.ConfigDict:
  """The full training config from its sections."""
  cfg = config_dict.ConfigDict()
  cfg.model, cfg.data, cfg.train, cfg.optim = model, data, train, optim
  cfg.mesh = mesh if mesh is not None else globals()["mesh"]()
  if reference is not None:
    cfg.reference = reference
  return cfg


def select(module_name: str, arg: str | None, table: Mapping[str, Any], default: str = "tiny"):
  """The entry of `table` named `arg` (None -> `default`); a ValueError lists the names."""
  key = default if arg is None or arg == "" else arg
  if key not in table:
    raise ValueError(f"unknown {module_name} config {arg!r}; valid names: "
                     f"{', '.join(table)}")
  return key, table[key]
