"""nanoGPT's CPU Shakespeare setup, side by side: jaxformer, the plain-JAX bound, PyTorch.

    python -m experiments.nanogpt_cpu [--steps=2000] [--nanogpt=PATH/TO/nanoGPT] [--only=...]

Same model architecture (4 layers, 4 heads, width 128, context 64, no biases, tied
embeddings), batch (12 x 64), optimizer (AdamW 0.9/0.99, weight decay 0.1 on matrices, lr 1e-3,
100 warmup steps, cosine to 1e-4, clip 1.0) and data (jaxformer's tiny-Shakespeare split: every
implementation trains on the same batches of the same steps and evaluates on the same 20
batches every 250 steps). The initialisations differ: jaxformer's kernels are LeCun-normal,
the plain-JAX and PyTorch rows use nanoGPT's N(0, 0.02), which ends ~0.12 nats higher at 2000
steps; the speed of a step does not depend on it.

Two tables:

1. Whole jobs (wall time: setup, compiles, `--steps` steps and 9 evaluations):
   - `jaxformer (README job)`: `jaxformer.train` itself in this process (checkpoints, metrics,
     evals with attention maps; no end sample, as nanoGPT prints none), with JAX's persistent
     compilation cache off: what a first run costs.
   - `plain JAX`: the fastest hand-written step we have for the same model, no Flax, no
     framework (`--embed=gather|onehot` picks the embedding lookup): the bound that separates
     framework overhead from XLA:CPU.
   - `PyTorch eager`: the same model in PyTorch (nanoGPT's architecture, written here
     independently; torch is in the [test] extra), eager, like nanoGPT's `--compile=False`.
   - `nanoGPT train.py` (with `--nanogpt=PATH`): nanoGPT's own script from that checkout on
     its own Shakespeare-char data (`data/shakespeare_char/prepare.py` must have been run).
   tokens/s there is the median over WINDOW-step windows, compile and evals excluded.
2. Steady state (`--rounds`): jaxformer's jitted train step alone, the plain-JAX step and
   PyTorch, measured in alternating WINDOW-step windows in one process, so a shared machine
   whose speed drifts by 10-20% over minutes slows each alike; the ratios are per window.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import shakespeare_char
from jaxformer import run_settings, tasks
from jaxformer.state import optim as optim_lib
from jaxformer.state import train_state as state_lib
from jaxformer.train import step as step_lib
from jaxformer.train import train
from jaxformer.train.metrics import read

WINDOW = 50            # steps per timing window


def config(steps: int):
  cfg = shakespeare_char.get_config("nanogpt_cpu")
  cfg.train.steps = steps
  cfg.train.sample_tokens = 0
  return cfg


# ----------------------------------------------------------------------------------------
# Plain JAX: the same GPT as pure functions over a dict of arrays.
# ----------------------------------------------------------------------------------------

def init_plain(key, vocab: int, d: int, layers: int, seq: int) -> dict:
  """nanoGPT's init: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)), norms 1."""
  keys = iter(jax.random.split(key, 2 + 4 * layers))
  normal = lambda shape, std=0.02: std * jax.random.normal(next(keys), shape, jnp.float32)
  resid = 0.02 / math.sqrt(2 * layers)
  return {"wte": normal((vocab, d)), "wpe": normal((seq, d)), "ln_f": jnp.ones((d,)),
          "layers": [{"ln1": jnp.ones((d,)), "qkv": normal((d, 3 * d)),
                      "proj": normal((d, d), resid), "ln2": jnp.ones((d,)),
                      "fc": normal((d, 4 * d)), "fc_proj": normal((4 * d, d), resid)}
                     for _ in range(layers)]}


def _layernorm(x, scale, eps=1e-5):
  mean = x.mean(-1, keepdims=True)
  var = jnp.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * scale


def plain_logits(params, tokens, heads: int, embed: str):
  b, t = tokens.shape
  vocab, d = params["wte"].shape
  if embed == "onehot":
    x = jax.nn.one_hot(tokens, vocab, dtype=jnp.float32) @ params["wte"]
  else:
    x = params["wte"][tokens]
  x = (x + params["wpe"][:t]).reshape(b * t, d)        # 2-D matmuls: faster on XLA:CPU
  causal = jnp.tril(jnp.ones((t, t), bool))
  for p in params["layers"]:
    h = _layernorm(x, p["ln1"]) @ p["qkv"]
    q, k, v = (h.reshape(b, t, 3, heads, d // heads).transpose(2, 0, 3, 1, 4))
    att = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), -jnp.inf)
    y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b * t, d)
    x = x + y @ p["proj"]
    x = x + jax.nn.gelu(_layernorm(x, p["ln2"]) @ p["fc"]) @ p["fc_proj"]
  return (_layernorm(x, params["ln_f"]) @ params["wte"].T).reshape(b, t, vocab)


def plain_loss(params, batch, heads: int, embed: str):
  logits = plain_logits(params, batch["inputs"], heads, embed)
  logp = jax.nn.log_softmax(logits)
  return -jnp.take_along_axis(logp, batch["targets"][..., None], -1).mean()


