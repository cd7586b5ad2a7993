"""A compute-optimal (Chinchilla) scaling study of character-level GPTs on a CPU, with
warmup-stable-decay cooldown branches, seeds and back-tests.

    python -m experiments.scaling_chinchilla --data=PATH/python_docs.txt
        [--workdir=runs/scaling_chinchilla] [--parallel=2] [--threads_per_run=1]
        [--until=runs] [--report_only] [--out=experiments/results/scaling_chinchilla]

Every run is a `jaxformer.sweep` point, so an interrupted study resumes where it stopped and a
re-run only refits and redraws; `--until=runs` stops after the runs that come before the
prediction (to train them in the background while the analysis code changes), and
`--report_only` re-renders OUT.md and OUT.png from OUT.json.

Design (numbers in the module constants):
- Model family: `configs/sweeps/isoflop.py`'s char GPTs (>= 2 layers), one `ladder` of sizes
  about 2x apart; N is the total parameter count (embeddings included, Hoffmann et al.),
  the non-embedding count is reported beside it; FLOPs are the exact count (Hoffmann et al.'s
  appendix F, `flops_per_token(method="hoffmann")`) everywhere: budgets, fits, optima.
- Budgets: 9 IsoFLOP budgets a quarter-decade apart, 1e11 .. 1e13 (100x); per budget every
  ladder size within 2^3 of the D = 20 N guess that gets >= 100 steps and <= 2 epochs.
- Schedules: warmup-stable-decay (decay over the last 20%, 1-sqrt shape, to 0). Per size one
  trunk is trained to its longest run; every shorter run is a cooldown branch of the trunk's
  checkpoint at that run's decay start (`scaling.plan_wsd`, `sweep.run_branched`), so a
  size's runs at all its budgets cost about one run.
- Learning rate: a width rule lr = k d^-p fitted to the optimum of LEARNING_RATES for the
  smallest, middle and largest size at LR_BUDGET (the LR runs are wsd trunks too, so their
  branches give the optimum at every lower budget); shown to hold across the budgets by the
  branches and by LR_CHECK: the largest top-budget size at 0.5x and 2x its rule LR.
- Seeds: SEEDS more seeds of SEEDED sizes up to SEED_BUDGET; sigma_seed is the pooled
  standard deviation of the final loss over seeds.
- Schedule check: COSINE_SIZES at COSINE_BUDGET as separate cosine runs (to 10%), 3 seeds,
  against the same sizes' cooldown branches.
- Fits: approaches 1-3 (`jaxformer.scaling`) on the seed-0 and seeded runs at the rule LR,
  bootstrap by trunk (the branches of one trunk share its stable phase, so they are one
  independent run), back-tests (`scaling.backtest`), and a prediction for 3x the largest
  budget written before that run trains, with its predictive interval, then the measured loss.

Processes: --parallel=2 trains two runs at once on one XLA:CPU thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

from configs.sweeps import isoflop  # noqa: E402
from jaxformer import scaling, sweep as sweep_lib  # noqa: E402

BUDGETS = tuple(float(f"{1e11 * 10 ** (k / 4):.3g}") for k in range(9))
LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
LR_BUDGET = 1e12
LR_CHECK_FACTORS = (0.5, 2.0)
SEEDS = (1, 2)
SEED_BUDGET = 3.16e12
COSINE_BUDGET = 1e12
PREDICTION_FACTOR = 3.0
DECAY_FRACTION = 0.2
MIN_WARMUP = 20
NAME = "L{model.num_layers}_d{model.d_model}_s{train.steps}_lr{optim.lr:g}_seed{train.seed}"
WSD = {"optim.decay_shape": "1-sqrt", "optim.min_lr_ratio": 0.0}


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help="a UTF-8 text corpus (e.g. python_docs.txt)")
  parser.add_argument("--workdir", default="runs/scaling_chinchilla")
  parser.add_argument("--parallel", type=int, default=2)
  parser.add_argument("--threads_per_run", type=int, default=1,
                      help="XLA:CPU threads of each run (0: XLA's default)")
  parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples")
  parser.add_argument("--until", choices=("runs", "all"), default="all",
                      help="runs: stop before the prediction (its fits need the final code)")
  parser.add_argument("--report_only", action="store_true",
                      help="re-render OUT.md/OUT.png from OUT.json, train nothing")
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/scaling_chinchilla"))
  args = parser.parse_args(argv)
  if not args.report_only:
    if not args.data or not os.path.isfile(args.data):
      parser.error(f"--data={args.data}: no such file (give the corpus, e.g. python_docs.txt)")
    args.data = os.path.abspath(args.data)
  return args


def overrides(args) -> dict:
  return {**isoflop.common_overrides(args.data, isoflop.corpus_info(args.data)[0]), **WSD}


def trunks_of(runs: list, **kwargs) -> list:
  return scaling.plan_wsd(runs, decay_fraction=DECAY_FRACTION, min_warmup_steps=MIN_WARMUP,
                          **kwargs)


def run_stage(args, name: str, trunks: list, lrs: list, seeds=(0,)) -> list[dict]:
  """Train `trunks` x `seeds` x `lrs` (rates or functions of the candidate) and their
  branches in workdir/name, as one sweep (both cores stay busy); the finished rows."""
  specs = merged([scaling.wsd_sweeps(trunks, isoflop.BASE, lr=lr, name=NAME,
                                     overrides=overrides(args), seeds=seeds) for lr in lrs])
  trunk_rows, branch_rows = sweep_lib.run_branched(specs, os.path.join(args.workdir, name),
                                                   parallel=args.parallel)
  rows = trunk_rows + branch_rows
  failed = [r["name"] for r in rows if r["status"] != "done"]
  if failed:
    raise SystemExit(f"error: runs {failed} of stage {name!r} did not finish; see their "
                     f"train.log under {os.path.join(args.workdir, name)} and re-run to resume")
  return rows


def merged(parts: list[dict]) -> dict:
  """One `wsd_sweeps` spec of several (same fields): zips concatenated, links re-indexed."""
  out = json.loads(json.dumps(parts[0]))
  for part in parts[1:]:
    trunks = len(out["trunks"]["zip"]["train.steps"])
    branches = len(out["branches"]["zip"]["train.steps"]) if out["branches"] else 0
    for kind in ("trunks", "branches"):
      if part[kind]:
        for key, values in part[kind]["zip"].items():
          out[kind]["zip"][key] = out[kind]["zip"][key] + list(values)
    out["links"] += [(b + branches, t + trunks, step) for b, t, step in part["links"]]
  return out


def lr_stage(args, plan: list) -> tuple[dict, list[dict]]:
  """The width rule {k, p, ...} from LEARNING_RATES x 3 sizes at LR_BUDGET (and, through
  their branches, at every lower budget)."""
  at = sorted({r.candidate.params: r for r in plan if r.budget == LR_BUDGET}.values(),
              key=lambda r: r.candidate.params)
  probes = {r.candidate.name for r in (at[0], at[len(at) // 2], at[-1])}
  runs = [r for r in plan if r.candidate.name in probes and r.budget <= LR_BUDGET]
  rows = run_stage(args, "lr", trunks_of(runs), list(LEARNING_RATES))
  return width_rule([r for r in rows if r["overrides"]["train.steps"] in
                     {p.steps for p in runs if p.budget == LR_BUDGET}]), rows


def width_rule(rows: list[dict]) -> dict:
  """Per width the optimum of the LR grid (`scaling.lr_optimum`: the parabola vertex in log
  LR, or the grid edge, flagged); then lr* = k d^-p (`scaling.lr_width_rule`, 95% CI on p)."""
  by_width: dict[int, dict[float, float]] = {}
  for row in rows:
    by_width.setdefault(row["overrides"]["model.d_model"], {})[
        row["overrides"]["optim.lr"]] = row["eval_loss"]
  optima, findings = {}, []
  for width, losses in sorted(by_width.items()):
    best = scaling.lr_optimum(list(losses), list(losses.values()))
    if best["edge"]:
      findings.append(f"d_model={width}: the best LR {best['lr']:g} is at the edge of the grid")
    optima[width] = best["lr"]
  widths = sorted(optima)
  rule = scaling.lr_width_rule(widths, [optima[w] for w in widths])
  return {"k": rule["k"], "p": -rule["slope"], "p_ci": [-rule["ci"][1], -rule["ci"][0]],
          "optima": {int(w): optima[w] for w in widths}, "findings": findings}


def rule_lr(rule: dict, d_model: int) -> float:
  """The width rule's LR, rounded to 3 significant digits (it names the run directory)."""
  return float(f"{rule['k'] * d_model ** -rule['p']:.3g}")


