"""A prepared GPU check: every attention implementation against XLA on the device, and
GPT-2 small and a Llama-style 1B train step with tokens/s and MFU, in under 8 minutes.

    python -m experiments.gpu_check [--out DIR] [--budget SECONDS] [--smoke]

On the device machine (one H100/H200; its image has JAX, flax, optax, orbax and chex but not
ml_collections or grain: prepare their wheels once on a machine with PyPI, `bash
experiments/gpu_wheels.sh`, which fills the git-ignored `.wheels/`; carry `.wheels` with the
run), one line:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .wheels/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 timeout 480 python3 -m experiments.gpu_check --out $OUT

Parts, in order, each time-boxed (a share of `--budget`, default 400 s from start-up; a part
or row that would start after its box or the budget is skipped with a note in the table, and a
watchdog writes what was measured and exits at budget + 30 s, so the whole run stays under 8
minutes; `timeout 480` is the last resort):

1. Attention: `dot_product_attention` with every `impl` that `jaxformer.ops.attention.IMPLS`
   offers against `impl="xla"` on the same device and dtype: the output and the gradients
   (dq, dk, dv of sum(out * dout)), on causal, GQA, packed (segment ids), sliding-window and
   cross (Tq != Tk) shapes, bfloat16 and float32 (float32 under `highest` matmul precision,
   so neither side uses TF32). An impl that refuses the inputs (cuDNN in float32, or off a
   GPU) is listed as refused with its reason. Tolerances are derived as in `tests/arrays.py`
   (`tolerance`), never tuned; the table gives the largest error / tolerance over the four
   arrays and the forward+backward time (median of 5).
2. Train steps, each as `jaxformer.train` runs it (`train.program.build_program` on one
   device: the same `jit_train_step`, AdamW, clipping, the non-finite-step guard), on random
   tokens: GPT-2 small (configs/gpt2.py:small, batch 16 x 1024) and a Llama-style 1B
   (configs/llama.py:llama3-8b with Llama 3.2 1B's shape: d_model 2048, 16 layers, 32 heads
   over 8 kv heads, mlp 8192, tied embeddings, vocab 128256; batch 4 x 2048), bf16 compute
   and float32 params, dropout off, unpacked rows, `attention_impl="auto"`; then, as time
   allows, GPT-2 small with each other impl. Reported: compile seconds, median step time
   (windows of 5 steps), tokens/s, MFU = 6N + attention + readout FLOPs (`train.progress.flops_per_step`)
   per second over the device's dense bf16 peak (`accelerators.peak_flops_per_device`), the
   compiled step's device memory. A step that runs out of memory is retried once at half the
   batch.

The table is printed, and written as gpu_check.md and gpu_check.json under `--out` (default
experiments/results/ when the device is a GPU; elsewhere only with `--out`), with the device,
JAX/jaxlib versions and the time each part took. The exit status is 1 when a comparison
fails, 0 otherwise (skipped parts included: the table says what was skipped).

`--smoke` runs the same code paths tiny on any device (the test suite runs it on the CPU in
seconds): small attention shapes, 2-layer models, a few steps.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments.timing import median_seconds

DEFAULT_OUT = os.path.join("experiments", "results")
NAME = "gpu_check"
DEFAULT_BUDGET = 400.0          # seconds; the watchdog fires GRACE later
GRACE = 30.0
# Share of the budget each part may take (from its own start, so time a part leaves unused
# goes to the ones after it).
SHARES = {"attention": 0.35, "gpt2-small": 0.2, "llama-1b": 0.35, "extra": 1.0}

# Tolerances (tests/arrays.py's derivation): two float32 evaluations of one sum of n terms
# whose magnitudes add up to S differ by at most LAMBDA sqrt(n) eps32 S (Higham & Mary's
# probabilistic bound, failure odds 2.5e-14 n), and a chain of sums adds in quadrature.
LAMBDA = 8.0
EPS32 = float(np.finfo(np.float32).eps)


def low_precision_eps(dtype) -> float:
  """Relative spacing of the dtype the kernels round intermediate values to (the probabilities
  and their gradients before the P @ V and dS @ K products) when the inputs are `dtype`; 0 for
  float32 (kept in float32 at `highest` precision)."""
  return 0.0 if jnp.dtype(dtype) == jnp.float32 else float(jnp.finfo(dtype).eps)


def tolerance(length: int, scale: float, dtype) -> float:
  """|impl - xla| bound for one array: float32 accumulation of a chain of sums `length` terms
  long (sum_tol: LAMBDA sqrt(length) eps32 scale), plus, for bf16/f16 inputs, one rounding of
  each term to that dtype in each evaluation at different points of the computation (the
  blocked kernels round unnormalised probabilities, xla normalised ones): independent relative
  errors <= eps/2 whose weighted sum, over terms whose magnitudes add up to `scale`, is within
  LAMBDA eps/2 scale per evaluation, so LAMBDA eps scale for two. `scale`: the array's largest
  magnitude in the xla result (as `tests/arrays.assert_close_f32`)."""
  return LAMBDA * math.sqrt(length) * EPS32 * scale + LAMBDA * low_precision_eps(dtype) * scale


# ----------------------------------------------------------------------------------------
# Results: collected as the parts run, written after each part (and by the watchdog)
# ----------------------------------------------------------------------------------------


class Results:
  """Rows of both tables, notes, the environment; `write` renders markdown + JSON."""

  def __init__(self, env: dict, out_dir: str | None):
    self.env, self.out_dir = env, out_dir
    self.attention: list[dict] = []
    self.train: list[dict] = []
    self.notes: list[str] = []
    self.parts: dict[str, float] = {}
    self.start = time.perf_counter()
    self.complete = False
    self._lock = threading.Lock()

  def failed(self) -> list[dict]:
    return [r for r in self.attention if r.get("ok") is False]

  def to_json(self) -> dict:
    return {"env": self.env, "complete": self.complete,
            "elapsed_s": round(time.perf_counter() - self.start, 1),
            "parts_s": dict(self.parts), "attention": list(self.attention),
            "train": list(self.train), "notes": list(self.notes)}

  def markdown(self) -> str:
    e = self.env
    lines = [f"# GPU check ({e['device_kind']}, {e['platform']})", "",
             f"`{e['command']}` on {e['date']}: {e['device_count']} x {e['device_kind']}, "
             f"jax {e['jax']}, jaxlib {e['jaxlib']}"
             + "".join(f", {k} {v}" for k, v in e.get("plugins", {}).items())
             + f", Python {e['python']}. {'Complete' if self.complete else 'INCOMPLETE'} "
             f"in {time.perf_counter() - self.start:.0f} s "
             f"({', '.join(f'{k} {v:.0f} s' for k, v in self.parts.items())}).", "",
             "## Attention: each impl against impl='xla' on the device", "",
             "err/tol: the largest |impl - xla| / tolerance over out, dq, dk, dv (<= 1 passes; "
             "tolerances derived as in tests/arrays.py, see `gpu_check.tolerance`). "
             "ms: forward+backward, median of 5.", "",
             "| case | dtype | impl | runs as | err/tol (out, dq, dk, dv) | ok | ms | xla ms |",
             "|---|---|---|---|---|---|---:|---:|"]
    for r in self.attention:
      errs = ", ".join(f"{x:.2g}" for x in r["err_over_tol"]) if r.get("err_over_tol") else "-"
      ok = {True: "yes", False: "**FAIL**", None: "-"}[r.get("ok")]
      lines.append(f"| {r['case']} | {r['dtype']} | {r['impl']} | {r.get('runs_as') or '-'} | "
                   f"{errs} | {ok} | {_num(r.get('ms'), '.2f')} | {_num(r.get('xla_ms'), '.2f')} |")
    notes = [f"- {r['case']} {r['dtype']} {r['impl']}: {r['note']}" for r in self.attention
             if r.get("note")]
    lines += [""] + notes + ([""] if notes else [])
    lines += ["## Train steps (one device, bf16 compute, float32 params, AdamW)", "",
              "GiB: the compiled step's device memory (arguments + outputs - donated + "
              "temporaries). MFU: 6N + attention + readout FLOPs per second over the dense bf16 peak.", "",
              "| model | params | batch x seq | attention | compile s | step ms | tokens/s "
              "| TFLOP/s | MFU | GiB |",
              "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in self.train:
      lines.append(
          f"| {r['model']} | {_num(r.get('params'), ',')} | {r.get('batch', '-')} x "
          f"{r.get('seq_len', '-')} | {r.get('attention_impl', '-')}"
          + (f" ({r['attention_runs_as']})" if r.get("attention_runs_as") not in
             (None, r.get("attention_impl")) else "") + " | "
          f"{_num(r.get('compile_s'), '.1f')} | {_num(r.get('step_ms'), '.1f')} | "
          f"{_num(r.get('tokens_per_s'), ',.0f')} | {_num(r.get('tflops'), '.1f')} | "
          f"{_pct(r.get('mfu'))} | {_num(r.get('compiled_gib'), '.1f')} |")
    notes = [f"- {r['model']} ({r.get('attention_impl', '-')}): {r['note']}"
             for r in self.train if r.get("note")]
    lines += [""] + notes + ([""] if notes else [])
    if self.notes:
      lines += ["## Notes", ""] + [f"- {n}" for n in self.notes] + [""]
    return "\n".join(lines)

  def write(self) -> list[str]:
    """Write gpu_check.md/.json under out_dir (if any); returns the paths written."""
    if self.out_dir is None:
      return []
    with self._lock:
      os.makedirs(self.out_dir, exist_ok=True)
      md, js = (os.path.join(self.out_dir, f"{NAME}.{ext}") for ext in ("md", "json"))
      for path, text in ((md, self.markdown()),
                         (js, json.dumps(self.to_json(), indent=2) + "\n")):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
          f.write(text)
        os.replace(tmp, path)
      return [md, js]


def _num(x, fmt: str) -> str:
  return "-" if x is None else format(x, fmt)


def _pct(x) -> str:
  return "-" if x is None else f"{100 * x:.1f}%"


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def environment(command: str) -> dict:
  device = jax.devices()[0]

  def version(name):
    try:
      return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      return None

  plugins = {name: version(name) for name in (
      "jax-cuda13-plugin", "jax-cuda12-plugin", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12",
      "flax", "optax")}
  stats = _memory_stats(device)
  return {"command": command, "date": datetime.datetime.now(datetime.timezone.utc)
          .strftime("%Y-%m-%d %H:%M UTC"),
          "platform": device.platform, "device_kind": device.device_kind,
          "device_count": jax.device_count(), "jax": jax.__version__,
          "jaxlib": version("jaxlib"), "plugins": {k: v for k, v in plugins.items() if v},
          "python": platform.python_version(),
          "memory_gib": round(stats["bytes_limit"] / 2**30, 1) if "bytes_limit" in stats
          else None}


def _memory_stats(device) -> dict:
  try:
    return device.memory_stats() or {}
  except Exception:  # noqa: BLE001 (CPU and some backends have none)
    return {}


class Deadline:
  """The run's budget and the current part's box (both absolute perf_counter times)."""

  def __init__(self, budget: float):
    self.end = time.perf_counter() + budget
    self.budget = budget
    self.part_end = self.end

  def start_part(self, share: float) -> None:
    now = time.perf_counter()
    self.part_end = min(self.end, now + share * self.budget)

  def left(self) -> float:
    return min(self.part_end, self.end) - time.perf_counter()


# ----------------------------------------------------------------------------------------
# Part 1: attention implementations against xla
# ----------------------------------------------------------------------------------------

# name: (b, tq, tk, h, hkv, d, keyword arguments of dot_product_attention)
FULL_CASES = {
    "causal": (4, 2048, 2048, 16, 16, 64, dict(causal=True)),
    "causal GQA 32/8, D=128": (2, 2048, 2048, 32, 8, 128, dict(causal=True)),
    "packed: segment ids": (2, 2048, 2048, 8, 8, 64, dict(causal=True, segments=3)),
    "window 512, GQA 8/2": (2, 2048, 2048, 8, 2, 128, dict(causal=True, window=512)),
    "cross Tq 1024, Tk 2048": (2, 1024, 2048, 8, 8, 64, dict()),
}
SMOKE_CASES = {
    "packed, causal GQA 4/2": (1, 32, 32, 4, 2, 16, dict(causal=True, segments=3)),
}


def _attention_order(cases: dict, smoke: bool) -> list[tuple[str, Any]]:
  """(case, dtype) in the order they run: every case in bf16 first, then float32."""
  f32 = list(cases)[:1] if smoke else ["causal", "causal GQA 32/8, D=128", "packed: segment ids"]
  return [(c, jnp.bfloat16) for c in cases] + [(c, jnp.float32) for c in f32 if c in cases]


def attention_inputs(b, tq, tk, h, hkv, d, kw, dtype, seed=0):
  """(q, k, v, dout, keyword arguments) on the default device, N(0, 1) values."""
  rng = np.random.default_rng(seed)
  shapes = [(b, tq, h, d), (b, tk, hkv, d), (b, tk, hkv, d), (b, tq, h, d)]
  q, k, v, dout = (jnp.asarray(rng.standard_normal(s, np.float32), dtype) for s in shapes)
  kw = dict(kw)
  segments = kw.pop("segments", None)
  if segments:                       # `segments` documents packed per row, random lengths
    assert tq == tk
    cuts = np.sort(rng.choice(np.arange(1, tq), size=(b, segments - 1), replace=False), axis=1)
    ids = (np.arange(tq)[None, :, None] >= cuts[:, None, :]).sum(-1).astype(np.int32)
    kw["segment_ids"] = jnp.asarray(ids)
  return q, k, v, dout, kw


def fwd_bwd(impl: str, kw: dict) -> Callable:
  """jit of (q, k, v, dout) -> (out, dq, dk, dv) for the loss sum(out * dout)."""
  from jaxformer.ops.attention import dot_product_attention

  def f(q, k, v, dout):
    out, vjp = jax.vjp(lambda q, k, v: dot_product_attention(q, k, v, impl=impl, **kw), q, k, v)
    return (out, *vjp(dout))

  return jax.jit(f)


def _grad_lengths(tq, tk, h, hkv, d) -> tuple[int, int, int, int]:
  """Longest chain of sums behind out, dq, dk, dv (tolerance's `length`): out sums logits over
  D, the softmax over Tk and P @ V over Tk; the gradients add dO . V over D, the row sums
  over Tk, and dk/dv sum over the group's G * Tq queries."""
  g = h // hkv
  out = d + 2 * tk
  return out, out + d + 2 * tk, out + d + g * tq, out + g * tq


def check_attention(res: Results, deadline: Deadline, *, smoke: bool) -> None:
  from jaxformer.ops import attention
  cases = SMOKE_CASES if smoke else FULL_CASES
  impls = [i for i in attention.IMPLS if i != "xla"]
  repeats = 2 if smoke else 5
  for case, dtype in _attention_order(cases, smoke):
    b, tq, tk, h, hkv, d, kw = cases[case]
    dname = jnp.dtype(dtype).name
    if deadline.left() <= 0:
      res.attention.append(dict(case=case, dtype=dname, impl="all", note="skipped: time box"))
      continue
    q, k, v, dout, kw = attention_inputs(b, tq, tk, h, hkv, d, kw, dtype)
    precision = "highest" if dtype == jnp.float32 else None
    with jax.default_matmul_precision(precision):
      try:
        ref_fn = fwd_bwd("xla", kw)
        want = jax.block_until_ready(ref_fn(q, k, v, dout))
        xla_ms = 1e3 * median_seconds(ref_fn, q, k, v, dout, repeats=repeats, warmup=False)
      except Exception as e:  # noqa: BLE001 (out of memory, ...: recorded, the check goes on)
        res.attention.append(dict(case=case, dtype=dname, impl="xla",
                                  note=f"reference failed: {_first_line(e)}"))
        continue
      lengths = _grad_lengths(tq, tk, h, hkv, d)
      tols = [tolerance(n, float(jnp.max(jnp.abs(w.astype(jnp.float32)))), dtype)
              for n, w in zip(lengths, want)]
      for impl in impls:
        row = dict(case=case, dtype=dname, impl=impl, shape=[b, tq, tk, h, hkv, d],
                   xla_ms=round(xla_ms, 3))
        if deadline.left() <= 0:
          res.attention.append(dict(row, note="skipped: time box"))
          continue
        row["runs_as"] = _runs_as(impl, q, k, v, kw)
        try:
          fn = fwd_bwd(impl, kw)
          got = jax.block_until_ready(fn(q, k, v, dout))
        except ValueError as e:               # the impl refuses these inputs, by name
          res.attention.append(dict(row, runs_as=None, note=f"refused: {e}"))
          continue
        except Exception as e:  # noqa: BLE001
          res.attention.append(dict(row, ok=False, note=f"error: {_first_line(e)}"))
          continue
        errs = [float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32))))
                for g, w in zip(got, want)]
        ratios = [e / t if t > 0 else (0.0 if e == 0 else math.inf) for e, t in zip(errs, tols)]
        finite = all(bool(jnp.all(jnp.isfinite(g))) for g in got)
        row.update(err_over_tol=[round(r, 4) for r in ratios], max_err=errs,
                   tolerance=tols, ok=finite and max(ratios) <= 1.0,
                   ms=round(1e3 * median_seconds(fn, q, k, v, dout, repeats=repeats,
                                                 warmup=False), 3))
        if not finite:
          row["note"] = "non-finite values"
        res.attention.append(row)
    del q, k, v, dout, want


