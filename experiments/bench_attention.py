"""Attention implementations side by side: TFLOP/s on GPU, compiled memory and error on CPU.

Why: `impl="pallas"` only earns its place if it is faster than our plain-JAX `blocked` path and
close to the vendor kernels. On a GPU this times, in bfloat16, forward and forward+backward of

  xla        dot_product_attention(impl="xla")      (materialised [B, H, T, T] logits)
  blocked    dot_product_attention(impl="blocked")  (plain JAX, ops.blocked_attention)
  pallas     dot_product_attention(impl="pallas")   (our kernel, ops.pallas)
  cudnn      jax.nn.dot_product_attention(implementation="cudnn")
  jax-pallas jax.experimental.pallas.ops.gpu.attention.mha (JAX's bundled Triton kernel)

for T in {1k, 2k, 4k, 8k, 16k}, head_dim {64, 128}, causal or not, with B * T = 16k tokens and
H * D = 2048. FLOPs: forward 4 * B * H * T^2 * D, backward 2.5x that (5 matmuls instead of 2);
causal counts half. A cell that fails (out of memory, unsupported) prints its reason.

`--tune` (GPU/TPU) instead times our kernel at T=8k, causal, for every (block_q, block_k) in
the backend's candidates, to choose `pallas.default_block_sizes`. The main table also gives
pallas / cudnn and pallas / jax-pallas ratios, the issue's targets (>= 0.8x cuDNN forward and
>= 0.7x forward+backward at T=8k, D=128, causal; ahead of jax-pallas).

On CPU (no kernels to time) it prints a memory/correctness table instead: compiled temporary
bytes of forward+backward (`memory_analysis()`, YNNPACK fusion disabled as in
`experiments/attention_memory.py` so the numbers are comparable) and the max error of each
implementation against a float64 NumPy reference on a small causal GQA input.

Usage: python -m experiments.bench_attention [--quick | --tune] [--out results.md]
"""

import os

_FLAG = "--xla_cpu_experimental_ynn_fusion_type="
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import argparse  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.timing import median_seconds  # noqa: E402
from jaxformer.ops.attention import dot_product_attention  # noqa: E402

MIB = 2**20
TOKENS, MODEL_DIM = 16384, 2048


# ---------------------------------------------------------------------------- implementations


def _ours(impl):
  return lambda q, k, v, causal: dot_product_attention(q, k, v, causal=causal, impl=impl)


def _cudnn(q, k, v, causal):
  return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")


def _bundled_mha():
  """JAX's Pallas GPU attention, or None when this jax does not ship it."""
  try:
    from jax.experimental.pallas.ops.gpu import attention as bundled
  except ImportError:
    return None
  return lambda q, k, v, causal: bundled.mha(q, k, v, None, sm_scale=1 / math.sqrt(q.shape[-1]),
                                             causal=causal)


def implementations(backend):
  """{name: fn(q, k, v, causal)} and notes on the peers that were skipped."""
  impls = {name: _ours(name) for name in ("xla", "blocked", "pallas")}
  notes = []
  if backend == "gpu":
    impls["cudnn"] = _cudnn
    bundled = _bundled_mha()
    if bundled is None:
      notes.append("jax-pallas skipped: jax.experimental.pallas.ops.gpu.attention not found")
    else:
      impls["jax-pallas"] = bundled
  else:
    notes.append(f"cudnn and jax-pallas skipped: they need a GPU (backend is {backend!r})")
  return impls, notes


def _fwd_bwd(attn, causal):
  """q, k, v, ct -> (dq, dk, dv): one forward and one backward pass."""
  def step(q, k, v, ct):
    _, vjp = jax.vjp(functools.partial(attn, causal=causal), q, k, v)
    return vjp(ct)
  return step


# ------------------------------------------------------------------------------------- GPU


def attention_flops(b, h, t, d, causal, backward):
  fwd = 4 * b * h * t * t * d * (0.5 if causal else 1.0)
  return fwd * (3.5 if backward else 1.0)


def tflops(attn, t, d, causal, backward, repeats):
  """TFLOP/s (float), or the reason the cell failed (str)."""
  b, h = max(1, TOKENS // t), MODEL_DIM // d
  keys = jax.random.split(jax.random.key(t * d), 4)
  q, k, v, ct = (jax.random.normal(key, (b, t, h, d), jnp.bfloat16) for key in keys)
  try:
    if backward:
      seconds = median_seconds(jax.jit(_fwd_bwd(attn, causal)), q, k, v, ct, repeats=repeats)
    else:
      seconds = median_seconds(jax.jit(functools.partial(attn, causal=causal)), q, k, v,
                               repeats=repeats)
  except Exception as e:  # noqa: BLE001  (a failed cell is reported, the table goes on)
    return "OOM" if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e) else (
        f"err: {type(e).__name__}")
  return attention_flops(b, h, t, d, causal, backward) / seconds / 1e12


def _cell(value) -> str:
  return f"{value:.1f}" if isinstance(value, float) else value


def _ratio(num, den) -> str:
  return f"{num / den:.2f}x" if isinstance(num, float) and isinstance(den, float) else "-"


