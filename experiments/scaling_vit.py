"""Test error vs training compute for tiny ViTs on MNIST, with the saturating law of Zhai et
al. 2022 ("Scaling Vision Transformers", eq. 1: E = a (C + d)^(-b) + c) fitted to the
compute-efficient frontier.

    python -m experiments.scaling_vit --data=mnist:/path/to/mnist_idx_dir | --data=tfds:mnist
        [--workdir=runs/scaling_vit] [--steps=3000] [--evals=10] [--seeds=3] [--parallel=2]
        [--threads_per_run=1] [--bootstrap=1000] [--bootstrap_seconds=180]
        [--out=experiments/results/scaling_vit]
    python -m experiments.scaling_vit --refit [--out=...]        # refit to OUT.json's evals
    python -m experiments.scaling_vit --report_only [--out=...]  # OUT.md/.png from OUT.json

Why: accuracy at one step count per size (this script before) says little about scaling;
Zhai et al. read error against compute over every model and training length, and fit the
lower envelope. Here 5 sizes of `configs/vit_tiny.py:mnist` (7x7 patches, head_dim 16, mlp
2x; widths and depths 1 x 16 .. 3 x 64, 32x in parameters) each train --steps steps of 128
images with the config's recipe (AdamW 2e-3, cosine, shift augmentation) and evaluate on the
10K test images --evals times. Every eval is a point (compute, test error = 1 -
eval_accuracy); the Pareto frontier over all points of all sizes is what `fit_zhai` fits,
with 95% bootstrap intervals resampling whole runs (`groups=`: a run's frontier points share
its luck; resampling the points independently gave b in [0.72, 0.92], resampling runs gives
[0.71, 1.73]). Intermediate evals are taken before the cosine schedule has annealed, so they
overstate the error a run of that length would reach: the frontier is conservative between
the run ends.

Seeds (issue #30: 3 seeds at 3 or more points; sigma_seed reported; a fit is flagged when
sigma_seed exceeds its residual RMS): the SEEDED sizes 1 x 16, 2 x 48 and 3 x 64 (smallest,
middle, largest: sigma_seed across the whole range of error, 22% .. 1.6%) also train with
train.seed 1 .. --seeds - 1 (initialisation, image order, augmentation shifts; the test images
are the same). They are a second sweep, in WORKDIR/seeds, named `<seed 0's name>_seed<k>`:
seed 0's points keep their names, so its finished runs are reused. sigma_seed is the sample sd
over seeds of the test error at one eval step, its variance pooled (by degrees of freedom: with
3 seeds at every eval, the root mean variance) over a size's evals and over the seeded sizes;
in error and in log error, the Zhai fit's residual space, where it is compared with the fit's
RMS residual: larger is **flagged** (seed 0's frontier then scatters about the law less than
repeat runs do, and the intervals understate the run-to-run noise). The frontier and the fit
use seed 0's runs only, as before the seeds (a frontier over every seed would keep the luckiest
seed, at the seeded sizes alone; means of 3 seeds at 3 sizes next to single runs would mix two
kinds of point), so the bootstrap still resamples seed 0's whole runs; the replicates measure
the noise the fit is judged against, and `refit` means what it meant.

Compute: C = flops_per_token(model, T) x T x images seen, T = 16 patches + [CLS] = 17 tokens
per image, i.e. `scaling.flops_per_token` (Kaplan: 6 N + 6 n_layer n_ctx d_attn per token,
N the non-embedding parameters: everything but the position table, so the patch projection
and the head are counted for every token) and the same count as the training loop's MFU.

Runs are `jaxformer.sweep` points (sweep.run summarises image runs now: it counts tokens only
for sequence data), two at a time on one XLA:CPU thread each with --parallel=2; finished
points are skipped, so a re-run only refits and redraws. Time: the committed study's 5 runs
took 264-640 s each (measured, two at a time on the 2-core CPU; MEASURED_WALL_S), ~19 min wall
at --parallel=2; the 6 seed runs at --seeds=3 (2 x (640 + 436 + 264) s) add ~22 min and
1.2e13 FLOPs, ~42 min for all 11 from scratch. The script prints its estimate for the runs not
finished yet (`estimate`) before it trains. 3 x 96 (71x) would take ~13 min alone.
Writes OUT.json (every eval point, the frontier, the fit and its band; the replicates'
evals as `seed_runs` and `sigma_seed` with its comparison `vs_fit`), OUT.md =
`render(OUT.json)` (with a table of every seeded eval: errors per seed and their sd) and
OUT.png = `plot(OUT.json)` (error vs compute, log-log: each size's curve, the other seeds
dotted, the frontier and the fitted law); `refit(OUT.json)` recomputes the fit's point
estimate (tests/unit/experiments/test_reports.py).
"""

