"""The training loop: config -> trained model in a workdir, resumable at any step.

Workdir: config.json, tokenizer.json (text tasks), checkpoints/ (Orbax, last N),
best/ (params of the best eval steps), metrics.jsonl, samples.txt. Running again on the same
workdir resumes from the latest checkpoint. Batches are a function of (seed, step) (see
`jaxformer.data.batching`) and dropout keys of (seed, step), so the resumed run reproduces
the metrics of an uninterrupted one exactly.

The run's parts: `config_checks` (before anything is written), `run_builder` (plan, pipeline,
state, jitted steps, checkpoint managers, writers), `evaluation` (eval steps and what rides on
them); this module runs the steps and owns the shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os

import jax

from jaxformer import console, paths, workdir_layout
from jaxformer.parallel import StopRequest, watchdog
from jaxformer.state.train_state import LOG_SUMS
from jaxformer.train import config_checks, evaluation, plots, program, run_builder
from jaxformer.train import step as step_lib
from jaxformer.train import workdir as workdir_lib
from jaxformer.train.metrics import read

# the log interval's sums, a small program of its own after each train step (its docstring);
# the sums are donated, `log_every` is fixed for a run
_log_interval = jax.jit(step_lib.log_interval, static_argnums=(3,), donate_argnums=(0,))


RESUME_HINT = "; rerun the same command to resume from the last complete checkpoint"


def train(config, workdir: str, *, fresh: bool = False, stop_after: int | None = None,
          data_changed_ok: bool = False) -> dict:
  """Train (or resume) `config` in `workdir`; returns the last eval record.

  The config is validated and the workdir checked before anything is written (on TPUs the
  train step is compiled first and refused when it cannot fit in HBM); the workdir is
  locked for the run (a second training on it is refused at once). `stop_after` ends the run
  after that many steps as if preempted (for tests/benchmarks). `data_changed_ok`: resume
  although the data changed since the run recorded it (`train.data_record`).
  """
  settings = config_checks.validate(config)
  run_builder.check_workdir(workdir, settings, fresh=fresh)   # before anything is written or compiled
  if jax.devices()[0].platform == "tpu":     # refuse a step that cannot fit before any work
    program.require_fit(config, settings, jax.devices())
  workdir_lib.check_usable(workdir)
  owner = workdir_lib.Lock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()
  with owner, watchdog.Watchdog(settings.train.stall_timeout, resume_hint=RESUME_HINT):
    try:
      return _train(config, settings, workdir, fresh=fresh, stop_after=stop_after,
                    data_changed_ok=data_changed_ok)
    except Exception as e:  # noqa: BLE001  (re-raised unless the disk is full)
      where = console.disk_full_path(e)
      if where is None:
        raise
      raise ValueError(f"no space left on the device of --workdir={workdir!r} ({where}); free "
                       "space and rerun: training resumes from the last complete checkpoint"
                       ) from e


def _train(config, settings, workdir: str, *, fresh: bool, stop_after: int | None,
           data_changed_ok: bool) -> dict:
  """The run, with its shutdown in one place: however it ends (done, preempted, an exception,
  Ctrl-C), the pending asynchronous checkpoint is waited for and the writers are closed."""
  with contextlib.ExitStack() as shutdown:
    return _run(config, settings, workdir, fresh=fresh, stop_after=stop_after,
                data_changed_ok=data_changed_ok, shutdown=shutdown)


def _run(config, settings, workdir: str, *, fresh: bool, stop_after: int | None,
         data_changed_ok: bool, shutdown: contextlib.ExitStack) -> dict:
  """Set up (or find the run finished), step, plot the curves (to the trackers too), shut
  down; then the end-of-training sample, which never holds a checkpoint or a writer open."""
  run = run_builder.open_run(config, settings, workdir, fresh=fresh, data_changed_ok=data_changed_ok,
                       shutdown=shutdown)
  if run.start >= settings.train.steps:
    print(f"{workdir}: already trained for {run.start} steps")
    return _last_eval(run.metrics.path)
  steps = run_builder.make_steps(run)
  watchdog.beat("compiling the steps", run.start, compiling=True)
  run_builder.compile_together(run, steps)
  writers = run_builder.open_writers(run, steps, shutdown)
  evaluator = evaluation.Evaluator(run, steps, writers)
  try:
    state, last_eval, preempted = _step_loop(run, steps, writers, evaluator, stop_after)
  except jax.errors.JaxRuntimeError as e:    # a collective whose peer process is gone
    watchdog.peer_lost(e)                    # several processes: one line, exit
    raise
  records = _records(run.metrics.path) if run.is_main else []   # none: stopped before a log
  if records:                # the curves, also to the trackers (open until the shutdown)
    curves = os.path.join(workdir, workdir_layout.CURVES)
    plots.plot_curves(run.metrics.path, curves)
    writers.image("curves", paths.path(curves).read_bytes(), records[-1]["step"])
  watchdog.beat("closing (the last checkpoint's write)", run.settings.train.steps)
  shutdown.close()           # checkpoints written, writers closed, before the sample
  if not preempted:
    watchdog.beat("the final sample", run.settings.train.steps, compiling=True)
    evaluator.final_sample(state["params"])
  return last_eval


def _step_loop(run: run_builder.Run, steps: run_builder.Steps, writers: run_builder.Writers,
               evaluator: evaluation.Evaluator, stop_after: int | None):
  """Train steps from `run.start` until the end, a stop request or `stop_after` steps:
  (state, last eval record, whether it was stopped early)."""
  t = run.settings.train
  state, last_eval, preempted, previous = run.state, None, False, None
  with StopRequest(run.start) as stop:        # on every process at the same step
    for s in range(run.start, t.steps):
      watchdog.beat("reading data", s + 1)
      batch = run.plan.global_batch(
          steps.first if s == run.start else
          run_builder.prepare(run, state, run.pipeline.train_batch(s), s, train=True))
      watchdog.beat("train step", s + 1, compiling=s == run.start)
      writers.profiler.before(s + 1)
      state, m = steps.train_step(state, batch, steps.dropout_key)
      sums, interval = _log_interval(state[LOG_SUMS], s, m, t.log_every)
      state, m = {**state, LOG_SUMS: sums}, {**m, **interval}
      writers.profiler.after(s + 1, m)
      done = s + 1
      if s == run.start:         # the first step is mostly compilation: rates start after it
        jax.block_until_ready(m["loss"])
        writers.bar.restart_window(done)
      if previous is not None:
        _check_finite(run, *previous)
      previous = (done, m)
      if done % t.log_every == 0 or done == t.steps:
        _log(run, steps, writers, done, m)
      if done % t.eval_every == 0 or done == t.steps:
        last_eval = evaluator(done, state)
      preempted = stop.reached(done) or (stop_after is not None and
                                         done - run.start >= stop_after)
      if (done % t.checkpoint_every == 0 or done == t.steps or preempted
          or done in t.checkpoint_steps):
        _check_finite(run, *previous)          # never save after the run should have stopped
        watchdog.beat("checkpoint", done)
        with writers.bar.paused():
          run.ckpts.save(done, state)
      if preempted:
        break
  return state, last_eval, preempted


class DivergedError(ValueError, FloatingPointError):
  """train.max_skipped_steps non-finite steps in a row. The settings diverged (optim.lr, the
  data), so it is a ValueError, which the CLIs print as one line with exit code 2 like any
  mistake in the settings; still a FloatingPointError for callers that catch that."""


def _check_finite(run: run_builder.Run, done: int, m: dict):
  """Log a skipped update; stop after train.max_skipped_steps in a row. Called one step late,
  so the host never waits for the device between steps (skipped steps leave the state good)."""
  if bool(m["finite"]):
    return
  logging.warning("step %d: non-finite loss or gradient, update skipped", done)
  max_skipped = run.settings.train.max_skipped_steps
  if int(m["skipped"]) >= max_skipped:
    saved = run.ckpts.manager.latest_step()
    kept = (f"the last checkpoint, step {saved}, in {run.workdir}/checkpoints is intact and "
            "a rerun resumes from it" if saved is not None else
            "no checkpoint was saved before it, so a rerun starts from scratch")
    raise DivergedError(
        f"{max_skipped} non-finite steps in a row at step {done}; stopping: {kept} "
        "(lower optim.lr or check the data)")


def _log(run: run_builder.Run, steps: run_builder.Steps, writers: run_builder.Writers, done: int, m: dict):
  """The train record of step `done`: to the progress bar, metrics.jsonl and TensorBoard.
  `loss` (and `accuracy`) are the means over the log interval's steps (`step.make_train_step`;
  one batch's loss is noise), `grad_norm` and `skipped` this step's. Besides the step's own
  metrics (`step.STEP_METRICS`), every metric the task and the model returned, under its own
  name (a list where it is not a scalar: MoE's per-expert load)."""
  record = {"step": done, "loss": float(m["interval_loss"]),
            "lr": float(steps.schedule(done - 1)),
            "grad_norm": float(m["grad_norm"]), "skipped": int(m["skipped"])}
  if run.task.step_accuracy:
    record["accuracy"] = float(m["interval_accuracy"])
  for key in (k for k in m if k not in step_lib.STEP_METRICS):
    value = jax.device_get(m[key])
    record[key] = value.tolist() if value.ndim else float(value)
  writers.bar.update(done, record)
  rate = writers.bar.steps_per_sec()
  if rate:
    record[f"{run.task.unit}_per_sec"] = rate * writers.units_per_step
  if writers.bar.mfu() is not None:
    record["mfu"] = writers.bar.mfu()
  writers.write(record)


def _records(path) -> list[dict]:
  return read(path) if paths.path(path).exists() else []


def _last_eval(path):
  evals = [r for r in _records(path) if "eval_loss" in r]
  return evals[-1] if evals else None
