"""Loss vs model size for GPT: run a scaling sweep, fit power laws, write a report and a plot.

    python experiments/scaling_gpt.py [--workdir=runs/scaling_gpt] [--steps=400]
        [--sweep=configs/sweeps/scaling_gpt.py] [--parallel=1]
        [--out=experiments/results/scaling_gpt]

Why one script: the sweep (`jaxformer.sweep.run`) skips finished points, so re-running only
refits and redraws; the runs stay in --workdir. `--steps` is passed as the sweep's argument
unless --sweep already names one (`path.py:arg`), so any sweep whose points are language
models with `params` and `eval_loss` in the summary works.

Fits on (non-embedding parameters N, final eval_loss), see `jaxformer.scaling_fits`:
  L = E + (N_c / N)^alpha   (saturating; curve_fit covariance)
  L = (N_c / N)^alpha       (Kaplan et al. 2020; OLS in log-log)
with 1-sigma errors from the fit covariance and a bootstrap over points. Writes OUT.md (points
and fits), OUT.json and OUT.png (log-log loss vs N with both fits; training loss vs compute
C = 6 N D of every run with the compute-efficient frontier).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402

from jaxformer import scaling_fits, sweep as sweep_lib  # noqa: E402

FITS = {"saturating": scaling_fits.fit_saturating_power_law,
        "kaplan": scaling_fits.fit_power_law}


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="runs/scaling_gpt")
  parser.add_argument("--steps", type=int, default=400,
                      help="training steps per point (the sweep's argument)")
  parser.add_argument("--sweep", default="configs/sweeps/scaling_gpt.py")
  parser.add_argument("--parallel", type=int, default=1)
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/scaling_gpt"),
                      help="output path prefix: writes OUT.md, OUT.json, OUT.png")
  args = parser.parse_args(argv)
  if args.steps < 1:
    raise ValueError(f"--steps={args.steps} must be >= 1")
  return args


def sweep_spec(path: str, steps: int) -> str:
  """`path` with `:steps` as the sweep argument, unless it names one already."""
  return path if ":" in path else f"{path}:{steps}"


def finished_rows(rows: list[dict]) -> list[dict]:
  """The points that trained to the end and have an eval loss, in order of size."""
  done = [r for r in rows if r["status"] == "done" and r["eval_loss"] is not None]
  for r in rows:
    if r not in done:
      print(f"warning: {r['name']} is {r['status']} (log {r['log']}); left out of the fits")
  return sorted(done, key=lambda r: r["params"])


def fit_all(n: np.ndarray, loss: np.ndarray) -> dict[str, dict]:
  """Both laws: parameters, covariance errors and bootstrap errors."""
  out = {}
  for key, fit_fn in FITS.items():
    fit = fit_fn(n, loss)
    try:
      boot = scaling_fits.bootstrap_stderr(fit_fn, n, loss, samples=500, seed=0)
    except ValueError as e:
      print(f"warning: no bootstrap for the {key} fit: {e}")
      boot = {}
    out[key] = {"law": fit.law, "params": fit.params, "stderr": fit.stderr,
                "bootstrap_stderr": boot, "method": fit.method,
                "rms_residual": fit.rms_residual}
  return out


def predict(fit: dict, n) -> np.ndarray:
  p = fit["params"]
  return p.get("E", 0.0) + (p["N_c"] / np.asarray(n, np.float64)) ** p["alpha"]


def run_records(rows: list[dict], workdir: str) -> list[dict]:
  """`compute_frontier` records (name, N, tokens per step, metrics) of the finished runs."""
  return [{"name": r["name"], "params": r["params"],
           "tokens_per_step": r["tokens"] / r["final_step"],
           "metrics": sweep_lib.read_metrics(os.path.join(workdir, r["name"]))} for r in rows]


def points_table(rows: list[dict], fits: dict) -> str:
  lines = ["| run | N (non-emb.) | N (total) | tokens D | D / N | C = 6ND | eval loss | "
           "saturating fit | Kaplan fit |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    n, d = r["params"], r["tokens"]
    lines.append(f"| {r['name']} | {n:,} | {r['params_total']:,} | {d:,} | {d / n:.1f} | "
                 f"{6 * n * d:.2e} | {r['eval_loss']:.4f} | "
                 f"{predict(fits['saturating'], n):.4f} | {predict(fits['kaplan'], n):.4f} |")
  return "\n".join(lines)


def _value(key: str, value: float) -> str:
  return f"{value:.3e}" if key == "N_c" else f"{value:.4f}"


def fits_table(fits: dict) -> str:
  lines = ["| law | parameter | value | ± (fit covariance) | ± (bootstrap) | RMS residual |",
           "|---|---|---:|---:|---:|---:|"]
  for fit in fits.values():
    for key, value in fit["params"].items():
      boot = fit["bootstrap_stderr"].get(key)
      lines.append(f"| `{fit['law']}` | {key} | {_value(key, value)} | "
                   f"{_value(key, fit['stderr'][key])} | "
                   f"{'—' if boot is None else _value(key, boot)} | {fit['rms_residual']:.4f} |")
  return "\n".join(lines)


def saturation_note(fit: dict) -> str:
  """Whether the irreducible loss E is resolved by these points."""
  e, sd = fit["params"]["E"], fit["stderr"]["E"]
  if e < 1e-6:
    return ("E is at its lower bound 0: over this range the loss shows no saturation, so "
            "the saturating law reduces to Kaplan's (alpha and N_c differ only because it is fit "
            "in loss, Kaplan's in log loss). N_c errors are heavy-tailed (N_c = e^(c/alpha)).")
  return f"Irreducible loss E = {e:.3f} ± {sd:.3f} nats/token (fit covariance)."


def report(spec: str, rows: list[dict], fits: dict, frontier, png_name: str) -> str:
  steps = {r["final_step"] for r in rows}
  return "\n\n".join([
      "# GPT scaling: loss vs non-embedding parameters",
      f"Sweep `{spec}`: {len(rows)} sizes, {', '.join(map(str, sorted(steps)))} steps, "
      f"eval loss (nats/token) after a fixed token budget. Fits by least squares; ± is "
      f"1 sigma from the fit covariance and from a bootstrap over points (500 resamples; "
      f"'—' where under half of the resamples kept enough distinct sizes to fit). "
      f"Reproduce: `python experiments/scaling_gpt.py` (finished runs are reused).",
      points_table(rows, fits), fits_table(fits), saturation_note(fits["saturating"]),
      f"Compute-efficient frontier (lower envelope of training loss vs C = 6ND over all "
      f"runs): {len(frontier.loss)} points, from {frontier.compute[0]:.2e} FLOPs "
      f"(loss {frontier.loss[0]:.3f}, {frontier.name[0]}) to {frontier.compute[-1]:.2e} "
      f"FLOPs (loss {frontier.loss[-1]:.3f}, {frontier.name[-1]}); runs on it: "
      f"{', '.join(dict.fromkeys(frontier.name))}.",
      f"![loss vs N and vs compute]({png_name})", ""])


def plot(rows: list[dict], fits: dict, records: list[dict], frontier, path: str):
  n = np.array([r["params"] for r in rows], np.float64)
  loss = np.array([r["eval_loss"] for r in rows])
  grid = np.geomspace(n.min() / 2, n.max() * 2, 200)
  fig, (ax_n, ax_c) = plt.subplots(1, 2, figsize=(12, 4.8))
  ax_n.loglog(n, loss, "ko", label="runs (final eval loss)")
  for fit, style in zip(fits.values(), ("C0-", "C3--")):
    p = fit["params"]
    label = ", ".join(f"{k}={_value(k, v)}" for k, v in p.items())
    ax_n.loglog(grid, predict(fit, grid), style, label=f"{fit['law']}\n({label})")
  ax_n.set(xlabel="non-embedding parameters N", ylabel="eval loss (nats/token)",
           title="loss vs model size")
  ax_n.legend(fontsize=8)
  for i, record in enumerate(records):
    compute, train_loss = scaling_fits.compute_curve(record["metrics"], record["params"],
                                                     record["tokens_per_step"])
    ax_c.loglog(compute, train_loss, color=plt.cm.viridis(i / max(len(records) - 1, 1)),
                alpha=0.8, label=record["name"])
  ax_c.loglog(frontier.compute, frontier.loss, "k-", lw=2.5, alpha=0.5, label="frontier")
  ax_c.set(xlabel="compute C = 6 N D (FLOPs)", ylabel="training loss",
           title="loss vs compute")
  ax_c.legend(fontsize=8)
  for ax in (ax_n, ax_c):
    ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%.1f"))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  args = parse_args(argv)
  spec = sweep_spec(args.sweep, args.steps)
  rows = finished_rows(sweep_lib.run(sweep_lib.load_sweep(spec), args.workdir,
                                     parallel=args.parallel))
  n = np.array([r["params"] for r in rows], np.float64)
  loss = np.array([r["eval_loss"] for r in rows], np.float64)
  fits = fit_all(n, loss)
  records = run_records(rows, args.workdir)
  frontier = scaling_fits.compute_frontier(records)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  text = report(spec, rows, fits, frontier, out.name + ".png")
  print(text)
  out.with_suffix(".md").write_text(text)
  out.with_suffix(".json").write_text(json.dumps({
      "sweep": spec, "points": [{k: r[k] for k in ("name", "params", "params_total", "tokens",
                                                   "final_step", "eval_loss", "wall_time_s")}
                                for r in rows],
      "fits": fits,
      "frontier": {"compute": frontier.compute.tolist(), "loss": frontier.loss.tolist(),
                   "name": frontier.name}}, indent=2) + "\n")
  plot(rows, fits, records, frontier, str(out.with_suffix(".png")))
  print(f"wrote {out}.md, {out}.json, {out}.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
