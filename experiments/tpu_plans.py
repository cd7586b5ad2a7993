"""Published models planned on published TPU slices, from a CPU machine.

For each row: the config (its published size), a slice people train on, the global batch of
the matching published run where there is one (per-chip batch x chips, so our estimate and
their measurement describe the same step), and a recipe: the settings MaxText's own benchmark
configs use for that model on that chip (`benchmarks/maxtext_{trillium,v5e}_model_configs.py`
at the commit in RECIPES_SOURCE: FSDP over every chip, no gradient accumulation, flash
attention, their remat/offload policy), in jaxformer's terms. A row compiles its recipe for
the topology's compile-only devices; where that does not fit, the optimizer-state levers next
(bfloat16 moments, then moments in host memory), until one fits. `--search` also runs
`jaxformer.plan.search` around it and keeps the fastest that fits. Compiles are cached
(~/.cache/jaxformer/plans, keyed by the lowered program), so a rerun, or a run interrupted
and restarted, recompiles nothing it has done; finished rows are kept in
experiments/results/tpu_plans.json. `tpu_plans_before.json` holds the rows as planned before
the step's TPU work (issue #41: XLA attention, float32 logits, a gradient reduce per
micro-batch, one-hot MoE dispatch; searched over mesh, FSDP, remat and accumulation), for the
report's "before" column.

Everything here is an estimate from the TPU compiler (its memory assignment and its per-op
cost model) and the chips' public figures; the published numbers beside them were measured
by others (`experiments/published_tpu_throughput.py`), with their own tuned sharding, kernels
and flags. Our TFLOP/s/chip count 6N + attention (halved for causal masks, as Kaplan's count
is) + the output head's matmul (MaxText's `embedding_flops`;
`counting.flops_per_token(readout=True)`); the published / est. ratio divides tokens/s, which
no FLOPs convention changes. `maxtext_calibration.py` runs this estimator on MaxText's own
compiled step, for the cost model's factor.

Usage: python -m experiments.tpu_plans [--rows=LABEL,...] [--search] [--budget_minutes=20]
           [--max_compiles=3] [--workers=2] [--redo]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from experiments import published_tpu_throughput as published  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
# --search varies these around the recipe's mesh (pure FSDP over every chip)
DIMENSIONS = ("remat", "accum", "attention", "optimizer")
RECIPES_SOURCE = ("github:AI-Hypercomputer/maxtext@e591f30cbbf217ed67ef71263ec0538239f9c3b8"
                  ":benchmarks/maxtext_{trillium,v5e}_model_configs.py")
# Tried in order until the step fits: MaxText's recipes keep float32 AdamW moments on device.
MEMORY_FALLBACKS = ({}, {"optim.state_dtype": "bfloat16"},
                    {"optim.state_dtype": "bfloat16", "optim.offload_state": True})


@dataclasses.dataclass(frozen=True)
class Row:
  label: str
  config: str                    # configs/<file>:<size>
  topology: str
  per_chip_batch: int | None     # None: the config's own global batch
  published: str | None = None   # the model name in published_tpu_throughput, same chips
  seq_len: int | None = None     # None: the config's (set to the published run's)
  slices: int = 1
  # the recipe's own settings beyond FSDP over every chip, no accumulation, flash attention
  recipe: tuple[tuple[str, Any], ...] = ()
  recipe_from: str = "ours"      # the MaxText benchmark config it follows, or "ours"

  @property
  def chips(self) -> int:
    from jaxformer.plan import topology
    return math.prod(topology.parse(self.topology)[1]) * self.slices


ROWS = [
    # dropout off, as in MaxText's pretraining recipes (attention dropout rules out the flash
    # kernels: the step would materialise the scores)
    Row("GPT-2 small", "gpt2.py:small", "v5e:2x2", 8,
        recipe=(("model.dropout_rate", 0.0), ("model.attention_dropout_rate", 0.0))),
    Row("Llama-2 7B", "llama.py:llama2-7b", "v5e:4x4", 2,
        recipe=(("model.remat_policy", "save_qkv"),), recipe_from="llama2-7b-v5e-256"),
    Row("Llama-3 8B", "llama.py:llama3-8b", "v6e:2x4", 3, "Llama 3.1 8B",
        recipe=(("model.remat_policy", "offload_layer_input_qkv_out"),),
        recipe_from="llama3_1-8b-8192"),
    Row("ViT-H/14", "vit.py:H/14", "v5e:4x4", 32, recipe=(("model.remat_policy", "full"),)),
    Row("Mixtral 8x7B", "mixtral.py:8x7b", "v5p:4x4x4", 4, seq_len=4096,
        recipe=(("model.remat_policy", "offload_layer_input_qkv_out"),),
        recipe_from="mixtral_8x7b_dropless (trillium's settings; dropless)"),
    Row("Llama-2 70B", "llama.py:llama2-70b", "v6e:16x16", 2, "Llama 2 70B",
        recipe=(("model.remat_policy", "offload_qkv"),), recipe_from="llama2_70b_4096_synthetic"),
    Row("Llama-3 70B", "llama.py:llama3-70b", "v6e:4x8", 2, "Llama 3.1 70B",
        recipe=(("model.remat_policy", "offload_layer_input_qkv"),),
        recipe_from="llama3_1-70b-8192-bs2"),
    Row("Mixtral 8x7B", "mixtral.py:8x7b", "v6e:16x16", 12, "Mixtral 8X7B", seq_len=4096,
        recipe=(("model.remat_policy", "offload_layer_input_qkv_out"),
                ("model.moe_dispatch", "capacity"), ("model.moe_capacity_factor", 1.25)),
        recipe_from="mixtral_8x7b_dropped"),
    Row("GPT-3 175B", "gpt3.py:175b", "v6e:16x16", 3, "GPT3-175B",
        recipe=(("model.remat_policy", "full"),), recipe_from="gpt-3-175b-bf16"),
]


def row_key(row: Row) -> str:
  seq = f" | seq {row.seq_len}" if row.seq_len else ""
  return f"{row.label} | {row.topology} x{row.slices} | batch/chip {row.per_chip_batch}{seq}"


def load(row: Row):
  from jaxformer.sweep.config import load_config
  overrides = {"model.scan_layers": True}
  if row.per_chip_batch is not None:
    overrides["train.batch_size"] = row.per_chip_batch * row.chips
  if row.seq_len is not None:
    overrides["data.seq_len"] = row.seq_len
  return load_config(str(ROOT / "configs" / row.config), overrides)


def _fixed(row: Row) -> dict[str, Any]:
  """What every recipe sets: FSDP over every chip, no accumulation, the attention kernel
  `auto` picks on TPU."""
  return {"mesh.data": row.chips // row.slices, "mesh.model": 1, "mesh.expert": 1,
          "mesh.fsdp": True, "mesh.replica": row.slices, "optim.grad_accum": 1,
          "model.attention_impl": "auto"}


def recipe(row: Row) -> dict[str, Any]:
  """The row's recipe as overrides: the fixed part and the recipe's own settings."""
  return {**_fixed(row), **dict(row.recipe)}


def run_row(row: Row, args) -> dict:
  from jaxformer.plan import estimate, search
  config = load(row)
  start = time.perf_counter()
  tried, compiles, best = [], [], None
  for extra in MEMORY_FALLBACKS:
    overrides = {**recipe(row), **extra}
    print(f"  recipe {' '.join(f'{k}={v}' for k, v in overrides.items())}", flush=True)
    try:
      plan = estimate.plan(search.with_overrides(config, overrides), row.topology, row.slices,
                           cache_dir=estimate.default_cache_dir()).to_json()
    except ValueError as e:              # a setting this row's model refuses: say so, go on
      tried.append({"overrides": overrides, "refused": str(e).splitlines()[0]})
      continue
    compiles.append(plan["compile_seconds"])
    tried.append({"overrides": overrides, "fits": plan["fits"],
                  "total_bytes": plan["per_chip_bytes"]["total"]})
    if plan["fits"]:
      best = {"overrides": overrides, "plan": plan, "by": "recipe"}
      break
  counts: dict[str, int] = {}
  if args.search:
    result = search.search(search.with_overrides(config, recipe(row)), row.topology,
                           row.slices, dimensions=DIMENSIONS,
                           budget_seconds=60 * args.budget_minutes, workers=args.workers,
                           max_compiles=args.max_compiles)
    for c in result.candidates:
      counts[c.status] = counts.get(c.status, 0) + 1
    compiles += [c.plan["compile_seconds"] for c in result.candidates if c.plan]
    found = result.best
    if found is not None and (best is None or found.seconds < best["plan"][
        "estimated_step_seconds"]):
      best = {"overrides": {**recipe(row), **found.overrides}, "plan": found.plan,
              "by": "search"}
  return {"row": dataclasses.asdict(row), "seconds": time.perf_counter() - start,
          "tried": tried, "counts": counts, "compile_seconds": compiles,
          "batch_size": config.train.batch_size, "seq_len": _length(config), "best": best,
          "why": None if best is not None else "none of the recipe's settings fit: " + "; ".join(
              t.get("refused") or f"{t['total_bytes'] / 2**30:.1f} GiB" for t in tried)}


def _length(config) -> str:
  """Tokens per example, or the image size for an image model."""
  if config.data.seq_len is not None:
    return str(config.data.seq_len)
  return f"{config.model.image_size}px"


def _published(row: Row) -> dict[str, float]:
  """The published run's metrics ({"tokens_per_s_per_chip": ..., "tflops_per_chip": ...}) of
  the row's model, slice and per-chip batch; {} where there is none."""
  if row.published is None:
    return {}
  return published.metrics(row.published, row.topology.split(":")[0], row.chips,
                           row.per_chip_batch)


