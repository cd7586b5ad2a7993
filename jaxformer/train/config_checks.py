"""Config checks, run before a training writes anything, so a rejected config leaves no trace.

`validate` needs neither data nor compilation (ranges, the task, the model's own fields via
`models.build`); `check_model_matches_data` compares the model with what the pipeline
produces; `check_workdir_config` refuses to resume a workdir holding a different model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import jax
import jax.numpy as jnp

from jaxformer import models, paths, workdir_layout, run_settings, tasks
from jaxformer.data import settings as source_settings
from jaxformer.state import optim, train_state
from jaxformer.train import evaluators, profiling, trackers


def validate(config) -> run_settings.RunSettings:
  """Config checks that need no data and no compilation: the typed settings of every section
  (`run_settings.parse`), the task, the data section as the settings of the task's source
  kind (`jaxformer.data.settings`: a key the kind does not name is refused), the checks
  across sections, and the model's own fields (`models.build`'s checks, as `settings.model`).
  Returns the typed settings, `data` the source kind's (what the pipelines and batch layouts
  read)."""
  settings = run_settings.parse(config)
  task = tasks.task_for_run(config, settings)
  settings = dataclasses.replace(settings,
                                 data=source_settings.parse(task.data_kind, config))
  t, o = settings.train, settings.optim
  if t.batch_size % (o.grad_accum * jax.process_count()):
    raise ValueError(f"train.batch_size={t.batch_size} must be divisible by "
                     f"optim.grad_accum={o.grad_accum} x {jax.process_count()} processes")
  if t.keep_checkpoint_every % t.checkpoint_every:
    near = max(1, round(t.keep_checkpoint_every / t.checkpoint_every)) * t.checkpoint_every
    raise ValueError(f"train.keep_checkpoint_every={t.keep_checkpoint_every} must be a multiple "
                     f"of train.checkpoint_every={t.checkpoint_every} (only saved steps can be "
                     f"kept); set it to {near}, or 0 to keep none")
  profile = profiling.parse_profile_steps(t.profile_steps)
  if profile and profile[-1] > t.steps:
    raise ValueError(f"train.profile_steps={t.profile_steps!r} reaches past the run's "
                     f"train.steps={t.steps}; profile steps within it, e.g. "
                     f"'{max(1, t.steps - 2)}-{t.steps}'")
  if t.checkpoint_steps and t.checkpoint_steps[-1] > t.steps:
    raise ValueError(f"train.checkpoint_steps={tuple(t.checkpoint_steps)} reaches past the "
                     f"run's train.steps={t.steps}; keep steps within it")
  if o.schedule == "wsd" and o.warmup_steps > optim.wsd_decay_start(o, t.steps):
    raise ValueError(f"optim.warmup_steps={o.warmup_steps} runs into the decay of the wsd "
                     f"schedule, which starts at step {optim.wsd_decay_start(o, t.steps)} "
                     f"(the last optim.decay_fraction={o.decay_fraction} of the steps); lower "
                     "--config.optim.warmup_steps or --config.optim.decay_fraction")
  if o.schedule != "rsqrt" and o.warmup_steps >= t.steps:
    # a warning, not an error: short smoke runs of real configs (CI's) are meant this way
    logging.warning("optim.warmup_steps=%d is not shorter than train.steps=%d: the learning "
                    "rate never reaches optim.lr=%g (lower --config.optim.warmup_steps if that "
                    "is not meant)", o.warmup_steps, t.steps, o.lr)
  trackers.check_installed(t.trackers)    # the extra of W&B / MLflow
  models.build(settings.model)            # the module itself builds
  evaluators.check(settings)              # their files parse, each fits the model family
  return settings


def check_model_matches_data(config, info: dict,
                             settings: run_settings.RunSettings | None = None):
  """The model must fit what the data pipeline produces (named fields, before compiling);
  `settings`: `run_settings.parse(config)` unless given."""
  settings = settings or run_settings.parse(config)
  data, m = settings.data, settings.model      # m: every field at the family's default
  if "num_classes" in info and m.get("num_classes") != info["num_classes"]:
    raise ValueError(f"model.num_classes={m.get('num_classes')} but the data "
                     f"({data.source!r}) has {info['num_classes']} classes; set "
                     f"--config.model.num_classes={info['num_classes']}")
  # A larger vocabulary is allowed: padding it to a multiple of mesh.model (tensor
  # parallelism) or of 64 (faster matmuls) only adds never-targeted logits.
  if "vocab_size" in info and m.get("vocab_size") is not None and (
      m.vocab_size < info["vocab_size"]):
    raise ValueError(f"model.vocab_size={m.vocab_size} but the data ({data.source!r}) "
                     f"has {info['vocab_size']} symbols; set "
                     f"--config.model.vocab_size={info['vocab_size']} (or larger)")
  if "image_shape" in info and m.get("image_size") is not None:
    h, w, c = info["image_shape"]
    channels = m.get("channels", c)
    if (h, w) != (m.image_size, m.image_size) or c != channels:
      raise ValueError(f"images are {h}x{w}x{c} but model.image_size={m.image_size}, "
                       f"model.channels={channels}; set them to {h} and {c}")
  # max_len bounds a learned position table: the decoder's positions="learned", or a family
  # without a `positions` choice (BERT's table is always learned)
  learned = m.get("max_len") is not None and m.get("positions", "learned") == "learned"
  lengths = {"data.seq_len": data.seq_len, "source length": info.get("src_len"),
             "target length": info.get("tgt_len")}
  offset = m.get("pad_id")      # RoBERTa's positions run from pad_id + 1 to length + pad_id
  offset = 0 if offset is None else offset + 1
  for name, length in lengths.items():
    if learned and length is not None and length + offset > m.max_len:
      raise ValueError(f"{name}={length} exceeds model.max_len={m.max_len} (the learned "
                       "position table" + (f", whose first {offset} rows model.pad_id="
                       f"{offset - 1} skips" if offset else "") + "); lower the length or "
                       "raise model.max_len")


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


# Run fields that do not change what the training steps compute (what is logged, evaluated,
# sampled or kept, where data is cached, and `loss_chunk`: how the loss is computed, the same
# loss to float rounding): they may change on resume. Every other field of
# `train`, `optim` and `data` is compared (`mesh` may change: a checkpoint restores onto any
# mesh; `model` has its own EXECUTION_FIELDS); `train.steps` only where it moves the schedule,
# `train.keep_checkpoint_every` only where it keeps what the run kept.
RESUMABLE_CHANGES = {
    "train": ("steps", "eval_every", "log_every", "checkpoint_every", "eval_batch_size",
              "keep_checkpoints", "keep_checkpoint_every", "checkpoint_steps", "keep_best", "best_metric",
              "max_skipped_steps", "stall_timeout", "profile_steps", "attention_maps", "sample_tokens",
              "sample_prompt", "sample_every", "loss_chunk", "trackers", "tracker_project",
              "tracker_group", "evaluators"),
    "data": ("eval_batches", "data_dir"),
    "optim": ("decay_steps",         # compared through the schedule it gives
              "offload_state"),      # where the moments wait between steps, not what
    "posttrain": (),                 # method, init_from, beta: what the steps optimize
}


def check_workdir_config(config, workdir: str, fresh: bool,
                         settings: run_settings.RunSettings | None = None):
  """Refuse to resume a run whose model, data, seed, batch or schedule differ from the saved
  run's (unless `fresh`): the resumed steps would not continue the steps already taken; and
  a train.keep_checkpoint_every that would delete the checkpoints the run kept."""
  saved = None if fresh else train_state.read_config(workdir)
  if saved is None:
    return
  check_continues(config, saved, steps_taken(workdir), where=workdir, settings=settings)


def check_continues(config, saved: dict, taken: int, *, where: str, branch: bool = False,
                    settings: run_settings.RunSettings | None = None):
  """`config` continues the run of config `saved` (JSON data) after its first `taken` steps:
  the checks of `check_workdir_config`. `where` starts each message (the workdir, or the
  --branch_from value); `branch`: the saved run is the trunk of a cooldown branch, whose
  only way out is to drop the change (a new workdir or --fresh would branch the same trunk)."""
  holds = f"{where}: the trunk is a run" if branch else f"{where} holds a run"
  settings = settings or run_settings.parse(config)
  model = _with_defaults(saved.get("model", {}))
  current = json.loads(json.dumps(settings.model.to_dict()))     # as a saved config.json
  changed = sorted(k for k in set(model) | set(current)
                   if model.get(k) != current.get(k) and k not in EXECUTION_FIELDS)
  if changed:
    raise ValueError(f"{holds} with a different model (fields {changed}); " + (
        "a branch continues the trunk's model: drop the --config.model overrides of them"
        if branch else "use a new --workdir, or --fresh to discard its checkpoints"))
  now = json.loads(config.to_json())
  for section, free in RESUMABLE_CHANGES.items():
    old, new = saved.get(section, {}), now.get(section, {})
    for key in sorted(set(old) & set(new)):       # a key saved before it existed: not compared
      if key not in free and old[key] != new[key]:
        raise ValueError(
            f"{holds} trained with {section}.{key}={old[key]!r}, not {new[key]!r}: "
            f"{'branching' if branch else 'resuming'} would not continue its steps; drop "
            f"--config.{section}.{key}" + ("" if branch else
                                           ", or use a new --workdir, or --fresh to discard it"))
  _check_schedule_unchanged(saved, settings, taken, holds, branch)
  _check_kept_checkpoints_stay(saved, settings, holds, branch)


def _check_kept_checkpoints_stay(saved: dict, settings, holds: str, branch: bool):
  """train.keep_checkpoint_every may change on resume if the checkpoints the run kept stay
  kept (the new value divides the old): Orbax applies the new rule to every checkpoint at the
  next save, so turning it off or raising it would delete them."""
  old = run_settings.parse_section("train", saved.get("train")).keep_checkpoint_every
  new = settings.train.keep_checkpoint_every
  if old and (not new or old % new):
    raise ValueError(f"{holds} that keeps a checkpoint every {old} steps; "
                     f"train.keep_checkpoint_every={new} would delete them at the next save: "
                     f"set --config.train.keep_checkpoint_every={old} (or a divisor of it)"
                     + ("" if branch else ", or use --fresh to discard them"))


def steps_taken(workdir: str) -> int:
  """The newest checkpoint's step in `workdir` (0 with none): the steps a resume continues."""
  directory = paths.path(os.path.join(workdir, workdir_layout.CHECKPOINTS))
  if not directory.exists():
    return 0
  return max((int(p.name) for p in directory.iterdir() if p.name.isdigit()), default=0)


