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
- Schedule check: two seeded sizes at COSINE_BUDGET (the larger also at SEED_BUDGET:
  COSINE_CHECKS) as separate cosine runs (COSINE_VARIANTS: to 10% at 1x and 2x the rule's LR,
  and to 0 with the branch's warmup), 3 seeds, against the same sizes' cooldown branches.
- Fits: approaches 1-3 (`jaxformer.scaling`) on the seed-0 and seeded runs at the rule LR,
  bootstrap by trunk (the branches of one trunk share its stable phase, so they are one
  independent run), back-tests (`scaling.backtest`), and a prediction for 3x the largest
  budget written before that run trains, with its predictive interval, then the measured loss.

Processes: --parallel=2 trains two runs at once on one XLA:CPU thread each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

import numpy as np  # noqa: E402

from configs.sweeps import isoflop  # noqa: E402
from experiments import report_check  # noqa: E402
from jaxformer import scaling, sweep as sweep_lib  # noqa: E402

BUDGETS = tuple(float(f"{1e11 * 10 ** (k / 4):.3g}") for k in range(9))
LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
LR_BUDGET = 1e12
LR_CHECK_FACTORS = (0.5, 2.0)
SEEDS = (1, 2)
SEED_BUDGET = 3.16e12
COSINE_BUDGET = 1e12
# (peak LR x the rule's, final LR x the peak, warmup): "5%" of the run (planning's cosine
# runs) or "trunk" (the branch's own warmup). The last variant differs from the branch only in
# the shape of the decay, as in Hägele et al. 2024's comparison.
COSINE_VARIANTS = ((1.0, 0.1, "5%"), (2.0, 0.1, "5%"), (1.0, 0.0, "trunk"))
# (budget, which of the first two seeded sizes, which COSINE_VARIANTS): every variant at
# COSINE_BUDGET; the larger size's run there is short (783 steps), so it is also checked at
# SEED_BUDGET (2,473 steps), where its branches have 3 seeds too.
COSINE_CHECKS = ((COSINE_BUDGET, (0, 1), (0, 1, 2)), (SEED_BUDGET, (1,), (0, 1)))
PREDICTION_FACTOR = 3.0
BACKTEST_SAMPLES = 50           # bootstrap resamples of each back-test fit (for its coverage)
DECAY_FRACTION = 0.2
MIN_WARMUP = 20
FORMAT = "wsd-branches-1"          # OUT.json's layout (the cosine study before #30 had none)
NAME = "L{model.num_layers}_d{model.d_model}_s{train.steps}_lr{optim.lr:g}_seed{train.seed}"
WSD = {"optim.decay_shape": "1-sqrt", "optim.min_lr_ratio": 0.0}


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help="a UTF-8 text corpus (e.g. python_docs.txt: "
                      "python -m experiments.python_docs_corpus builds it)")
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
  return finished_rows(trunk_rows + branch_rows, name, args.workdir)


def finished_rows(rows: list[dict], stage: str, workdir: str) -> list[dict]:
  """`rows` when every run finished, else the one-line error that names them (a rerun of the
  study resumes them)."""
  failed = [r["name"] for r in rows if r["status"] != "done"]
  if failed:
    raise SystemExit(f"error: runs {failed} of stage {stage!r} did not finish; see their "
                     f"train.log under {os.path.join(workdir, stage)} and re-run to resume")
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
  """Two seeded sizes as separate cosine runs (COSINE_CHECKS), seeds 0, 1, 2, in the
  COSINE_VARIANTS: to 10% of the peak after a 5% warmup at 1x and 2x the rule's LR (the rule
  was tuned under wsd, whose mean LR over a run is higher than a cosine's), and to 0 after
  the branch's own warmup at 1x (only the decay's shape differs from the branch): the
  schedules the branches are compared with."""
  sizes = seeded_sizes(plan)[:2]
  trunk_warmup = {t.candidate.name: t.warmup_steps
                  for t in trunks_of([r for r in plan if r.candidate.name in sizes])}
  rows = []
  for budget, which, variants in COSINE_CHECKS:
    runs = [r for r in plan if r.candidate.name in [sizes[i] for i in which]
            and r.budget == budget]
    rows += _cosine_runs(args, rule, runs, [COSINE_VARIANTS[i] for i in variants],
                         trunk_warmup)
  return finished_rows(rows, "cosine", args.workdir)