from __future__ import annotations

import argparse
import inspect
import os
import pathlib
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import report_check  # noqa: E402
from jaxformer import cli, scaling, sweep as sweep_lib  # noqa: E402

BASE = "configs/vit_tiny.py:mnist"
# (num_layers, d_model), largest first: `jaxformer.sweep.run` starts points in order, so with
# parallel=2 the longest run starts at once and the rest queue beside it. head_dim 16, mlp 2x.
SIZES = ((3, 64), (2, 64), (2, 48), (1, 32), (1, 16))
NAME = "L{model.num_layers}_d{model.d_model}_s{train.steps}"    # seed 0's point names
# The sizes trained with --seeds seeds (seed 0 and train.seed 1, 2, ...), largest first: the
# smallest, middle and largest, so sigma_seed is measured across the whole range of test error
# (22% .. 1.6%; the log-error noise the fit is judged against need not be the same at both
# ends). 3 x 64 is the dearest run (~11 min); the 3 smallest instead would save ~4 min.
SEEDED = ((3, 64), (2, 48), (1, 16))
# Measured wall time (s) of each size's 3000-step run in the committed study (two runs at a
# time, one XLA:CPU thread each, on the 2-core CPU): what `estimate` scales by steps.
MEASURED_WALL_S = {(3, 64): 640, (2, 64): 469, (2, 48): 436, (1, 32): 361, (1, 16): 264}
MEASURED_STEPS = 3000
PILOT = 10                     # bootstrap resamples timed to size the bootstrap
BACKTEST_SAMPLES = 200        # bootstrap resamples of each back-test fit (6 fits)
BAND_POINTS = 60               # grid points of the stored bootstrap band
DATA_FORMS = "mnist:<directory of the IDX files> or tfds:<name> (e.g. tfds:mnist)"


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help=DATA_FORMS + " (not with --report_only or --refit)")
  parser.add_argument("--workdir", default="runs/scaling_vit")
  parser.add_argument("--steps", type=int, default=3000, help="training steps per size")
  parser.add_argument("--evals", type=int, default=10, help="evaluations per size")
  parser.add_argument("--seeds", type=int, default=3,
                      help="seeds of each SEEDED size (seed 0 and train.seed 1 ..; 1: none)")
  parser.add_argument("--parallel", type=int, default=2)
  parser.add_argument("--threads_per_run", type=int, default=1,
                      help="XLA:CPU threads of each run (0: XLA's default)")
  parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
  parser.add_argument("--bootstrap_seconds", type=float, default=180,
                      help="fewer resamples if the requested ones would take longer")
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/scaling_vit"),
                      help="output path prefix: writes OUT.md, OUT.json, OUT.png")
  parser.add_argument("--report_only", action="store_true",
                      help="rewrite OUT.md and OUT.png from OUT.json; train and fit nothing")
  parser.add_argument("--refit", action="store_true",
                      help="refit the law (with its bootstrap) to OUT.json's evals and rewrite "
                           "OUT.json, OUT.md and OUT.png; train nothing")
  args = parser.parse_args(argv)
  if args.report_only or args.refit:
    if args.report_only and args.refit:
      parser.error("--report_only and --refit: give one")
    return args
  kind, sep, rest = (args.data or "").partition(":")
  if kind not in ("mnist", "tfds") or not sep or not rest:
    parser.error(f"--data={args.data!r}: give {DATA_FORMS}")
  if kind == "mnist":
    if not os.path.isdir(rest):
      parser.error(f"--data={args.data!r}: {rest} is not a directory")
    args.data = "mnist:" + os.path.abspath(rest)      # the runs are subprocesses
  if args.steps < 1 or args.evals < 1 or args.bootstrap < 0 or args.seeds < 1:
    parser.error("--steps, --evals and --seeds must be >= 1, --bootstrap >= 0")
  return args


