"""Published models planned on published TPU slices, from a CPU machine (issue #29).

For each row: the config (its published size), a slice people train on, and the global batch
of the matching published run where there is one (per-chip batch x chips, so our estimate and
their measurement describe the same step). `jaxformer.plan.search.search` varies the mesh,
FSDP, the remat policy and gradient accumulation (layers scanned, XLA attention), compiles the
most promising candidates for the topology's compile-only devices and keeps the fastest that
fits. Compiles are cached (~/.cache/jaxformer/plans), so a rerun, or a run interrupted and
restarted, recompiles nothing it has done; finished rows are kept in
experiments/results/tpu_plans.json.

Everything here is an estimate from the TPU compiler (its memory assignment and its per-op cost
model) and the chips' public figures; the published numbers beside them were measured by
others (`experiments/published_tpu_throughput.py`), with their own tuned sharding, kernels and
flags. "TFLOP/s/chip" on both sides counts model FLOPs (6N + attention; ours does not halve
causal attention, MaxText's has since July 2025).

Usage: python -m experiments.tpu_plans [--rows=LABEL,...] [--budget_minutes=20]
           [--max_compiles=3] [--workers=2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from experiments import published_tpu_throughput as published  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
DIMENSIONS = ("mesh", "fsdp", "remat", "accum")


@dataclasses.dataclass(frozen=True)
class Row:
  label: str
  config: str                    # configs/<file>:<size>
  topology: str
  per_chip_batch: int | None     # None: the config's own global batch
  published: str | None = None   # the model name in published_tpu_throughput, same chips
  seq_len: int | None = None     # None: the config's (set to the published run's)
  slices: int = 1

  @property
  def chips(self) -> int:
    from jaxformer.plan import topology
    return math.prod(topology.parse(self.topology)[1]) * self.slices


ROWS = [
    Row("GPT-2 small", "gpt2.py:small", "v5e:2x2", 8),
    Row("Llama-2 7B", "llama.py:llama2-7b", "v5e:4x4", 2),
    Row("Llama-3 8B", "llama.py:llama3-8b", "v6e:2x4", 3, "Llama 3.1 8B"),
    Row("ViT-H/14", "vit.py:H/14", "v5e:4x4", 32),
    Row("Mixtral 8x7B", "mixtral.py:8x7b", "v5p:4x4x4", 4, seq_len=4096),
    Row("Llama-2 70B", "llama.py:llama2-70b", "v6e:16x16", 2, "Llama 2 70B"),
    Row("Llama-3 70B", "llama.py:llama3-70b", "v6e:4x8", 2, "Llama 3.1 70B"),
    Row("Mixtral 8x7B", "mixtral.py:8x7b", "v6e:16x16", 12, "Mixtral 8X7B", seq_len=4096),
    Row("GPT-3 175B", "gpt3.py:175b", "v6e:16x16", 3, "GPT3-175B"),
]


def row_key(row: Row) -> str:
  seq = f" | seq {row.seq_len}" if row.seq_len else ""
  return f"{row.label} | {row.topology} x{row.slices} | batch/chip {row.per_chip_batch}{seq}"


def load(row: Row):
  from jaxformer.sweep.config import load_config
  overrides = {"model.scan_layers": True, "model.attention_impl": "xla"}
  if row.per_chip_batch is not None:
    overrides["train.batch_size"] = row.per_chip_batch * row.chips
  if row.seq_len is not None:
    overrides["data.seq_len"] = row.seq_len
  return load_config(str(ROOT / "configs" / row.config), overrides)


def run_row(row: Row, args) -> dict:
  from jaxformer.plan import search
  config = load(row)
  start = time.perf_counter()
  result = search.search(config, row.topology, row.slices, dimensions=DIMENSIONS,
                              budget_seconds=60 * args.budget_minutes, workers=args.workers,
                              max_compiles=args.max_compiles)
  best = result.best
  counts: dict[str, int] = {}
  for c in result.candidates:
    counts[c.status] = counts.get(c.status, 0) + 1
  compiles = [c.plan["compile_seconds"] for c in result.candidates if c.plan]
  why = None
  if best is None:
    memory = [c.reason for c in result.candidates if "alone need" in c.reason]
    why = (f"none of the {len(compiles)} compiled fit" if compiles else
           min(memory, key=lambda m: float(m.split(" need ")[1].split()[0])) if memory else
           "no candidate passed the checks")
  return {"row": dataclasses.asdict(row), "seconds": time.perf_counter() - start,
          "counts": counts, "compile_seconds": compiles,
          "fitting": sum(c.fits for c in result.candidates),
          "batch_size": config.train.batch_size, "seq_len": _length(config),
          "best": None if best is None else {"overrides": best.overrides, "plan": best.plan},
          "why": why}


def _length(config) -> str:
  """Tokens per example, or the image size for an image model."""
  if config.data.seq_len is not None:
    return str(config.data.seq_len)
  return f"{config.model.image_size}px"


def _published(row: Row) -> published.PublishedRun | None:
  if row.published is None:
    return None
  for run in published.RUNS:
    if (run.model == row.published and run.chip == row.topology.split(":")[0]
        and run.chips == row.chips and run.metric == "tflops_per_chip"
        and run.per_chip_batch == row.per_chip_batch and run.precision == "bf16"):
      return run
  return None


def table(results: dict) -> str:
  lines = ["| model | slice | chips | global batch x seq | fits | best sharding found | "
           "GiB/chip | est. step s (compiler) | est. MFU (compiler / roofline) | "
           "est. TFLOP/s/chip | published TFLOP/s/chip | published / est. | compiles |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for row in ROWS:
    r = results.get(row_key(row))
    if r is None:
      continue
    if r["seq_len"] is None:                 # rows recorded before lengths were strings
      r["seq_len"] = _length(load(row))
    best = r["best"]
    pub = _published(row)
    compiles = r["compile_seconds"]
    compiled = (f"{len(compiles)} ({min(compiles):.0f}-{max(compiles):.0f} s)"
                if compiles else "0")
    if best is None:
      lines.append(f"| {row.label} | {row.topology} | {row.chips} | {r['batch_size']} x "
                   f"{r['seq_len']} | no: {r.get('why') or 'none compiled fit'} | - | - | - | "
                   "- | - | "
                   f"{pub.value if pub else '-'} | - | {compiled} |")
      continue
    p = best["plan"]
    sharding = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in best["overrides"].items())
    est = p["estimated_step_seconds"]
    tflops = p["flops_per_step"]["analytic"] / (row.chips * est) / 1e12 if est else None
    mfu = p["mfu"]
    ratio = f"{pub.value / tflops:.2f}" if pub and tflops else "-"
    lines.append(
        f"| {row.label} | {row.topology} | {row.chips} | {r['batch_size']} x {r['seq_len']} "
        f"| yes | {sharding} | {p['per_chip_bytes']['total'] / 2**30:.1f} | "
        f"{est:.3f} | {100 * mfu['estimate']:.0f}% / {100 * mfu['roofline']:.0f}% | "
        f"{tflops:.0f} | {pub.value if pub else '-'} | {ratio} | {compiled} |")
  return "\n".join(lines)


REPORT = """# Published models planned on TPU slices