def by_width(rule: dict, factor: float = 1.0):
  return lambda candidate: float(f"{factor * rule_lr(rule, candidate.overrides['model.d_model']):.3g}")


def seeded_sizes(plan: list) -> set[str]:
  """The 3 sizes nearest the middle of the COSINE_BUDGET curve (the seeded and cosine sizes)."""
  at = sorted({r.candidate.params: r for r in plan if r.budget == COSINE_BUDGET}.values(),
              key=lambda r: r.candidate.params)
  middle = len(at) // 2
  return [r.candidate.name for r in at[max(middle - 1, 0):middle + 2]]


def lr_check_size(plan: list) -> str:
  """The widest size at the largest budget that has runs at >= 3 budgets (the rule's LR is
  extrapolated furthest there, and its branches test it at several budgets)."""
  runs_of = {}
  for r in plan:
    runs_of.setdefault(r.candidate.name, []).append(r)
  top = [r for r in plan if r.budget == max(BUDGETS) and len(runs_of[r.candidate.name]) >= 3]
  return max(top, key=lambda r: r.candidate.params).candidate.name


def cosine_stage(args, plan: list, rule: dict) -> list[dict]:
  """Two seeded sizes at COSINE_BUDGET as separate cosine runs (to 10% of the peak), seeds
  0, 1, 2: the schedule the branches are compared with."""
  sizes = seeded_sizes(plan)[:2]
  runs = [r for r in plan if r.candidate.name in sizes and r.budget == COSINE_BUDGET]
  spec = scaling.to_sweep(runs, isoflop.BASE, lr=lambda r: by_width(rule)(r.candidate),
                          overrides=isoflop.common_overrides(args.data,
                                                             isoflop.corpus_info(args.data)[0]),
                          name=NAME + "_cosine")
  spec["zip"] = {k: [v for v in vs for _ in (0, *SEEDS)] for k, vs in spec["zip"].items()}
  spec["zip"]["train.seed"] = [s for _ in runs for s in (0, *SEEDS)]
  rows = sweep_lib.run(spec, os.path.join(args.workdir, "cosine"), parallel=args.parallel)
  failed = [r["name"] for r in rows if r["status"] != "done"]
  if failed:
    raise SystemExit(f"error: cosine runs {failed} did not finish; re-run to resume")
  return rows


