"""A training run's parts, built before its first step, each closeable registered for shutdown.

`open_run` checks the workdir against the config, builds the sharding plan, the data pipeline
and the train state (resumed from the latest checkpoint, or initialized) and opens the
checkpoint managers; `make_steps` jits the train and eval steps; `open_writers` opens the
progress bar, the trackers (metrics.jsonl, TensorBoard, W&B, MLflow) and the profiler.
Whatever they open goes on the run's ExitStack as soon as it is open, so the shutdown
(`loop._train`) closes exactly what was opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from typing import Any, Callable

import jax
import numpy as np

from jaxformer import accelerators, parallel, paths, workdir_layout, run_settings, tasks
from jaxformer.parallel import offload
from jaxformer.state import checkpoint, optim
from jaxformer.state import train_state as state_lib
from jaxformer.train import config_checks, data_record, profiling, progress
from jaxformer.train import trackers as trackers_lib
from jaxformer.train import step as step_lib
from jaxformer.train import workdir as workdir_lib
from jaxformer.train.metrics import MetricsWriter


@dataclasses.dataclass
class Run:
  """A run ready to train from step `start`: its data, model and train state, and what saves
  them. `state` is the state at `start` (the first train step donates its buffers)."""
  config: Any
  settings: run_settings.RunSettings   # the typed train/optim/data/mesh sections of `config`
  workdir: str
  is_main: bool                  # process 0: the one that writes the run's files
  task: tasks.Task
  plan: parallel.ShardingPlan
  pipeline: Any
  module: Any
  tx: Any
  state_shardings: Any
  state: Any
  start: int
  ckpts: checkpoint.Checkpoints
  best: checkpoint.BestCheckpoints | None
  metrics: MetricsWriter
  logged_through: int = 0        # the last step metrics.jsonl held before the resume cut it


def save_points(workdir: str, settings: run_settings.RunSettings) -> tuple[int, int]:
  """(the first step the run in `workdir` saves a checkpoint at, its last step): by its saved
  config where it has one (the run that wrote what is there; checkpoint_every and steps may
  change on resume) and by this one, the earlier of each."""
  trains = [settings.train]
  saved = (state_lib.read_config(workdir) or {}).get("train")
  if saved:
    try:
      trains.append(run_settings.parse_section("train", saved))
    except ValueError:              # a config of an older version: this one's values decide
      pass
  return (min(min(t.checkpoint_every, t.steps, *t.checkpoint_steps[:1]) for t in trains),
          min(t.steps for t in trains))


def check_workdir(workdir: str, settings: run_settings.RunSettings, *, fresh: bool) -> None:
  """Before anything is written or compiled: the workdir's members are of the kind a run
  writes, and a start from step 0 would overwrite no earlier results (unless `fresh`).
  Process 0 checks; the others follow its verdict."""
  def check():
    workdir_lib.check_members(workdir, fresh=fresh)
    if not fresh:
      workdir_lib.check_nothing_overwritten(workdir, *save_points(workdir, settings))
  parallel.process_zero_first(lambda: check() if jax.process_index() == 0 else None,
                              "checking --workdir")


def open_run(config, settings: run_settings.RunSettings, workdir: str, *, fresh: bool,
             shutdown: contextlib.ExitStack, data_changed_ok: bool = False) -> Run:
  """The run in `workdir`, resumed or started. config.json is written only once the config has
  passed the checks that need the data and the mesh (a rejected first attempt leaves none
  behind to refuse the corrected rerun); data.json with it (`data_record`: a resume on
  changed data is refused unless `data_changed_ok`)."""
  is_main = jax.process_index() == 0
  if fresh and settings.posttrain is not None:   # starting over needs the source: check it
    from jaxformer.posttrain import start as posttrain_init     # before discarding the run
    posttrain_init.require_source(settings)
  if fresh and is_main:
    removed = workdir_lib.clear(workdir)
    print(f"{workdir}: --fresh, removed the previous run's {', '.join(removed) or 'nothing'}",
          flush=True)
  config_checks.check_workdir_config(config, workdir, fresh, settings)
  if is_main:
    workdir_lib.remove_rejected_attempt(workdir)

  t = settings.train
  task = tasks.task_for_run(config, settings)
  plan = parallel.ShardingPlan.from_config(settings.mesh)
  plan.check_batch_size(t.batch_size, grad_accum=settings.optim.grad_accum)
  if t.eval_batch_size:
    plan.check_batch_size(t.eval_batch_size, "train.eval_batch_size")
  pipeline = parallel.process_zero_first(     # dataset and tokenizer made once, by process 0
      lambda: task.make_pipeline(config, settings, workdir=workdir,
                                 process_index=jax.process_index(),
                                 process_count=jax.process_count()),
      "preparing the data")
  config_checks.check_model_matches_data(config, pipeline.info, settings)

  module, tx, init_boxed = state_lib.train_state_fns(config, settings)
  abstract = jax.eval_shape(init_boxed)
  state_shardings = plan.state_shardings(abstract)     # divisibility errors: no compile yet
  state_shardings = offloaded(config, settings, plan, state_shardings)
  data = parallel.process_zero_first(
      lambda: data_record.check(workdir, settings,
                                data_record.fingerprint(config, pipeline, settings),
                                taken=config_checks.steps_taken(workdir),
                                data_changed_ok=data_changed_ok) if is_main else None,
      "checking the data against the run's")
  if is_main:
    _write_config(config, workdir)
    if data is not None:
      data_record.write(workdir, data)
  ckpts = checkpoint.Checkpoints(os.path.join(workdir, workdir_layout.CHECKPOINTS),
                                 keep=t.keep_checkpoints, keep_every=t.keep_checkpoint_every,
                                 keep_steps=t.checkpoint_steps)
  shutdown.callback(ckpts.close)
  best = checkpoint.BestCheckpoints(os.path.join(workdir, workdir_layout.BEST),
                                    metric=t.best_metric, keep=t.keep_best) if t.keep_best else None
  if best is not None:
    shutdown.callback(best.close)
  metrics = MetricsWriter(os.path.join(workdir, workdir_layout.METRICS))
  logged_through = 0
  had_checkpoints = bool(workdir_lib.checkpoint_steps(workdir)) if is_main else False
  restored = ckpts.restore_latest(plan.restore_target(abstract))   # from any mesh
  if restored is None and not fresh:    # every checkpoint there was unreadable (moved aside)?
    parallel.process_zero_first(
        lambda: workdir_lib.check_nothing_overwritten(workdir, *save_points(workdir, settings))
        if is_main and had_checkpoints else None, "checking --workdir")
  if restored is None:
    state, start = plan.init_state(init_boxed)[0], 0
    if settings.posttrain is not None:      # SFT / DPO: the source run's params
      from jaxformer.posttrain import start as posttrain_init
      state = posttrain_init.init_state(settings, plan, state, abstract, workdir)
  else:
    start, state = restored
  if settings.optim.offload_state:          # the moments to host memory, where steps keep them
    state = jax.device_put(state, state_shardings)
  if is_main:
    print(f"{workdir}: " + (f"resumed from step {start}" if start else "starting fresh"),
          flush=True)
    logged_through = metrics.truncate_after(start)
  if best is not None:
    best.forget_after(start)            # saved after the checkpoint we resume from: redone
  return Run(config, settings, workdir, is_main, task, plan, pipeline, module, tx, state_shardings, state,
             start, ckpts, best, metrics, logged_through)


def _write_config(config, workdir: str):
  """config.json, atomically: other processes may be reading it."""
  paths.write_text(os.path.join(workdir, workdir_layout.CONFIG), config.to_json(indent=2))


@dataclasses.dataclass
class Steps:
  """The jitted steps, and the batches whose shapes fixed their shardings: `first` is the
  train batch at `start`, `example` the first eval batch."""
  train_step: Callable
  eval_step: Callable
  dropout_key: Any
  schedule: Callable             # step -> learning rate, for the logs
  first: dict
  example: dict


def make_steps(run: Run) -> Steps:
  """The train step (donating the state) and the eval step, jitted for the plan's shardings."""
  plan, t, o = run.plan, run.settings.train, run.settings.optim
  logging.info("%s", plan.describe())
  first = prepare(run, run.state, run.pipeline.train_batch(run.start), run.start, train=True)
  example = prepare(run, run.state, next(iter(run.pipeline.eval_batches())), run.start,
                    train=False)
  batch_shardings = lambda batch: {k: plan.batch_sharding(np.ndim(v)) for k, v in batch.items()}
  train_step = jit_train_step(run.settings, plan, run.module, run.tx, run.task,
                              run.state_shardings, batch_shardings(first))
  extra = run.task.extra_state
  eval_step = plan.jit(step_lib.make_eval_step(run.module, run.task),
                       in_shardings=(run.state_shardings["params"], batch_shardings(example))
                       + ((run.state_shardings[extra],) if extra else ()),
                       out_shardings=plan.replicated, name="eval_step")
  dropout_key = plan.replicate(jax.random.split(jax.random.key(t.seed))[1])
  # jitted: the logs call it on the host, where eager dispatch compiled ~10 tiny ops (~0.5 s)
  schedule = jax.jit(optim.learning_rate_schedule(o, t.steps))
  return Steps(train_step, eval_step, dropout_key, schedule, first, example)