def _cosine_runs(args, rule: dict, runs: list, variants, trunk_warmup: dict) -> list[dict]:
  rows = []
  for factor, end, warmup in variants:
    spec = scaling.to_sweep(runs, isoflop.BASE, lr=lambda r: by_width(rule, factor)(r.candidate),
                            overrides={**isoflop.common_overrides(
                                args.data, isoflop.corpus_info(args.data)[0]),
                                "optim.min_lr_ratio": end},
                            name=NAME + ("_cosine" if end == 0.1 else f"_cosine_to{end:g}"))
    if warmup == "trunk":
      spec["zip"]["optim.warmup_steps"] = [trunk_warmup[r.candidate.name] for r in runs]
    spec["zip"] = {k: [v for v in vs for _ in (0, *SEEDS)] for k, vs in spec["zip"].items()}
    spec["zip"]["train.seed"] = [s for _ in runs for s in (0, *SEEDS)]
    rows += sweep_lib.run(spec, os.path.join(args.workdir, "cosine"), parallel=args.parallel)
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


# ---------------------------------------------------------------------------------------------
# Results: every run as a point (OUT.json), then the analysis, then the report from the JSON.

def points_of(args, stages: dict, prediction_rows=()) -> list[dict]:
  """One record per finished run of every stage: its size (N total and non-embedding), tokens,
  exact FLOPs, budget, LR, seed, schedule, trunk (the independent run it belongs to) and final
  eval loss."""
  vocab_size = isoflop.corpus_info(args.data)[0]
  family = {(c.overrides["model.num_layers"], c.overrides["model.d_model"]): c
            for c in isoflop.gpt_candidates(vocab_size)}
  budgets = {(r.candidate.name, r.steps): r.budget for r in stages["plan"]}
  out = []
  for stage in ("lr", "main", "seeds", "lr_check", "cosine", "predict"):
    rows = prediction_rows if stage == "predict" else stages[stage]
    for row in rows:
      o = row["overrides"]
      c = family[(o["model.num_layers"], o["model.d_model"])]
      steps = o["train.steps"]
      tokens = steps * isoflop.TOKENS_PER_STEP
      seed = o.get("train.seed", 0)
      out.append({
          "stage": stage, "name": row["name"], "size": c.name, "n": c.params,
          "n_non_embedding": row["params"], "d": tokens, "steps": steps,
          "flops": c.flops_per_token * tokens, "flops_per_token": c.flops_per_token,
          "budget": budgets.get((c.name, steps), c.flops_per_token * tokens),
          "lr": o["optim.lr"], "seed": seed, "schedule": o.get("optim.schedule", "wsd"),
          "warmup_steps": o.get("optim.warmup_steps"),
          "min_lr_ratio": o.get("optim.min_lr_ratio", WSD["optim.min_lr_ratio"]),
          "trunk": f"{stage}/{c.name}/lr{o['optim.lr']:g}/seed{seed}",
          "eval_loss": row["eval_loss"], "wall_time_s": row["wall_time_s"]})
  return out


def setup_of(args) -> dict:
  vocab_size, train_chars = isoflop.corpus_info(args.data)
  family = isoflop.gpt_candidates(vocab_size)
  return {"corpus": pathlib.Path(args.data).name, "vocab": vocab_size,
          "train_chars": train_chars, "budgets": list(BUDGETS),
          "tokens_per_step": isoflop.TOKENS_PER_STEP, "decay_fraction": DECAY_FRACTION,
          "learning_rates": list(LEARNING_RATES), "lr_budget": LR_BUDGET,
          "seeds": [0, *SEEDS], "seed_budget": SEED_BUDGET, "cosine_budget": COSINE_BUDGET,
          "prediction_factor": PREDICTION_FACTOR, "bootstrap": args.bootstrap,
          "family": [{"size": c.name, "n": c.params, "flops_per_token": c.flops_per_token}
                     for c in family]}


def fit_points(points: list[dict]) -> list[dict]:
  """The runs the laws are fitted to: every wsd run at the rule's LR (seed 0 and the seeds)."""
  return [p for p in points if p["stage"] in ("main", "seeds")]


def fpt_of(setup: dict):
  family = sorted({f["n"]: f for f in setup["family"]}.values(), key=lambda f: f["n"])
  return scaling.family_flops_per_token([f["n"] for f in family],
                                        [f["flops_per_token"] for f in family])


def _fit_arrays(points: list[dict]):
  fit = fit_points(points)
  arr = {k: np.array([p[k] for p in fit], np.float64) for k in ("n", "d", "eval_loss", "budget")}
  return fit, arr, np.array([p["trunk"] for p in fit])


NON_EMBEDDING = "approach 3 (non-embedding N)"


def approach_3(points: list[dict], samples: int, key: str = "n"):
  """Approach 3 on N = total parameters (`key="n"`) or non-embedding ("n_non_embedding")."""
  fit, arr, trunks = _fit_arrays(points)
  n = np.array([p[key] for p in fit], np.float64)
  return scaling.fit_parametric(n, arr["d"], arr["eval_loss"], samples=samples, groups=trunks)


def fpt_non_embedding(points: list[dict]):
  """FLOPs per token as a function of the non-embedding count, from the trained sizes."""
  sizes = sorted({p["n_non_embedding"]: p["flops_per_token"] for p in fit_points(points)}.items())
  return scaling.family_flops_per_token([s[0] for s in sizes], [s[1] for s in sizes])


