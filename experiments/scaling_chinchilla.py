"""A compute-optimal (Chinchilla) scaling study of character-level GPTs on a CPU.

    python -m experiments.scaling_chinchilla --data=PATH/python_docs.txt
        [--workdir=runs/scaling_chinchilla] [--budgets 6e11 2e12 6e12] [--parallel=2]
        [--out=experiments/results/scaling_chinchilla] [--bootstrap=200]

Stages (every run is a `jaxformer.sweep` point, so an interrupted study resumes where it
stopped and a re-run only refits and redraws):
1. Learning rate: 5 peak LRs (1e-3 .. 1.6e-2, x2 apart) x 3 sizes (smallest, middle,
   largest) at the smallest budget. Per size, the vertex of a parabola in log LR through the
   best LR and its two neighbours is that width's optimum; a line through them in log-log
   gives the width rule lr(d_model) = k d_model^-p used for every run (small models here want
   a larger LR: one LR for all would bias the IsoFLOP curves).
2. IsoFLOP runs: `configs/sweeps/isoflop.py` plans 5 sizes around each budget's expected
   optimum (D = 20 N), steps from C = 6 N D (N = total parameters), warmup 5% and a cosine
   that ends at each run's last step.
3. Fits: approach 1 (lower envelope of the training-loss curves), approach 2 (parabola per
   IsoFLOP curve), approach 3 (`scaling.fit_parametric`), each with 95% bootstrap intervals.
4. Prediction: one run at 3x the largest budget at approach 3's N_opt, its loss predicted
   before it is trained; the report states the error.

Processes: with --parallel=2 two runs train at once, each on one XLA:CPU thread
(--threads_per_run=1); on 2 cores this measured 1.2-1.3x the throughput of one 2-thread run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

import numpy as np  # noqa: E402

from configs.sweeps import isoflop  # noqa: E402
from jaxformer import scaling, sweep as sweep_lib  # noqa: E402

LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
PREDICTION_FACTOR = 3.0


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", required=True, help="a UTF-8 text corpus (e.g. python_docs.txt)")
  parser.add_argument("--workdir", default="runs/scaling_chinchilla")
  parser.add_argument("--budgets", type=float, nargs="+", default=[6e11, 2e12, 6e12])
  parser.add_argument("--sizes", type=int, default=5, help="model sizes per budget")
  parser.add_argument("--parallel", type=int, default=2)
  parser.add_argument("--threads_per_run", type=int, default=1,
                      help="XLA:CPU threads of each run (0: XLA's default)")
  parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples")
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/scaling_chinchilla"))
  args = parser.parse_args(argv)
  if len(args.budgets) < 3 or max(args.budgets) < 10 * min(args.budgets):
    parser.error(f"--budgets {args.budgets}: give >= 3 budgets spanning >= 10x")
  if not os.path.isfile(args.data):
    parser.error(f"--data={args.data}: no such file")
  args.data = os.path.abspath(args.data)
  return args


def run_sweep(spec: dict, workdir: str, parallel: int) -> list[dict]:
  rows = sweep_lib.run(spec, workdir, parallel=parallel)
  failed = [r["name"] for r in rows if r["status"] != "done"]
  if failed:
    raise SystemExit(f"error: runs {failed} did not finish; see their train.log in {workdir} "
                     "and re-run to resume")
  return rows


def lr_stage(args, plan: list) -> tuple[dict, list[dict]]:
  """Stage 1: the width rule {k, p, optima} from 3 sizes x LEARNING_RATES at the smallest
  budget (see the module docstring)."""
  smallest = [r for r in plan if r.budget == min(args.budgets)]
  probe = [smallest[0], smallest[len(smallest) // 2], smallest[-1]]
  spec = scaling.to_sweep(probe, isoflop.BASE, lr=LEARNING_RATES[0],
                          overrides=isoflop.common_overrides(args.data, vocab(args)),
                          name="lr{optim.lr:g}_L{model.num_layers}_d{model.d_model}"
                               "_s{train.steps}")
  del spec["overrides"]["optim.lr"]
  spec["product"] = {"optim.lr": list(LEARNING_RATES)}
  rows = run_sweep(spec, os.path.join(args.workdir, "lr"), args.parallel)
  return width_rule(rows), rows


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
          "optima": {int(w): optima[w] for w in widths}, "findings": findings,
          "losses": {int(w): {str(r): v for r, v in sorted(l.items())}
                     for w, l in sorted(by_width.items())}}


def rule_lr(rule: dict, d_model: int) -> float:
  """The width rule's LR, rounded to 3 significant digits (it names the run directory)."""
  return float(f"{rule['k'] * d_model ** -rule['p']:.3g}")