def _runs_as(impl: str, q, k, v, kw) -> str:
  """What `impl` dispatches to for these inputs (auto's choice; cudnn's refusal)."""
  from jaxformer.ops import attention
  if impl not in ("auto", "cudnn"):
    return impl
  reason = attention.cudnn_unsupported_reason(q, k, v, bias=kw.get("bias"))
  if reason is None:
    return "cudnn"
  if impl == "cudnn":
    return None
  b, tq, h, _ = q.shape
  return ("blocked" if 4 * b * h * tq * k.shape[1] > attention.AUTO_XLA_MAX_LOGIT_BYTES
          else "xla")


# ----------------------------------------------------------------------------------------
# Part 2: train steps
# ----------------------------------------------------------------------------------------

# Llama 3.2 1B's shape (its published config): 1,235,814,400 parameters with tied embeddings
LLAMA_1B = dict(d_model=2048, num_layers=16, num_heads=32, num_kv_heads=8, mlp_dim=8192,
                vocab_size=128256, tie_embeddings=True, rope_theta=500_000.0)
SMOKE_MODEL = dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=64, vocab_size=256)


def model_config(name: str, *, batch: int, seq_len: int, impl: str, smoke: bool):
  """The training config of a row: the repository's config with the check's overrides."""
  if name == "gpt2-small":
    from configs import gpt2
    cfg = gpt2.get_config("small")
    overrides = dict(dropout_rate=0.0, attention_dropout_rate=0.0)
    if smoke:
      overrides.update(SMOKE_MODEL, max_len=seq_len)
  elif name == "llama-1b":
    from configs import llama
    cfg = llama.get_config("llama3-8b")
    overrides = dict(LLAMA_1B)
    if smoke:
      overrides.update(SMOKE_MODEL, num_kv_heads=2, max_len=seq_len)
  else:
    raise ValueError(f"unknown model {name!r}")
  with cfg.unlocked():
    for key, value in dict(overrides, attention_impl=impl).items():
      cfg.model[key] = value
    cfg.data.seq_len = seq_len
    cfg.data.packing = "stream"           # unpacked rows: plain causal pretraining rows
    cfg.train.batch_size = batch
    cfg.optim.grad_accum = 1
    cfg.mesh.data, cfg.mesh.model, cfg.mesh.expert, cfg.mesh.fsdp = 1, 1, 1, False
  return cfg