def _tokens(row: Row, r: dict) -> int:
  """Tokens per chip per step (0 for images)."""
  seq = str(r["seq_len"])
  return row.per_chip_batch * int(seq) if seq.isdigit() else 0


def _published_cell(pub: dict) -> str:
  if "tokens_per_s_per_chip" not in pub:
    return "-"
  flops = f" ({pub['tflops_per_chip']:.0f})" if "tflops_per_chip" in pub else ""
  return f"{pub['tokens_per_s_per_chip']:,.0f}{flops}"


def _tflops(row: Row, plan: dict) -> float | None:
  est = plan["estimated_step_seconds"]
  return plan["flops_per_step"]["analytic"] / (row.chips * est) / 1e12 if est else None


def _short(overrides: dict, row: Row) -> str:
  """The settings beyond the recipe's fixed part (FSDP over every chip, no accumulation)."""
  fixed = _fixed(row)
  shown = {k: v for k, v in overrides.items() if fixed.get(k) != v}
  return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in shown.items()) or "-"


def table(results: dict, before: dict) -> str:
  lines = ["| model | slice | chips | global batch x seq | fits | settings beyond FSDP over "
           "every chip, no accumulation (recipe) | GiB/chip (host) | est. step s "
           "(compute + exposed comm.) | est. MFU | est. TFLOP/s/chip | before | est. tokens/s/chip "
           "| published tokens/s/chip (TFLOP/s) | published / est. | compiles |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for row in ROWS:
    r = results.get(row_key(row))
    if r is None:
      continue
    pub = _published(row)
    old = (before.get(row_key(row)) or {}).get("best")
    was = f"{_tflops(row, old['plan']):.0f}" if old else "no fit"
    compiles = r["compile_seconds"]
    compiled = (f"{len(compiles)} ({min(compiles):.0f}-{max(compiles):.0f} s)"
                if compiles else "0")
    source = row.recipe_from
    best = r["best"]
    if best is None:
      lines.append(f"| {row.label} | {row.topology} | {row.chips} | {r['batch_size']} x "
                   f"{r['seq_len']} | no: {r['why']} | ({source}) | - | - | - | - | {was} | - | "
                   f"{_published_cell(pub)} | - | {compiled} |")
      continue
    p = best["plan"]
    est = p["estimated_step_seconds"]
    parts = p.get("estimate") or {}
    split = (f" ({parts['compute_seconds']:.2f} + {parts['exposed_communication_seconds']:.2f})"
             if "exposed_communication_seconds" in parts else "")
    tflops = _tflops(row, p)
    tokens = _tokens(row, r) / est
    ratio = (f"{pub['tokens_per_s_per_chip'] / tokens:.2f}"
             if "tokens_per_s_per_chip" in pub and tokens else "-")
    host = p["per_chip_bytes"].get("host", 0)
    fits = "yes" if p["per_chip_bytes"]["total"] <= p["hbm_bytes"] else "yes (compiler)"
    lines.append(
        f"| {row.label} | {row.topology} | {row.chips} | {r['batch_size']} x {r['seq_len']} "
        f"| {fits} | {_short(best['overrides'], row)} ({source}; {best['by']}) | "
        f"{p['per_chip_bytes']['total'] / 2**30:.1f} ({host / 2**30:.1f}) | "
        f"{est:.3f}{split} | {100 * p['mfu']['estimate']:.0f}% | {tflops:.0f} | {was} | "
        f"{f'{tokens:,.0f}' if tokens else '-'} | {_published_cell(pub)} | {ratio} | "
        f"{compiled} |")
  return "\n".join(lines)


REPORT = """# Published models planned on TPU slices

`python -m experiments.tpu_plans` on a 2-core CPU machine with no accelerator: each row's
config compiled by libtpu for the slice's compile-only devices, with the settings MaxText's
benchmark configs use for that model and chip (the recipe column names the config, from
`{source}`; "ours" where MaxText has none): FSDP over every chip, no gradient accumulation,
layers scanned, the attention kernel `auto` picks on TPU (jaxformer's Pallas flash kernel),
the chunked loss, the remat/offload policy shown; where that does not fit, bfloat16 optimizer
moments, then moments in host memory. Every number on our side is an estimate from the TPU
compiler (its memory assignment, its per-op cycle estimates at the chip clock measured from
its matmul estimates) and the chips' public figures (`jaxformer/accelerators.py`), not a
measurement.

{table}

- fits: "yes (compiler)" where host memory is used and the bytes shown exceed HBM: the TPU
  compiler refuses a program whose temporaries exceed HBM (RESOURCE_EXHAUSTED, checked on a
  compile-only v5e), and accepted these; with host offload its temporaries count host buffers
  too, so the GiB column overstates the device's part there.
- global batch: the published run's per-chip batch x chips where there is one (so both sides
  describe the same step), otherwise a per-chip batch people use; seq is the published
  run's where the config's differs (Mixtral: 4096), otherwise the config's.
- est. step: the compiler's cycle estimate (Pallas kernels charged at
  `estimate.KERNEL_EFFICIENCY`, 50% of their roofline) plus the communication its schedule
  cannot hide behind the compute of the same scope (`jaxformer.plan.estimate.exposed_communication`).
- est. MFU: analytic model FLOPs (6N + attention + the output head's 6Vd, as MaxText counts
  them: `train.progress.flops_per_step`) / (chips x peak
  x estimated step); est. TFLOP/s/chip: the same FLOPs / (chips x estimated step).
- before: est. TFLOP/s/chip of the same row before the step's TPU work (XLA attention,
  float32 logits, a gradient reduce per micro-batch, one-hot MoE dispatch; the best of a
  search over mesh, FSDP, remat and accumulation: `tpu_plans_before.json`).
- published: measured by Google with MaxText, from `experiments/published_tpu_throughput.py`,
  where each number's source is recorded. published / est. divides tokens per second per chip
  (same model, slice and batch on both sides), so it does not depend on how FLOPs are counted:
  the published TFLOP/s count attention whole (Llama-3.1 8B's 413 is 1,423 TFLOP per chip per
  step), ours halve it for causal masks as Kaplan's count does (1,265 TFLOP there).
- The cost model's own factor: MaxText's compiled step for Llama-3.1 8B on v6e-8, analysed by
  this same estimator, comes out {factor:.2f}x slower than it was measured
  (`maxtext_calibration.md`); so a published / est. ratio near {factor:.2f} is MaxText's own
  program under the same model.

How far the estimate can be trusted: the compiler's cycle estimates are what XLA uses to
schedule, not a simulator. Where the published / estimated ratio is near 1 the compiled step
is as fast as MaxText's measured one would be if the estimate held; a ratio well above 1 says
our step, as compiled, does more work or moves more memory than theirs, and cannot tell that
apart from estimate error without hardware.

Runs (what each row compiled; compile times as measured when first compiled, on 2 cores
shared with other jobs; wall time of the run that wrote this):

{searches}
"""


def searches(results: dict) -> str:
  lines = []
  for row in ROWS:
    r = results.get(row_key(row))
    if r is None:
      continue
    compiled = r["compile_seconds"]
    tried = "; ".join(
        f"{_short(t['overrides'], row) if t['overrides'] else '-'}: "
        + (f"refused ({t['refused']})" if "refused" in t else
           f"{t['total_bytes'] / 2**30:.1f} GiB, {'fits' if t['fits'] else 'does not fit'}")
        for t in r["tried"])
    counts = ", ".join(f"{n} {k}" for k, n in sorted(r["counts"].items()))
    lines.append(f"- {row_key(row)}: {tried}" + (f"; search: {counts}" if counts else "")
                 + (f"; compiles {min(compiled):.0f}-{max(compiled):.0f} s each, "
                    f"{sum(compiled) / 60:.1f} min in all" if compiled else "")
                 + f"; this run {r['seconds'] / 60:.1f} min (cached compiles are read back)")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default=None, help="comma-separated labels (default: all)")
  parser.add_argument("--search", action="store_true",
                      help="also search around each recipe (compiles several candidates)")
  parser.add_argument("--budget_minutes", type=float, default=20.0)
  parser.add_argument("--max_compiles", type=int, default=3)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--redo", action="store_true", help="redo finished rows "
                      "(compiles come from the cache)")
  parser.add_argument("--out", default=str(RESULTS / "tpu_plans.md"))
  args = parser.parse_args(argv)
  state_path = RESULTS / "tpu_plans.json"
  results = json.loads(state_path.read_text()) if state_path.exists() else {}
  results = {k: v for k, v in results.items() if k in {row_key(r) for r in ROWS}}
  before = json.loads((RESULTS / "tpu_plans_before.json").read_text())
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
  pathlib.Path(args.out).write_text(render(results, before))
  print(table(results, before))


def render(results: dict, before: dict) -> str:
  pending = [row_key(r) for r in ROWS if row_key(r) not in results]
  text = table(results, before) + ("\n\nNot planned yet with the recipes (`python -m "
                                   "experiments.tpu_plans` resumes; their rows in "
                                   "`tpu_plans_before.json`): " + "; ".join(pending) + "."
                                   if pending else "")
  from experiments import maxtext_calibration
  calibration = json.loads((RESULTS / "maxtext_calibration.json").read_text())
  return REPORT.format(table=text, source=RECIPES_SOURCE, searches=searches(results),
                       factor=maxtext_calibration.factor(calibration, "llama3_1-8b_v6e-8"))


if __name__ == "__main__":
  main()