def gpu_table(impls, lengths, head_dims, repeats):
  names = list(impls)
  peers = [n for n in ("cudnn", "jax-pallas") if n in impls]
  lines = ["| T | D | causal | pass | " + " | ".join(names + [f"pallas/{p}" for p in peers])
           + " |", "|---:|---:|:---:|:---|" + "---:|" * (len(names) + len(peers))]
  for d in head_dims:
    for causal in (False, True):
      for t in lengths:
        for backward in (False, True):
          cells = {n: tflops(impls[n], t, d, causal, backward, repeats) for n in names}
          row = [_cell(cells[n]) for n in names] + [_ratio(cells["pallas"], cells[p])
                                                   for p in peers]
          lines.append(f"| {t} | {d} | {causal} | {'fwd+bwd' if backward else 'fwd'} | "
                       + " | ".join(row) + " |")
          print(lines[-1], flush=True)
  return lines


TUNE_BLOCKS = {"gpu": (32, 64, 128), "tpu": (128, 256, 512)}


def tune_table(backend, head_dims, repeats, t=8192):
  """Our kernel's TFLOP/s per (block_q, block_k) at length t, causal."""
  lines = [f"| D | block_q | block_k | fwd (T={t}, causal) | fwd+bwd |",
           "|---:|---:|---:|---:|---:|"]
  for d in head_dims:
    for bq, bk in itertools.product(TUNE_BLOCKS[backend], repeat=2):
      attn = lambda q, k, v, causal, bs=(bq, bk): dot_product_attention(
          q, k, v, causal=causal, impl="pallas", block_sizes=bs)
      cells = [_cell(tflops(attn, t, d, True, backward, repeats)) for backward in (False, True)]
      lines.append(f"| {d} | {bq} | {bk} | " + " | ".join(cells) + " |")
      print(lines[-1], flush=True)
  return lines


# ------------------------------------------------------------------------------------- CPU


def reference(q, k, v, causal):
  """float64 NumPy attention (GQA by repeating k/v; queries are the last Tq positions)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  rep = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
  s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
  if causal:
    tq, tk = q.shape[1], k.shape[1]
    s = np.where(np.arange(tk)[None] <= np.arange(tq)[:, None] + tk - tq, s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)


def max_error(attn, causal, t=97):
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (1, t, 4, 32), jnp.float32)
  k, v = (jax.random.normal(key, (1, t, 2, 32), jnp.float32) for key in keys[1:])
  return float(np.abs(np.asarray(attn(q, k, v, causal=causal)) - reference(q, k, v, causal)).max())


def temp_mib(attn, t, causal, heads=8, head_dim=64):
  spec = jax.ShapeDtypeStruct((1, t, heads, head_dim), jnp.float32)
  compiled = jax.jit(_fwd_bwd(attn, causal)).lower(spec, spec, spec, spec).compile()
  return compiled.memory_analysis().temp_size_in_bytes / MIB


def cpu_table(impls, lengths, causal=True):
  names = list(impls)
  lines = [f"| metric (causal={causal}, B=1, H=8, D=64, float32) | " + " | ".join(names) + " |",
           "|:---|" + "---:|" * len(names)]
  errors = [f"{max_error(impls[n], causal):.1e}" for n in names]
  lines.append("| max abs error vs float64 (T=97, H=4, Hkv=2, D=32) | " + " | ".join(errors) + " |")
  print(lines[-1], flush=True)
  for t in lengths:
    cells = [f"{temp_mib(impls[n], t, causal):.1f}" for n in names]
    lines.append(f"| fwd+bwd compiled temp MiB, T={t} | " + " | ".join(cells) + " |")
    print(lines[-1], flush=True)
  return lines


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="T in {1k, 2k} (CPU: {256, 512}), D=64")
  p.add_argument("--tune", action="store_true",
                 help="GPU/TPU: our kernel's TFLOP/s per block size at T=8k, causal")
  p.add_argument("--out", help="append the markdown table to this file")
  p.add_argument("--repeats", type=int, default=10)
  args = p.parse_args()

  backend = jax.default_backend()
  impls, notes = implementations(backend)
  device = jax.devices()[0].device_kind
  header = [f"### attention benchmark: {device} ({backend}), jax {jax.__version__}", ""]
  print("\n".join(header + notes), flush=True)
  if args.tune:
    if backend not in TUNE_BLOCKS:
      p.error(f"--tune needs a GPU or TPU (backend is {backend!r})")
    header.append(f"pallas TFLOP/s per block size, bfloat16, B*T={TOKENS}, H*D={MODEL_DIM}")
    lines = tune_table(backend, [64, 128], args.repeats)
  elif backend == "gpu":
    lengths = [1024, 2048] if args.quick else [1024, 2048, 4096, 8192, 16384]
    head_dims = [64] if args.quick else [64, 128]
    header.append(f"TFLOP/s, bfloat16, B*T={TOKENS}, H*D={MODEL_DIM}, causal FLOPs halved")
    lines = gpu_table(impls, lengths, head_dims, 3 if args.quick else args.repeats)
  else:
    lengths = [256, 512] if args.quick else [1024, 2048, 4096]
    header.append("CPU: no timings; pallas runs in interpret mode")
    lines = cpu_table(impls, lengths)
  table = "\n".join(header + [""] + [f"- {n}" for n in notes] + [""] + lines) + "\n"
  print("\n" + table)
  if args.out:
    with open(args.out, "a") as f:
      f.write(table + "\n")


if __name__ == "__main__":
  main()