def vocab(args) -> int:
  return isoflop.corpus_info(args.data)[0]


def isoflop_stage(args, plan: list, rule: dict) -> list[dict]:
  spec = scaling.to_sweep(
      plan, isoflop.BASE,
      lr=lambda run: rule_lr(rule, run.candidate.overrides["model.d_model"]),
      overrides=isoflop.common_overrides(args.data, vocab(args)),
      name="L{model.num_layers}_d{model.d_model}_s{train.steps}_lr{optim.lr:g}")
  return run_sweep(spec, os.path.join(args.workdir, "isoflop"), args.parallel)


def measured_points(plan: list, rows: list[dict], workdir: str) -> dict:
  """Per finished IsoFLOP run: budget, N (total), D, exact FLOPs, final eval loss, and its
  training-loss curve (approach 1)."""
  by_prefix = {run.name: run for run in plan}
  points = []
  for row in rows:
    run = by_prefix[row["name"].rsplit("_lr", 1)[0]]
    records = sweep_lib.read_metrics(os.path.join(workdir, row["name"]))
    train = [r for r in records if "loss" in r]
    points.append({"name": row["name"], "budget": run.budget, "n": run.candidate.params,
                   "n_non_embedding": row["params"], "d": run.tokens, "flops": run.flops,
                   "flops_per_token": run.candidate.flops_per_token,
                   "lr": row["overrides"]["optim.lr"], "eval_loss": row["eval_loss"],
                   "wall_time_s": row["wall_time_s"],
                   "curve": {"tokens": [r["step"] * run.tokens_per_step for r in train],
                             "loss": [r["loss"] for r in train]}})
  return points


def fit_all(points: list[dict], samples: int) -> dict:
  arr = {k: np.array([p[k] for p in points], np.float64)
         for k in ("n", "d", "eval_loss", "budget")}
  curves = [scaling.Curve(params=p["n"], tokens=np.array(p["curve"]["tokens"]),
                                     loss=np.array(p["curve"]["loss"]),
                                     flops_per_token=p["flops_per_token"]) for p in points]
  return {
      "approach 1": scaling.envelope_optimum(curves, samples=samples),
      "approach 2": scaling.isoflop_optimum(arr["n"], arr["d"], arr["eval_loss"], arr["budget"],
                                            samples=samples),
      "approach 3": scaling.fit_parametric(arr["n"], arr["d"], arr["eval_loss"],
                                           samples=samples),
  }, arr, curves