`python -m experiments.tpu_plans` on a 2-core CPU machine with no accelerator: each row's
config compiled by libtpu for the slice's compile-only devices (`jaxformer.plan --search`
over mesh, FSDP, remat policy and gradient accumulation; layers scanned, XLA attention),
the fastest candidate that fits by the compiler's cost model. Every number on our side is an
estimate from the TPU compiler (its memory assignment, its per-op cycle estimates at the
chip clock measured from its matmul estimates) and the chips' public figures
(`jaxformer/accelerators.py`), not a measurement.

{table}

- global batch: the published run's per-chip batch x chips where there is one (so both sides
  describe the same step), otherwise a per-chip batch people use; seq is the published
  run's where the config's differs (Mixtral: 4096), otherwise the config's.
- est. MFU: analytic model FLOPs (6N + attention, `scaling.flops_per_token`) / (chips x peak
  x estimated step); the roofline column uses the roofline step instead.
- est. TFLOP/s/chip: the same model FLOPs / (chips x compiler-estimated step).
- published: measured by Google with MaxText (tuned sharding, kernels, XLA flags, remat
  offloading), from `experiments/published_tpu_throughput.py`, where each number's source
  (repository, commit, file, the line quoted) is recorded. MaxText halves causal attention
  FLOPs; we count them whole, which flatters our TFLOP/s by a few percent at these lengths.