def _size_fields(rows) -> dict:
  """The zipped model fields of (num_layers, d_model, ...) rows: head_dim 16, mlp 2x."""
  return {"model.num_layers": [r[0] for r in rows], "model.d_model": [r[1] for r in rows],
          "model.num_heads": [max(r[1] // 16, 1) for r in rows],
          "model.mlp_dim": [2 * r[1] for r in rows]}


def sweep_spec(data: str, steps: int, evals: int) -> dict:
  """The sweep: one point per size, the config's recipe with `steps` and `evals` evals."""
  every = max(steps // evals, 1)
  fields = {**_size_fields(SIZES),
            "train.steps": [steps] * len(SIZES)}          # zipped, so the point names carry it
  return dict(base=BASE, zip=fields, overrides={
      "data.source": data, "train.eval_every": every, "train.checkpoint_every": every,
      "train.log_every": max(steps // 50, 1), "optim.warmup_steps": min(100, max(steps // 10, 1)),
      "train.keep_best": 0, "train.attention_maps": False},
      name=NAME)


def seed_spec(data: str, steps: int, evals: int, seeds: int) -> dict | None:
  """The seed replicates: train.seed 1 .. seeds-1 of each SEEDED size, otherwise the points of
  `sweep_spec` (named `<its name>_seed<k>`); None when seeds <= 1. A sweep of its own, as
  seed 0's points keep their names (and so their finished runs) without a seed in them."""
  rows = [(n, d, seed) for n, d in SEEDED for seed in range(1, seeds)]
  if not rows:
    return None
  spec = sweep_spec(data, steps, evals)
  return dict(base=BASE, zip={**_size_fields(rows), "train.steps": [steps] * len(rows),
                              "train.seed": [r[2] for r in rows]},
              overrides=spec["overrides"], name=NAME + "_seed{train.seed}")


def size_points(row: dict, workdir: str) -> dict:
  """One size: its counts, FLOPs per image and every eval as (images, compute, error)."""
  config = sweep_lib.load_config(BASE, row["overrides"])
  m = config.model
  tokens = (m.image_size // m.patch_size) ** 2 + 1             # patches + [CLS]
  per_image = scaling.flops_per_token(m, tokens) * tokens
  batch = config.train.batch_size
  evals = [{"step": r["step"], "images": r["step"] * batch,
            "compute": float(per_image) * r["step"] * batch,
            "error": 1.0 - r["eval_accuracy"], "eval_loss": r["eval_loss"]}
           for r in sweep_lib.read_metrics(os.path.join(workdir, row["name"]))
           if "eval_accuracy" in r]
  best = min(evals, key=lambda e: e["error"])
  return {"name": row["name"], "num_layers": m.num_layers, "d_model": m.d_model,
          "params": row["params"], "params_total": row["params_total"],
          "flops_per_image": int(per_image), "tokens_per_image": tokens,
          "steps": row["final_step"], "images": row["final_step"] * batch,
          "final_error": evals[-1]["error"], "best_error": best["error"],
          "best_step": best["step"], "wall_time_s": row["wall_time_s"], "evals": evals}


def pareto_frontier(sizes: list[dict]) -> list[dict]:
  """The eval points no point of less (or equal) compute beats: the lower envelope of error
  vs compute over all sizes."""
  points = sorted(({**e, "name": s["name"]} for s in sizes for e in s["evals"]),
                  key=lambda p: (p["compute"], p["error"]))
  frontier, lowest = [], np.inf
  for p in points:
    if p["error"] < lowest:
      frontier.append(p)
      lowest = p["error"]
  return frontier


def _key(size: dict) -> tuple:
  return size["num_layers"], size["d_model"]


def seed_sigma(sizes: list[dict], seed_runs: list[dict]) -> dict | None:
  """sigma_seed from seed 0's runs (`sizes`) and the replicates (`seed_runs`, each with its
  "seed"): at each seeded size and each eval step every seed reached, the sample standard
  deviation over seeds of the test error (`sd`) and of its log (`sd_log`, the Zhai fit's
  residual space); their variances pooled, weighted by degrees of freedom (seeds - 1; with
  the same seeds at every eval: the root mean variance) over a size's evals (the size's `sd`,
  `sd_log`) and over every seeded size (`pooled`, `pooled_log`, `dof`). None without a size
  of >= 2 seeds."""
  runs = {}
  for run in [*({**s, "seed": 0} for s in sizes), *seed_runs]:
    runs.setdefault(_key(run), {})[run["seed"]] = run
  out, total, total_log, dof = [], 0.0, 0.0, 0
  for size in sizes:
    by_seed = runs[_key(size)]
    if len(by_seed) < 2:
      continue
    seeds = sorted(by_seed)
    errors = {seed: {e["step"]: e for e in by_seed[seed]["evals"]} for seed in seeds}
    evals, ss, ss_log, k = [], 0.0, 0.0, 0
    for step in sorted(set().union(*map(set, errors.values()))):
      have = [seed for seed in seeds if step in errors[seed]]
      values = np.array([errors[seed][step]["error"] for seed in have], np.float64)
      row = {"step": step, "compute": errors[have[0]][step]["compute"],
             "errors": [errors[seed][step]["error"] if step in errors[seed] else None
                        for seed in seeds], "sd": None, "sd_log": None}
      if values.size >= 2:
        logs = np.log(values)
        row["sd"] = float(np.std(values, ddof=1))
        row["sd_log"] = float(np.std(logs, ddof=1))
        ss += float(np.sum((values - values.mean()) ** 2))
        ss_log += float(np.sum((logs - logs.mean()) ** 2))
        k += values.size - 1
      evals.append(row)
    out.append({"name": size["name"], "num_layers": size["num_layers"],
                "d_model": size["d_model"], "seeds": seeds,
                "runs": [by_seed[seed]["name"] for seed in seeds], "evals": evals,
                "sd": float(np.sqrt(ss / k)) if k else None,
                "sd_log": float(np.sqrt(ss_log / k)) if k else None, "dof": k})
    total, total_log, dof = total + ss, total_log + ss_log, dof + k
  if not dof:
    return None
  return {"sizes": out, "pooled": float(np.sqrt(total / dof)),
          "pooled_log": float(np.sqrt(total_log / dof)), "dof": dof}


def seed_flag(sigma: dict | None, fit: dict | None) -> dict | None:
  """sigma_seed against the fit's RMS residual, in the fit's residual space (log error for
  fit_zhai): {"space", "sigma", "rms_residual", "flagged": sigma > RMS}; None without both."""
  if sigma is None or fit is None:
    return None
  space = fit.get("residual_space", "log")
  value = sigma["pooled_log"] if space == "log" else sigma["pooled"]
  return {"space": space, "sigma": value, "rms_residual": fit["rms_residual"],
          "flagged": bool(value > fit["rms_residual"])}


def _point_seconds(point, steps: int) -> float:
  """A run's estimated wall time: the committed study's measured wall of its size, scaled by
  steps (a size it did not measure: by FLOPs per image from the nearest measured size)."""
  m = point.config.model
  key = (m.num_layers, m.d_model)
  if key in MEASURED_WALL_S:
    return MEASURED_WALL_S[key] * steps / MEASURED_STEPS
  per = _per_image(m)
  ref = min(MEASURED_WALL_S, key=lambda k: abs(np.log(_per_image_of(*k) / per)))
  return MEASURED_WALL_S[ref] * per / _per_image_of(*ref) * steps / MEASURED_STEPS


def _per_image(m) -> float:
  tokens = (m.image_size // m.patch_size) ** 2 + 1             # patches + [CLS]
  return float(scaling.flops_per_token(m, tokens) * tokens)


def _per_image_of(num_layers: int, d_model: int) -> float:
  fields = _size_fields([(num_layers, d_model)])
  config = sweep_lib.load_config(BASE, {k: v[0] for k, v in fields.items()})
  return _per_image(config.model)


def estimate(sweeps: list[tuple[dict, str]], parallel: int) -> dict:
  """The runs of the (spec, workdir) `sweeps` not finished there (the sweeps run one after the
  other, each `parallel` points at a time in order): their training compute (FLOPs x images,
  the report's C) and wall time from the committed study's measured walls."""
  runs, wall = [], 0.0
  for spec, workdir in sweeps:
    slots = [0.0] * parallel
    for point in sweep_lib.expand(spec):
      steps = point.config.train.steps
      if sweep_lib.is_finished(os.path.join(workdir, point.name), steps):
        continue
      seconds = _point_seconds(point, steps)
      i = int(np.argmin(slots))
      slots[i] += seconds
      runs.append({"name": point.name, "seconds": seconds,
                   "compute": _per_image(point.config.model) * steps
                   * point.config.train.batch_size})
    wall += max(slots)
  return {"runs": runs, "compute": sum(r["compute"] for r in runs),
          "run_seconds": sum(r["seconds"] for r in runs), "wall_seconds": wall}


def estimate_text(est: dict, parallel: int) -> str:
  if not est["runs"]:
    return "[scaling_vit] every run is finished: refitting only"
  names = ", ".join(r["name"] for r in est["runs"])
  return (f"[scaling_vit] {len(est['runs'])} run(s) to train ({names}): C = "
          f"{est['compute']:.3g} FLOPs of training, ~{est['wall_seconds'] / 60:.0f} min wall at "
          f"--parallel={parallel} ({est['run_seconds'] / 60:.0f} run-minutes; estimated from "
          f"the committed study's measured walls, two 1-thread runs at a time on 2 cores)")


def _zhai_kwargs(groups) -> dict:
  """groups= for `fit_zhai` when it takes it (run-level resampling), else nothing."""
  if groups is None or "groups" not in inspect.signature(scaling.fit_zhai).parameters:
    return {}
  return {"groups": groups}


def affordable_samples(c: list, err: list, samples: int, seconds: float, groups=None):
  """(how many bootstrap resamples of fit_zhai fit in `seconds`, the PILOT-resample fit they
  were timed on, None if it failed). A resample takes ~0.1 s on a clean frontier but measured
  3 s on a noisy one (12 starts of up to 2000 evaluations each), where 1000 resamples would
  take most of an hour."""
  start = time.perf_counter()
  try:
    pilot = scaling.fit_zhai(c, err, samples=PILOT, **_zhai_kwargs(groups))
  except ValueError:
    pilot = None                            # fit_frontier's own call reports why
  each = (time.perf_counter() - start) / PILOT
  return max(min(samples, int(seconds / each)), PILOT), pilot


def fit_frontier(frontier: list[dict], samples: int, seconds: float = float("inf"), *,
                 by_run: bool = True):
  """(fit or None, notes): fit_zhai to the frontier with at most `samples` resamples (fewer
  if they would take over `seconds`); without intervals when too few resamples keep the 5
  distinct computes the law needs. `by_run`: the bootstrap draws whole runs (every frontier
  point of a drawn run; they share its luck), where fit_zhai takes groups=."""
  c = [p["compute"] for p in frontier]
  err = [p["error"] for p in frontier]
  groups = [p["name"] for p in frontier] if by_run else None
  kw = _zhai_kwargs(groups)
  notes = []
  if by_run and not kw:
    notes.append("fit_zhai takes no groups= here: the bootstrap resampled frontier points, "
                 "not runs, which understates the intervals")
  if samples > PILOT and len(set(c)) >= 5 and np.isfinite(seconds):
    affordable, pilot = affordable_samples(c, err, samples, seconds, groups)
    if affordable < samples:
      notes.append(f"{affordable} bootstrap resamples instead of {samples}: more would take "
                   f"over --bootstrap_seconds={seconds:g}")
      samples = affordable
    if samples == PILOT and pilot is not None:
      return pilot, notes
  try:
    return scaling.fit_zhai(c, err, samples=samples, **kw), notes
  except ValueError as e:
    if not (samples and "bootstrap" in str(e)):
      return None, [*notes, f"no fit: {e}"]
    notes.append(f"no bootstrap intervals ({e})")
  try:
    return scaling.fit_zhai(c, err, samples=0), notes
  except ValueError as e:
    return None, [*notes, f"no fit: {e}"]


def refit(results: dict) -> dict:
  """{"fit": params or None}: fit_zhai's point estimate recomputed from the JSON's frontier
  (samples=0), which `pareto_frontier` recomputes from every stored eval."""
  frontier = pareto_frontier(results["sizes"])
  if [(p["name"], p["step"]) for p in frontier] != [(p["name"], p["step"])
                                                    for p in results["frontier"]]:
    raise ValueError("the JSON's frontier is not the Pareto frontier of its evals")
  fit, _ = fit_frontier(frontier, 0, by_run=False)
  return {"fit": None if fit is None else fit.params}


def _zhai(params: dict, c):
  return params["a"] * (np.asarray(c, np.float64) + params["d"]) ** (-params["b"]) + params["c"]


def sizes_table(sizes: list[dict]) -> str:
  lines = ["| run | layers | d_model | N (non-emb.) | N (total) | FLOPs / image | steps | "
           "images | best test error (step) | final test error | final C (FLOPs) | wall (s) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for s in sizes:
    wall = s["wall_time_s"]
    lines.append(
        f"| {s['name']} | {s['num_layers']} | {s['d_model']} | {s['params']:,} | "
        f"{s['params_total']:,} | {s['flops_per_image']:.3g} | {s['steps']:,} | "
        f"{s['images']:,} | {s['best_error']:.2%} ({s['best_step']}) | "
        f"{s['final_error']:.2%} | {s['evals'][-1]['compute']:.3g} | "
        f"{'—' if wall is None else f'{wall:.0f}'} |")
  return "\n".join(lines)


def frontier_table(frontier: list[dict], fit: dict | None) -> str:
  lines = ["| compute C (FLOPs) | test error | run | step | fitted law |",
           "|---:|---:|---|---:|---:|"]
  for p in frontier:
    pred = f"{float(_zhai(fit['params'], p['compute'])):.2%}" if fit is not None else "—"
    lines.append(f"| {p['compute']:.3g} | {p['error']:.2%} | {p['name']} | {p['step']} | "
                 f"{pred} |")
  return "\n".join(lines)


def fit_text(fit: dict | None, notes: list[str]) -> str:
  if fit is None:
    return "No fit of Zhai et al.'s law: " + "; ".join(notes)
  lines = ["| parameter | value | 95% interval |", "|---|---:|---:|"]
  for key, value in fit["params"].items():
    low, high = fit["ci"][key]
    interval = "—" if low is None else f"[{low:.4g}, {high:.4g}]"
    lines.append(f"| {key} | {value:.4g} | {interval} |")
  p = fit["params"]
  if fit.get("bootstrap_by_run"):
    unit = ("95% percentile intervals, the bootstrap resampling whole runs: every frontier "
            "point of a drawn run together, as a run's evals share its luck")
  else:
    unit = f"intervals from {fit['bootstrap_samples']} bootstrap resamples of the frontier points"
  findings = [*fit["findings"], *notes]
  return "\n\n".join([
      f"Fit of `{fit['law']}` to the {fit['n_points']} frontier points ({fit['method']}; RMS "
      f"residual {fit['rms_residual']:.4f} in log error; {unit}): error falls as "
      f"compute^-{p['b']:.3f} above d = {p['d']:.3g} FLOPs towards a floor c = {p['c']:.2%}.",
      "\n".join(lines),
      "Findings:\n" + "\n".join(f"- {f}" for f in findings) if findings else
      "Findings: none (no parameter at a bound)."])


def seed_table(sigma: dict) -> str:
  """Each seeded size's evals: the test error of every seed at one step and their sd, then
  the size's pooled sd."""
  width = max(len(s["seeds"]) for s in sigma["sizes"])
  lines = ["| run | step | C (FLOPs) | " + " | ".join(f"seed {i}" for i in range(width)) +
           " | sd | sd (log error) |", "|---|---:|---:|" + "---:|" * (width + 2)]

  def cells(values):
    values = [*values, *[None] * (width - len(values))]
    return " | ".join("—" if v is None else f"{v:.2%}" for v in values)

  for size in sigma["sizes"]:
    for e in size["evals"]:
      sd_log = "—" if e["sd_log"] is None else f"{e['sd_log']:.4f}"
      lines.append(f"| {size['name']} | {e['step']} | {e['compute']:.3g} | "
                   f"{cells(e['errors'])} | {'—' if e['sd'] is None else format(e['sd'], '.2%')}"
                   f" | {sd_log} |")
    lines.append(f"| **{size['name']}** | pooled ({size['dof']} dof) | | "
                 + " | ".join([""] * width) + f" | **{size['sd']:.2%}** | "
                 f"**{size['sd_log']:.4f}** |")
  return "\n".join(lines)


def seed_text(results: dict) -> str:
  """The seed replicates, sigma_seed and the flag, from the JSON alone."""
  sigma, fit = results["sigma_seed"], results["fit"]
  seeded = sorted({(r["num_layers"], r["d_model"]) for r in results["seed_runs"]})
  intro = (f"Seed replicates: {len(seeded)} sizes "
           f"({', '.join(f'{n} x {d}' for n, d in seeded)}) trained with "
           f"{results.get('seeds', '?')} seeds (train.seed 0, 1, ..: the initialisation, the "
           f"order of the training images and the augmentation shifts; the 10,000 test images "
           f"are the same for every seed, so the scatter is training noise). The table of "
           f"sizes, the frontier and the fit use seed 0's runs only: a frontier over every "
           f"seed's evals would keep the luckiest seed, and only at the seeded sizes. The "
           f"replicates measure σ_seed.")
  if sigma is None:
    return intro + " σ_seed: none (no seeded size has 2 finished seeds)."
  per = ", ".join(f"{s['name']} {s['sd']:.2%} ({s['sd_log']:.4f})" for s in sigma["sizes"])
  flag = seed_flag(sigma, fit)
  space = "log error" if flag is None or flag["space"] == "log" else "error"
  text = (f"σ_seed (the sample standard deviation over seeds of the test error at one eval "
          f"step, its variance pooled over every eval of a size and over the seeded sizes, "
          f"{sigma['dof']} degrees of freedom): **{sigma['pooled']:.2%}** in error (percentage "
          f"points), **{sigma['pooled_log']:.4f}** in log error; per size (log error in "
          f"brackets): {per}.")
  if flag is None:
    verdict = "Not compared with a fit: there is none."
  elif flag["flagged"]:
    verdict = (f"**flagged**: sigma_seed exceeds the residual RMS ({flag['sigma']:.4f} > "
               f"{flag['rms_residual']:.4f} in {space}, the fit's residual space): seed 0's "
               f"frontier scatters about the law less than repeat runs scatter about each "
               f"other, so the law follows one seed's luck, and its intervals, from "
               f"resampling seed 0's runs, understate the run-to-run noise.")
  else:
    verdict = (f"Not flagged: sigma_seed does not exceed the residual RMS "
               f"({flag['sigma']:.4f} <= {flag['rms_residual']:.4f} in {space}, the fit's "
               f"residual space): the law's misfit is at least the seeds' noise.")
  return "\n\n".join([intro, seed_table(sigma), text, verdict])


def backtest_text(results: dict) -> list[str]:
  """The back-test section: each run's frontier points predicted by the law fitted to the
  other runs' (leave-largest-run-out, leave-one-run-out). The frontier itself is computed
  with every run, so a held-out run's points are those where it was best."""
  if "backtest" not in results:
    return []
  entry = results["backtest"]
  notes = "".join(f"\n\nNote: {n}" for n in entry["notes"])
  return ["## Back-test", ((entry["markdown"] or "No back-test.") + notes).rstrip()]


def render(results: dict) -> str:
  """The markdown report, from the results (OUT.json) alone."""
  sizes, frontier, fit = results["sizes"], results["frontier"], results["fit"]
  span = sizes[-1]["params"] / sizes[0]["params"]
  data = results["data"] if results["data"].startswith("tfds:") else "mnist:<IDX dir>"
  steps = "" if results["steps"] == 3000 else f" --steps={results['steps']}"
  if results.get("seeds", 3) != 3:
    steps += f" --seeds={results['seeds']}"
  seeds = [seed_text(results)] if "seed_runs" in results else []
  return "\n\n".join([
      "# ViT scaling on MNIST: test error vs compute (Zhai et al. 2022)",
      f"`{results['base']}` with `data.source={data}`, {len(sizes)} sizes (head_dim 16, mlp 2x, "
      f"7x7 patches) from {sizes[0]['params']:,} to {sizes[-1]['params']:,} non-embedding "
      f"parameters ({span:.0f}x), each {results['steps']:,} steps of 128 images (the config's "
      f"AdamW + cosine + shift-augmentation recipe) with {results['evals']} evals on the 10,000 "
      f"test images. Compute C = flops_per_token(model, 17) x 17 tokens x images seen "
      f"(Kaplan's 6N + attention per token, N non-embedding; the loop's MFU count). Test "
      f"error = 1 - eval_accuracy. Reproduce: `python -m experiments.scaling_vit "
      f"--data={data}{steps}` (finished runs are reused).",
      sizes_table(sizes),
      f"Compute-efficient frontier: the {len(frontier)} eval points (of "
      f"{sum(len(s['evals']) for s in sizes)}) that no point of less compute beats. "
      f"Intermediate evals come before the cosine schedule annealed, so the frontier between "
      f"run ends is conservative.",
      frontier_table(frontier, fit), fit_text(fit, results["notes"]), *seeds,
      *backtest_text(results),
      "![error vs compute](scaling_vit.png)", ""])


def plot(results: dict, path: str):
  """Error vs compute (each size, the frontier, the law and its stored band) and error vs
  size, from the results alone."""
  sizes, frontier, fit = results["sizes"], results["frontier"], results["fit"]
  fig, (ax_c, ax_n) = plt.subplots(1, 2, figsize=(12.5, 4.8),
                                   gridspec_kw={"width_ratios": [1.6, 1]})
  colors = [plt.cm.viridis(i / max(len(sizes) - 1, 1)) for i in range(len(sizes))]
  for s, color in zip(sizes, colors):
    ax_c.loglog([e["compute"] for e in s["evals"]], [e["error"] for e in s["evals"]], "o-",
                color=color, ms=4, alpha=0.8,
                label=f"{s['name'].split('_s')[0]} (N={s['params']:,})")
  color_of = {_key(s): color for s, color in zip(sizes, colors)}
  for i, r in enumerate(results.get("seed_runs") or []):
    ax_c.loglog([e["compute"] for e in r["evals"]], [e["error"] for e in r["evals"]], ":",
                color=color_of.get(_key(r), "0.5"), lw=1, alpha=0.7,
                label="other seeds" if i == 0 else None)
  fc = np.array([p["compute"] for p in frontier])
  ax_c.loglog(fc, [p["error"] for p in frontier], "k-", lw=2.5, alpha=0.35, label="frontier")
  if fit is not None:
    grid = np.geomspace(fc.min() / 2, fc.max() * 2, 200)
    p = fit["params"]
    ax_c.loglog(grid, _zhai(p, grid), "--", color="C3",
                label=f"a (C+d)^-b + c: b = {p['b']:.3f}, c = {p['c']:.2%}")
    band = results.get("band")
    if band:
      ax_c.fill_between(band["compute"], band["low"], band["high"], color="C3", alpha=0.12,
                        label="95% bootstrap band")
  ax_c.set(xlabel="training compute C (FLOPs)", ylabel="test error",
           title="test error vs compute")
  ax_c.legend(fontsize=8)
  n = [s["params"] for s in sizes]
  ax_n.loglog(n, [s["final_error"] for s in sizes], "ko-", label="final eval")
  ax_n.loglog(n, [s["best_error"] for s in sizes], "s--", color="0.5", mfc="none",
              label="best eval")
  ax_n.set(xlabel="non-embedding parameters N", ylabel="test error", title="error vs size")
  ax_n.legend(fontsize=8)
  for ax in (ax_c, ax_n):
    ax.grid(True, which="both", alpha=0.2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def results_of(meta: dict, sizes: list[dict], samples: int, seconds: float,
               seed_runs: list[dict] | None = None) -> dict:
  """OUT.json: `meta` (base, data, steps, evals, compute; seeds), seed 0's sizes with every
  eval, their frontier and the law fitted to it (bootstrap by run), its band on a grid; with
  `seed_runs` (the replicates, train.seed >= 1) also those and sigma_seed with its flag."""
  frontier = pareto_frontier(sizes)
  fit, notes = fit_frontier(frontier, samples, seconds)
  band = None
  if fit is not None and fit.draws():
    fc = np.array([p["compute"] for p in frontier])
    grid = np.geomspace(fc.min() / 2, fc.max() * 2, BAND_POINTS)
    low, high = fit.predict_ci(grid)
    band = {"compute": grid.tolist(), "low": low.tolist(), "high": high.tolist()}
  test, test_notes = scaling.backtest_sizes_fallback(
      [p["compute"] for p in frontier], [p["error"] for p in frontier],
      [p["name"] for p in frontier], scaling.fit_zhai, samples=min(samples, BACKTEST_SAMPLES),
      x_name="C (FLOPs)")
  backtest = {"result": None if test is None else test.as_dict(),
              "markdown": None if test is None else test.markdown(), "notes": test_notes}
  seeded = {}
  if seed_runs is not None:
    sigma = seed_sigma(sizes, seed_runs)
    flag = seed_flag(sigma, None if fit is None else fit.as_dict())
    seeded = {"seed_runs": seed_runs,
              "sigma_seed": None if sigma is None else {**sigma, "vs_fit": flag}}
  return scaling.stats.json_ready({
      **meta, "sizes": sizes, "frontier": frontier,
      "fit": None if fit is None else fit.as_dict(), "notes": notes, "band": band,
      "backtest": backtest, **seeded})


def finished(rows: list[dict]) -> list[dict]:
  """The finished rows of a sweep; a warning for each other one (left out)."""
  done = [r for r in rows if r["status"] == "done"]
  for r in rows:
    if r not in done:
      print(f"warning: {r['name']} is {r['status']} (log {r['log']}); left out")
  return done


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  if args.refit:
    try:
      stored = report_check.load(args.out)
    except ValueError as e:
      cli.fail(str(e))
    meta = {k: stored[k] for k in ("base", "data", "steps", "evals", "compute", "seeds")
            if k in stored}
    results = results_of(meta, stored["sizes"], args.bootstrap, args.bootstrap_seconds,
                         stored.get("seed_runs"))
  else:
    if args.threads_per_run:
      sweep_lib.limit_xla_threads(args.threads_per_run)
    spec = sweep_spec(args.data, args.steps, args.evals)
    extra = seed_spec(args.data, args.steps, args.evals, args.seeds)
    seed_dir = os.path.join(args.workdir, "seeds")   # a sweep of its own: its own summary
    sweeps = [(spec, args.workdir)] + ([] if extra is None else [(extra, seed_dir)])
    print(estimate_text(estimate(sweeps, args.parallel), args.parallel), flush=True)
    done = finished(sweep_lib.run(spec, args.workdir, parallel=args.parallel))
    if not done:
      raise SystemExit(f"error: no run finished; see the train.log files in {args.workdir}")
    sizes = sorted((size_points(r, args.workdir) for r in done), key=lambda s: s["params"])
    seed_runs = None
    if extra is not None:
      seed_runs = [{**size_points(r, seed_dir), "seed": r["overrides"]["train.seed"]}
                   for r in finished(sweep_lib.run(extra, seed_dir, parallel=args.parallel))]
      seed_runs.sort(key=lambda r: (r["params"], r["seed"]))
    meta = {"base": BASE, "data": args.data if args.data.startswith("tfds:") else "mnist",
            "steps": args.steps, "evals": args.evals,
            "compute": "flops_per_token(model, 17) * 17 * images seen (Kaplan 6N + attention)",
            "seeds": args.seeds}
    results = results_of(meta, sizes, args.bootstrap, args.bootstrap_seconds, seed_runs)
  print(report_check.write(args.out, results, render, plot))
  print(f"wrote {args.out}.md, {args.out}.json, {args.out}.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
