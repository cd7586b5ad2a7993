"""Test error vs training compute for tiny ViTs on MNIST, with the saturating law of Zhai et
al. 2022 ("Scaling Vision Transformers", eq. 1: E = a (C + d)^(-b) + c) fitted to the
compute-efficient frontier.

    python -m experiments.scaling_vit --data=mnist:/path/to/mnist_idx_dir | --data=tfds:mnist
        [--workdir=runs/scaling_vit] [--steps=3000] [--evals=10] [--parallel=2]
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

Compute: C = flops_per_token(model, T) x T x images seen, T = 16 patches + [CLS] = 17 tokens
per image, i.e. `scaling.flops_per_token` (Kaplan: 6 N + 6 n_layer n_ctx d_attn per token,
N the non-embedding parameters: everything but the position table, so the patch projection
and the head are counted for every token) and the same count as the training loop's MFU.

Runs are `jaxformer.sweep` points (sweep.run summarises image runs now: it counts tokens only
for sequence data), two at a time on one XLA:CPU thread each with --parallel=2; finished
points are skipped, so a re-run only refits and redraws. Time (estimated, not measured end to
end): 6-10 min wall at --steps=3000 on the 2-core CPU, from the GPT sweep's measured
single-thread 12-20 GFLOP/s (3 x 64: 11 MFLOPs per image, ~1,100 images/s, ~6 min alone; the
others ~2,000-6,000 images/s). 3 x 96 (71x) would take ~13 min alone: over the 12 min budget.
Writes OUT.json (every eval point, the frontier, the fit and its band), OUT.md =
`render(OUT.json)` and OUT.png = `plot(OUT.json)` (error vs compute, log-log: each size's
curve, the frontier and the fitted law); `refit(OUT.json)` recomputes the fit's point
estimate (tests/test_reports.py).
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
PILOT = 10                     # bootstrap resamples timed to size the bootstrap
BAND_POINTS = 60               # grid points of the stored bootstrap band
DATA_FORMS = "mnist:<directory of the IDX files> or tfds:<name> (e.g. tfds:mnist)"


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help=DATA_FORMS + " (not with --report_only or --refit)")
  parser.add_argument("--workdir", default="runs/scaling_vit")
  parser.add_argument("--steps", type=int, default=3000, help="training steps per size")
  parser.add_argument("--evals", type=int, default=10, help="evaluations per size")
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
  if args.steps < 1 or args.evals < 1 or args.bootstrap < 0:
    parser.error("--steps and --evals must be >= 1, --bootstrap >= 0")
  return args


def sweep_spec(data: str, steps: int, evals: int) -> dict:
  """The sweep: one point per size, the config's recipe with `steps` and `evals` evals."""
  every = max(steps // evals, 1)
  fields = {"model.num_layers": [n for n, _ in SIZES], "model.d_model": [d for _, d in SIZES],
            "model.num_heads": [max(d // 16, 1) for _, d in SIZES],
            "model.mlp_dim": [2 * d for _, d in SIZES],
            "train.steps": [steps] * len(SIZES)}          # zipped, so the point names carry it
  return dict(base=BASE, zip=fields, overrides={
      "data.source": data, "train.eval_every": every, "train.checkpoint_every": every,
      "train.log_every": max(steps // 50, 1), "optim.warmup_steps": min(100, max(steps // 10, 1)),
      "train.keep_best": 0, "train.attention_maps": False},
      name="L{model.num_layers}_d{model.d_model}_s{train.steps}")


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


def render(results: dict) -> str:
  """The markdown report, from the results (OUT.json) alone."""
  sizes, frontier, fit = results["sizes"], results["frontier"], results["fit"]
  span = sizes[-1]["params"] / sizes[0]["params"]
  data = results["data"] if results["data"].startswith("tfds:") else "mnist:<IDX dir>"
  steps = "" if results["steps"] == 3000 else f" --steps={results['steps']}"
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
      frontier_table(frontier, fit), fit_text(fit, results["notes"]),
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


def results_of(meta: dict, sizes: list[dict], samples: int, seconds: float) -> dict:
  """OUT.json: `meta` (base, data, steps, evals, compute), the sizes with every eval, their
  frontier and the law fitted to it (bootstrap by run), its band on a grid."""
  frontier = pareto_frontier(sizes)
  fit, notes = fit_frontier(frontier, samples, seconds)
  band = None
  if fit is not None and fit.draws():
    fc = np.array([p["compute"] for p in frontier])
    grid = np.geomspace(fc.min() / 2, fc.max() * 2, BAND_POINTS)
    low, high = fit.predict_ci(grid)
    band = {"compute": grid.tolist(), "low": low.tolist(), "high": high.tolist()}
  return scaling.stats.json_ready({
      **meta, "sizes": sizes, "frontier": frontier,
      "fit": None if fit is None else fit.as_dict(), "notes": notes, "band": band})


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  if args.refit:
    try:
      stored = report_check.load(args.out)
    except ValueError as e:
      cli.fail(str(e))
    meta = {k: stored[k] for k in ("base", "data", "steps", "evals", "compute")}
    results = results_of(meta, stored["sizes"], args.bootstrap, args.bootstrap_seconds)
  else:
    if args.threads_per_run:
      sweep_lib.limit_xla_threads(args.threads_per_run)
    rows = sweep_lib.run(sweep_spec(args.data, args.steps, args.evals), args.workdir,
                         parallel=args.parallel)
    done = [r for r in rows if r["status"] == "done"]
    for r in rows:
      if r not in done:
        print(f"warning: {r['name']} is {r['status']} (log {r['log']}); left out")
    if not done:
      raise SystemExit(f"error: no run finished; see the train.log files in {args.workdir}")
    sizes = sorted((size_points(r, args.workdir) for r in done), key=lambda s: s["params"])
    meta = {"base": BASE, "data": args.data if args.data.startswith("tfds:") else "mnist",
            "steps": args.steps, "evals": args.evals,
            "compute": "flops_per_token(model, 17) * 17 * images seen (Kaplan 6N + attention)"}
    results = results_of(meta, sizes, args.bootstrap, args.bootstrap_seconds)
  print(report_check.write(args.out, results, render, plot))
  print(f"wrote {args.out}.md, {args.out}.json, {args.out}.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
