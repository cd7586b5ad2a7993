"""Kaplan et al.'s L(N) for character-level GPTs: 6 sizes, each trained until one more
doubling of its tokens moves its loss by less than the seed-to-seed noise sigma_seed (3 seeds
at the 3 smallest sizes), alpha_N with a 95% interval next to Kaplan's 0.076.

    python -m experiments.scaling_gpt --data=PATH/corpus.txt [--workdir=runs/scaling_gpt_v2]
        [--scale=1] [--lr=width] [--seeds=3] [--max_epochs=2] [--parallel=1]
        [--threads_per_run=1] [--bootstrap=1000] [--out=experiments/results/scaling_gpt]
    python -m experiments.scaling_gpt --report_only [--out=...]   # OUT.md/.png from OUT.json

Design (configs/sweeps/scaling_gpt.py): per size and seed a chain of warmup-stable-decay runs
of BASE_STEPS x 1, 2, 4, ... steps, each a cooldown branch of the previous one's stable
phase. The study runs in rounds: train every planned run (`jaxformer.sweep`: finished runs
are skipped), then `plan` decides from the final eval losses which chains need their next
length. A size doubles until its last doubling improved its final eval loss (the seed mean
at a seeded size) by less than sigma_seed (the seeds' standard deviation over a size's last 2
lengths: its own at a seeded size; pooled over the seeded sizes elsewhere), or until the next length would pass --max_epochs of the training split:
then it stops "not converged" and the report says so. Every run is a sweep point and every
branch is created idempotently, so rerunning the script continues where it stopped; a
finished study only refits and redraws.

Per size the L(N) loss is the final eval loss of its last length (the converged cooldown),
with early stopping's best eval beside it. Fits (`jaxformer.scaling`): `fit_kaplan_n` (L =
(N_c / N)^alpha_N, least squares in log-log) and `fit_saturating` (L = E + (N_c / N)^alpha)
on one point per run (size, seed), the bootstrap resampling whole sizes (`groups=`, seeds of
a size together) where the fits take `groups=`, else on per-size means. A fit is flagged when
sigma_seed (in log loss) exceeds its RMS residual: then the interval from resampling points
does not show the run-to-run noise.

Converged losses (`limits`): where sizes stop at the cap, their last losses are upper
bounds and the fit above is biased low. Per size, L(D) = L_inf + (D_c / D)^beta
(`scaling.fit_limit`) on every run's final loss at each length gives L_inf with a bootstrap
interval (whole seeds resampled at a seeded size; else parametric, the fitted curve plus the
pooled seeds' sd of each length); alpha_N is fitted to the L_inf with a nested bootstrap
(`scaling.fit_kaplan_limits`), and L(D) fitted without the last length back-tests the
extrapolation. Both alpha_N are in the report's headline.

Writes OUT.json (every run's eval curve, every size's doubling history, sigma_seed, the fits'
points and results), OUT.md = `render(OUT.json)` and OUT.png = `plot(OUT.json)`; `refit`
recomputes the fits' point estimates from OUT.json (tests/unit/experiments/test_reports.py).
"""

from __future__ import annotations

import argparse
import inspect
import os
import pathlib
import sys
import time

import numpy as np

from configs.sweeps import isoflop, scaling_gpt as gpt_sweep
from experiments import report_check
from jaxformer import scaling

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

FORMAT = "scaling_gpt/wsd-doubling/2"   # results["format"] of the reports `render` draws
KAPLAN_ALPHA_N = 0.076         # Kaplan et al. 2020, eq. 1.1 (N_c = 8.8e13 non-embedding params)
GFLOPS = (15.0, 25.0)          # measured single-thread XLA:CPU rates of these models (range)
BAND_POINTS = 60               # grid points of the stored bootstrap bands
STARTUP_S = 30                 # measured start-up of one run (imports, data, compile), seconds
BACKTEST_SAMPLES = 200         # bootstrap resamples of each back-test fit (7 fits per law)


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help="a UTF-8 text corpus, e.g. python_docs.txt (11 MB: "
                      "python -m experiments.python_docs_corpus builds it)")
  parser.add_argument("--workdir", default="runs/scaling_gpt_v2")
  parser.add_argument("--scale", type=float, default=1.0,
                      help="multiplies the first length of every chain (0.01: smoke test)")
  parser.add_argument("--lr", default="width",
                      help="peak learning rate, or 'width' (the sweep's width rule)")
  parser.add_argument("--seeds", type=int, default=3, help="seeds at each seeded size")
  parser.add_argument("--max_epochs", type=float, default=2.0,
                      help="cap on a chain's length in epochs of the training split")
  parser.add_argument("--parallel", type=int, default=1)
  parser.add_argument("--threads_per_run", type=int, default=1,
                      help="XLA:CPU threads of each run (0: XLA's default)")
  parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/scaling_gpt"),
                      help="output path prefix: writes OUT.md, OUT.json, OUT.png")
  parser.add_argument("--report_only", action="store_true",
                      help="rewrite OUT.md and OUT.png from OUT.json; train nothing")
  args = parser.parse_args(argv)
  if args.report_only:
    return args
  if not args.data or not os.path.isfile(args.data):
    parser.error(f"--data={args.data}: no such file (give the corpus, or --report_only)")
  if "," in args.data:
    parser.error(f"--data={args.data}: the sweep argument is comma-separated; use a path "
                 "without commas")
  if not (args.scale > 0 and args.seeds >= 2 and args.max_epochs > 0 and args.bootstrap >= 0
          and args.parallel >= 1):
    parser.error("--scale and --max_epochs must be > 0, --seeds >= 2 (sigma_seed needs 2), "
                 "--bootstrap >= 0, --parallel >= 1")
  args.data = os.path.abspath(args.data)
  return args


def sweep_values(args) -> dict:
  return gpt_sweep.parse_arg(f"source={args.data},scale={args.scale!r},lr={args.lr},"
                             f"seeds={args.seeds},max_epochs={args.max_epochs!r}")


# ---- planning: pure functions of the final eval losses --------------------------------------


LIMIT_LENGTHS = 5     # lengths a size needs for the converged-loss estimate and its back-test
SIGMA_LENGTHS = 2     # sigma_seed pools the seeds' scatter over a size's last 2 lengths


def seed_sigma(finals: dict, last: int = SIGMA_LENGTHS) -> dict:
  """sigma_seed from `finals` {size: {length index: {seed: final eval loss}}}: the sample
  standard deviation over seeds of the final loss at one length, its variance pooled (weighted
  by degrees of freedom) over the `last` longest lengths of a size with >= 2 seeds finished
  (`per_size`; None with fewer) and over every size (`pooled`), also in log loss
  (`pooled_log`, comparable with a log-space fit's RMS residual); `dof` counts the pooled
  degrees of freedom. Only the last lengths: the noise that matters is that of the losses a
  doubling compares, and the first lengths, still falling fast, scatter more."""
  per_size, total, total_log, dof = {}, 0.0, 0.0, 0
  for size, by_length in finals.items():
    ss, k = 0.0, 0
    seeded = sorted(j for j, losses in by_length.items() if len(losses) >= 2)
    for j in seeded[-last:]:
      values = np.array(list(by_length[j].values()), np.float64)
      ss += float(np.sum((values - values.mean()) ** 2))
      total_log += float(np.sum((np.log(values) - np.log(values).mean()) ** 2))
      k += values.size - 1
    per_size[size] = float(np.sqrt(ss / k)) if k else None
    total, dof = total + ss, dof + k
  return {"per_size": per_size, "pooled": float(np.sqrt(total / dof)) if dof else None,
          "pooled_log": float(np.sqrt(total_log / dof)) if dof else None, "dof": dof,
          "lengths": last}


