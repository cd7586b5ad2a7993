"""Sharding benchmark: what each mesh layout costs on 8 CPU devices, and GPT-2 small MFU on
one GPU when there is one.

    python -m experiments.bench_sharding [--steps=10] [--gpu_batch=8]

Both parts time the training's own step (`jaxformer.state.train_state` and `jaxformer.train.step`:
GPT-2 small's AdamW settings, clipping, dropout as the model sets it, the non-finite-step
guard) jitted through `ShardingPlan`.

CPU part: a small GPT (d_model 128, 8 heads, 4 layers, context 64, batch 16) on every
(data, model, expert) mesh of 8 fake CPU devices, with and without FSDP: step compile time,
median step time, per-device parameter bytes; printed as a markdown table. (CPU "devices"
share the host's cores, so step times show partitioning overhead, not speed-ups.)

GPU part (skipped without a GPU): GPT-2 small in bfloat16 on one device, context 1024:
tokens/s and model FLOPs utilisation = flops_per_token * tokens/s / peak bf16 FLOP/s.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = " ".join(  # 8 CPU devices; must happen before JAX is imported
    [f for f in os.environ.get("XLA_FLAGS", "").split()
     if not f.startswith("--xla_force_host_platform_device_count")]
    + ["--xla_force_host_platform_device_count=8"])

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402

from configs import gpt2  # noqa: E402
from jaxformer import accelerators, scaling, tasks  # noqa: E402
from jaxformer.parallel import ShardingPlan, per_device_bytes  # noqa: E402
from jaxformer.train import state as state_lib, step as step_lib  # noqa: E402

MESHES = [(8, 1, 1), (4, 2, 1), (2, 4, 1), (1, 8, 1)]
CPU_MODEL = dict(family="decoder", vocab_size=256, d_model=128, num_layers=4, num_heads=8,
                 mlp_dim=512, max_len=64, positions="learned", norm="layernorm",
                 use_bias=False, tie_embeddings=True, attention_impl="xla")


def time_steps(plan, config, batch_size, seq_len, steps):
  """(compile seconds, median step seconds, per-device param bytes) of the training step."""
  module, tx, init_boxed = state_lib.train_state_fns(config)
  state, shardings = plan.init_state(init_boxed)
  tokens = np.random.default_rng(0).integers(0, config.model.vocab_size,
                                             (batch_size, seq_len + 1), np.int32)
  batch = plan.global_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]})
  step = plan.jit(step_lib.make_train_step(module, tx, tasks.task_for(config.model)),
                  in_shardings=(shardings, {k: plan.batch_sharding(2) for k in batch},
                                plan.replicated),
                  out_shardings=(shardings, plan.replicated), donate_argnums=(0,))
  dropout_key = plan.replicate(jax.random.key(0))
  state, metrics = step(state, batch, dropout_key)
  metrics["loss"].block_until_ready()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = step(state, batch, dropout_key)
    metrics["loss"].block_until_ready()
    times.append(time.perf_counter() - start)
  return step.compile_seconds[0], statistics.median(times), per_device_bytes(state["params"])


def cpu_table(steps: int, batch_size: int = 16, seq_len: int = 64) -> str:
  devices = jax.devices("cpu")
  config = gpt2.get_config("small")
  config.model = ConfigDict(CPU_MODEL)
  rows = ["| mesh (data, model, expert) | fsdp | compile s | step ms | param KiB / device |",
          "|---|---|---|---|---|"]
  for shape in MESHES:
    for fsdp in (False, True):
      if fsdp and shape[0] == 1:
        continue                      # FSDP over a data axis of size 1 is plain TP
      plan = ShardingPlan.from_config(dict(data=shape[0], model=shape[1], expert=shape[2],
                                           fsdp=fsdp), devices)
      compile_s, step_s, nbytes = time_steps(plan, config, batch_size, seq_len, steps)
      rows.append(f"| {shape} | {fsdp} | {compile_s:.2f} | {1e3 * step_s:.1f} | "
                  f"{nbytes / 1024:.0f} |")
      print(rows[-1], file=sys.stderr, flush=True)       # progress
  return "\n".join(rows)


def gpu_report(batch_size: int, steps: int, seq_len: int = 1024) -> str:
  """GPT-2 small (bf16 compute, float32 params) on one GPU: tokens/s and MFU."""
  device = jax.devices("gpu")[0]
  config = gpt2.get_config("small")
  plan = ShardingPlan.from_config(dict(data=1, model=1, expert=1), [device])
  _, step_s, _ = time_steps(plan, config, batch_size, seq_len, steps)
  tokens_per_s = batch_size * seq_len / step_s
  flops = scaling.flops_per_token(config.model, seq_len) * tokens_per_s
  peak = accelerators.peak_flops_per_device(device, dtype="bfloat16")   # the one table
  mfu = f"{100 * flops / peak:.1f}%" if peak else "n/a (unknown peak)"
  return (f"{device.device_kind}: GPT-2 small bf16, batch {batch_size} x {seq_len}: "
          f"{tokens_per_s:,.0f} tokens/s, {flops / 1e12:.1f} TFLOP/s, MFU {mfu}")


def _has_gpu() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
  parser.add_argument("--gpu_batch", type=int, default=8)
  args = parser.parse_args()
  print(cpu_table(args.steps))
  if _has_gpu():
    print(gpu_report(args.gpu_batch, args.steps))


if __name__ == "__main__":
  main()