def _check_schedule_unchanged(saved: dict, settings, taken: int, holds: str, branch: bool):
  """train.steps and optim.decay_steps may change on resume (extend or shorten a run, or a
  cooldown branch of a wsd run) unless that moves the learning rate of the steps already
  taken (cosine/linear decay over train.steps when optim.decay_steps is unset)."""
  old_steps, old_optim = saved.get("train", {}).get("steps"), saved.get("optim", {})
  new_steps = settings.train.steps
  if old_steps is None or (old_steps == new_steps and old_optim.get("decay_steps")
                           == settings.optim.decay_steps):
    return
  shared = jnp.arange(min(old_steps, new_steps, taken))
  old_lr = optim.learning_rate_schedule(run_settings.parse_section("optim", old_optim),
                                       old_steps)(shared)
  new_lr = optim.learning_rate_schedule(settings.optim, new_steps)(shared)
  if not bool(jnp.allclose(old_lr, new_lr, rtol=1e-6, atol=0)):
    keep = old_optim.get("decay_steps") or old_steps
    if branch:
      raise ValueError(
          f"{holds} of train.steps={old_steps}; train.steps={new_steps} would change the "
          f"learning rate of the {taken} steps it took (a branch's decay must start at or "
          "after its branch point): branch from an earlier kept step, or raise "
          "--config.train.steps")
    raise ValueError(
        f"{holds} of train.steps={old_steps} whose optim.schedule="
        f"{settings.optim.schedule!r} decays over {keep} steps; this config would change the "
        f"learning rate of the steps already taken: add --config.optim.decay_steps={keep} to "
        "keep its schedule, or use --fresh")