def prepare(run: Run, state, batch: dict, step: int, *, train: bool) -> dict:
  """The batch the step takes: the pipeline's `batch`, through the task's host-side rollout
  with `state`'s params where it has one (`Task.rolls_out`: GRPO samples and scores there)."""
  task = run.task
  if not task.rolls_out:
    return batch
  extra = state[task.extra_state] if task.extra_state is not None else None
  return task.rollout(run.config, run.pipeline, state["params"], extra, batch, step=step,
                      train=train)


def compile_together(run: Run, steps: Steps) -> None:
  """Several processes: compile the train and eval steps ahead of their first call, then
  wait for every process. Why: the first collective of a CPU job sets up its Gloo context
  and gives the other processes 30 s to join; a process still preparing data or compiling
  under load missed it (`DEADLINE_EXCEEDED ... cpu:gloo`) and the job failed at step 1. The
  calls reuse these executables."""
  if jax.process_count() == 1:
    return
  plan, extra = run.plan, run.task.extra_state
  steps.train_step.lower(run.state, plan.global_batch(steps.first), steps.dropout_key).compile()
  steps.eval_step.lower(run.state["params"], plan.global_batch(steps.example),
                        *((run.state[extra],) if extra else ())).compile()
  parallel.barrier("compiled the steps")