def predict_run(args, fit, rule: dict) -> dict:
  """The run at PREDICTION_FACTOR x the largest budget: the family's candidate with the lowest
  approach-3 loss at that budget (exact FLOPs), and its predicted loss with a 95% interval.
  Written to prediction.json before the run trains, and never recomputed afterwards."""
  path = pathlib.Path(args.workdir) / "prediction.json"
  if path.exists():
    return json.loads(path.read_text())
  budget = PREDICTION_FACTOR * max(args.budgets)
  vocab_size, train_chars = isoflop.corpus_info(args.data)
  options = []
  for candidate in isoflop.gpt_candidates(vocab_size):
    try:
      run = scaling.plan_run(budget, candidate, tokens_per_step=isoflop.TOKENS_PER_STEP,
                                      flops="exact", max_tokens=2 * train_chars)
    except ValueError:
      continue
    options.append((float(fit.predict(run.candidate.params, run.tokens)), run))
  predicted, run = min(options, key=lambda o: o[0])
  low, high = fit.predict_ci(run.candidate.params, run.tokens)
  n_opt, d_opt = fit.compute_optimal(budget)
  out = {"budget": budget, "name": run.name, "n": run.candidate.params, "d": run.tokens,
         "steps": run.steps, "flops": run.flops,
         "lr": rule_lr(rule, run.candidate.overrides["model.d_model"]),
         "overrides": dict(run.candidate.overrides), "warmup_steps": run.warmup_steps,
         "predicted_loss": predicted, "predicted_ci": [float(low), float(high)],
         "closed_form_optimum_6nd": {"n": n_opt, "d": d_opt},
         "predicted_at": time.strftime("%Y-%m-%d %H:%M:%S")}
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(out, indent=2) + "\n")
  return out


def prediction_stage(args, prediction: dict) -> dict:
  run = scaling.PlannedRun(
      budget=prediction["budget"], steps=prediction["steps"],
      candidate=scaling.Candidate(prediction["name"].rsplit("_s", 1)[0], prediction["n"],
                                  prediction["overrides"]),
      tokens_per_step=isoflop.TOKENS_PER_STEP, warmup_steps=prediction["warmup_steps"],
      flops=prediction["flops"])
  spec = scaling.to_sweep([run], isoflop.BASE, lr=prediction["lr"],
                          overrides=isoflop.common_overrides(args.data, vocab(args)),
                          name="L{model.num_layers}_d{model.d_model}_s{train.steps}")
  (row,) = run_sweep(spec, os.path.join(args.workdir, "predict"), args.parallel)
  measured = row["eval_loss"]
  low, high = prediction["predicted_ci"]
  return {**prediction, "measured_loss": measured,
          "error": measured - prediction["predicted_loss"],
          "relative_error": measured / prediction["predicted_loss"] - 1,
          "inside_ci": bool(low <= measured <= high), "wall_time_s": row["wall_time_s"]}


CHINCHILLA = {"approach 1": (0.50, 0.50), "approach 2": (0.49, 0.51),
              "approach 3": (0.46, 0.54)}


def _ci(fit, key: str, fmt: str = ".3f") -> str:
  low, high = fit.ci(key)
  return f"{fit.params[key]:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def exponents_table(fits: dict) -> str:
  lines = ["| approach | a (N_opt ~ C^a), 95% CI | b (D_opt ~ C^b), 95% CI | Chinchilla a / b |",
           "|---|---|---|---|"]
  for name, fit in fits.items():
    if name == "approach 3":
      ex = fit.exponents()
      a = f"{ex['a'][0]:.3f} [{ex['a'][1][0]:.3f}, {ex['a'][1][1]:.3f}]"
      b = f"{ex['b'][0]:.3f} [{ex['b'][1][0]:.3f}, {ex['b'][1][1]:.3f}]"
    else:
      a, b = _ci(fit, "a"), _ci(fit, "b")
    ref = CHINCHILLA[name]
    lines.append(f"| {name} | {a} | {b} | {ref[0]:.2f} / {ref[1]:.2f} |")
  return "\n".join(lines)


def parametric_table(fit) -> str:
  lines = ["| parameter | value | 95% CI | Chinchilla (Hoffmann et al. 2022) |", "|---|---:|---|---:|"]
  for key in ("E", "A", "B", "alpha", "beta"):
    low, high = fit.ci(key)
    lines.append(f"| {key} | {fit.params[key]:.4g} | [{low:.4g}, {high:.4g}] | "
                 f"{scaling.HOFFMANN_2022.params[key]:g} |")
  return "\n".join(lines)