def bracketed_budgets(points: list[dict]) -> tuple[list[float], list[float]]:
  """(used, excluded) budgets for approach 2: a parabola's vertex is an optimum only where the
  IsoFLOP curve's lowest loss (seed mean) lies inside the sizes trained, with >= 3 sizes."""
  used, excluded = [], []
  for budget in sorted({p["budget"] for p in fit_points(points)}):
    by_n: dict[int, list[float]] = {}
    for p in fit_points(points):
      if p["budget"] == budget:
        by_n.setdefault(p["n"], []).append(p["eval_loss"])
    sizes = sorted(by_n)
    best = int(np.argmin([np.mean(by_n[n]) for n in sizes]))
    (used if len(sizes) >= 3 and 0 < best < len(sizes) - 1 else excluded).append(budget)
  return used, excluded


def fits_of(points: list[dict], samples: int) -> tuple[dict, dict]:
  """Approaches 1-3 on the rule-LR runs, each bootstrapped by trunk, and the bootstrap
  errors: a fit whose resamples fail too often (`scaling.BootstrapError`) is reported with
  no interval and the reason, never with intervals from the resamples that happened to fit."""
  fit, arr, trunks = _fit_arrays(points)
  used = np.isin(arr["budget"], bracketed_budgets(points)[0])
  curves = []
  for trunk in sorted(set(trunks.tolist())):
    mine = sorted((p for p in fit if p["trunk"] == trunk), key=lambda p: p["d"])
    if len(mine) >= 2:
      curves.append(scaling.Curve(params=mine[0]["n"], tokens=np.array([p["d"] for p in mine]),
                                  loss=np.array([p["eval_loss"] for p in mine]),
                                  flops_per_token=mine[0]["flops_per_token"]))
  makers = {
      "approach 1": lambda k: scaling.envelope_optimum(curves, window=1, samples=k),
      "approach 2": lambda k: scaling.isoflop_optimum(
          arr["n"][used], arr["d"][used], arr["eval_loss"][used], arr["budget"][used],
          samples=k, groups=trunks[used]),
      "approach 3": lambda k: approach_3(points, k),
      NON_EMBEDDING: lambda k: approach_3(points, k, "n_non_embedding")}
  fits, errors = {}, {}
  for name, make in makers.items():
    try:
      fits[name] = make(samples)
    except scaling.BootstrapError as e:
      fits[name], errors[name] = make(0), str(e)
  return fits, errors


def seed_noise(points: list[dict]) -> dict:
  """sigma_seed: the pooled standard deviation of the final loss over seeds of one (size,
  tokens) run, in nats and in log loss (the approach-3 residual's space)."""
  groups: dict[tuple, list[float]] = {}
  for p in fit_points(points):
    groups.setdefault((p["size"], p["d"]), []).append(p["eval_loss"])
  rows = [{"size": k[0], "d": k[1], "losses": v, "mean": float(np.mean(v)),
           "sd": float(np.std(v, ddof=1))} for k, v in sorted(groups.items()) if len(v) >= 3]
  if not rows:
    return {"rows": [], "sigma": float("nan"), "sigma_log": float("nan"), "points": 0}
  var = np.mean([r["sd"] ** 2 for r in rows])
  var_log = np.mean([np.var(np.log(r["losses"]), ddof=1) for r in rows])
  return {"rows": rows, "sigma": float(np.sqrt(var)), "sigma_log": float(np.sqrt(var_log)),
          "points": len(rows)}


def lr_table(points: list[dict], rule: dict) -> list[dict]:
  """Per width and budget of the LR stage: the grid's optimum LR against the rule's."""
  out = []
  lr_points = [p for p in points if p["stage"] == "lr"]
  for size, d in sorted({(p["size"], p["d"]) for p in lr_points}):
    mine = sorted((p for p in lr_points if p["size"] == size and p["d"] == d),
                  key=lambda p: p["lr"])
    if len(mine) < 3:
      continue
    best = scaling.lr_optimum([p["lr"] for p in mine], [p["eval_loss"] for p in mine])
    width = int(size.split("_d")[1])
    out.append({"size": size, "budget": mine[0]["budget"], "d": d, "optimum": best["lr"],
                "edge": best["edge"], "rule": rule_lr(rule, width),
                "losses": {f"{p['lr']:g}": p["eval_loss"] for p in mine}})
  return out


def lr_check(points: list[dict]) -> list[dict]:
  """The LR check size at 0.5x, 1x (its main runs) and 2x the rule's LR, per budget."""
  check = [p for p in points if p["stage"] == "lr_check"]
  if not check:
    return []
  size = check[0]["size"]
  main = [p for p in points if p["stage"] == "main" and p["size"] == size]
  out = []
  for d in sorted({p["d"] for p in check}):
    row = {"size": size, "d": d, "budget": next(p["budget"] for p in check if p["d"] == d)}
    for p in main + check:
      if p["d"] == d:
        row[f"{p['lr']:g}"] = p["eval_loss"]
    out.append(row)
  return out