def _random_batch(program, vocab: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  batch = {}
  for key, spec in program.batch.items():
    if np.issubdtype(spec.dtype, np.integer):
      x = rng.integers(0, vocab, spec.shape, dtype=np.int32)
    else:
      x = np.ones(spec.shape, spec.dtype)
    batch[key] = jax.device_put(x, spec.sharding)
  return batch


def train_row(name: str, *, batch: int, seq_len: int, impl: str, smoke: bool,
              deadline: Deadline, peak: float | None) -> dict:
  """One train-step measurement: compile + first step, then timed windows until the box."""
  from jaxformer import scaling
  from jaxformer.state import train_state as state_lib
  from jaxformer.train import progress
  from jaxformer.train.program import build_program

  device = jax.devices()[0]
  cfg = model_config(name, batch=batch, seq_len=seq_len, impl=impl, smoke=smoke)
  row = dict(model=name, batch=batch, seq_len=seq_len, attention_impl=impl,
             params=int(scaling.count_params(cfg.model)["total"]),
             remat_policy=cfg.model.get("remat_policy"), scan_layers=cfg.model.get("scan_layers"))
  m = cfg.model
  head_dim = m.get("head_dim") or m.d_model // m.num_heads
  q = jax.ShapeDtypeStruct((batch, seq_len, m.num_heads, head_dim), jnp.dtype(m.dtype))
  kv = jax.ShapeDtypeStruct((batch, seq_len, m.get("num_kv_heads") or m.num_heads, head_dim),
                            jnp.dtype(m.dtype))
  row["attention_runs_as"] = _runs_as(impl, q, kv, kv, {})
  program = build_program(cfg, [device])
  _, _, init_boxed = state_lib.train_state_fns(cfg)
  state = program.plan.init_state(init_boxed)[0]
  data = _random_batch(program, cfg.model.vocab_size)
  key = jax.device_put(jax.random.key(1), program.key.sharding)
  flops = progress.flops_per_step(cfg.model, program.task, program.batch, 1)
  start = time.perf_counter()
  step = program.step.lower(state, data, key).compile()     # the trainer's jit, compiled
  row["compile_s"] = round(time.perf_counter() - start, 2)
  row["compiled_gib"] = _compiled_gib(step)
  start = time.perf_counter()
  state, metrics = step(state, data, key)
  jax.block_until_ready(metrics)
  row["first_step_s"] = round(time.perf_counter() - start, 2)
  row["loss"] = float(metrics["loss"])
  window = 2 if smoke else 5
  times = []
  max_windows = 2 if smoke else 20
  while len(times) < max_windows and (not times or deadline.left() > 2 * times[-1] * window):
    start = time.perf_counter()
    for _ in range(window):
      state, metrics = step(state, data, key)
    jax.block_until_ready(metrics)
    times.append((time.perf_counter() - start) / window)
  step_s = statistics.median(times)
  tokens = batch * seq_len
  row.update(step_ms=round(1e3 * step_s, 2), timed_steps=len(times) * window,
             tokens_per_s=tokens / step_s, flops_per_step=flops,
             tflops=flops / step_s / 1e12, mfu=flops / step_s / peak if peak else None,
             final_loss=float(metrics["loss"]))
  stats = _memory_stats(device)
  if "peak_bytes_in_use" in stats:           # the process's peak so far, not this row's alone
    row["process_peak_gib"] = stats["peak_bytes_in_use"] / 2**30
  del state, data
  return row


def _compiled_gib(compiled) -> float | None:
  """Device memory the compiled step needs (arguments + outputs - donated + temporaries)."""
  try:
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes) / 2**30
  except Exception:  # noqa: BLE001 (a backend without the analysis)
    return None


