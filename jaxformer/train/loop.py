"""The training loop: config -> trained model in a workdir, resumable at any step.

Workdir: config.json, tokenizer.json, checkpoints/ (Orbax), metrics.jsonl, samples.txt.
Running again on the same workdir resumes from the latest checkpoint; batches are a function
of (seed, step) and dropout keys of (seed, step), so the resumed run reproduces the metrics of
an uninterrupted one exactly.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import models, sampling
from jaxformer.data.text import TextCorpus
from jaxformer.train import checkpoint, optim, step as step_lib
from jaxformer.train.metrics import MetricsWriter, read

SUPPORTED_FAMILIES = ("decoder",)


def _validate(config):
  family = config.model.get("family")
  if family not in SUPPORTED_FAMILIES:
    raise ValueError(f"model.family={family!r}: this training loop trains language models "
                     f"({SUPPORTED_FAMILIES}); other families are not wired in yet")
  for key in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every"):
    value = config.train.get(key)
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"train.{key}={value!r} must be an int >= 1")
  seq_len = config.data.seq_len
  if not isinstance(seq_len, int) or seq_len < 1:
    raise ValueError(f"data.seq_len={seq_len!r} must be an int >= 1")
  if config.model.get("positions", "learned") == "learned" and seq_len > config.model.max_len:
    raise ValueError(f"data.seq_len={seq_len} exceeds model.max_len={config.model.max_len} "
                     "(the learned position table); lower data.seq_len or raise model.max_len")
  models.build(config.model)              # every model field is checked here


def _check_workdir_config(config, workdir: str, fresh: bool):
  """Refuse to resume a run whose model differs from the saved one (unless `fresh`)."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path) and not fresh:
    with open(path) as f:
      saved = json.load(f)
    if saved.get("model") != json.loads(config.model.to_json()):
      changed = sorted(k for k in set(saved.get("model", {})) | set(config.model)
                       if saved.get("model", {}).get(k) != config.model.get(k))
      raise ValueError(f"{workdir} holds a run with a different model (fields {changed}); "
                       "use a new --workdir, or --fresh to discard its checkpoints")
  with open(path, "w") as f:
    f.write(config.to_json(indent=2))


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


def train_state_fns(config):
  """(module, optimizer, init_state): init_state() builds the train state pytree
  {'step', 'params', 'opt_state', 'skipped'}; its eval_shape is the checkpoint layout."""
  module = models.build(config.model)
  tx = optim.make_optimizer(config.optim, config.train.steps)
  init_key = jax.random.split(jax.random.key(config.train.seed))[0]

  def init_state():
    dummy = jnp.zeros((1, config.data.seq_len), jnp.int32)
    params = nn.unbox(module.init(init_key, dummy))["params"]
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
            "skipped": jnp.zeros((), jnp.int32)}

  return module, tx, init_state