def memory_levers(config, settings: run_settings.RunSettings) -> list[str]:
  """The config fields (`field=value`) that keep data in host memory."""
  from jaxformer.layers.block_settings import OFFLOADED_REMAT_POLICIES
  fields = ["optim.offload_state=True"] if settings.optim.offload_state else []
  policy = settings.model.get("remat_policy")
  if policy in OFFLOADED_REMAT_POLICIES:
    fields.append(f"model.remat_policy={policy!r}")
  return fields


def offloaded(config, settings: run_settings.RunSettings, plan: parallel.ShardingPlan,
              state_shardings):
  """The train state's shardings with the optimizer state in host memory where
  `optim.offload_state`; a host-memory lever the plan's devices cannot do is refused by its
  field (before anything compiles)."""
  offload.check(memory_levers(config, settings), list(plan.mesh.devices.flat))
  return offload.state_shardings(state_shardings, settings.optim.offload_state)


def jit_train_step(settings: run_settings.RunSettings, plan: parallel.ShardingPlan, module, tx,
                   task: tasks.Task, state_shardings, batch_shardings) -> parallel.CompiledStep:
  """The train step (state, batch, dropout key) -> (state, metrics), jitted for the plan's
  shardings with the state donated: what the loop runs, and what `jaxformer.plan` compiles
  for a TPU topology."""
  t, o = settings.train, settings.optim
  opt_state_in = None
  if o.offload_state:      # host -> device for the update (state_shardings has it on host)
    on_device = offload.on_device(state_shardings["opt_state"])
    opt_state_in = lambda opt_state: jax.device_put(opt_state, on_device)
  sizes = plan.mesh.shape
  param_specs = jax.tree.map(lambda s: s.spec, state_shardings["params"])
  map_axes = step_lib.grad_reduce_axes(
      o.grad_reduce, grad_accum=o.grad_accum, batch_size=t.batch_size,
      batch_axes={a: sizes[a] for a in plan.batch_mesh_axes},
      param_axes=plan.sharded_over(state_shardings["params"]),
      expert_parallel=sizes["expert"] > 1,
      row_sums=task.row_sums)
  return plan.jit(step_lib.make_train_step(
      module, tx, task, label_smoothing=t.label_smoothing, z_loss=t.z_loss,
      grad_accum=o.grad_accum, batch_shards=plan.batch_shards,
      shard_axes=plan.batch_mesh_axes, map_axes=map_axes,
      map_shards=math.prod(sizes[a] for a in map_axes), param_specs=param_specs,
      loss_chunk=t.loss_chunk, opt_state_in=opt_state_in),
      in_shardings=(state_shardings, batch_shardings, plan.replicated),
      out_shardings=(state_shardings, plan.replicated), donate_argnums=(0,),
      name="train_step")