def _out_of_memory(e: BaseException) -> bool:
  text = str(e)
  return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def check_training(res: Results, deadline: Deadline, *, smoke: bool, rows: list[tuple]) -> None:
  from jaxformer import accelerators
  try:
    peak = accelerators.peak_flops_per_device(jax.devices()[0], "bfloat16")
  except ValueError as e:
    peak = None
    res.notes.append(f"no MFU: {e}")
  if peak is None:
    res.notes.append(f"no MFU: no dense bf16 peak is tabulated for "
                     f"{jax.devices()[0].device_kind!r} (set JAXFORMER_PEAK_FLOPS)")
  min_left = 0.0 if smoke else 30.0
  for part, name, batch, seq_len, impl in rows:
    auto = next((r.get("attention_runs_as") for r in res.train
                 if r["model"] == name and r.get("attention_impl") == "auto"), None)
    if part == "extra" and impl == auto:   # measured already, as auto's choice
      continue
    part_start = time.perf_counter()
    print(f"train: {name} {impl} batch {batch} x {seq_len}", flush=True)
    deadline.start_part(SHARES[part])
    if deadline.left() <= min_left:
      res.train.append(dict(model=name, batch=batch, seq_len=seq_len, attention_impl=impl,
                            note="skipped: time box"))
      continue
    for attempt in range(2):
      try:
        row = train_row(name, batch=batch, seq_len=seq_len, impl=impl, smoke=smoke,
                        deadline=deadline, peak=peak)
        if attempt:
          row["note"] = f"batch {2 * batch} ran out of memory; halved"
        res.train.append(row)
        break
      except Exception as e:  # noqa: BLE001 (recorded; the check goes on)
        if attempt == 0 and _out_of_memory(e) and batch > 1 and deadline.left() > min_left:
          batch //= 2
          continue
        res.train.append(dict(model=name, batch=batch, seq_len=seq_len, attention_impl=impl,
                              note=f"error: {_first_line(e)}"))
        break
    key = f"{name} {impl}"
    res.parts[key] = round(time.perf_counter() - part_start, 1)
    res.write()