def optima_table(fits: dict, budgets: list[float]) -> str:
  lines = ["| budget (FLOPs) | " + " | ".join(f"{k}: N_opt, D_opt, D/N" for k in fits) + " |",
           "|---:|" + "---|" * len(fits)]
  for c in budgets:
    cells = []
    for fit in fits.values():
      n, d = fit.compute_optimal(c)
      cells.append(f"{n:,.0f}, {d:,.0f}, {d / n:.1f}")
    lines.append(f"| {c:.3g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def points_table(points: list[dict]) -> str:
  lines = ["| budget | run | N (total) | N (non-emb.) | D tokens | D/N | FLOPs (exact) | "
           "6ND | lr | eval loss | wall s |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for p in sorted(points, key=lambda p: (p["budget"], p["n"])):
    lines.append(f"| {p['budget']:.3g} | {p['name']} | {p['n']:,} | {p['n_non_embedding']:,} | "
                 f"{p['d']:,} | {p['d'] / p['n']:.1f} | {p['flops']:.3g} | "
                 f"{6 * p['n'] * p['d']:.3g} | {p['lr']:g} | {p['eval_loss']:.4f} | "
                 f"{p['wall_time_s']:.0f} |")
  return "\n".join(lines)


def plot(path: pathlib.Path, fits: dict, arr: dict, curves: list, budgets: list[float],
         prediction: dict):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from jaxformer.scaling import plots
  fig, axes = plt.subplots(2, 3, figsize=(17, 10))
  plots.envelope(axes[0, 0], curves, fits["approach 1"])
  plots.isoflop_curves(axes[0, 1], arr["n"], arr["eval_loss"], arr["budget"], fits["approach 2"])
  axes[0, 1].plot([prediction["n"]], [prediction["measured_loss"]], "r*", ms=12,
                  label=f"prediction run ({prediction['budget']:.2g} FLOPs)")
  axes[0, 1].errorbar([prediction["n"]], [prediction["predicted_loss"]],
                      yerr=[[prediction["predicted_loss"] - prediction["predicted_ci"][0]],
                            [prediction["predicted_ci"][1] - prediction["predicted_loss"]]],
                      fmt="rs", mfc="none", label="predicted (approach 3, 95% CI)")
  axes[0, 1].legend(fontsize=7)
  span = [min(budgets) / 2, prediction["budget"] * 2]
  plots.optimum_vs_compute(axes[0, 2], fits, span, which="n")
  plots.optimum_vs_compute(axes[1, 0], fits, span, which="d")
  plots.loss_contours(axes[1, 1], fits["approach 3"], tuple(span),
                      (arr["n"].min() / 3, arr["n"].max() * 3),
                      runs=(6 * arr["n"] * arr["d"], arr["n"]))
  ax = axes[1, 2]
  fit = fits["approach 3"]
  order = np.argsort(arr["eval_loss"])
  ax.plot(arr["eval_loss"][order], fit.predict(arr["n"], arr["d"])[order], "o", label="runs")
  lims = [arr["eval_loss"].min() - 0.05, arr["eval_loss"].max() + 0.05]
  ax.plot(lims, lims, "k--", lw=0.8)
  ax.plot([prediction["measured_loss"]], [prediction["predicted_loss"]], "r*", ms=12,
          label="prediction run")
  ax.set(xlabel="measured eval loss", ylabel="approach 3 L(N, D)", title="fit vs measured")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_report(args, rule: dict, points: list[dict], fits: dict, arr: dict, curves: list,
                 prediction: dict):
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  budgets = sorted(set(arr["budget"].tolist()))
  fit3 = fits["approach 3"]
  findings = [f"- {name}: {f}" for name, fit in fits.items() for f in fit.findings]
  text = "\n\n".join([
      "# Compute-optimal scaling of character-level GPTs on a CPU (Chinchilla approaches 1-3)",
      f"Corpus `{pathlib.Path(args.data).name}` (character-level, 90/10 split), "
      f"{len(points)} IsoFLOP runs at budgets {', '.join(f'{c:.3g}' for c in budgets)} FLOPs "
      f"({args.sizes} sizes each, N = total parameters incl. embeddings, FLOPs by Hoffmann et "
      "al.'s appendix F count), each with warmup 5% and a cosine to 10% ending at its last "
      "step, batch 16 x 64 tokens, final eval loss on the same 40 validation batches. "
      f"Learning rate by width: lr = {rule['k']:.4g} x d_model^-{rule['p']:.3f} (95% t-interval "
      f"on p: [{rule['p_ci'][0]:.2f}, {rule['p_ci'][1]:.2f}]), fitted to the "
      f"best LR of 5 (1e-3 .. 1.6e-2) at d_model {', '.join(map(str, rule['optima']))} at the "
      f"smallest budget (optima {', '.join(f'{v:.2e}' for v in rule['optima'].values())}). "
      f"Intervals: 95% bootstrap ({args.bootstrap} resamples: approach 1 over runs, 2 over "
      "runs within each budget, 3 over runs). Reproduce: `python "
      "experiments/scaling_chinchilla.py --data=PATH/python_docs.txt` (finished runs are reused).",
      "## Exponents of the compute-optimal allocation", exponents_table(fits),
      "## Approach 3: L(N, D) = E + A / N^alpha + B / D^beta", parametric_table(fit3),
      f"Huber delta 1e-3 on log L, L-BFGS from the paper's 4500 starts; RMS residual "
      f"{fit3.rms_residual:.4f} in log loss over {fit3.n_points} runs.",
      "## Compute-optimal N, D and tokens per parameter", optima_table(fits, budgets),
      "## Prediction of a run not yet trained",
      f"Budget {prediction['budget']:.3g} FLOPs ({PREDICTION_FACTOR:g}x the largest). Approach 3 "
      f"picked {prediction['name']} (N = {prediction['n']:,}, D = {prediction['d']:,}) and "
      f"predicted eval loss {prediction['predicted_loss']:.4f} (95% CI "
      f"[{prediction['predicted_ci'][0]:.4f}, {prediction['predicted_ci'][1]:.4f}]) at "
      f"{prediction['predicted_at']}, before training it. Measured: "
      f"{prediction['measured_loss']:.4f}; error {prediction['error']:+.4f} nats "
      f"({prediction['relative_error']:+.2%}), "
      f"{'inside' if prediction['inside_ci'] else 'outside'} the interval.",
      "## Findings", "\n".join(findings) or "none",
      "## Runs", points_table(points),
      f"![study]({out.name}.png)", ""])
  out.with_suffix(".md").write_text(text)
  out.with_suffix(".json").write_text(json.dumps({
      "learning_rate_rule": rule, "points": points,
      "fits": {k: v.as_dict() for k, v in fits.items()},
      "exponents_approach_3": fits["approach 3"].exponents(), "prediction": prediction},
      indent=2, default=float) + "\n")
  plot(out.with_suffix(".png"), fits, arr, curves, budgets, prediction)
  print(text)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.threads_per_run:
    sweep_lib.limit_xla_threads(args.threads_per_run)
  plan = isoflop.plan(args.data, args.budgets, sizes=args.sizes)
  rule, lr_rows = lr_stage(args, plan)
  print(f"learning-rate rule: lr = {rule['k']:.4g} * d_model^-{rule['p']:.3f}")
  rows = isoflop_stage(args, plan, rule)
  points = measured_points(plan, rows, os.path.join(args.workdir, "isoflop"))
  fits, arr, curves = fit_all(points, args.bootstrap)
  prediction = prediction_stage(args, predict_run(args, fits["approach 3"], rule))
  write_report(args, rule, points, fits, arr, curves, prediction)
  return 0


if __name__ == "__main__":
  sys.exit(main())
