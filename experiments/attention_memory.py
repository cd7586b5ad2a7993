"""Compiled temporary memory of attention forward+backward: impl="xla" vs impl="blocked".

For each sequence length T this lowers and compiles (never runs, never allocates the inputs)
`jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))` with
`loss(q, k, v, ct) = sum(attention(q, k, v) * ct)`, where `ct` is an extra (non-differentiated)
input standing in for a random cotangent, so XLA can neither fold the loss nor drop the
backward pass. It reports `compiled.memory_analysis().temp_size_in_bytes`: the scratch
memory XLA allocates beyond arguments and outputs. The xla path materialises [B, H, T, T]
float32 logits/probabilities (O(T^2)); the blocked path only [B, H, T, block_k] (O(T)), so
its temp bytes per token should stay roughly constant.

Why the XLA flag: the CPU backend's YNNPACK fusion can swallow the attention matmuls into
fused custom calls whose scratch is not accounted for (`temp_size_in_bytes` may then read 0).
Disabling that fusion keeps the buffer assignment, and hence the number, comparable across
implementations. It is set before jax is imported, appended to any existing XLA_FLAGS.

With --time it also runs each compiled step (real arrays; keep T small on a laptop: xla needs
~5 float32 [H, T, T] buffers) and reports the median wall time of forward+backward.

Usage: python -m experiments.attention_memory [--lengths 2048 4096 8192 16384] [--causal]
                                               [--block_k 512] [--time]
"""

import os

_FLAG = "--xla_cpu_experimental_ynn_fusion_type="
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments import timing  # noqa: E402
from jaxformer.ops import blocked_attention  # noqa: E402
from jaxformer.ops.attention import dot_product_attention  # noqa: E402

MIB = 2**20
TARGET_T, TARGET_RATIO = 8192, 10.0


def attention_fn(impl, causal, block_k, head_dim):
  if impl == "blocked" and block_k is not None:
    scale = 1.0 / math.sqrt(head_dim)
    return lambda q, k, v: blocked_attention.blocked_attention(q, k, v, causal=causal, scale=scale,
                                                   block_k=block_k)
  return lambda q, k, v: dot_product_attention(q, k, v, causal=causal, impl=impl)


def compile_step(impl, t, *, heads, head_dim, causal, block_k, batch=1, dtype=jnp.float32):
  """Compiled value_and_grad(sum(attn(q, k, v) * ct)) w.r.t. q, k, v."""
  attn = attention_fn(impl, causal, block_k, head_dim)

  def loss(q, k, v, ct):
    return jnp.sum(attn(q, k, v).astype(jnp.float32) * ct)

  spec = jax.ShapeDtypeStruct((batch, t, heads, head_dim), dtype)
  ct = jax.ShapeDtypeStruct((batch, t, heads, head_dim), jnp.float32)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(spec, spec, spec,
                                                                     ct).compile()


def median_seconds(compiled, t, *, heads, head_dim, repeats=5):
  keys = jax.random.split(jax.random.key(0), 4)
  args = [jax.random.normal(key, (1, t, heads, head_dim), jnp.float32) for key in keys]
  return timing.median_seconds(compiled, *args, repeats=repeats)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--causal", action="store_true")
  p.add_argument("--time", action="store_true", help="also run and time fwd+bwd")
  p.add_argument("--block_k", type=int, default=None,
                 help=f"blocked key block size (default: blocked_attention.DEFAULT_BLOCK_K="
                      f"{blocked_attention.DEFAULT_BLOCK_K} via dot_product_attention)")
  args = p.parse_args()

  print(f"backend={jax.default_backend()} jax={jax.__version__} B=1 H={args.heads} "
        f"D={args.head_dim} float32 causal={args.causal} "
        f"block_k={args.block_k or blocked_attention.DEFAULT_BLOCK_K}\n")
  rows = {}
  for t in args.lengths:
    res = {}
    for impl in ("xla", "blocked"):
      start = time.perf_counter()
      compiled = compile_step(impl, t, heads=args.heads, head_dim=args.head_dim,
                              causal=args.causal, block_k=args.block_k)
      res[impl] = compiled.memory_analysis().temp_size_in_bytes
      print(f"  compiled {impl:7s} T={t:6d} in {time.perf_counter() - start:6.1f}s", flush=True)
      if args.time:
        res[impl + "_s"] = median_seconds(compiled, t, heads=args.heads, head_dim=args.head_dim)
    rows[t] = res

  timed = " xla ms | blocked ms |" if args.time else ""
  print(f"\n| T | xla temp MiB | blocked temp MiB | ratio xla/blocked | blocked bytes/T |{timed}")
  print("|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.time else ""))
  for t, r in rows.items():
    ratio = r["xla"] / r["blocked"] if r["blocked"] else float("inf")
    ms = (f" {1e3 * r['xla_s']:.1f} | {1e3 * r['blocked_s']:.1f} |" if args.time else "")
    print(f"| {t} | {r['xla'] / MIB:.1f} | {r['blocked'] / MIB:.1f} | {ratio:.2f} | "
          f"{r['blocked'] / t:.0f} |{ms}")
  if TARGET_T in rows:
    r = rows[TARGET_T]
    ratio = r["xla"] / r["blocked"] if r["blocked"] else float("inf")
    verdict = "MEETS" if ratio >= TARGET_RATIO else "MISSES"
    print(f"\nratio at T={TARGET_T}: {ratio:.2f}x -> {verdict} target >= {TARGET_RATIO:g}x")


if __name__ == "__main__":
  main()
