"""Which attention `attention_impl="auto"` runs on TPU: each impl's estimated time, planned.

Compiles (never runs) one layer's attention forward + backward,
`jit(grad(sum(attention(q, k, v) * ct)))`, for compile-only TPU devices of a generation (one
chip, inside a one-device mesh so the kernels are built for the TPU: `target_platform`), at a
model's per-chip shapes, and estimates its time the way the planner does
(`jaxformer.plan.estimate`): the compiler's estimated cycles for XLA ops, plus custom kernels
at `plan_estimate.KERNEL_EFFICIENCY` of their roofline (our Pallas kernel from its cost_estimate,
splash from its block map). Prints one row per impl: per layer, and per step (x layers;
a forward recomputed under full remat is not included).

Default: Llama-2 7B (32 heads of 128, MHA, causal) at T=4096, 2 rows per chip, bf16, v5e.
Usage: python -m experiments.tpu_attention_choice [--topology v5e:2x2] [--batch 2]
           [--seq 4096] [--heads 32] [--kv_heads 32] [--head_dim 128] [--layers 32]
           [--impls xla blocked pallas splash auto]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jaxformer.ops import attention as attention_ops  # noqa: E402
from jaxformer import accelerators  # noqa: E402
from jaxformer.plan import estimate as plan_estimate, hlo, topology as topology_lib  # noqa: E402


def estimate(impl: str, args, device, chip) -> dict:
  mesh = Mesh([device], ("data",))
  sharding = NamedSharding(mesh, P())
  q = jax.ShapeDtypeStruct((args.batch, args.seq, args.heads, args.head_dim), jnp.bfloat16,
                           sharding=sharding)
  kv = jax.ShapeDtypeStruct((args.batch, args.seq, args.kv_heads, args.head_dim),
                            jnp.bfloat16, sharding=sharding)

  def loss(q, k, v, ct):
    out = attention_ops.dot_product_attention(q, k, v, causal=True, impl=impl)
    return jnp.sum(out.astype(jnp.float32) * ct)

  with jax.set_mesh(mesh):
    resolved = attention_ops.resolve_impl(impl, q, kv, kv)
    start = time.perf_counter()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, q).compile()
  seconds = time.perf_counter() - start
  stats = hlo.analyse(compiled.as_text(), mesh)
  model = dict(family="decoder", num_heads=args.heads, num_kv_heads=args.kv_heads,
               d_model=args.heads * args.head_dim, mlp_dim=4 * args.heads * args.head_dim,
               vocab_size=32000, num_layers=1)
  kernels = plan_estimate.kernel_summary(stats, chip,
                                         plan_estimate.splash_kernel_flops(stats, model))
  xla = stats.estimated_cycles / chip.clock_hz
  layer = xla + kernels["seconds"]
  return dict(impl=impl, resolved=resolved, compile=seconds, xla_ms=1e3 * xla,
              kernel_roofline_ms=1e3 * kernels["roofline_seconds"],
              kernel_ms=1e3 * kernels["seconds"], kernel_flops=kernels["flops"],
              layer_ms=1e3 * layer, step_s=layer * args.layers,
              temp_mib=compiled.memory_analysis().temp_size_in_bytes / 2**20)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--topology", default="v5e:2x2")
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--seq", type=int, default=4096)
  parser.add_argument("--heads", type=int, default=32)
  parser.add_argument("--kv_heads", type=int, default=32)
  parser.add_argument("--head_dim", type=int, default=128)
  parser.add_argument("--layers", type=int, default=32)
  parser.add_argument("--impls", nargs="+", default=["xla", "blocked", "pallas", "splash",
                                                     "auto"])
  args = parser.parse_args(argv)
  device = topology_lib.devices(args.topology)[0]
  chip = accelerators.CHIPS[topology_lib.generation(args.topology)]
  print(f"{args.topology} ({chip.name}), B={args.batch} T={args.seq} H={args.heads} "
        f"Hkv={args.kv_heads} D={args.head_dim} bf16 causal, fwd+bwd of one layer; kernels "
        f"at {plan_estimate.KERNEL_EFFICIENCY:.0%} of their roofline")
  print("| impl | runs | XLA ops ms | kernels at roofline ms | kernels charged ms | "
        "layer ms | step s (x layers) | temp MiB |")
  print("|---|---|---:|---:|---:|---:|---:|---:|")
  for impl in args.impls:
    r = estimate(impl, args, device, chip)
    print(f"| {r['impl']} | {r['resolved']} | {r['xla_ms']:.2f} | "
          f"{r['kernel_roofline_ms']:.2f} | {r['kernel_ms']:.2f} | {r['layer_ms']:.2f} | "
          f"{r['step_s']:.3f} | {r['temp_mib']:.0f} |", flush=True)


if __name__ == "__main__":
  main()