def plain_functions(cfg, embed: str):
  m = cfg.model
  tx = optim_lib.make_optimizer(run_settings.parse_section("optim", cfg.optim),
                                cfg.train.steps)                 # same AdamW, mask, schedule

  @jax.jit
  def init():
    params = init_plain(jax.random.key(0), m.vocab_size, m.d_model, m.num_layers, m.max_len)
    return params, tx.init(params)

  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(plain_loss)(params, batch, m.num_heads, embed)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def eval_loss(params, batch):
    logits = plain_logits(params, batch["inputs"], m.num_heads, embed)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)
    w = batch["valid"][:, None] * jnp.ones(nll.shape[:2])
    return jnp.sum(nll[..., 0] * w), jnp.sum(w)

  return init, jax.jit(step, donate_argnums=(0, 1)), jax.jit(eval_loss)


# ----------------------------------------------------------------------------------------
# Runners: each returns dict(tokens_per_sec, wall, eval_loss)
# ----------------------------------------------------------------------------------------

def timed_job(cfg, steps: int, step, sync, evaluate=None) -> dict:
  """`step(s)` for s < steps, `evaluate()` every train.eval_every steps and at the end.
  tokens/s: median over WINDOW-step windows after the first (compile), eval time excluded
  (`sync()` waits for the device at window ends); wall: the whole job."""
  start = t0 = time.perf_counter()
  rates, last, tokens = [], None, cfg.train.batch_size * cfg.data.seq_len
  for s in range(steps):
    step(s)
    done = s + 1
    if done % WINDOW == 0:
      sync()
      now = time.perf_counter()
      if done > WINDOW:
        rates.append(WINDOW * tokens / (now - t0))
      t0 = now
    if evaluate is not None and (done % cfg.train.eval_every == 0 or done == steps):
      last = evaluate()
      t0 = time.perf_counter()
  return {"tokens_per_sec": statistics.median(rates), "wall": time.perf_counter() - start,
          "eval_loss": last}


def run_jaxformer(cfg, steps: int) -> dict:
  workdir = tempfile.mkdtemp(prefix="nanogpt_cpu_")
  try:
    start = time.perf_counter()
    last = train(cfg, workdir)
    wall = time.perf_counter() - start
    records = read(os.path.join(workdir, "metrics.jsonl"))
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  speed = statistics.median(r["tokens_per_sec"] for r in records if "tokens_per_sec" in r)
  return {"tokens_per_sec": speed, "wall": wall, "eval_loss": last["eval_loss"]}


def jaxformer_step(cfg, pipeline):
  """jaxformer's own train step (model, loss, optimizer, skip-on-non-finite), no loop:
  (step(s), sync(), evaluate=None)."""
  module, tx, init_boxed = state_lib.train_state_fns(cfg)
  fn = jax.jit(step_lib.make_train_step(module, tx, tasks.task_for(cfg.model)),
               donate_argnums=(0,))
  carry = {"state": jax.jit(lambda: nn.unbox(init_boxed()))(), "m": None}
  key = jax.random.key(1)

  def step(s):
    carry["state"], carry["m"] = fn(carry["state"], pipeline.train_batch(s), key)

  return step, lambda: jax.block_until_ready(carry["m"]), None


def plain_step(cfg, pipeline, embed: str):
  init, step_fn, eval_fn = plain_functions(cfg, embed)
  carry = {"state": init(), "loss": None}
  eval_batches = list(pipeline.eval_batches())

  def step(s):
    params, opt_state, carry["loss"] = step_fn(*carry["state"], pipeline.train_batch(s))
    carry["state"] = (params, opt_state)

  def evaluate():
    sums = [eval_fn(carry["state"][0], b) for b in eval_batches]
    return float(sum(x for x, _ in sums) / sum(n for _, n in sums))

  return step, lambda: jax.block_until_ready(carry["loss"]), evaluate


def torch_step(cfg, pipeline, steps: int, threads: int):
  import torch

  from experiments import nanogpt_torch
  torch.set_num_threads(threads)
  model, opt, schedule = nanogpt_torch.build(cfg)
  lrs = np.asarray(jax.vmap(schedule)(jnp.arange(steps)))
  eval_batches = [{k: torch.from_numpy(np.asarray(v)) for k, v in b.items()}
                  for b in pipeline.eval_batches()]

  def step(s):
    batch = pipeline.train_batch(s)
    nanogpt_torch.train_step(model, opt, float(lrs[min(s, steps - 1)]),
                             torch.from_numpy(batch["inputs"]),
                             torch.from_numpy(batch["targets"]), clip=float(cfg.optim.clip))

  return step, lambda: None, lambda: nanogpt_torch.evaluate(model, eval_batches)


def alternating(cfg, runners: dict, rounds: int) -> dict:
  """Steady-state tokens/s of several implementations measured in alternating WINDOW-step
  windows (after one warm-up window each, which compiles), so a machine whose speed drifts
  (a shared host) slows every implementation alike: {name: [tokens/s per window]}."""
  tokens = cfg.train.batch_size * cfg.data.seq_len
  done = {name: 0 for name in runners}
  rates = {name: [] for name in runners}
  for r in range(rounds + 1):
    for name, (step, sync, _) in runners.items():
      start = time.perf_counter()
      for _ in range(WINDOW):
        step(done[name])
        done[name] += 1
      sync()
      if r:
        rates[name].append(WINDOW * tokens / (time.perf_counter() - start))
  return rates