def history(by_length: dict, seeds, sigma: float | None) -> list[dict]:
  """A size's lengths with every seed finished, in order: the seed-mean final loss, the
  improvement over the previous length (`delta` = previous - this) and whether it is below
  `sigma` (`converged`; None before the second length or without sigma)."""
  out = []
  for index in sorted(by_length):
    losses = by_length[index]
    if set(losses) != set(seeds) or (out and out[-1]["index"] != index - 1) or \
        (not out and index != 0):
      break
    values = [losses[s] for s in seeds]
    loss = float(np.mean(values))
    delta = out[-1]["loss"] - loss if out else None
    out.append({"index": index, "loss": loss, "losses": values,
                "sd": float(np.std(values, ddof=1)) if len(values) >= 2 else None,
                "delta": delta, "sigma": sigma,
                "converged": None if delta is None or sigma is None else bool(delta < sigma)})
  return out


def decide(by_length: dict, seeds, sigma: float | None, last_index: int) -> dict:
  """What one size needs next, from its finished final losses {index: {seed: loss}}:
    run        train `runs` [(seed, index)]: the seeds missing at the first length without
               all of them (the first, or the next after a doubling that still helped)
    converged  the last doubling improved the loss by less than sigma: `index` is the answer
    capped     the next length would pass the epoch cap: `index` is the answer, not converged
    waiting    no sigma yet (no seeded size has two seeds at a length): nothing to decide
  `history` is the size's doubling history (`history`)."""
  steps = history(by_length, seeds, sigma)
  done = len(steps)                  # lengths 0 .. done - 1 have every seed

  def need(index):
    have = by_length.get(index, {})
    return {"state": "run", "index": index, "history": steps,
            "runs": [(s, index) for s in seeds if s not in have]}

  if done == 0:
    return need(0)
  last = steps[-1]
  if done >= 2 and last["converged"] is None:
    return {"state": "waiting", "index": last["index"], "history": steps, "runs": []}
  if done >= 2 and last["converged"]:
    return {"state": "converged", "index": last["index"], "history": steps, "runs": []}
  if last["index"] >= last_index:
    return {"state": "capped", "index": last["index"], "history": steps, "runs": []}
  return need(last["index"] + 1)


def plan(finals: dict, seeds_of: dict, last_index: int) -> dict:
  """The whole study's next step from `finals` {size: {index: {seed: loss}}}: `runs` [(size,
  seed, index)] to train now, each size's `decide`, and `sigma` (`seed_sigma`). A seeded
  size is judged by its own sigma_seed, the others by the pooled one."""
  sigma = seed_sigma({s: finals.get(s, {}) for s in seeds_of if len(seeds_of[s]) >= 2})
  sizes, runs = {}, []
  for size, seeds in seeds_of.items():
    own = sigma["per_size"].get(size) if len(seeds) >= 2 else None
    decision = decide(finals.get(size, {}), seeds, own if own is not None else sigma["pooled"],
                      last_index)
    sizes[size] = decision
    runs += [(size, seed, index) for seed, index in decision["runs"]]
  return {"runs": runs, "sizes": sizes, "sigma": sigma}


# ---- compute ----------------------------------------------------------------------------------


def chain_steps(lengths: list[int], count: int) -> int:
  """Steps a chain trains to reach its `count`-th length: the first in full, each later one
  from the previous one's decay start."""
  return lengths[0] + sum(lengths[j] - gpt_sweep.decay_start(lengths[j - 1])
                          for j in range(1, count))