def train(config, workdir: str, *, fresh: bool = False, stop_after: int | None = None) -> dict:
  """Train (or resume) `config` in `workdir`; returns the last eval record.

  `stop_after` ends the run after that many steps as if preempted (for tests/benchmarks).
  """
  _validate(config)
  os.makedirs(workdir, exist_ok=True)
  if fresh:                               # explicitly asked: discard the previous run
    shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)
    if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
      os.remove(os.path.join(workdir, "metrics.jsonl"))
  _check_workdir_config(config, workdir, fresh)

  t, d = config.train, config.data
  corpus = TextCorpus(d.source, train_fraction=d.get("train_fraction", 0.9))
  if corpus.tokenizer.vocab_size != config.model.vocab_size:
    raise ValueError(f"model.vocab_size={config.model.vocab_size} but the {d.source!r} "
                     f"tokenizer has {corpus.tokenizer.vocab_size} symbols; set "
                     f"--config.model.vocab_size={corpus.tokenizer.vocab_size}")
  corpus.tokenizer.save(os.path.join(workdir, "tokenizer.json"))

  module, tx, init_state = train_state_fns(config)
  schedule = optim.learning_rate_schedule(config.optim, t.steps)
  dropout_key = jax.random.split(jax.random.key(t.seed))[1]
  ckpts = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"),
                                 keep=t.get("keep_checkpoints", 3))
  metrics = MetricsWriter(os.path.join(workdir, "metrics.jsonl"))
  restored = ckpts.restore_latest(jax.eval_shape(init_state))
  if restored is None:
    state, start = jax.jit(init_state)(), 0
    metrics.truncate_after(-1)
  else:
    start, state = restored
    metrics.truncate_after(start)
    logging.info("resuming from step %d", start)
  if start >= t.steps:
    ckpts.close()
    print(f"{workdir}: already trained for {start} steps")
    return _last_eval(os.path.join(workdir, "metrics.jsonl"))

  train_step = step_lib.make_train_step(module, tx,
                                        label_smoothing=t.get("label_smoothing", 0.0),
                                        z_loss=t.get("z_loss", 0.0))
  eval_step = step_lib.make_eval_step(module)
  batch = lambda split, s: corpus.batch(split, s, batch_size=t.batch_size,
                                         seq_len=d.seq_len, seed=t.seed)
  eval_batches = t.get("eval_batches", 20)
  tokens_per_step = t.batch_size * d.seq_len
  max_skipped = t.get("max_skipped_steps", 5)
  last_eval, window_start, window_steps = None, time.perf_counter(), 0

  with _StopRequest() as stop:
    for s in range(start, t.steps):
      state, m = train_step(state, batch("train", s), dropout_key)
      done = s + 1
      window_steps += 1
      if not bool(m["finite"]):
        logging.warning("step %d: non-finite loss or gradient, update skipped", done)
        if int(state["skipped"]) >= max_skipped:
          raise FloatingPointError(
              f"{max_skipped} non-finite steps in a row at step {done}; stopping. The last "
              f"good checkpoint in {workdir}/checkpoints is intact (lower optim.lr or check "
              "the data)")
      if done % t.log_every == 0 or done == t.steps:
        elapsed = time.perf_counter() - window_start
        record = {"step": done, "loss": float(m["loss"]), "lr": float(schedule(s)),
                  "grad_norm": float(m["grad_norm"]), "skipped": int(state["skipped"]),
                  "tokens_per_sec": tokens_per_step * window_steps / elapsed}
        metrics.write(record)
        eta = (t.steps - done) * elapsed / window_steps
        print(f"step {done:>6d}/{t.steps}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
              f"{record['tokens_per_sec']:,.0f} tok/s  eta {eta:.0f}s", flush=True)
        window_start, window_steps = time.perf_counter(), 0
      if done % t.eval_every == 0 or done == t.steps:
        eval_start = time.perf_counter()
        results = [eval_step(state["params"], batch("validation", i))
                   for i in range(eval_batches)]
        last_eval = {"step": done,
                     "eval_loss": float(np.mean([r["loss"] for r in results])),
                     "eval_accuracy": float(np.mean([r["accuracy"] for r in results]))}
        metrics.write(last_eval)
        print(f"step {done:>6d}  eval_loss {last_eval['eval_loss']:.4f}  "
              f"eval_accuracy {last_eval['eval_accuracy']:.3f}", flush=True)
        window_start += time.perf_counter() - eval_start    # throughput excludes eval
      preempted = stop.requested or (stop_after is not None and done - start >= stop_after)
      if done % t.checkpoint_every == 0 or done == t.steps or preempted:
        ckpts.save(done, state)
      if preempted:
        break
  ckpts.close()
  if not preempted and t.get("sample_tokens", 0):
    text = sampling.sample_text(config, state["params"], corpus.tokenizer,
                                prompt=t.get("sample_prompt", "\n"),
                                max_new_tokens=t.sample_tokens, temperature=0.8, top_k=20,
                                seed=t.seed)
    with open(os.path.join(workdir, "samples.txt"), "a") as f:
      f.write(f"--- step {t.steps}\n{text}\n")
    print(f"\n--- sample after {t.steps} steps ---\n{text}\n", flush=True)
  return last_eval


def _last_eval(path):
  evals = [r for r in read(path) if "eval_loss" in r] if os.path.exists(path) else []
  return evals[-1] if evals else None