- "no" in fits: why nothing fitted: the exact per-chip bytes of parameters, gradients and
  AdamW's two float32 moments already exceed the chip's HBM (no sharding of a float32
  AdamW run fits; MaxText fits these with other optimizer-state or offloading settings), or
  none of the candidates compiled within the row's compile cap fitted (what was tried is in
  `tpu_plans.json`; the closest Llama-3 8B candidate missed by 1.0 GiB).

How far the estimate can be trusted: the compiler's cycle estimates are what XLA uses to
schedule, not a simulator; they leave out collective time (carried by the roofline column)
and Pallas kernels (charged at `estimate.KERNEL_EFFICIENCY`, 50%, of their roofline:
FlashAttention-2's published lower end). Where the published / estimated ratio is
near 1 the compiled step is as fast as MaxText's measured one would be if the estimate
held; a large ratio says our step, as compiled, does much more work or moves much more
memory than theirs (for instance f32 logits and XLA attention's T x T scores, gradient
all-reduces inside the accumulation loop, untuned sharding), and cannot tell that apart from
estimate error without hardware.

Searches (candidates by status; compile times as measured when each was first compiled, on 2
cores shared by two compile workers and other jobs; wall time of the run that wrote this):

{searches}
"""


def searches(results: dict) -> str:
  lines = []
  for row in ROWS:
    r = results.get(row_key(row))
    if r is None:
      continue
    compiled = r["compile_seconds"]
    counts = ", ".join(f"{n} {k}" for k, n in sorted(r["counts"].items()))
    lines.append(f"- {row_key(row)}: {counts}"
                 + (f"; {r['fitting']} fit" if "fitting" in r else "")
                 + (f"; compiles {min(compiled):.0f}-{max(compiled):.0f} s each, "
                    f"{sum(compiled) / 60:.1f} min in all" if compiled else "")
                 + f"; this run {r['seconds'] / 60:.1f} min (cached compiles are read back)")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default=None, help="comma-separated labels (default: all)")
  parser.add_argument("--budget_minutes", type=float, default=20.0)
  parser.add_argument("--max_compiles", type=int, default=3)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--redo", action="store_true", help="re-analyse finished rows "
                      "(compiles come from the cache)")
  parser.add_argument("--out", default=str(RESULTS / "tpu_plans.md"))
  args = parser.parse_args(argv)
  state_path = RESULTS / "tpu_plans.json"
  results = json.loads(state_path.read_text()) if state_path.exists() else {}
  results = {k: v for k, v in results.items() if k in {row_key(r) for r in ROWS}}
  wanted = None if args.rows is None else set(args.rows.split(","))
  for row in ROWS:
    if wanted is not None and row.label not in wanted:
      continue
    key = row_key(row)
    if key in results and not args.redo:
      continue
    print(f"== {key}", flush=True)
    results[key] = run_row(row, args)
    state_path.write_text(json.dumps(results, indent=1))
  text = table(results)
  pathlib.Path(args.out).write_text(REPORT.format(table=text, searches=searches(results)))
  print(text)


if __name__ == "__main__":
  main()
