"""The training loop: config -> trained model in a workdir, resumable at any step.

Workdir: config.json, tokenizer.json (text tasks), checkpoints/ (Orbax, last N),
best/ (params of the best eval steps), metrics.jsonl, samples.txt. Running again on the same
workdir resumes from the latest checkpoint. Batches are a function of (seed, step) (see
`jaxformer.data.batching`) and dropout keys of (seed, step), so the resumed run reproduces
the metrics of an uninterrupted one exactly.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import pathlib
import signal

import jax
import jax.numpy as jnp
import numpy as np

from jax.experimental import multihost_utils

from jaxformer import checkpoint, inference, models, optim, parallel, scaling
from jaxformer import state as state_lib
from jaxformer.data.pipeline import make_pipeline
from jaxformer.train import (attention_maps, plots, profiling, progress, step as step_lib,
                             tasks)
from jaxformer.train import workdir as workdir_lib
from jaxformer.train.metrics import MetricsWriter, read
from jaxformer.train.tensorboard import SummaryWriter


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# (field, check, what it must be); a None value means "not set" and passes where it is optional
_RANGES = (
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


def _validate(config):
  """Config checks that need no data and no compilation (the model's own via models.build)."""
  tasks.task_for(config.model)
  for field, ok, want in _RANGES:
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


def _check_model_matches_data(config, info: dict):
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
EXECUTION_FIELDS = ("attention_impl", "attention_block_sizes", "remat_policy", "dtype")


def _check_workdir_config(config, workdir: str, fresh: bool):
  """Refuse to resume a run whose model differs from the saved one (unless `fresh`)."""
  saved = None if fresh else state_lib.read_config(workdir)
  if saved is not None:
    saved = saved.get("model", {})
    current = json.loads(config.model.to_json())
    changed = sorted(k for k in set(saved) | set(current)
                     if saved.get(k) != current.get(k) and k not in EXECUTION_FIELDS)
    if changed:
      raise ValueError(f"{workdir} holds a run with a different model (fields {changed}); "
                       "use a new --workdir, or --fresh to discard its checkpoints")


def _write_config(config, workdir: str):
  """config.json, written once the config has passed every check (a rejected first attempt
  leaves none behind to refuse the corrected rerun)."""
  path = os.path.join(workdir, "config.json")
  if jax.process_index() == 0:        # atomic: other processes may be reading it
    with open(path + ".tmp", "w") as f:
      f.write(config.to_json(indent=2))
    os.replace(path + ".tmp", path)


class _StopRequest:
  """SIGTERM/SIGINT set a flag: the loop saves a checkpoint at the end of the step and exits."""

  def __init__(self):
    self.requested = False
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    logging.warning("signal %d: saving a checkpoint and stopping", signum)
    self.requested = True

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def flops_per_step(config, task, batch, process_count: int) -> int:
  """Model FLOPs of one optimizer step (Kaplan's 6N + attention convention, see
  `scaling.flops_per_token`), for the MFU estimate."""
  rows = batch[task.labels].shape[0] * process_count
  if task.name == "classification":
    m = config.model
    tokens = (m.image_size // m.patch_size) ** 2 + (1 if m.get("pool", "cls") == "cls" else 0)
    return scaling.flops_per_token(m, tokens) * tokens * rows
  if task.name == "seq2seq":
    tgt_len = batch["tgt_out"].shape[1]
    length = max(batch["src"].shape[1], tgt_len)
    return scaling.flops_per_token(config.model, length) * tgt_len * rows
  seq_len = batch["inputs"].shape[1]
  return scaling.flops_per_token(config.model, seq_len) * seq_len * rows


def evaluate(eval_step, params, pipeline, task, plan) -> dict:
  """Split-level eval metrics from per-batch sums (padded rows carry zero weight)."""
  totals = None
  for batch in pipeline.eval_batches():
    sums = eval_step(params, plan.global_batch(batch))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return tasks.finalize_eval(task, jax.device_get(totals))


def train(config, workdir: str, *, fresh: bool = False, stop_after: int | None = None) -> dict:
  """Train (or resume) `config` in `workdir`; returns the last eval record.

  The config is validated and the workdir checked before anything is written; the workdir is
  locked for the run (a second training on it is refused at once). `stop_after` ends the run
  after that many steps as if preempted (for tests/benchmarks).
  """
  _validate(config)
  workdir_lib.check_usable(workdir)
  owner = workdir_lib.Lock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()
  with owner:
    try:
      return _train(config, workdir, fresh=fresh, stop_after=stop_after)
    except OSError as e:
      if e.errno != errno.ENOSPC:
        raise
      where = e.filename or "a file"
      raise ValueError(f"no space left on the device of --workdir={workdir!r} ({where}); free "
                       "space and rerun: training resumes from the last complete checkpoint"
                       ) from e


def _train(config, workdir: str, *, fresh: bool, stop_after: int | None) -> dict:
  """The run, with its shutdown in one place: however it ends (done, preempted, an exception,
  Ctrl-C), the pending asynchronous checkpoint is waited for and the writers are closed."""
  with contextlib.ExitStack() as shutdown:
    return _run(config, workdir, fresh=fresh, stop_after=stop_after, shutdown=shutdown)


def _run(config, workdir: str, *, fresh: bool, stop_after: int | None,
         shutdown: contextlib.ExitStack) -> dict:
  if fresh and jax.process_index() == 0:
    removed = workdir_lib.clear(workdir)
    print(f"{workdir}: --fresh, removed the previous run's {', '.join(removed) or 'nothing'}",
          flush=True)
  _check_workdir_config(config, workdir, fresh)

  t = config.train
  task = tasks.task_for(config.model)
  plan = parallel.ShardingPlan.from_config(config.mesh)
  plan.check_batch_size(t.batch_size)
  pipeline = make_pipeline(config, workdir=workdir, process_index=jax.process_index(),
                           process_count=jax.process_count())
  _check_model_matches_data(config, pipeline.info)

  module, tx, init_boxed = state_lib.train_state_fns(config)
  abstract = jax.eval_shape(init_boxed)
  state_shardings = plan.state_shardings(abstract)     # divisibility errors: no compile yet
  _write_config(config, workdir)
  schedule = optim.learning_rate_schedule(config.optim, t.steps)
  dropout_key = jax.random.split(jax.random.key(t.seed))[1]
  ckpts = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"),
                                 keep=t.get("keep_checkpoints", 3))
  shutdown.callback(ckpts.close)
  best_metric = t.get("best_metric", "eval_loss")
  best = checkpoint.BestCheckpoints(os.path.join(workdir, "best"), metric=best_metric,
                                    keep=t.get("keep_best", 1)) if t.get("keep_best", 1) else None
  if best is not None:
    shutdown.callback(best.close)
  metrics = MetricsWriter(os.path.join(workdir, "metrics.jsonl"))
  restored = ckpts.restore_latest(plan.restore_target(abstract))   # from any mesh
  if restored is None:
    state, start = plan.init_state(init_boxed)[0], 0
  else:
    start, state = restored
  if jax.process_index() == 0:
    print(f"{workdir}: " + (f"resumed from step {start}" if start else "starting fresh"),
          flush=True)
  if jax.process_index() == 0:
    metrics.truncate_after(start)
  if best is not None:
    best.forget_after(start)            # saved after the checkpoint we resume from: redone
  if start >= t.steps:
    print(f"{workdir}: already trained for {start} steps")
    return _last_eval(os.path.join(workdir, "metrics.jsonl"))

  logging.info("%s", plan.describe())
  first = pipeline.train_batch(start)
  example = next(iter(pipeline.eval_batches()))
  batch_shardings = lambda batch: {k: plan.batch_sharding(np.ndim(v)) for k, v in batch.items()}
  train_step = plan.jit(step_lib.make_train_step(
      module, tx, task, label_smoothing=t.get("label_smoothing", 0.0),
      z_loss=t.get("z_loss", 0.0), grad_accum=config.optim.get("grad_accum", 1)),
      in_shardings=(state_shardings, batch_shardings(first), plan.replicated),
      out_shardings=(state_shardings, plan.replicated), donate_argnums=(0,),
      name="train_step")
  eval_step = plan.jit(step_lib.make_eval_step(module, task),
                       in_shardings=(state_shardings["params"], batch_shardings(example)),
                       out_shardings=plan.replicated, name="eval_step")
  dropout_key = plan.replicate(dropout_key)
  max_skipped = t.get("max_skipped_steps", 5)
  is_main = jax.process_index() == 0
  units_per_step = task.units_per_batch(first) * jax.process_count()
  peak = progress.peak_flops_per_device(dtype=config.model.get("dtype", "float32"))
  bar = progress.Progress(
      t.steps, start, unit=task.unit, units_per_step=units_per_step, window=1,
      flops_per_step=flops_per_step(config, task, first, jax.process_count()),
      peak_flops=peak * jax.device_count() if peak else None)
  shutdown.callback(bar.close)
  tb = SummaryWriter(workdir, purge_step=start + 1 if start else None) if is_main else None
  if tb is not None:
    shutdown.callback(tb.close)
  profiler = profiling.StepProfiler(workdir, t.get("profile_steps"))
  shutdown.callback(profiler.close)
  # (one process: the snapshot runs on the host's example outside the sharded step)
  show_attention = jax.process_count() == 1 and t.get("attention_maps", True)
  if show_attention:
    snapshot_fn = attention_maps.make_snapshot_fn(module, task)
    tokenizer = getattr(pipeline, "tokenizer", None)
    labels = ([tokenizer.decode([i]) for i in example[task.inputs[0]][0]]
              if tokenizer is not None and task.name in ("lm", "mlm") else None)
  samples = task.name == "lm" and t.get("sample_tokens", 0)
  sample_every = t.get("sample_every", 0)      # 0: one sample at the end of training
  last_eval, preempted = None, False

  def check_finite(done, m):
    """Log a skipped update; stop after max_skipped in a row. Called one step late, so the
    host never waits for the device between steps (skipped steps leave the state good)."""
    if not bool(m["finite"]):
      logging.warning("step %d: non-finite loss or gradient, update skipped", done)
      if int(m["skipped"]) >= max_skipped:
        saved = ckpts.manager.latest_step()
        kept = (f"the last checkpoint, step {saved}, in {workdir}/checkpoints is intact and "
                "a rerun resumes from it" if saved is not None else
                "no checkpoint was saved before it, so a rerun starts from scratch")
        raise FloatingPointError(
            f"{max_skipped} non-finite steps in a row at step {done}; stopping: {kept} "
            "(lower optim.lr or check the data)")

  previous = None
  with _StopRequest() as stop:
    for s in range(start, t.steps):
      batch = plan.global_batch(first if s == start else pipeline.train_batch(s))
      profiler.before(s + 1)
      state, m = train_step(state, batch, dropout_key)
      profiler.after(s + 1, m)
      done = s + 1
      if previous is not None:
        check_finite(*previous)
      previous = (done, m)
      if done % t.log_every == 0 or done == t.steps:
        record = {"step": done, "loss": float(m["loss"]), "lr": float(schedule(s)),
                  "grad_norm": float(m["grad_norm"]), "skipped": int(m["skipped"])}
        if task.name == "classification":
          record["accuracy"] = float(m["accuracy"])
        for key in (k for k in m if k.startswith("moe_")):
          value = jax.device_get(m[key])
          record[key] = value.tolist() if value.ndim else float(value)
        bar.update(done, record)
        rate = bar.steps_per_sec()
        if rate:
          record[f"{task.unit}_per_sec"] = rate * units_per_step
        if bar.mfu() is not None:
          record["mfu"] = bar.mfu()
        if is_main:
          metrics.write(record)
          tb.scalars(_scalars(record), done)
      if done % t.eval_every == 0 or done == t.steps:
        with bar.paused():
          last_eval = {"step": done, **evaluate(eval_step, state["params"], pipeline, task, plan)}
          if show_attention:
            png, entropy = attention_maps.write_attention_map(
                snapshot_fn, state["params"], example, step=done, workdir=workdir,
                tokens=labels)
            last_eval["attention_entropy"] = float(np.mean(entropy))
            tb.image("attention", pathlib.Path(png).read_bytes(), done)
          bar.log(f"step {done:>6d}  " + "  ".join(
              f"{k} {v:.4f}" for k, v in last_eval.items() if k != "step"))
          if is_main:
            metrics.write(last_eval)
            tb.scalars(_scalars(last_eval), done)
          if best is not None:
            best.maybe_save(done, state["params"], last_eval)
          if samples and sample_every and done % sample_every == 0 and done < t.steps:
            _write_sample(config, state["params"], pipeline.tokenizer, workdir, done)
      preempted = stop.requested or (stop_after is not None and done - start >= stop_after)
      if done % t.checkpoint_every == 0 or done == t.steps or preempted:
        check_finite(*previous)          # never save after the run should have stopped
        with bar.paused():
          ckpts.save(done, state)
      if preempted:
        break
  shutdown.close()           # checkpoints written, writers closed, before plots and samples
  if is_main:
    plots.plot_curves(os.path.join(workdir, "metrics.jsonl"),
                      os.path.join(workdir, "curves.png"))
  if not preempted and samples:
    _write_sample(config, state["params"], pipeline.tokenizer, workdir, t.steps)
  return last_eval


def _scalars(record: dict) -> dict:
  """TensorBoard scalars of a metrics record; a list (per-expert load) becomes tag/i."""
  out = {}
  for key, value in record.items():
    if key == "step":
      continue
    if isinstance(value, list):
      out.update({f"{key}/{i}": v for i, v in enumerate(value)})
    else:
      out[key] = value
  return out


def _write_sample(config, params, tokenizer, workdir, step: int):
  """Append a seeded sample of the current model to samples.txt (and print it).

  A sample is a by-product: if it fails, the error is logged and training (or the finished
  run, whose checkpoints are already saved) goes on."""
  t = config.train
  if jax.process_count() > 1:          # every process samples from the whole params
    params = multihost_utils.process_allgather(params, tiled=True)
  try:
    text = inference.sample_text(config, params, tokenizer,
                                 prompt=t.get("sample_prompt", "\n"),
                                 max_new_tokens=t.sample_tokens, temperature=0.8, top_k=20,
                                 seed=t.seed)
  except Exception as e:  # noqa: BLE001  (never fail a run for its sample)
    logging.exception("sample after %d steps failed; the run's checkpoints and metrics are "
                      "kept", step)
    print(f"warning: sample after {step} steps failed ({type(e).__name__}: {e}); the run "
          "itself is complete", flush=True)
    return
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "samples.txt"), "a") as f:
      f.write(f"--- step {step}\n{text}\n")
  print(f"\n--- sample after {step} steps ---\n{text}\n", flush=True)


def _last_eval(path):
  evals = [r for r in read(path) if "eval_loss" in r] if os.path.exists(path) else []
  return evals[-1] if evals else None