@dataclasses.dataclass
class Writers:
  """Where a run reports: the progress bar, the trackers (metrics.jsonl, TensorBoard, W&B,
  MLflow: `trackers`), the profiler."""
  bar: progress.Progress
  metrics: MetricsWriter
  trackers: trackers_lib.Trackers   # none on the processes that write no files (not process 0)
  profiler: profiling.StepProfiler
  units_per_step: int            # tokens or images, over all processes

  def write(self, record: dict) -> None:
    """A metrics record to metrics.jsonl and the other trackers (on process 0)."""
    self.trackers.log_metrics(record)

  def image(self, name: str, png: bytes, step: int) -> None:
    """A plot (PNG bytes) to the trackers that take images (on process 0)."""
    self.trackers.log_image(step, name, png)


def open_writers(run: Run, steps: Steps, shutdown: contextlib.ExitStack) -> Writers:
  """The progress bar (throughput, MFU), the trackers (process 0; TensorBoard purges the steps
  a resume rewrites, W&B and MLflow continue their runs) and the profiler, each registered for
  shutdown as it opens (the trackers see the exception that ends the run)."""
  t = run.settings.train
  units_per_step = run.task.units_per_batch(steps.first) * jax.process_count()
  peak = accelerators.peak_flops_per_device(dtype=run.settings.model.dtype)
  bar = progress.Progress(
      t.steps, run.start, unit=run.task.unit, units_per_step=units_per_step, window=1,
      flops_per_step=progress.flops_per_step(run.settings.model, run.task, steps.first,
                                            jax.process_count()),
      peak_flops=peak * jax.device_count() if peak else None)
  shutdown.callback(bar.close)
  trackers = trackers_lib.Trackers()
  if run.is_main:
    trackers = trackers_lib.open_trackers(
        t.trackers, run.workdir, metrics=run.metrics, start=run.start,
        logged_through=run.logged_through, project=t.tracker_project, group=t.tracker_group,
        hparams=lambda: trackers_lib.run_hparams(run.config, mesh_shape=run.plan.mesh.shape,
                                                 params=run.state["params"]))
    shutdown.push(trackers.exit)
  profiler = profiling.StepProfiler(run.workdir, t.profile_steps)
  shutdown.callback(profiler.close)
  return Writers(bar, run.metrics, trackers, profiler, units_per_step)