def estimate(chains: list[dict], lengths: list[int], parallel: int, eval_tokens: int) -> dict:
  """FLOPs and hours of the study if every chain stops after 2 lengths (the least the rule
  allows) and if every chain reaches the cap (the most). `chains`: {size, flops_per_token,
  tokens_per_s}; evals are forward passes (1/3 of training FLOPs per token) over
  `eval_tokens` every eval_every steps; each run starts in STARTUP_S (measured tokens/s only:
  the FLOP rates count training alone)."""
  out = {}
  for label, count in (("least", min(2, len(lengths))), ("most", len(lengths))):
    steps = sum(chain_steps(lengths, count) for _ in chains)
    flops = measured = 0.0
    for c in chains:
      s = chain_steps(lengths, count)
      evals = s / (lengths[0] // gpt_sweep.EVALS_PER_BASE) + count
      flops += c["flops_per_token"] * (s * isoflop.TOKENS_PER_STEP + evals * eval_tokens / 3)
      measured += s * isoflop.TOKENS_PER_STEP / c["tokens_per_s"]
    out[label] = {"lengths": count, "steps": steps,
                  "tokens": steps * isoflop.TOKENS_PER_STEP, "flops": flops,
                  "hours_at_gflops": [flops / (g * 1e9) / parallel / 3600 for g in GFLOPS],
                  "runs": count * len(chains), "startup_s": STARTUP_S,
                  "hours_measured": (measured + count * len(chains) * STARTUP_S)
                  / parallel / 3600}
  return out


def estimate_text(est: dict, parallel: int) -> str:
  lines = []
  for label, e in est.items():
    lo, hi = sorted(e["hours_at_gflops"])
    lines.append(f"{label}: {e['lengths']} lengths per chain, {e['steps']:,} steps "
                 f"({e['tokens']:.3g} tokens), {e['flops']:.3g} FLOPs: {lo:.1f}-{hi:.1f} h at "
                 f"{GFLOPS[1]:g}-{GFLOPS[0]:g} GFLOP/s per run, {e['hours_measured']:.1f} h at "
                 f"the cosine study's measured tokens/s and {e['startup_s']} s start-up for each "
                 f"of "
                 f"{e['runs']} runs ({parallel} run(s) at a time)")
  return "; ".join(lines)


# ---- running the study ------------------------------------------------------------------------


def _sizes_by_name() -> dict:
  return {gpt_sweep.size_name(s): s for s in gpt_sweep.SIZES}


def run_key(size: str, seed: int, index: int, lengths: list[int]) -> tuple:
  return _sizes_by_name()[size], seed, lengths[index]


def train_round(values: dict, planned: list[tuple], lengths: list[int], args) -> list[dict]:
  """Branch every planned run that continues a chain (idempotent), then train the planned
  runs not finished yet; returns their sweep rows (name, status, eval_loss, ...)."""
  from jaxformer import sweep as sweep_lib
  from jaxformer.train import workdir as workdir_lib

  spec = gpt_sweep.sweep_of(values, [run_key(*r, lengths) for r in planned])
  points = {(r[0], r[1], r[2]): p for r, p in zip(planned, sweep_lib.expand(spec,
                                                                             validate=False))}
  for (size, seed, index), point in points.items():
    if index == 0:
      continue
    parent = points[(size, seed, index - 1)].name
    target = os.path.join(args.workdir, point.name)
    if workdir_lib.branch(os.path.join(args.workdir, parent),
                          gpt_sweep.decay_start(lengths[index - 1]), target):
      print(f"[scaling_gpt] {point.name}: branched from {parent} at step "
            f"{gpt_sweep.decay_start(lengths[index - 1])}", flush=True)
  return sweep_lib.run(spec, args.workdir, parallel=args.parallel)


def finals_of(rows: list[dict], planned: list[tuple]) -> dict:
  """{size: {index: {seed: final eval loss}}} of the finished runs."""
  out = {}
  for (size, seed, index), row in zip(planned, rows):
    if row["status"] == "done" and row["eval_loss"] is not None:
      out.setdefault(size, {}).setdefault(index, {})[seed] = float(row["eval_loss"])
  return out


def run_study(args, values: dict, lengths: list[int]) -> tuple[list[tuple], list[dict], dict]:
  """Rounds of train -> plan until no size needs another run; (planned, rows, plan)."""
  seeds = gpt_sweep.seeds_of(values["seeds"])
  planned = [(size, seed, 0) for size in seeds for seed in seeds[size]]
  while True:
    rows = train_round(values, planned, lengths, args)
    bad = [r for r in rows if r["status"] != "done"]
    if bad:
      lines = "; ".join(f"{r['name']} is {r['status']} (log {r['log']})" for r in bad)
      raise SystemExit(f"error: {len(bad)} run(s) did not finish: {lines}. Rerun the same "
                       "command to resume them")
    decision = plan(finals_of(rows, planned), seeds, len(lengths) - 1)
    new = [r for r in decision["runs"] if r not in planned]
    for size, d in decision["sizes"].items():
      h = d["history"][-1] if d["history"] else None
      delta = "" if not h or h["delta"] is None else f", last doubling {h['delta']:+.4f}"
      sigma = "" if not h or h["sigma"] is None else f", sigma_seed {h['sigma']:.4f}"
      print(f"[scaling_gpt] {size}: {d['state']} at x{2 ** d['index']}"
            + (f" (loss {h['loss']:.4f}{delta}{sigma})" if h else ""), flush=True)
    if not new:
      return planned, rows, decision
    planned += new
    print(f"[scaling_gpt] next round: {len(new)} run(s): "
          + ", ".join(f"{s}/seed{seed}@x{2 ** i}" for s, seed, i in new), flush=True)


# ---- results, fits ----------------------------------------------------------------------------


def fit_law(fit_fn, x, y, samples: int, groups=None):
  """(fit or None, notes): without bootstrap intervals when too few resamples can be fit,
  None when the law cannot be fit at all."""
  kw = {} if groups is None else {"groups": groups}
  try:
    return fit_fn(x, y, samples=samples, **kw), []
  except ValueError as e:
    if not (samples and "bootstrap" in str(e)):
      return None, [f"no fit: {e}"]
    note = f"no bootstrap intervals ({e})"
  try:
    return fit_fn(x, y, samples=0), [note]
  except ValueError as e:
    return None, [note, f"no fit: {e}"]


def takes_groups(fit_fn) -> bool:
  return "groups" in inspect.signature(fit_fn).parameters


FITS = (("kaplan", scaling.fit_kaplan_n, "loss", True),
        ("saturating", scaling.fit_saturating, "loss", True),
        ("kaplan_best_eval", scaling.fit_kaplan_n, "best_loss", False))


def fit_points(sizes: list[dict], by_run: bool) -> dict:
  """The points the fits take: one per run (size, seed) with its size as the group, or one
  per size (seed means) when the fits cannot resample by run."""
  if by_run:
    rows = [(s["params"], loss, best, s["size"]) for s in sizes
            for loss, best in zip(s["losses"], s["best_losses"])]
  else:
    rows = [(s["params"], s["loss"], s["best_loss"], s["size"]) for s in sizes]
  params, loss, best, groups = (list(v) for v in zip(*rows))
  return {"by_run": by_run, "params": params, "loss": loss, "best_loss": best,
          "groups": groups}


def fit_all(points: dict, samples: int) -> dict:
  out = {}
  n = np.array(points["params"], np.float64)
  for key, fn, column, boot in FITS:
    groups = points["groups"] if points["by_run"] and boot and samples else None
    fit, notes = fit_law(fn, n, np.array(points[column]), samples if boot else 0, groups)
    entry = {"fit": None if fit is None else fit.as_dict(), "notes": notes}
    if fit is not None and fit.draws():
      grid = np.geomspace(n.min() / 1.5, n.max() * 1.5, BAND_POINTS)
      low, high = fit.predict_ci(grid)
      entry["band"] = {"n": grid.tolist(), "low": low.tolist(), "high": high.tolist()}
    out[key] = entry
  return out


def backtests(points: dict, samples: int, sigma: dict) -> dict:
  """`scaling.backtest_sizes` of the Kaplan and saturating laws on the fits' points (leave the
  largest size out, and each in turn), resampling whole sizes where it can (with 5 sizes
  left, > 10% of such resamples cannot be fitted; then runs, then none: the notes say which
  and why; `backtest_sizes_fallback`). Points that are seed means get sigma_seed as extra
  scatter."""
  n, loss = np.array(points["params"], np.float64), np.array(points["loss"], np.float64)
  seed_sigma = 0.0 if points["by_run"] else (sigma["pooled"] or 0.0)
  out = {}
  for key, fn, _, boot in FITS:
    if boot:
      result, notes = scaling.backtest_sizes_fallback(
          n, loss, points["groups"], fn, samples=min(samples, BACKTEST_SAMPLES), x_name="N",
          seed_sigma=seed_sigma)
      out[key] = {"result": None if result is None else result.as_dict(),
                  "markdown": None if result is None else result.markdown(), "notes": notes}
  return out


def length_sd(sizes: list[dict]) -> list[float | None]:
  """The seeds' sd of the final loss at each length (x1, x2, ...), its variance pooled over
  the seeded sizes (None at a length no seeded size reached)."""
  out = []
  for j in range(max(len(s["history"]) for s in sizes)):
    ss = dof = 0
    for s in sizes:
      if len(s["seeds"]) >= 2 and j < len(s["history"]):
        values = np.array(s["history"][j]["losses"], np.float64)
        ss, dof = ss + float(np.sum((values - values.mean()) ** 2)), dof + values.size - 1
    out.append(float(np.sqrt(ss / dof)) if dof else None)
  return out


def limit_points(size: dict) -> dict:
  """One point per run (length, seed) of a size's doubling history: tokens, final loss, seed."""
  rows = [(h["tokens"], loss, seed, h["index"]) for h in size["history"]
          for seed, loss in zip(size["seeds"], h["losses"])]
  tokens, loss, seed, index = (list(v) for v in zip(*rows))
  return {"tokens": tokens, "loss": loss, "seed": seed, "index": index}


def _limit_args(points: dict, sd: list, parametric: bool = False) -> dict:
  """The arguments of `scaling.fit_limit` / `backtest_limit` for one size's points: by seed
  with >= 2 seeds (unless `parametric`), else parametric with the pooled seed sd of each
  point's length."""
  seeded = len(set(points["seed"])) >= 2 and not parametric
  return dict(groups=points["seed"] if seeded else None,
              noise=[sd[j] for j in points["index"]])


def _limit_fit(points: dict, sd: list, samples: int, seed: int = 0, parametric: bool = False):
  """`scaling.fit_limit` of one size's points (`_limit_args`)."""
  return scaling.fit_limit(points["tokens"], points["loss"], samples=samples, seed=seed,
                           **_limit_args(points, sd, parametric))


def limits(sizes: list[dict], samples: int) -> dict:
  """The converged-loss estimate (issue #30's runs stopped at the epoch cap): per size L(D) =
  L_inf + (D_c / D)^beta on every run's final loss at each length (`scaling.fit_limit`;
  bootstrap resampling whole seeds at a seeded size, else parametric: fitted curve + normal
  noise of the pooled seeds' sd at each length, independent across lengths; at the seeded
  sizes the parametric interval is stored too, `parametric_ci`, to compare the two); then
  alpha_N on the L_inf (`scaling.fit_kaplan_limits`: nested bootstrap, each draw one L_inf
  from each size's draws; `kaplan_sizes_resampled` also draws sizes with replacement); and
  per size the back-test: L(D) fitted without the longest length, predicting it."""
  sd = length_sd(sizes)
  none = {"length_sd": sd, "sizes": [], "kaplan": None, "kaplan_sizes_resampled": None,
          "kaplan_backtest": None}
  short = [s["size"] for s in sizes if len(s["history"]) < LIMIT_LENGTHS]
  if short:
    return dict(none, notes=[f"{', '.join(short)} ran fewer than {LIMIT_LENGTHS} lengths (the "
                             "back-test fits L(D)'s 3 parameters without the last, and needs "
                             "4 lengths left)"])
  if any(v is None for v in sd):
    return dict(none, notes=["no seeded size reached every length: no noise for the "
                             "parametric bootstrap"])
  try:
    return _limits(sizes, sd, samples)
  except ValueError as e:            # a law that cannot be fit, or BootstrapError (> 10% fail)
    return dict(none, notes=[f"not estimated: {e}"])


def _limits(sizes: list[dict], sd: list[float], samples: int) -> dict:
  out, fits = [], []
  for i, s in enumerate(sizes):
    points = limit_points(s)
    lim = _limit_fit(points, sd, samples, seed=i)
    fits.append(lim)
    entry = {"size": s["size"], "params": s["params"], "points": points, "fit": lim.as_dict()}
    if len(s["seeds"]) >= 2 and samples:
      other = _limit_fit(points, sd, min(samples, BACKTEST_SAMPLES), seed=i, parametric=True)
      entry["parametric_ci"] = list(other.ci("L_inf"))
    entry["backtest"] = scaling.backtest_limit(
        points["tokens"], points["loss"], samples=min(samples, BACKTEST_SAMPLES), seed=i,
        **_limit_args(points, sd))
    out.append(entry)
  n = [s["params"] for s in sizes]
  kaplan = {key: scaling.fit_kaplan_limits(n, fits, samples=samples, resample_sizes=resample)
            .as_dict() for key, resample in (("kaplan", False),
                                             ("kaplan_sizes_resampled", True))}
  kaplan["kaplan_backtest"] = scaling.fit_kaplan_n(
      n, [e["backtest"]["L_inf"] for e in out], samples=0).as_dict()
  return {"length_sd": sd, "sizes": out, **kaplan, "notes": []}


def refit(results: dict) -> dict:
  """The fits' point estimates recomputed from results["fit_points"] (samples=0), and the
  converged-loss fits' from results["limits"]: each size's L(D) (`limit/<size>`) and alpha_N
  on their L_inf (`kaplan_limits`)."""
  points = results["fit_points"]
  n = np.array(points["params"], np.float64)
  out = {}
  for key, fn, column, _ in FITS:
    fit, _ = fit_law(fn, n, np.array(points[column]), 0)
    out[key] = None if fit is None else fit.params
  lim = results["limits"]
  fits = [_limit_fit(s["points"], lim["length_sd"], 0) for s in lim["sizes"]]
  for s, fit in zip(lim["sizes"], fits):
    out[f"limit/{s['size']}"] = fit.params
  if fits:
    n = [s["params"] for s in lim["sizes"]]
    out["kaplan_limits"] = scaling.fit_kaplan_limits(n, fits, samples=0).params
    out["kaplan_limits_backtest"] = scaling.fit_kaplan_n(n, [
        scaling.backtest_limit(s["points"]["tokens"], s["points"]["loss"], samples=0)["L_inf"]
        for s in lim["sizes"]], samples=0).params
  return out


def stored(results: dict) -> dict:
  """What `refit` is compared with (tests/unit/experiments/test_reports.py): every fit's stored params."""
  out = report_check.stored_estimates(results)
  lim = results["limits"]
  for s in lim["sizes"]:
    out[f"limit/{s['size']}"] = s["fit"]["params"]
  if lim["sizes"]:
    out["kaplan_limits"] = lim["kaplan"]["params"]
    out["kaplan_limits_backtest"] = lim["kaplan_backtest"]["params"]
  return out


def run_record(name: str, size: str, seed: int, index: int, row: dict, workdir: str,
               lengths: list[int]) -> dict:
  from jaxformer import sweep as sweep_lib
  records = sweep_lib.read_metrics(os.path.join(workdir, name))
  curve = [{"step": r["step"], "tokens": r["step"] * isoflop.TOKENS_PER_STEP,
            "eval_loss": r["eval_loss"]} for r in records if "eval_loss" in r]
  best = min(curve, key=lambda c: c["eval_loss"])
  return {"name": name, "size": size, "seed": seed, "index": index, "steps": lengths[index],
          "tokens": lengths[index] * isoflop.TOKENS_PER_STEP,
          "branched_at": gpt_sweep.decay_start(lengths[index - 1]) if index else None,
          "final_loss": float(row["eval_loss"]), "best_loss": best["eval_loss"],
          "best_step": best["step"], "wall_time_s": row["wall_time_s"], "curve": curve}


def collect(args, values: dict, lengths: list[int], planned, rows, decision, corpus: dict,
            est: dict, wall_s: float) -> dict:
  """The results dict (OUT.json) of a finished study."""
  seeds = gpt_sweep.seeds_of(values["seeds"])
  runs = [run_record(row["name"], *key, row, args.workdir, lengths)
          for key, row in zip(planned, rows)]
  info = {(r[0]): row for r, row in zip(planned, rows)}
  sizes = []
  for size, d in decision["sizes"].items():
    if d["state"] not in ("converged", "capped"):
      continue
    chosen = {r["seed"]: r for r in runs if r["size"] == size and r["index"] == d["index"]}
    row = info[size]
    layers, width = _sizes_by_name()[size]
    hist = [dict(h, steps=lengths[h["index"]], tokens=lengths[h["index"]]
                 * isoflop.TOKENS_PER_STEP) for h in d["history"]]
    sizes.append({
        "size": size, "num_layers": layers, "d_model": width, "params": row["params"],
        "params_total": row["params_total"], "lr": gpt_sweep.lr_of(values["lr"], width),
        "seeds": list(seeds[size]), "state": d["state"], "index": d["index"],
        "steps": lengths[d["index"]], "tokens": lengths[d["index"]] * isoflop.TOKENS_PER_STEP,
        "epochs": lengths[d["index"]] * isoflop.TOKENS_PER_STEP / corpus["train_chars"],
        "loss": hist[-1]["loss"], "losses": [chosen[s]["final_loss"] for s in seeds[size]],
        "best_losses": [chosen[s]["best_loss"] for s in seeds[size]],
        "best_loss": float(np.mean([chosen[s]["best_loss"] for s in seeds[size]])),
        "sigma": hist[-1]["sigma"], "history": hist})
  sizes.sort(key=lambda s: s["params"])
  by_run = all(takes_groups(fn) for _, fn, _, boot in FITS if boot)
  points = fit_points(sizes, by_run)
  return scaling.stats.json_ready({
      "format": FORMAT, "corpus": corpus,
      "settings": {"scale": args.scale, "lr": args.lr, "seeds": args.seeds,
                   "max_epochs": args.max_epochs, "bootstrap": args.bootstrap,
                   "lengths": lengths, "decay_fraction": gpt_sweep.DECAY_FRACTION,
                   "min_lr_ratio": gpt_sweep.MIN_LR_RATIO,
                   "warmup_steps": gpt_sweep.run_overrides(values, gpt_sweep.SIZES[0], 0,
                                                           lengths[0])["optim.warmup_steps"],
                   "eval_every": lengths[0] // gpt_sweep.EVALS_PER_BASE,
                   "width_rule": list(gpt_sweep.WIDTH_RULE)},
      "kaplan_2020": {"alpha_N": KAPLAN_ALPHA_N, "N_c": 8.8e13},
      "sigma": decision["sigma"], "estimate": est, "wall_s": wall_s,
      "sizes": sizes, "runs": runs, "fit_points": points,
      "fits": fit_all(points, args.bootstrap),
      "backtests": backtests(points, args.bootstrap, decision["sigma"]),
      "limits": limits(sizes, args.bootstrap)})


# ---- the report: a pure function of the results -----------------------------------------------


def _fmt(key: str, value) -> str:
  if value is None:
    return "—"
  return f"{value:.3g}" if key.endswith("_c") else f"{value:.4f}"


def _ci(fit: dict, key: str) -> str:
  low, high = fit["ci"][key]
  return "—" if low is None else f"[{_fmt(key, low)}, {_fmt(key, high)}]"


def _predict(fit: dict, n: float) -> float:
  p = fit["params"]
  if "alpha_N" in p:
    return (p["N_c"] / n) ** p["alpha_N"]
  return p["E"] + (p["X_c"] / n) ** p["alpha"]


def sizes_table(results: dict) -> str:
  fits = results["fits"]
  lines = ["| size | N (non-emb.) | N (total) | peak LR | seeds | steps | tokens D | D / N | "
           "epochs | final eval loss (seed mean) | seeds' final losses | best eval (mean) | "
           "last doubling Δ | σ_seed | converged? | Kaplan fit | saturating fit |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|"]
  for s in results["sizes"]:
    pred = [f"{_predict(fits[k]['fit'], s['params']):.4f}" if fits[k]["fit"] else "—"
            for k in ("kaplan", "saturating")]
    delta = s["history"][-1]["delta"]
    lines.append(
        f"| {s['size']} | {s['params']:,} | {s['params_total']:,} | {s['lr']:g} | "
        f"{len(s['seeds'])} | {s['steps']:,} | {s['tokens']:,} | {s['tokens'] / s['params']:.0f} | "
        f"{s['epochs']:.2f} | {s['loss']:.4f} | {', '.join(f'{v:.4f}' for v in s['losses'])} | "
        f"{s['best_loss']:.4f} | {'—' if delta is None else f'{delta:+.4f}'} | "
        f"{_fmt('sigma', s['sigma'])} | "
        f"{'yes' if s['state'] == 'converged' else 'no: epoch cap'} | {pred[0]} | {pred[1]} |")
  return "\n".join(lines)


def history_table(results: dict) -> str:
  lines = ["| size | length | steps | tokens | final eval loss (seed mean) | seeds' sd | "
           "Δ vs previous | σ_seed (judged by) | converged? |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
  for s in results["sizes"]:
    for h in s["history"]:
      verdict = ("—" if h["converged"] is None else
                 "yes (Δ < σ)" if h["converged"] else "no (Δ ≥ σ)")
      delta = "—" if h["delta"] is None else f"{h['delta']:+.4f}"
      lines.append(f"| {s['size']} | x{2 ** h['index']} | {h['steps']:,} | {h['tokens']:,} | "
                   f"{h['loss']:.4f} | {_fmt('sd', h.get('sd'))} | {delta} | "
                   f"{_fmt('sigma', h['sigma'])} | {verdict} |")
  return "\n".join(lines)


def fits_table(results: dict) -> str:
  lines = ["| law (fitted to) | parameter | value | 95% interval | RMS residual | method |",
           "|---|---|---:|---:|---:|---|"]
  labels = {"kaplan": "final eval loss", "saturating": "final eval loss",
            "kaplan_best_eval": "best eval loss (no intervals)"}
  for key, entry in results["fits"].items():
    fit = entry["fit"]
    if fit is None:
      continue
    for name, value in fit["params"].items():
      lines.append(f"| `{fit['law']}` ({labels[key]}) | {name} | {_fmt(name, value)} | "
                   f"{_ci(fit, name)} | {fit['rms_residual']:.4f} | {fit['method']} |")
  return "\n".join(lines)


def alpha_text(results: dict) -> str:
  entry, points = results["fits"]["kaplan"], results["fit_points"]
  fit, sizes = entry["fit"], results["sizes"]
  if fit is None:
    return f"No Kaplan fit: {'; '.join(entry['notes'])}."
  alpha = fit["params"]["alpha_N"]
  low, high = fit["ci"]["alpha_N"]
  unit = ("whole sizes (every seed of a drawn size together)" if points["by_run"] else
          "the per-size seed means (the fits took no groups=)")
  if low is not None:
    where = ("inside" if low <= KAPLAN_ALPHA_N <= high else
             "above" if KAPLAN_ALPHA_N > high else "below")
    interval = (f" (95% bootstrap interval [{low:.4f}, {high:.4f}], resampling {unit}; "
                f"Kaplan et al.'s {KAPLAN_ALPHA_N} is {where} it)")
  else:
    interval = f" (no interval); Kaplan et al.: {KAPLAN_ALPHA_N}"
  capped = [s["size"] for s in sizes if s["state"] == "capped"]
  caveat = (f" Not converged at the epoch cap: {', '.join(capped)}: their losses are upper "
            "bounds of the converged ones, which biases alpha_N low if the larger sizes are "
            "among them." if capped else " Every size converged by the doubling rule.")
  best = results["fits"]["kaplan_best_eval"]["fit"]
  best_text = (f" Fitted to early stopping's best evals instead: alpha_N = "
               f"{best['params']['alpha_N']:.4f}." if best else "")
  return (f"{headline(results)}\n\nUpper-bound fit (the final losses of each size's last "
          f"length): **alpha_N = {alpha:.4f}**{interval}, next to Kaplan et al. 2020 (eq. 1.1): "
          f"alpha_N = {KAPLAN_ALPHA_N}, N_c = 8.8e13, on WebText2 with BPE tokens and N from "
          f"~1e3 to ~1e9; this is another corpus and a character vocabulary, so the two need "
          f"not agree.{caveat}{best_text}")


def _alpha_ci(fit: dict | None) -> str:
  if fit is None:
    return "no fit"
  low, high = fit["ci"]["alpha_N"]
  interval = "no interval" if low is None else f"[{low:.4f}, {high:.4f}]"
  return f"{fit['params']['alpha_N']:.4f} {interval}"


def headline(results: dict) -> str:
  """One sentence with both alpha_N values next to Kaplan's."""
  upper, lim = results["fits"]["kaplan"]["fit"], results["limits"]
  if lim["kaplan"] is None:
    return (f"**alpha_N = {_alpha_ci(upper)} fitted to the final losses of each size's last "
            f"length; Kaplan et al. 2020: alpha_N = {KAPLAN_ALPHA_N}** (95% bootstrap "
            "interval; no converged-loss fit: see below).")
  text = (f"**alpha_N = {_alpha_ci(upper)} fitted to the final losses at the epoch cap "
          f"(upper bounds of the converged losses, so biased low), and alpha_N = "
          f"{_alpha_ci(lim['kaplan'])} fitted to the converged losses L_inf extrapolated from "
          f"each size's L(D)")
  if lim.get("kaplan_sizes_resampled"):
    low, high = lim["kaplan_sizes_resampled"]["ci"]["alpha_N"]
    if low is not None:
      text += f" ([{low:.4f}, {high:.4f}] when sizes are resampled too)"
  return text + f"; Kaplan et al. 2020: alpha_N = {KAPLAN_ALPHA_N}** (95% bootstrap intervals)."


def limits_text(results: dict) -> str:
  """The converged-loss section: per-size L_inf, alpha_N on them, the x32 back-test."""
  lim, sizes = results["limits"], results["sizes"]
  if not lim["sizes"]:
    return ("## Converged losses (extrapolated)\n\n**No converged-loss estimate:** " +
            "; ".join(lim["notes"]))
  by_size = {s["size"]: s for s in sizes}
  count = len(lim["length_sd"])
  xl, xp = f"x{2 ** (count - 1)}", f"x1..x{2 ** (count - 2)}"
  sd = ", ".join(f"x{2 ** j} {v:.4f}" for j, v in enumerate(lim["length_sd"]))
  lines = [
      "## Converged losses (extrapolated from each size's L(D))",
      "No size converged by the doubling rule, so its last loss is only an upper bound. Per "
      "size, L(D) = L_inf + (D_c / D)^beta (`scaling.fit_limit`, i.e. `fit_saturating` on "
      "tokens D, bounded least squares on L, 0 <= L_inf <= the smallest loss) is fitted to "
      "every run's final eval loss at each length (one point per length and seed) and L_inf is "
      "the converged loss (the fitter's E, alpha and X_c, named in its findings, are L_inf, "
      "beta and D_c). Intervals (95%): at a seeded size a bootstrap resampling whole seeds "
      "(a seed's lengths are branches of one trunk and share its luck); at a single-seed size a "
      "parametric bootstrap: the fitted curve plus independent normal noise with the seeds' sd "
      f"of each length pooled over the seeded sizes ({sd}), refitted. At the seeded sizes the "
      "parametric interval is shown too, as a check of that noise model. Every bootstrap counts "
      "its resamples and refuses intervals when more than 10% cannot be fitted.",
      "| size | N (non-emb.) | points | L_inf | 95% interval | method (resamples fitted) | "
      f"parametric interval | beta | D_c | RMS residual | {xl} loss (seed mean) | {xl} - L_inf |",
      "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
  for e in lim["sizes"]:
    f, p = e["fit"], e["fit"]["params"]
    low, high = f["ci"]["L_inf"]
    par = e.get("parametric_ci")
    par = "—" if not par or par[0] is None else f"[{par[0]:.4f}, {par[1]:.4f}]"
    last = by_size[e["size"]]["loss"]
    lines.append(
        f"| {e['size']} | {e['params']:,} | {f['n_points']} | {p['L_inf']:.4f} | "
        f"{'—' if low is None else f'[{low:.4f}, {high:.4f}]'} | {f['method']} "
        f"({f['bootstrap']}) | {par} | "
        f"{p['beta']:.3f} | {p['D_c']:.3g} | {f['rms_residual']:.4f} | {last:.4f} | "
        f"{last - p['L_inf']:+.4f} |")
  rows = ["| fit to L_inf | alpha_N | 95% interval | N_c | RMS residual (log) | method |",
          "|---|---:|---:|---:|---:|---|"]
  for key, label in (("kaplan", "per-size uncertainty"),
                     ("kaplan_sizes_resampled", "per-size uncertainty + sizes resampled")):
    f = lim[key]
    if f is None:
      continue
    low, high = f["ci"]["alpha_N"]
    rows.append(f"| {label} | {f['params']['alpha_N']:.4f} | "
                f"{'—' if low is None else f'[{low:.4f}, {high:.4f}]'} | "
                f"{f['params']['N_c']:.3g} | {f['rms_residual']:.4f} | {f['method']} |")
  bt = [f"| size | {xl} loss measured (seed mean) | predicted from {xp} | 95% interval (mean "
        "curve) | error (predicted - measured) | error / σ_seed | no-change error (last Δ) "
        f"| L_inf from {xp} |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for e in lim["sizes"]:
    b, s = e["backtest"], by_size[e["size"]]
    delta = s["history"][-1]["delta"]
    band = "—" if b["low"] is None else f"[{b['low']:.4f}, {b['high']:.4f}]"
    bt.append(f"| {e['size']} | {b['measured']:.4f} | {b['predicted']:.4f} | {band} | "
              f"{b['error']:+.4f} | {b['error'] / s['sigma']:+.1f} | "
              f"{'—' if delta is None else f'{delta:+.4f}'} | {b['L_inf']:.4f} |")
  errors = np.array([e["backtest"]["error"] for e in lim["sizes"]])
  inside = sum(1 for e in lim["sizes"] if e["backtest"]["low"] is not None and
               e["backtest"]["low"] <= e["backtest"]["measured"] <= e["backtest"]["high"])
  deltas = np.array([by_size[e["size"]]["history"][-1]["delta"] for e in lim["sizes"]])
  moves = ", ".join(f"{e['size']} {e['backtest']['L_inf'] - e['fit']['params']['L_inf']:+.4f}"
                    for e in lim["sizes"])
  findings = [f"- {e['size']}: {x}" for e in lim["sizes"] for x in e["fit"]["findings"]]
  findings += [f"- {key}: {x}" for key in ("kaplan", "kaplan_sizes_resampled")
               if lim[key] for x in lim[key]["findings"]]
  return "\n\n".join([
      *lines[:2], "\n".join(lines[2:]),
      "alpha_N on these L_inf (`scaling.fit_kaplan_limits`: `fit_kaplan_n` on the point "
      "estimates; its interval from a nested bootstrap: each draw takes one L_inf at random from "
      "each size's bootstrap draws above and refits alpha_N, so the per-size uncertainty "
      f"propagates; the second row also draws the {len(sizes)} sizes with replacement, adding the sizes' "
      "scatter about the power law):", "\n".join(rows),
      f"Back-test of the extrapolation: L(D) fitted to {xp} only (same method and "
      f"bootstrap), its prediction of the {xl} loss next to the measured one. A prediction that "
      "misses by less than the no-change guess (the previous length's loss, off by the last doubling Δ) "
      f"shows the curve bends as the law says: RMS error {np.sqrt(np.mean(errors ** 2)):.4f} "
      f"vs {np.sqrt(np.mean(deltas ** 2)):.4f} for no change; the measured {xl} loss lies inside "
      f"the mean curve's 95% interval at {inside} of {len(errors)} sizes.", "\n".join(bt),
      f"Stability: without the {xl} length, L_inf moves by "
      f"{moves} "
      f"(L_inf from {xp} minus L_inf from all lengths), and alpha_N on those L_inf is "
      f"{lim['kaplan_backtest']['params']['alpha_N']:.4f} (point estimate) vs "
      f"{lim['kaplan']['params']['alpha_N']:.4f} on all lengths. The back-test predicted "
      f"above the measured loss at {int(np.sum(errors > 0))} of {len(errors)} sizes: where "
      "a curve fitted to shorter runs under-predicts the later fall, L_inf from all lengths "
      "may still be too high (an upper-side estimate, like the measured losses, but closer).",
      f"How far to trust L_inf: it extrapolates beyond the longest run ({xl}, "
      f"{max(s['epochs'] for s in sizes):.2f} epochs) to "
      "infinite tokens, assuming the law's form holds there; the longest lengths already repeat "
      "the training split, so the curve's bend mixes diminishing returns with "
      "repeated data (more epochs would eventually overfit and raise the loss, which the law "
      "cannot show); the parametric bootstrap treats the lengths' noise as independent, "
      "although a single-seed size's lengths share one trunk. Read L_inf and its alpha_N as "
      "the converged-loss estimate under this law, the upper-bound fit above as what was "
      "measured.",
      "Findings of these fits:\n" + "\n".join(findings) if findings else
      "Findings of these fits: none (no parameter at a bound, no resample dropped)."])


def sigma_text(results: dict) -> str:
  sigma = results["sigma"]
  per = ", ".join(f"{k} {v:.4f}" for k, v in sigma["per_size"].items() if v is not None)
  text = (f"σ_seed (the sample standard deviation over seeds of a run's final eval loss at "
          f"one length, pooled over each size's last {sigma.get('lengths', 2)} lengths): "
          f"{per}; pooled over the seeded sizes "
          f"{_fmt('sigma', sigma['pooled'])} nats ({sigma['dof']} degrees of freedom), "
          f"{_fmt('sigma', sigma['pooled_log'])} in log loss. Seeds change the initialisation, "
          f"the data order and the validation windows, so σ_seed is the noise of a measured "
          f"loss. A seeded size is judged by its own σ_seed, the others by the pooled one.")
  flags = []
  for key in ("kaplan", "kaplan_best_eval"):
    fit = results["fits"][key]["fit"]
    if fit is not None and sigma["pooled_log"] is not None and \
        sigma["pooled_log"] > fit["rms_residual"]:
      flags.append(f"**Flag ({key}):** σ_seed in log loss ({sigma['pooled_log']:.4f}) exceeds "
                   f"the fit's RMS residual ({fit['rms_residual']:.4f}): the points scatter "
                   f"about the law less than repeat runs do, so an interval from resampling "
                   f"the points alone would understate the run-to-run noise.")
  return "\n\n".join([text, *flags])


def findings_text(results: dict) -> str:
  lines = [f"- {key}: {text}" for key, entry in results["fits"].items()
           for text in ((entry["fit"] or {}).get("findings", []) + entry["notes"])]
  return ("Findings:\n" + "\n".join(lines) if lines else
          "Findings: none (no parameter at a bound, every fit bootstrapped).")


def backtest_text(results: dict) -> str:
  parts = []
  for key, entry in results["backtests"].items():
    body = entry["markdown"] or ""
    notes = "".join(f"\n\nNote: {n}" for n in entry["notes"])
    parts.append(f"**{key}**: {body}{notes}".rstrip())
  return "\n\n".join(parts)


def lr_text(settings: dict) -> str:
  if settings["lr"] != "width":
    return settings["lr"]
  k, p = settings["width_rule"]
  return f"lr = {k:g} d_model^-{p:g} (the width rule fitted by scaling_chinchilla.py)"


def compute_text(results: dict) -> str:
  est, wall = results["estimate"], results["wall_s"]
  hours = sum(r["wall_time_s"] or 0 for r in results["runs"]) / 3600
  return (f"Compute: {len(results['runs'])} runs, {hours:.1f} h of training summed over runs "
          f"({wall / 3600:.1f} h wall for this invocation of the script). Planned before "
          f"training: {estimate_text(est, results['settings'].get('parallel', 1))}.")


def render(results: dict) -> str:
  """The markdown report of a study's results (OUT.json), from the JSON alone."""
  if results.get("format") != FORMAT:
    raise ValueError(f"results format {results.get('format')!r} is not {FORMAT!r}: an older "
                     "study's JSON; rerun the study (python -m experiments.scaling_gpt)")
  c, st, sizes = results["corpus"], results["settings"], results["sizes"]
  span = sizes[-1]["params"] / sizes[0]["params"]
  seeded = [s["size"] for s in sizes if len(s["seeds"]) >= 2]
  lengths = st["lengths"]
  scale = "" if st["scale"] == 1 else f" --scale={st['scale']:g}"
  return "\n\n".join([
      "# GPT scaling: L(N) at convergence (Kaplan et al. 2020 protocol, wsd cooldowns)",
      f"Corpus `{c['name']}` ({c['chars']:,} characters, {c['vocab']} distinct, 90% train / "
      f"10% validation). {len(sizes)} character-level GPTs (`configs/sweeps/scaling_gpt.py`: "
      f">= 2 layers, head_dim 16, mlp 4x, no biases, tied embeddings), non-embedding N from "
      f"{sizes[0]['params']:,} to {sizes[-1]['params']:,} ({span:.0f}x); batch 16 x 64 tokens, "
      f"AdamW at peak LR {lr_text(st)}. Per size and seed a chain of warmup-stable-decay runs "
      f"({st['warmup_steps']} warmup steps, constant LR, then 1-sqrt to "
      f"{st['min_lr_ratio']:g} x the peak over the last {st['decay_fraction']:.0%} of the "
      f"steps) of {', '.join(f'{n:,}' for n in lengths)} steps, each a cooldown branch of "
      f"the previous one's stable phase; {st['seeds']} seeds at {', '.join(seeded)}, one "
      f"elsewhere. A size doubles its tokens until the last doubling improves its final eval "
      f"loss (seed mean) by less than σ_seed, or the next length would pass "
      f"{st['max_epochs']:g} epochs (then: not converged). Its L(N) loss is the final eval "
      f"loss of its last length on {c['eval_tokens']:,} validation tokens. Reproduce: "
      f"`python -m experiments.scaling_gpt --data=PATH/{c['name']}"
      f"{scale}` (finished runs are reused).",
      sizes_table(results), alpha_text(results), sigma_text(results),
      "Doubling history (Δ = the previous length's loss minus this one's):",
      history_table(results),
      "Upper-bound fits (to the final losses of each size's last length, not converged):",
      fits_table(results), findings_text(results), limits_text(results),
      "## Back-tests (of the upper-bound fits, leaving sizes out)", backtest_text(results),
      compute_text(results), f"![loss vs N and eval curves]({results['png']})", ""])


def plot(results: dict, path: str):
  """Loss vs N with the fits, and every run's eval curve vs tokens, from the JSON alone."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib import ticker

  sizes = results["sizes"]
  n = np.array([s["params"] for s in sizes], np.float64)
  fig, (ax_n, ax_t) = plt.subplots(1, 2, figsize=(12.5, 4.8))
  colors = {s["size"]: plt.cm.viridis(i / max(len(sizes) - 1, 1)) for i, s in enumerate(sizes)}
  grid = np.geomspace(n.min() / 1.5, n.max() * 1.5, 200)
  for key, style, color in (("kaplan", "-", "C3"), ("saturating", "--", "C0")):
    entry = results["fits"][key]
    fit = entry["fit"]
    if fit is None:
      continue
    p = fit["params"]
    label = (f"L = (N_c/N)^a: a = {p['alpha_N']:.4f}" if key == "kaplan" else
             f"L = E + (N_c/N)^a: E = {p['E']:.3f}, a = {p['alpha']:.3f}")
    ax_n.loglog(grid, [_predict(fit, x) for x in grid], style, color=color, label=label)
    if key == "kaplan" and "band" in entry:
      b = entry["band"]
      ax_n.fill_between(b["n"], b["low"], b["high"], color=color, alpha=0.15,
                        label="95% bootstrap band")
  lim = results.get("limits") or {}
  if lim.get("sizes"):
    p = lim["kaplan"]["params"]
    ax_n.loglog(grid, (p["N_c"] / grid) ** p["alpha_N"], ":", color="k",
                label=f"on L_inf: a = {p['alpha_N']:.4f}")
    for e in lim["sizes"]:
      value, (low, high) = e["fit"]["params"]["L_inf"], e["fit"]["ci"]["L_inf"]
      err = None if low is None else [[value - low], [high - value]]
      ax_n.errorbar([e["params"]], [value], yerr=err, fmt="s", ms=4, color="k", capsize=2,
                    label="L_inf (extrapolated)" if e is lim["sizes"][0] else None)
  for s in sizes:
    ax_n.scatter([s["params"]] * len(s["losses"]), s["losses"], color=colors[s["size"]],
                 edgecolors="k", zorder=3, marker="o" if s["state"] == "converged" else "^")
  ax_n.set(xlabel="non-embedding parameters N", ylabel="final eval loss (nats/char)",
           title="loss vs model size (^ = not converged)")
  ax_n.legend(fontsize=8)
  for r in results["runs"]:
    tokens = [c["tokens"] for c in r["curve"]]
    ax_t.loglog(tokens, [c["eval_loss"] for c in r["curve"]], "-", lw=0.8, alpha=0.6,
                color=colors.get(r["size"], "0.5"))
    ax_t.plot(r["tokens"], r["final_loss"], "o", ms=3, color=colors.get(r["size"], "0.5"))
  ax_t.set(xlabel="training tokens", ylabel="eval loss (nats/char)",
           title="eval curves (dots: each length's final eval)")
  for ax in (ax_n, ax_t):
    ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%.2f"))
    ax.grid(True, which="both", alpha=0.2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  from jaxformer import sweep as sweep_lib

  start = time.time()
  if args.threads_per_run:
    sweep_lib.limit_xla_threads(args.threads_per_run)
  values = sweep_values(args)
  vocab, train_chars = isoflop.corpus_info(args.data)
  lengths = gpt_sweep.lengths(values["scale"], values["max_epochs"], train_chars)
  trunks = sweep_lib.expand(gpt_sweep.get_sweep(
      f"source={args.data},scale={args.scale!r},lr={args.lr},seeds={args.seeds},"
      f"max_epochs={args.max_epochs!r}"))
  o = trunks[0].config
  eval_tokens = o.data.eval_batches * o.train.eval_batch_size * o.data.seq_len
  chains = [{"size": p.name, "flops_per_token": scaling.flops_per_token(p.config.model, 64),
             "tokens_per_s": gpt_sweep.MEASURED_TOKENS_PER_S[(p.config.model.num_layers,
                                                              p.config.model.d_model)]}
            for p in trunks]
  est = estimate(chains, lengths, args.parallel, eval_tokens)
  print(f"[scaling_gpt] {len(chains)} chains, lengths {lengths} steps; compute: "
        f"{estimate_text(est, args.parallel)}", flush=True)
  planned, rows, decision = run_study(args, values, lengths)
  corpus = {"name": os.path.basename(args.data), "vocab": vocab,
            "chars": len(pathlib.Path(args.data).read_text(encoding="utf-8")),
            "train_chars": train_chars, "eval_tokens": eval_tokens}
  results = collect(args, values, lengths, planned, rows, decision, corpus, est,
                    time.time() - start)
  results["settings"]["parallel"] = args.parallel
  results["png"] = pathlib.Path(args.out).name + ".png"
  text = report_check.write(args.out, results, render, plot)
  print(text)
  print(f"wrote {args.out}.md, {args.out}.json, {args.out}.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