def training_stages(args) -> dict:
  """Every run before the prediction; returns the rows of each stage and the plan."""
  plan = isoflop.plan_window(args.data, BUDGETS)
  rule, lr_rows = lr_stage(args, plan)
  print(f"learning-rate rule: lr = {rule['k']:.4g} * d_model^-{rule['p']:.3f}", flush=True)
  main_rows = run_stage(args, "main", trunks_of(plan), [by_width(rule)])
  seeded = seeded_sizes(plan)
  seed_rows = run_stage(args, "seeds", trunks_of([r for r in plan if r.candidate.name in seeded
                                                  and r.budget <= SEED_BUDGET]),
                        [by_width(rule)], seeds=SEEDS)
  top = lr_check_size(plan)
  check_rows = run_stage(args, "lr_check", trunks_of(
      [r for r in plan if r.candidate.name == top]),
      [by_width(rule, factor) for factor in LR_CHECK_FACTORS])
  cosine_rows = cosine_stage(args, plan, rule)
  return {"plan": plan, "rule": rule, "lr": lr_rows, "main": main_rows, "seeds": seed_rows,
          "lr_check": check_rows, "cosine": cosine_rows}


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.report_only:
    results = json.loads(pathlib.Path(args.out).with_suffix(".json").read_text())
    write_report(args, results)
    return 0
  if args.threads_per_run:
    sweep_lib.limit_xla_threads(args.threads_per_run)
  stages = training_stages(args)
  if args.until == "runs":
    print("every run before the prediction is trained (--until=runs)")
    return 0
  raise SystemExit("the analysis stage is not written yet")


def write_report(args, results: dict) -> None:
  raise SystemExit("the analysis stage is not written yet")


if __name__ == "__main__":
  sys.exit(main())