def train_rows(smoke: bool, gpt2_batch: int, llama_batch: int) -> list[tuple]:
  """(part, model, batch, seq_len, attention impl) in the order they run."""
  from jaxformer.ops import attention
  if smoke:
    gpt2_batch, llama_batch, gpt2_seq, llama_seq = 2, 2, 32, 32
  else:
    gpt2_seq, llama_seq = 1024, 2048
  rows = [("gpt2-small", "gpt2-small", gpt2_batch, gpt2_seq, "auto"),
          ("llama-1b", "llama-1b", llama_batch, llama_seq, "auto")]
  if not smoke:                          # the same code path: nothing new to smoke-test
    first = ("pallas", "xla", "blocked")   # our kernel first: the row most worth the time
    extra = [i for i in first if i in attention.IMPLS]
    extra += [i for i in attention.IMPLS if i not in extra and i != "auto"]
    rows += [("extra", "gpt2-small", gpt2_batch, gpt2_seq, i) for i in extra]
  return rows


# ----------------------------------------------------------------------------------------


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=None,
                      help=f"directory for {NAME}.md/.json (default {DEFAULT_OUT} on a GPU; "
                      "nothing is written elsewhere unless given)")
  parser.add_argument("--budget", type=float, default=None,
                      help=f"seconds for all parts (default {DEFAULT_BUDGET:.0f}; smoke 600); "
                      f"a watchdog stops the run {GRACE:.0f} s after it")
  parser.add_argument("--smoke", "--cpu", action="store_true",
                      help="the same code paths, tiny, on any device (seconds on a CPU)")
  parser.add_argument("--gpt2_batch", type=int, default=16, help="GPT-2 small rows of 1024")
  parser.add_argument("--llama_batch", type=int, default=4, help="Llama 1B rows of 2048")
  parser.add_argument("--parts", nargs="*", default=("attention", "train"),
                      choices=("attention", "train"))
  args = parser.parse_args(argv)
  started = time.perf_counter()           # the budget counts from here: backend start-up too
  for name in ("gpt2_batch", "llama_batch"):
    if getattr(args, name) < 1:
      parser.error(f"--{name}={getattr(args, name)} must be >= 1")
  budget = args.budget if args.budget is not None else (600.0 if args.smoke else DEFAULT_BUDGET)
  if not budget > 0:
    parser.error(f"--budget={budget} must be > 0 seconds")

  command = "python -m experiments.gpu_check " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])
  env = environment(command.strip())
  out_dir = args.out
  if out_dir is None and env["platform"] == "gpu":
    out_dir = DEFAULT_OUT
  res = Results(env, out_dir)
  if out_dir is None:
    res.notes.append(f"not written: the device is {env['platform']!r}, not a GPU (pass --out)")
  deadline = Deadline(budget - (time.perf_counter() - started))

  def watchdog():
    res.notes.append(f"stopped by the watchdog at {budget + GRACE:.0f} s (budget {budget:.0f} "
                     "s + grace): a compile or step overran its box; rows after it are missing")
    try:
      paths = res.write()
      print(res.markdown(), flush=True)
      print("wrote " + ", ".join(paths) if paths else "", flush=True)
    finally:
      os._exit(3)

  timer = threading.Timer(max(0.0, budget + GRACE - (time.perf_counter() - started)), watchdog)
  timer.daemon = True
  timer.start()

  print(f"{env['device_count']} x {env['device_kind']} ({env['platform']}), jax {env['jax']}, "
        f"jaxlib {env['jaxlib']}; budget {budget:.0f} s", flush=True)
  try:
    if "attention" in args.parts:
      part_start = time.perf_counter()
      deadline.start_part(SHARES["attention"])
      check_attention(res, deadline, smoke=args.smoke)
      res.parts["attention"] = round(time.perf_counter() - part_start, 1)
      res.write()
      print(f"attention: {len(res.attention)} rows, {len(res.failed())} failed "
            f"({res.parts['attention']:.0f} s)", flush=True)
    if "train" in args.parts:
      check_training(res, deadline, smoke=args.smoke,
                     rows=train_rows(args.smoke, args.gpt2_batch, args.llama_batch))
  finally:
    timer.cancel()              # also when a part raised: the watchdog must not outlive main
  res.complete = True
  paths = res.write()
  print(res.markdown())
  if paths:
    print("wrote " + ", ".join(paths))
  return 1 if res.failed() else 0


if __name__ == "__main__":
  sys.exit(main())
