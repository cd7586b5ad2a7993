"""Evaluation during training and what rides on it: the split-level eval metrics, attention
maps, `train.evaluators` (`train.evaluators`), the best checkpoints and text samples (every
`train.sample_every` steps and at the end).
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxformer import inference, paths, workdir_layout
from jaxformer.parallel import watchdog
from jaxformer.train import attention_maps, evaluators
from jaxformer.train import run_builder
from jaxformer.train.run_builder import Run, Steps, Writers


def evaluate(eval_step, params, pipeline, task, plan, extra=None, *, step: int = 0,
             prepare=None) -> dict:
  """Split-level eval metrics from per-batch sums (padded rows carry zero weight); `extra`:
  the train-state entry the task also reads (`Task.extra_state`), passed to the eval step.

  Each batch's sums are fetched to the host before the next batch is dispatched, and summed
  there (in their own dtype: the same numbers as an on-device sum). Why: dispatching every
  eval batch (and a device-side add per batch) without waiting queued ~40 multi-device
  programs with collectives behind the train step; with several CPU processes that deadlocked
  XLA's per-device launch queues in 2 of 11 runs under load (docs/design/parallelism.md, "No
  process waits forever"). One host round trip per eval batch costs nothing next to the eval step itself."""
  jax.block_until_ready(params)          # no train step still running beside the eval steps
  totals = None
  for i, batch in enumerate(pipeline.eval_batches()):
    watchdog.beat("evaluation", step, compiling=i == 0)
    args = () if task.extra_state is None else (extra,)
    if prepare is not None:              # a task's host-side rollout (Task.rolls_out)
      batch = prepare(batch)
    sums = jax.device_get(eval_step(params, plan.global_batch(batch), *args))
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
  return task.finalize(totals)


def token_labels(pipeline, ids) -> list[str] | None:
  """The attention map's axis labels for a text example: the tokenizer's text of each id,
  "[MASK]" for the id MLM appends after the vocabulary, "<id>" for any other id past it."""
  tokenizer = getattr(pipeline, "tokenizer", None)
  if tokenizer is None:
    return None
  mask_id = getattr(pipeline, "mask_id", None)
  return ["[MASK]" if i == mask_id else tokenizer.decode([i]) if 0 <= i < tokenizer.vocab_size
          else f"<{i}>" for i in map(int, ids)]


class Evaluator:
  """What a run does at an eval step: metrics (logged and written), an attention map, a best
  checkpoint when the eval beats a kept one, and a sample every `train.sample_every` steps."""

  def __init__(self, run: Run, steps: Steps, writers: Writers):
    self.run, self.steps, self.writers = run, steps, writers
    t = run.settings.train
    # the map, and train.evaluators, on process 0 from the whole params: with several
    # processes every process takes part in gathering them (`evaluators.gather_params`), on
    # the same condition (these settings), so none waits at a collective the others skip
    self.show_attention = t.attention_maps
    self.gather = bool(t.attention_maps or t.evaluators)
    if self.show_attention and run.is_main:
      self.snapshot_fn = attention_maps.make_snapshot_fn(run.module, run.task)
      self.labels = (token_labels(run.pipeline, steps.example[run.task.inputs[0]][0])
                     if run.task.text else None)
    self.evaluators = evaluators.Evaluators(run, steps) if run.is_main else None
    self.samples = run.task.samples and t.sample_tokens
    self.sample_every = t.sample_every      # 0: one sample at the end of training

  def __call__(self, done: int, state) -> dict:
    """The eval record of step `done` from the train state `state`."""
    run, bar = self.run, self.writers.bar
    params = state["params"]
    extra = state[run.task.extra_state] if run.task.extra_state is not None else None
    with bar.paused():
      prepare = ((lambda b: run_builder.prepare(run, state, b, done, train=False))
                 if run.task.rolls_out else None)
      record = {"step": done, **evaluate(self.steps.eval_step, params, run.pipeline, run.task,
                                         run.plan, extra, step=done, prepare=prepare)}
      groups = {}
      if self.gather:
        watchdog.beat("attention map and train.evaluators", done, compiling=True)
        whole = evaluators.gather_params(params)
        if run.is_main:
          record.update(self._attention(whole, done))
          groups = self.evaluators(whole, done)
          record.update(evaluators.flat(groups))
      bar.log(f"step {done:>6d}  " + "  ".join(
          f"{k} {v:.4f}" for k, v in record.items()
          if k != "step" and not k.startswith(tuple(f"eval_{n}/" for n in groups))))
      for name, group in groups.items():
        bar.log(f"{'':13s}eval_{name}: " + "  ".join(f"{k} {v:.4f}" for k, v in group.items()))
      self.writers.write(record)
      if run.best is not None:
        run.best.maybe_save(done, params, record)
      if (self.samples and self.sample_every and done % self.sample_every == 0
          and done < run.settings.train.steps):
        write_sample(run, params, done)
    return record

  def _attention(self, params, done: int) -> dict:
    """The attention map of the fixed example (to the workdir and the trackers) and its mean
    head entropy, on process 0."""
    if not self.show_attention:
      return {}
    run = self.run
    shown = attention_maps.write_attention_map(
        self.snapshot_fn, params, self.steps.example, step=done, workdir=run.workdir,
        tokens=self.labels, images=run.task.unit == "images")
    if shown is None:               # no layer records probabilities (attention variants)
      return {}
    png, entropy = shown
    self.writers.image("attention", paths.path(png).read_bytes(), done)
    return {"attention_entropy": float(np.mean(entropy))}

  def final_sample(self, params) -> None:
    """The end-of-training sample (language models with train.sample_tokens > 0)."""
    if self.samples:
      write_sample(self.run, params, self.run.settings.train.steps)


def write_sample(run: Run, params, step: int):
  """Append a seeded sample of the current model to samples.txt (and print it).

  A sample is a by-product: if it fails, the error is logged and training (or the finished
  run, whose checkpoints are already saved) goes on."""
  t, tokenizer = run.settings.train, run.pipeline.tokenizer
  if jax.process_count() > 1:          # every process samples from the whole params
    params = multihost_utils.process_allgather(params, tiled=True)
  try:
    text = inference.sample_text(run.config, params, tokenizer,
                                 prompt=t.sample_prompt,
                                 max_new_tokens=t.sample_tokens, temperature=0.8, top_k=20,
                                 seed=t.seed)
  except Exception as e:  # noqa: BLE001  (never fail a run for its sample)
    logging.exception("sample after %d steps failed; the run's checkpoints and metrics are "
                      "kept", step)
    print(f"warning: sample after {step} steps failed ({type(e).__name__}: {e}); the run "
          "itself is complete", flush=True)
    return
  if run.is_main:
    paths.append_text(os.path.join(run.workdir, workdir_layout.SAMPLES),
                      f"--- step {step}\n{text}\n")
  print(f"\n--- sample after {step} steps ---\n{text}\n", flush=True)