def cosine_check(points: list[dict], sigma: float) -> list[dict]:
  """Per cosine size: mean final loss of the cosine runs and of the same runs as cooldown
  branches over the 3 seeds, their difference against 2 sigma_seed."""
  out = []
  variant = lambda p: (p["size"], p["d"], p["lr"], p.get("min_lr_ratio", 0.1),  # noqa: E731
                       p.get("warmup_steps") or 0)
  for key in sorted({variant(p) for p in points if p["stage"] == "cosine"}):
    size, d, lr, end, warmup = key
    cos = [p["eval_loss"] for p in points if p["stage"] == "cosine" and variant(p) == key]
    wsd = [p for p in fit_points(points) if p["size"] == size and p["d"] == d]
    diff = float(np.mean([p["eval_loss"] for p in wsd]) - np.mean(cos))
    out.append({"size": size, "d": d, "budget": wsd[0]["budget"], "cosine_lr": lr,
                "wsd_lr": wsd[0]["lr"],
                "cosine_end": end, "cosine_warmup": warmup,
                "wsd_warmup": wsd[0].get("warmup_steps"), "cosine": cos,
                "wsd": [p["eval_loss"] for p in wsd], "difference": diff,
                "within_2_sigma": bool(abs(diff) <= 2 * sigma)})
  return out


def analyse(results: dict, samples: int) -> dict:
  """The fits, optima, seed noise, LR and schedule checks and back-tests of `results`."""
  import functools
  points, setup = results["points"], results["setup"]
  fits, bootstrap_errors = fits_of(points, samples)
  fpt = fpt_of(setup)
  budgets = setup["budgets"]
  fit3 = fits["approach 3"]
  noise = seed_noise(points)
  test_points = [{"n": p["n"], "d": p["d"], "loss": p["eval_loss"], "budget": p["budget"],
                  "group": p["trunk"]} for p in fit_points(points)]
  try:
    backtest = scaling.backtest(test_points, fit=functools.partial(   # 10 fits: fewer draws
        scaling.fit_parametric, samples=min(samples, BACKTEST_SAMPLES)))
  except scaling.BootstrapError as e:            # errors without coverage, and say why
    bootstrap_errors["back-test"] = str(e)
    backtest = scaling.backtest(test_points, fit=functools.partial(
        scaling.fit_parametric, samples=0))
  exact = {"approach 3": fpt, NON_EMBEDDING: fpt_non_embedding(points)}
  optima = []
  for c in budgets:
    row = {"budget": c}
    for name, fit in fits.items():
      n, d = (fit.compute_optimal(c, flops_per_token=exact[name]) if name in exact
              else fit.compute_optimal(c))
      row[name] = [float(n), float(d)]
    row["approach 3, C = 6ND"] = [float(v) for v in fit3.compute_optimal(c)]
    optima.append(row)
  exponents = {name: ({k: [v[0], list(v[1])] for k, v in
                       fit.exponents(budgets=[min(budgets), max(budgets)],
                                     flops_per_token=exact[name]).items()}
                      if name in exact else
                      {k: [fit.params[k], list(fit.ci(k))] for k in ("a", "b")})
               for name, fit in fits.items()}
  exponents["approach 3, C = 6ND"] = {k: [v[0], list(v[1])]
                                      for k, v in fit3.exponents().items()}
  flagged = bool(noise["sigma_log"] > fit3.rms_residual)
  used, excluded = bracketed_budgets(points)
  return {"fits": {k: v.as_dict() for k, v in fits.items()}, "exponents": exponents,
          "bootstrap_errors": bootstrap_errors,
          "approach_2_budgets": {"used": used, "excluded": excluded},
          "optima": optima, "seed_noise": noise, "seed_noise_exceeds_residual": flagged,
          "lr_table": lr_table(points, results["rule"]), "lr_check": lr_check(points),
          "cosine_check": cosine_check(points, noise["sigma"]),
          "backtest": backtest.as_dict(), "backtest_markdown": backtest.markdown()}