def run_nanogpt(path: str, cfg, steps: int) -> dict:
  """nanoGPT's own train.py on its Shakespeare-char data, our sizes; its ms/iter lines."""
  m, t = cfg.model, cfg.train
  args = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
          "--compile=False", f"--n_layer={m.num_layers}", f"--n_head={m.num_heads}",
          f"--n_embd={m.d_model}", f"--block_size={cfg.data.seq_len}",
          f"--batch_size={t.batch_size}", f"--max_iters={steps}", f"--lr_decay_iters={steps}",
          "--dropout=0.0", f"--eval_interval={t.eval_every}", "--eval_iters=20",
          "--log_interval=10", "--always_save_checkpoint=False",
          f"--out_dir={tempfile.mkdtemp(prefix='nanogpt_out_')}"]
  start = time.perf_counter()
  out = subprocess.run(args, cwd=path, capture_output=True, text=True, check=True).stdout
  wall = time.perf_counter() - start
  ms = [float(x) for x in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", out)][2:]
  val = re.findall(r"val loss ([\d.]+)", out)
  b, tt = t.batch_size, cfg.data.seq_len
  return {"tokens_per_sec": b * tt * 1000 / statistics.median(ms), "wall": wall,
          "eval_loss": float(val[-1]) if val else None}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--rounds", type=int, default=8,
                      help=f"alternating {WINDOW}-step windows per implementation (0: none)")
  parser.add_argument("--embed", choices=("gather", "onehot"), default="gather")
  parser.add_argument("--nanogpt", default=None, help="a nanoGPT checkout to run as well")
  parser.add_argument("--threads", type=int, default=os.cpu_count(),
                      help="PyTorch intra-op threads (default: all cores, as nanoGPT)")
  parser.add_argument("--only", nargs="*", default=None,
                      choices=("jaxformer", "step", "plain", "torch", "nanogpt"))
  args = parser.parse_args()
  cfg = config(args.steps)
  pipeline = tasks.get("lm").make_pipeline(cfg, run_settings.parse(cfg),
                                           workdir=tempfile.mkdtemp(prefix="nanogpt_data_"))
  want = set(args.only or ("jaxformer", "step", "plain", "torch", "nanogpt"))
  plain_name = f"plain JAX ({args.embed})"
  runners = {"step": ("jaxformer step alone", lambda: jaxformer_step(cfg, pipeline)),
             "plain": (plain_name, lambda: plain_step(cfg, pipeline, args.embed)),
             "torch": ("PyTorch eager",
                       lambda: torch_step(cfg, pipeline, args.steps, args.threads))}
  chosen = {name: make for key, (name, make) in runners.items() if key in want}

  jobs = []                          # whole jobs: steps + evaluations, wall time
  if "jaxformer" in want:
    jobs.append(("jaxformer (README job)", run_jaxformer(cfg, args.steps)))
  for key in ("plain", "torch"):     # jaxformer's whole job is the README-job row
    if key in want:
      name, make = runners[key]
      jobs.append((name, timed_job(cfg, args.steps, *make())))
  if "nanogpt" in want and args.nanogpt:
    jobs.append(("nanoGPT train.py", run_nanogpt(args.nanogpt, cfg, args.steps)))
  rates = alternating(cfg, {name: make() for name, make in chosen.items()}, args.rounds
                      ) if args.rounds and chosen else {}

  print(f"\n{args.steps} steps of {cfg.train.batch_size} x {cfg.data.seq_len} tokens, "
        f"jax {jax.__version__}, {os.cpu_count()} CPUs\n")
  base = next((r["tokens_per_sec"] for n, r in jobs if n.startswith("PyTorch")), None)
  print("| whole job | tokens/s | vs PyTorch | wall (s) | final eval loss |")
  print("|---|---:|---:|---:|---:|")
  for name, r in jobs:
    ratio = f"{r['tokens_per_sec'] / base:.2f}x" if base else "-"
    loss = f"{r['eval_loss']:.4f}" if r.get("eval_loss") is not None else "-"
    print(f"| {name} | {r['tokens_per_sec']:,.0f} | {ratio} | {r['wall']:.0f} | {loss} |")
  if rates:
    ref = rates.get("PyTorch eager")
    print(f"\nSteady state, {args.rounds} alternating windows of {WINDOW} steps each "
          "(ratios per window, then the median):\n")
    print("| step | tokens/s (median) | vs PyTorch | vs plain JAX |")
    print("|---|---:|---:|---:|")
    for name, r in rates.items():
      per = lambda other: (f"{statistics.median(a / b for a, b in zip(r, other)):.2f}x"
                           if other else "-")
      print(f"| {name} | {statistics.median(r):,.0f} | {per(ref)} | "
            f"{per(rates.get(plain_name))} |")


if __name__ == "__main__":
  main()