def predict(args, results: dict) -> dict:
  """The run at PREDICTION_FACTOR x the largest budget: the family's size with the lowest
  approach-3 loss at that budget (exact FLOPs) and its predicted loss with a 95% predictive
  interval. Written to prediction.json before the run trains, never recomputed."""
  path = pathlib.Path(args.workdir) / "prediction.json"
  if path.exists():
    return json.loads(path.read_text())
  fit3 = approach_3(results["points"], args.bootstrap)
  budget = PREDICTION_FACTOR * max(BUDGETS)
  vocab_size, train_chars = isoflop.corpus_info(args.data)
  options = []
  for candidate in isoflop.gpt_candidates(vocab_size):
    try:
      run = scaling.plan_run(budget, candidate, tokens_per_step=isoflop.TOKENS_PER_STEP,
                             flops="exact", max_tokens=isoflop.MAX_EPOCHS * train_chars,
                             min_steps=100)
    except ValueError:
      continue
    options.append((float(fit3.predict(run.candidate.params, run.tokens)), run))
  predicted, run = min(options, key=lambda o: o[0])
  low, high = fit3.predict_interval(run.candidate.params, run.tokens)
  mean_low, mean_high = fit3.predict_ci(run.candidate.params, run.tokens)
  n_opt, d_opt = fit3.compute_optimal(budget, flops_per_token=fpt_of(results["setup"]))
  out = {"budget": budget, "size": run.candidate.name, "n": run.candidate.params,
         "d": run.tokens, "steps": run.steps, "flops": run.flops,
         "predicted_loss": predicted, "predictive_interval": [float(low), float(high)],
         "mean_law_interval": [float(mean_low), float(mean_high)],
         "optimum_exact": {"n": float(n_opt), "d": float(d_opt)},
         "predicted_at": time.strftime("%Y-%m-%d %H:%M:%S")}
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(out, indent=2) + "\n")
  return out


def prediction_stage(args, prediction: dict, rule: dict) -> list[dict]:
  """Train the predicted run (a wsd run of its own length at the rule's LR)."""
  vocab_size, train_chars = isoflop.corpus_info(args.data)
  (candidate,) = [c for c in isoflop.gpt_candidates(vocab_size) if c.name == prediction["size"]]
  run = scaling.plan_run(prediction["budget"], candidate, tokens_per_step=isoflop.TOKENS_PER_STEP,
                         flops="exact", max_tokens=isoflop.MAX_EPOCHS * train_chars,
                         min_steps=100)
  return run_stage(args, "predict", trunks_of([run]), [by_width(rule)])


CHINCHILLA = {"approach 1": (0.50, 0.50), "approach 2": (0.49, 0.51),
              "approach 3": (0.46, 0.54), NON_EMBEDDING: (0.46, 0.54),
              "approach 3, C = 6ND": (0.46, 0.54)}


def _ci(value: float, ci, fmt: str = ".3f") -> str:
  low, high = ci
  if low is None or high is None or low != low or high != high:
    return f"{value:{fmt}} [no interval]"
  return f"{value:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def _table(header: list[str], rows: list[list], align: str | None = None) -> str:
  align = align or "|" + "---|" * len(header)
  return "\n".join(["| " + " | ".join(header) + " |", align,
                    *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)])


def render(results: dict) -> str:
  """The report, from OUT.json alone (so `--report_only` and the report test rebuild it)."""
  setup, rule, points = results["setup"], results["rule"], results["points"]
  analysis, prediction = results["analysis"], results["prediction"]
  fits, noise = analysis["fits"], analysis["seed_noise"]
  fit3 = fits["approach 3"]
  main = [p for p in points if p["stage"] == "main"]
  budgets = setup["budgets"]
  sections = [
      "# Compute-optimal scaling of character-level GPTs on a CPU (Chinchilla approaches 1-3, "
      "cooldown branches)",
      f"Corpus `{setup['corpus']}` (character-level, {setup['vocab']} symbols, "
      f"{setup['train_chars']:,} training characters). {len(budgets)} IsoFLOP budgets "
      f"{budgets[0]:.3g} .. {budgets[-1]:.3g} FLOPs ({budgets[-1] / budgets[0]:.0f}x), "
      f"{len({p['size'] for p in main})} sizes of >= 2 layers "
      f"({min(p['n'] for p in main):,} .. {max(p['n'] for p in main):,} parameters), "
      f"{len(main)} seed-0 runs. **One FLOP convention throughout**: C is the exact training "
      "FLOPs (Hoffmann et al. appendix F: embeddings, logits and attention included) in the "
      "budgets, the fits, the optima and the exponents; the C = 6ND closed form is shown "
      "beside it only for comparison. N is the total parameter count (Hoffmann et al.); the "
      "non-embedding count is in the runs table (Pearce & Song 2024 show the choice moves "
      "the exponents at small N). Every run is warmup-stable-decay (decay over the last "
      f"{setup['decay_fraction']:.0%}, 1-sqrt, to 0); each size's shorter runs are cooldown "
      "branches of its longest run (trained for their decay only), so the points of one trunk "
      "share its stable phase: every bootstrap resamples trunks, not points. Batch 16 x 64 "
      "tokens; final eval loss on the same 40 validation batches. Reproduce: `python -m "
      "experiments.scaling_chinchilla --data=PATH/python_docs.txt`; `--report_only` rebuilds "
      "this file from its JSON.",
      "## Learning rate",
      f"One rule for every budget: lr = {rule['k']:.4g} x d_model^-{rule['p']:.3f} (95% "
      f"t-interval on p [{rule['p_ci'][0]:.2f}, {rule['p_ci'][1]:.2f}]), fitted to the "
      f"optimum of {len(setup['learning_rates'])} LRs for d_model "
      f"{', '.join(map(str, rule['optima']))} at {setup['lr_budget']:.3g} FLOPs (per-width "
      "tuning at one budget; μP would cover width but not the depth this family also "
      "changes). That it holds across the budgets: the LR runs' cooldown branches give each "
      "width's optimum at every smaller budget, and the LR check trains the widest "
      "top-budget size at 0.5x and 2x the rule.",
      _table(["size", "budget", "tokens", "optimum LR (grid)", "rule LR", "optimum / rule",
              "losses by LR"],
             [[r["size"], f"{r['budget']:.3g}", f"{r['d']:,}",
               f"{r['optimum']:.3g}{' (edge)' if r['edge'] else ''}", f"{r['rule']:.3g}",
               f"{r['optimum'] / r['rule']:.2f}",
               ", ".join(f"{k}: {v:.4f}" for k, v in r["losses"].items())]
              for r in analysis["lr_table"]]),
      _lr_check_text(analysis["lr_check"]),
      "## Exponents of the compute-optimal allocation",
      _table(["approach", "a (N_opt ~ C^a), 95% CI", "b (D_opt ~ C^b), 95% CI",
              "Chinchilla a / b", "bootstrap"],
             [[name, _ci(v["a"][0], v["a"][1]), _ci(v["b"][0], v["b"][1]),
               f"{CHINCHILLA[name][0]:.2f} / {CHINCHILLA[name][1]:.2f}",
               _bootstrap_cell(analysis, name.split(",")[0])]
              for name, v in analysis["exponents"].items()]),
      "Approaches 1 and 2 read N_opt(C) off the runs at their exact FLOPs; approach 2 uses "
      f"the {len(analysis['approach_2_budgets']['used'])} budgets whose IsoFLOP curve has its "
      "lowest loss inside the sizes trained" + (
          " (not " + ", ".join(f"{c:.3g}" for c in analysis["approach_2_budgets"]["excluded"])
          + ": their lowest loss is at the smallest or largest size, so no vertex is an "
          "optimum)" if analysis["approach_2_budgets"]["excluded"] else "") + ". Approach 3's "
      "exponents are the slopes of its optimum, minimised at exact compute, over "
      f"{budgets[0]:.3g} .. {budgets[-1]:.3g}; the 6ND row is the closed form of the same fit; "
      "the non-embedding row fits the law to non-embedding N (Kaplan's count), whose share "
      "of N grows with size here, so its exponents differ (Pearce & Song 2024).",
      "## Approach 3: L(N, D) = E + A / N^alpha + B / D^beta",
      _table(["parameter", "value", "95% CI", "Hoffmann et al. 2022", "Besiroglu et al. 2024"],
             [[k, f"{fit3['params'][k]:.4g}",
               _ci(fit3["params"][k], fit3["ci"].get(k, [None, None]), ".4g").split(" ", 1)[1],
               f"{scaling.HOFFMANN_2022.params[k]:g}", f"{scaling.BESIROGLU_2024.params[k]:g}"]
              for k in ("E", "A", "B", "alpha", "beta")]),
      f"{fit3['method']}; RMS residual {fit3['rms_residual']:.4f} in log loss over "
      f"{fit3['n_points']} runs.",
      "## Compute-optimal N, D and tokens per parameter (exact FLOPs)",
      _table(["budget (FLOPs)", *[f"{k}: N_opt, D_opt, D/N" for k in analysis["optima"][0]
                                  if k != "budget"]],
             [[f"{row['budget']:.3g}", *[f"{v[0]:,.0f}, {v[1]:,.0f}, {v[1] / v[0]:.1f}"
                                         for k, v in row.items() if k != "budget"]]
              for row in analysis["optima"]]),
      "## Seed noise",
      _seed_text(noise, fit3, analysis["seed_noise_exceeds_residual"]),
      "## Cooldown branch vs a separate cosine run",
      _cosine_text(analysis["cosine_check"], noise["sigma"]),
      "## Back-tests (approach 3)",
      analysis["backtest_markdown"] + (
          "\n\nNo coverage: " + analysis["bootstrap_errors"]["back-test"]
          if "back-test" in analysis.get("bootstrap_errors", {}) else ""),
      "## Prediction of a run not yet trained",
      f"Budget {prediction['budget']:.3g} FLOPs ({setup['prediction_factor']:g}x the largest). "
      f"Approach 3 (exact FLOPs; optimum N = {prediction['optimum_exact']['n']:,.0f}) picked "
      f"{prediction['size']} (N = {prediction['n']:,}, D = {prediction['d']:,}) and predicted "
      f"eval loss {prediction['predicted_loss']:.4f}, 95% predictive interval "
      f"[{prediction['predictive_interval'][0]:.4f}, {prediction['predictive_interval'][1]:.4f}] "
      f"(the mean law's alone: [{prediction['mean_law_interval'][0]:.4f}, "
      f"{prediction['mean_law_interval'][1]:.4f}]), at {prediction['predicted_at']}, before "
      f"training it. Measured: {prediction['measured_loss']:.4f}; error "
      f"{prediction['error']:+.4f} nats ({prediction['relative_error']:+.2%}), "
      f"{'inside' if prediction['inside'] else 'outside'} the predictive interval.",
      "## Findings",
      "\n".join(f"- {name}: {f}" for name, fit in fits.items() for f in fit["findings"])
      or "none",
      "## Runs",
      _table(["stage", "run", "N (total)", "N (non-emb.)", "D tokens", "D/N", "FLOPs (exact)",
              "6ND", "lr", "seed", "eval loss", "wall s"],
             [[p["stage"], p["name"], f"{p['n']:,}", f"{p['n_non_embedding']:,}", f"{p['d']:,}",
               f"{p['d'] / p['n']:.1f}", f"{p['flops']:.3g}", f"{6 * p['n'] * p['d']:.3g}",
               f"{p['lr']:g}", p["seed"], f"{p['eval_loss']:.4f}", f"{p['wall_time_s']:.0f}"]
              for p in sorted(points, key=lambda p: (p["stage"], p["n"], p["d"], p["seed"]))],
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"),
      "![study](scaling_chinchilla.png)", ""]
  return "\n\n".join(sections)


def _bootstrap_cell(analysis: dict, name: str) -> str:
  error = analysis.get("bootstrap_errors", {}).get(name)
  if error:
    return "**no interval**: " + error.split(";")[0]
  return analysis["fits"][name]["bootstrap"]


def _lr_check_text(rows: list[dict]) -> str:
  if not rows:
    return "LR check: not run."
  rates = sorted({k for r in rows for k in r if k not in ("size", "d", "budget")}, key=float)
  return (f"LR check ({rows[0]['size']}; the middle column is the rule's LR):\n\n" +
          _table(["budget", "tokens", *[f"lr {r}" for r in rates]],
                 [[f"{r['budget']:.3g}", f"{r['d']:,}",
                   *[f"{r[k]:.4f}" if k in r else "" for k in rates]] for r in rows]))


def _seed_text(noise: dict, fit3: dict, flagged: bool) -> str:
  if not noise["points"]:
    return "No seed replicates."
  return (f"{noise['points']} (size, tokens) runs trained with 3 seeds: sigma_seed = "
          f"{noise['sigma']:.4f} nats (pooled sd), {noise['sigma_log']:.4f} in log loss, "
          f"against approach 3's RMS residual {fit3['rms_residual']:.4f}: "
          + ("**flagged**: the seed noise exceeds the residual, so the fit is as good as the "
             "runs can show and its small residual is partly chance" if flagged else
             "the residual exceeds the seed noise (the law misses by more than seed noise)")
          + ".\n\n" + _table(["size", "tokens", "losses (seeds 0, 1, 2)", "mean", "sd"],
                             [[r["size"], f"{r['d']:,}",
                               ", ".join(f"{v:.4f}" for v in r["losses"]),
                               f"{r['mean']:.4f}", f"{r['sd']:.4f}"] for r in noise["rows"]]))


def _cosine_text(rows: list[dict], sigma: float) -> str:
  if not rows:
    return "Not run."
  return ("3 seeds each: the mean final loss of the cooldown branch "
          "(warmup, constant, 1-sqrt decay to 0 over the last 20%) minus that of a separate "
          f"cosine run of the same length, against 2 sigma_seed = {2 * sigma:.4f}. The cosine "
          "runs: warmup 5% and cosine to 10% of the peak, at the branch's peak LR (the rule, "
          "tuned under wsd) and at twice it, since a cosine's mean LR over a run is about half "
          "a wsd run's; and cosine to 0 after the branch's own warmup at its peak LR, which "
          "differs from the branch only in the shape of the decay.\n\n" +
          _table(["size", "budget", "tokens", "wsd LR", "cosine LR", "cosine warmup (branch's)",
                  "cosine to (x peak)", "cosine (seeds)", "wsd branch (seeds)",
                  "branch - cosine", "within 2 sigma_seed"],
                 [[r["size"], f"{r['budget']:.3g}", f"{r['d']:,}",
                   f"{r.get('wsd_lr', 0):g}",
                   f"{r.get('cosine_lr', 0):g}",
                   f"{r.get('cosine_warmup', 0)} ({r.get('wsd_warmup')})",
                   f"{r.get('cosine_end', 0.1):g}",
                   ", ".join(f"{v:.4f}" for v in r["cosine"]),
                   ", ".join(f"{v:.4f}" for v in r["wsd"]), f"{r['difference']:+.4f}",
                   "yes" if r["within_2_sigma"] else "**no**"] for r in rows]))


def refit(results: dict) -> dict:
  """The fits' point estimates recomputed from the JSON's runs (no bootstrap): what the
  report test compares with the stored analysis."""
  return {name: fit.params for name, fit in fits_of(results["points"], 0)[0].items()}


def stored(results: dict) -> dict:
  """The fits' point estimates the JSON holds (what `refit` is compared with)."""
  return {name: fit["params"] for name, fit in results["analysis"]["fits"].items()}


def plot(results: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  points, analysis = results["points"], results["analysis"]
  fit = fit_points(points)
  from jaxformer.scaling import plots
  fig, axes = plt.subplots(1, 4, figsize=(22, 5))
  ax = axes[0]
  for budget in results["setup"]["budgets"]:
    mine = sorted((p for p in fit if p["budget"] == budget), key=lambda p: p["n"])
    if mine:
      ax.plot([p["n"] for p in mine], [p["eval_loss"] for p in mine], "o-", ms=3,
              label=f"{budget:.2g}")
  pred = results["prediction"]
  ax.plot([pred["n"]], [pred["measured_loss"]], "r*", ms=12, label="prediction run")
  ax.errorbar([pred["n"]], [pred["predicted_loss"]],
              yerr=[[pred["predicted_loss"] - pred["predictive_interval"][0]],
                    [pred["predictive_interval"][1] - pred["predicted_loss"]]],
              fmt="rs", mfc="none", label="predicted (95% predictive)")
  ax.set(xscale="log", xlabel="N (total parameters)", ylabel="final eval loss",
         title="IsoFLOP curves (exact FLOPs)")
  ax.legend(fontsize=6, ncol=2)
  ax = axes[1]
  c = np.array([row["budget"] for row in analysis["optima"]])
  for name in ("approach 1", "approach 2", "approach 3", "approach 3, C = 6ND"):
    ax.plot(c, [row[name][0] for row in analysis["optima"]], "o-" if "6ND" not in name else
            "--", ms=3, label=name)
  ax.set(xscale="log", yscale="log", xlabel="C (FLOPs)", ylabel="N_opt", title="optimal N")
  ax.legend(fontsize=7)
  ax = axes[2]
  law = analysis["fits"]["approach 3"]["params"]
  measured = np.array([p["eval_loss"] for p in fit])
  predicted = np.array([law["E"] + law["A"] / p["n"] ** law["alpha"] +
                        law["B"] / p["d"] ** law["beta"] for p in fit])
  ax.plot(measured, predicted, "o", ms=3, label="runs")
  lims = [measured.min() - 0.05, measured.max() + 0.05]
  ax.plot(lims, lims, "k--", lw=0.8)
  ax.set(xlabel="measured eval loss", ylabel="approach 3 L(N, D)", title="fit vs measured")
  ax.legend(fontsize=8)
  fit3 = dataclasses.replace(scaling.HOFFMANN_2022, params=law)     # the fitted law's values
  n = np.array([p["n"] for p in fit], np.float64)
  plots.loss_contours(axes[3], fit3, (c.min() / 2, pred["budget"] * 2), (n.min() / 3, n.max() * 3),
                      runs=(np.array([p["flops"] for p in fit]), n),
                      flops_per_token=fpt_of(results["setup"]))
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv=None) -> int:
  args = parse_args(argv)
  out = pathlib.Path(args.out)
  if args.report_only:
    return report_check.report_only(out, render, plot)
  if args.threads_per_run:
    sweep_lib.limit_xla_threads(args.threads_per_run)
  stages = training_stages(args)
  if args.until == "runs":
    print("every run before the prediction is trained (--until=runs)")
    return 0
  results = {"format": FORMAT, "setup": setup_of(args), "rule": stages["rule"],
             "points": points_of(args, stages)}
  prediction = predict(args, results)
  rows = prediction_stage(args, prediction, stages["rule"])
  results["points"] = points_of(args, stages, rows)
  measured = next(p for p in results["points"] if p["stage"] == "predict")
  low, high = prediction["predictive_interval"]
  results["prediction"] = {**prediction, "measured_loss": measured["eval_loss"],
                           "error": measured["eval_loss"] - prediction["predicted_loss"],
                           "relative_error": measured["eval_loss"] / prediction["predicted_loss"] - 1,
                           "inside": bool(low <= measured["eval_loss"] <= high)}
  results["analysis"] = analyse(results, args.bootstrap)
  results = json.loads(json.dumps(results, default=float))
  print(report_check.write(out, results, render, plot))
  return 0


if __name__ == "__main__":
  sys.exit(main())
