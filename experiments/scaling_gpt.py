"""Kaplan et al.'s L(N) for character-level GPTs: 6 sizes trained near convergence on one
corpus, early-stopped loss vs non-embedding parameters, alpha_N with a 95% interval.

    python -m experiments.scaling_gpt --data=PATH/corpus.txt [--workdir=runs/scaling_gpt]
        [--scale=1] [--evals=20] [--lr=width] [--parallel=2] [--threads_per_run=1]
        [--bootstrap=1000] [--out=experiments/results/scaling_gpt]

The runs are the points of configs/sweeps/scaling_gpt.py (protocol, sizes, step budgets and
time there: ~25 min wall on the 2-core CPU at --scale=1, then ~2 min of fits).
`jaxformer.sweep` skips finished points, so an interrupted study resumes and a re-run only
refits and redraws; the step budget, LR and cosine length name the run directories, so
changing --scale or --lr never resumes a run with another schedule.
With --parallel=2 two runs train at once, each on one XLA:CPU thread (as
experiments/scaling_chinchilla.py does: 1.2-1.3x the throughput of one 2-thread run).

Per size the loss is the best eval loss of its --evals evaluations (early stopping, as Kaplan
et al.), and a convergence check reports how far the last eval ended above the best and the
slope of the eval loss over the run's constant-LR tail (the evals from `optim.decay_steps`
on, where the cosine has reached its floor; at least the last 3) in nats per doubling of
tokens: steeper than FALLING (one more doubling would still gain > 0.01 nats) marks a size
as still falling. In that tail the LR no longer changes, so a falling loss is learning, not
annealing; at 10% of the peak LR it is also slow learning, so a flat tail is evidence of
convergence, not proof (a run at twice the tokens would be).

Fits on (N, best eval loss), `jaxformer.scaling`: `fit_kaplan_n` (L = (N_c / N)^alpha_N,
least squares in log-log) and `fit_saturating` (L = E + (N_c / N)^alpha), 95% bootstrap
intervals over the sizes. Writes OUT.md (setup, per-size table with the convergence check,
fits and findings), OUT.json (every eval of every size, the fits) and OUT.png (loss vs N with
both fits; every size's eval curve vs tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402

from configs.sweeps import isoflop, scaling_gpt as gpt_sweep  # noqa: E402
from jaxformer import scaling, sweep as sweep_lib  # noqa: E402
from jaxformer.scaling import plots as scaling_plots  # noqa: E402

KAPLAN_ALPHA_N = 0.076         # Kaplan et al. 2020, eq. 1.1 (N_c = 8.8e13 non-embedding params)
FALLING = -0.01                # nats per doubling of tokens; a steeper tail is "still falling"
MIN_TAIL = 3                   # evals the tail slope is fitted over, at least


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", required=True,
                      help="a UTF-8 text corpus, e.g. python_docs.txt (11 MB)")
  parser.add_argument("--workdir", default="runs/scaling_gpt")
  parser.add_argument("--sweep", default="configs/sweeps/scaling_gpt.py",
                      help="a sweep file taking source=,scale=,evals=,lr= as its argument")
  parser.add_argument("--scale", type=float, default=1.0,
                      help="fraction of each size's step budget (e.g. 0.002: smoke test)")
  parser.add_argument("--evals", type=int, default=20, help="evaluations per run")
  parser.add_argument("--lr", default="width",
                      help="peak learning rate, or 'width' (the sweep's width rule)")
  parser.add_argument("--parallel", type=int, default=2)
  parser.add_argument("--threads_per_run", type=int, default=1,
                      help="XLA:CPU threads of each run (0: XLA's default)")
  parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/scaling_gpt"),
                      help="output path prefix: writes OUT.md, OUT.json, OUT.png")
  args = parser.parse_args(argv)
  if not os.path.isfile(args.data):
    parser.error(f"--data={args.data}: no such file")
  if "," in args.data:
    parser.error(f"--data={args.data}: the sweep argument is comma-separated; use a path "
                 "without commas")
  if args.scale <= 0 or args.evals < 3 or args.bootstrap < 0:
    parser.error("--scale must be > 0, --evals >= 3 (the convergence slope needs "
                 "3 evals), --bootstrap >= 0")
  args.data = os.path.abspath(args.data)
  return args


def sweep_spec(args) -> str:
  return (f"{args.sweep}:source={args.data},scale={args.scale!r},evals={args.evals},"
          f"lr={args.lr}")


def finished_rows(rows: list[dict]) -> list[dict]:
  """The runs that trained to the end, smallest first; the others are named and left out."""
  done = [r for r in rows if r["status"] == "done" and r["eval_loss"] is not None]
  for r in rows:
    if r not in done:
      print(f"warning: {r['name']} is {r['status']} (log {r['log']}); left out of the fits")
  return sorted(done, key=lambda r: r["params"])


def tail_start(row: dict) -> int:
  """The step from which the LR is constant (the cosine's end), or the last step."""
  o = row["overrides"]
  return o.get("optim.decay_steps") or row["final_step"]


def eval_curve(row: dict, workdir: str) -> list[dict]:
  """Every eval of a run: step, tokens seen, eval loss."""
  o = row["overrides"]
  tokens_per_step = o["train.batch_size"] * o["data.seq_len"]
  return [{"step": r["step"], "tokens": r["step"] * tokens_per_step,
           "eval_loss": r["eval_loss"]}
          for r in sweep_lib.read_metrics(os.path.join(workdir, row["name"]))
          if "eval_loss" in r]


def convergence(curve: list[dict], tail_step: int) -> dict:
  """Best eval (early stopping), last - best, and the slope of the evals from `tail_step` on
  (at least MIN_TAIL) in nats per doubling of tokens, with a verdict (module docstring)."""
  tokens = np.array([c["tokens"] for c in curve], np.float64)
  loss = np.array([c["eval_loss"] for c in curve], np.float64)
  best = int(np.argmin(loss))
  in_tail = sum(c["step"] >= tail_step for c in curve)
  tail = min(max(MIN_TAIL, in_tail), loss.size)
  slope = (float(np.polyfit(np.log2(tokens[-tail:]), loss[-tail:], 1)[0])
           if tail >= 2 else float("nan"))
  if not slope >= FALLING:                   # NaN (a single eval) counts as still falling
    verdict = "still falling"
  elif best < loss.size - 1:
    verdict = f"flat; best at {tokens[best] / tokens[-1]:.0%} of its tokens"
  else:
    verdict = "flat"
  return {"best_loss": float(loss[best]), "best_step": curve[best]["step"],
          "best_tokens": int(tokens[best]), "last_loss": float(loss[-1]),
          "last_minus_best": float(loss[-1] - loss[best]), "tail_evals": tail,
          "slope_per_doubling": slope, "converged": verdict != "still falling",
          "verdict": verdict}


def fit_law(fit_fn, x, y, samples: int):
  """(fit or None, notes): without bootstrap intervals when too few resamples can be fit
  (e.g. 5 sizes for a 3-parameter law), None when the law cannot be fit at all."""
  try:
    return fit_fn(x, y, samples=samples), []
  except ValueError as e:
    if not (samples and "bootstrap" in str(e)):
      return None, [f"no fit: {e}"]
    note = f"no bootstrap intervals ({e})"
  try:
    return fit_fn(x, y, samples=0), [note]
  except ValueError as e:
    return None, [note, f"no fit: {e}"]


def fit_all(points: list[dict], samples: int) -> dict:
  n = np.array([p["params"] for p in points], np.float64)
  best = np.array([p["best_loss"] for p in points])
  last = np.array([p["last_loss"] for p in points])
  out = {}
  for key, fn, loss, k in (("kaplan", scaling.fit_kaplan_n, best, samples),
                           ("saturating", scaling.fit_saturating, best, samples),
                           ("kaplan_last_eval", scaling.fit_kaplan_n, last, 0)):
    fit, notes = fit_law(fn, n, loss, k)
    out[key] = {"fit": fit, "notes": notes}
  return out


def _fmt(key: str, value: float) -> str:
  return f"{value:.3g}" if key.endswith("_c") or key == "X_c" else f"{value:.4f}"


def _ci(fit, key: str) -> str:
  low, high = fit.ci(key)
  return "—" if not np.isfinite(low) else f"[{_fmt(key, low)}, {_fmt(key, high)}]"


def points_table(points: list[dict], fits: dict) -> str:
  kaplan, sat = fits["kaplan"]["fit"], fits["saturating"]["fit"]
  lines = ["| run | N (non-emb.) | N (total) | steps | tokens D | D / N | epochs | best eval "
           "loss (step) | last eval | last − best | tail slope (nats/doubling) | verdict | "
           "Kaplan fit | saturating fit | wall (s) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
  for p in points:
    n = p["params"]
    pred = [f"{float(f.predict(n)):.4f}" if f is not None else "—" for f in (kaplan, sat)]
    wall = p["wall_time_s"]
    lines.append(
        f"| {p['name']} | {n:,} | {p['params_total']:,} | {p['steps']:,} | {p['tokens']:,} | "
        f"{p['tokens'] / n:.0f} | {p['epochs']:.2f} | {p['best_loss']:.4f} ({p['best_step']}) | "
        f"{p['last_loss']:.4f} | {p['last_minus_best']:+.4f} | "
        f"{p['slope_per_doubling']:+.4f} | {p['verdict']} | {pred[0]} | {pred[1]} | "
        f"{'—' if wall is None else f'{wall:.0f}'} |")
  return "\n".join(lines)


def fits_table(fits: dict) -> str:
  lines = ["| law (fitted to) | parameter | value | 95% interval | RMS residual | method |",
           "|---|---|---:|---:|---:|---|"]
  labels = {"kaplan": "best eval loss", "saturating": "best eval loss",
            "kaplan_last_eval": "last eval loss (no intervals)"}
  for key, entry in fits.items():
    fit = entry["fit"]
    if fit is None:
      continue
    for name, value in fit.params.items():
      lines.append(f"| `{fit.law}` ({labels[key]}) | {name} | {_fmt(name, value)} | "
                   f"{_ci(fit, name)} | {fit.rms_residual:.4f} | {fit.method} |")
  return "\n".join(lines)


def alpha_text(fits: dict, points: list[dict]) -> str:
  fit = fits["kaplan"]["fit"]
  if fit is None:
    return f"No Kaplan fit: {'; '.join(fits['kaplan']['notes'])}."
  alpha = fit.params["alpha_N"]
  low, high = fit.ci("alpha_N")
  if np.isfinite(low):
    where = ("inside" if low <= KAPLAN_ALPHA_N <= high else
             "above" if KAPLAN_ALPHA_N > high else "below")
    interval = (f" (95% bootstrap interval [{low:.4f}, {high:.4f}] over the {len(points)} "
                f"sizes); Kaplan et al.'s 0.076 is {where} it")
  else:
    interval = " (no interval); Kaplan et al.: 0.076"
  last = fits["kaplan_last_eval"]["fit"]
  last_text = (f" Fitted to the last evals instead of the best: alpha_N = "
               f"{last.params['alpha_N']:.4f}." if last is not None else "")
  return (f"**alpha_N = {alpha:.4f}**{interval}. Kaplan et al. 2020 (eq. 1.1): alpha_N = "
          f"0.076, N_c = 8.8e13, on WebText2 with BPE tokens and N from ~1e3 to ~1e9; this is "
          f"another corpus and a character vocabulary, so the two need not agree. With "
          f"{len(points)} sizes the interval reflects the scatter of these points around the "
          f"line, not the size-to-size variation of training (one seed per size).{last_text}")


def convergence_text(points: list[dict]) -> str:
  falling = [p for p in points if not p["converged"]]
  head = (f"Convergence check (the evidence for \"near convergence\"): slope of the eval loss "
          f"against log2(tokens) over each run's constant-LR tail (the evals from the end of "
          f"the cosine, at 80% of the steps, on: at least {MIN_TAIL}); steeper than "
          f"{FALLING} nats per doubling counts as still falling. The LR does not change in "
          f"the tail, so a fall there is learning, not annealing; at 10% of the peak LR "
          f"learning is slow, so a flat tail is evidence of convergence, not proof.")
  if not falling:
    return head + f" All {len(points)} sizes had flattened."
  names = ", ".join(f"{p['name']} ({p['slope_per_doubling']:+.3f})" for p in falling)
  bias = (" Under-training that grows with size bends the curve up at large N and biases "
          "alpha_N low." if any(p is points[-1] for p in falling) else "")
  rest = ("none had flattened" if len(falling) == len(points) else
          "the others had flattened")
  return head + f" Still falling: {names}; {rest}.{bias}"


def findings_text(fits: dict) -> str:
  lines = []
  for key, entry in fits.items():
    fit = entry["fit"]
    for text in (*(fit.findings if fit is not None else ()), *entry["notes"]):
      lines.append(f"- {key}: {text}")
  return "Findings:\n" + "\n".join(lines) if lines else "Findings: none (no parameter at a " \
                                                        "bound, every fit bootstrapped)."


def lr_text(lr: str) -> str:
  if lr != "width":
    return lr
  k, p = gpt_sweep.WIDTH_RULE
  return f"lr = {k:g} d_model^-{p:g} (the width rule fitted by scaling_chinchilla.py)"


def report(args, corpus: dict, points: list[dict], fits: dict, png_name: str) -> str:
  span = points[-1]["params"] / points[0]["params"]
  return "\n\n".join([
      "# GPT scaling: L(N) near convergence (Kaplan et al. 2020 protocol)",
      f"Corpus `{corpus['name']}` ({corpus['chars']:,} characters, {corpus['vocab']} "
      f"distinct, 90% train / 10% validation). {len(points)} character-level GPTs "
      f"(`configs/sweeps/scaling_gpt.py`: >= 2 layers, head_dim 16, mlp 4x, no biases, tied "
      f"embeddings), non-embedding N from {points[0]['params']:,} to "
      f"{points[-1]['params']:,} ({span:.0f}x); batch 16 x 64 tokens, AdamW at peak LR "
      f"{lr_text(args.lr)}, warmup 5%, cosine to 10% of the peak at 80% of each run's "
      f"steps, then constant; step budgets x{args.scale:g} of the sweep's (larger models "
      f"train longer, on fewer tokens per parameter). Each size's loss is its "
      f"best of {args.evals} evals on the same {corpus['eval_tokens']:,} validation tokens "
      f"(early stopping). "
      f"Reproduce: `python -m experiments.scaling_gpt --data=PATH/{corpus['name']}"
      f"{'' if args.scale == 1 else f' --scale={args.scale:g}'}` (finished runs are reused).",
      points_table(points, fits), convergence_text(points), alpha_text(fits, points),
      fits_table(fits), findings_text(fits),
      f"![loss vs N and eval curves]({png_name})", ""])


def plot(points: list[dict], fits: dict, path: str):
  n = np.array([p["params"] for p in points], np.float64)
  fig, (ax_n, ax_t) = plt.subplots(1, 2, figsize=(12.5, 4.8))
  colors = [plt.cm.viridis(i / max(len(points) - 1, 1)) for i in range(len(points))]
  grid = np.geomspace(n.min() / 1.5, n.max() * 1.5, 200)
  kaplan, sat = fits["kaplan"]["fit"], fits["saturating"]["fit"]
  if kaplan is not None:
    p = kaplan.params
    scaling_plots.law(ax_n, kaplan, grid, "-", color="C3",
                      label=f"L = (N_c/N)^a: a = {p['alpha_N']:.4f}, N_c = {p['N_c']:.2g}")
  if sat is not None:
    p = sat.params
    scaling_plots.law(ax_n, sat, grid, "--", color="C0", band_alpha=None,
                      label=f"L = E + (N_c/N)^a: E = {p['E']:.3f}, a = {p['alpha']:.3f}")
  ax_n.loglog(n, [p["last_loss"] for p in points], "o", ms=10, mfc="none", mec="0.5",
              label="last eval")
  ax_n.scatter(n, [p["best_loss"] for p in points], c=colors, zorder=3, edgecolors="k",
               label="best eval (early-stopped)")
  ax_n.set(xlabel="non-embedding parameters N", ylabel="eval loss (nats/char)",
           title="loss vs model size")
  ax_n.legend(fontsize=8)
  for p, color in zip(points, colors):
    tokens = [c["tokens"] for c in p["curve"]]
    ax_t.loglog(tokens, [c["eval_loss"] for c in p["curve"]], "-", color=color,
                label=f"{p['name'].split('_s')[0]} (N={p['params']:,})")
    ax_t.loglog(p["best_tokens"], p["best_loss"], "*", color=color, ms=11, mec="k")
  ax_t.set(xlabel="training tokens", ylabel="eval loss (nats/char)",
           title="eval curves (* = best)")
  ax_t.legend(fontsize=8)
  for ax in (ax_n, ax_t):
    ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%.2f"))
    ax.grid(True, which="both", alpha=0.2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.threads_per_run:
    sweep_lib.limit_xla_threads(args.threads_per_run)
  spec = sweep_spec(args)
  rows = finished_rows(sweep_lib.run(sweep_lib.load_sweep(spec), args.workdir,
                                     parallel=args.parallel))
  if len(rows) < 3:
    raise SystemExit(f"error: only {len(rows)} runs finished; the fits need >= 3 sizes. See "
                     f"the train.log files in {args.workdir} and re-run to resume")
  vocab, train_chars = isoflop.corpus_info(args.data)
  o = rows[0]["overrides"]
  corpus = {"name": os.path.basename(args.data), "vocab": vocab,
            "chars": len(pathlib.Path(args.data).read_text(encoding="utf-8")),
            "train_chars": train_chars,
            "eval_tokens": (o["data.eval_batches"] * o["train.eval_batch_size"]
                            * o["data.seq_len"])}
  points = []
  for row in rows:
    curve = eval_curve(row, args.workdir)
    points.append({"name": row["name"], "num_layers": row["overrides"]["model.num_layers"],
                   "d_model": row["overrides"]["model.d_model"], "params": row["params"],
                   "params_total": row["params_total"], "steps": row["final_step"],
                   "tokens": row["tokens"], "epochs": row["tokens"] / train_chars,
                   "wall_time_s": row["wall_time_s"],
                   **convergence(curve, tail_start(row)), "curve": curve})
  fits = fit_all(points, args.bootstrap)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  text = report(args, corpus, points, fits, out.name + ".png")
  print(text)
  out.with_suffix(".md").write_text(text)
  out.with_suffix(".json").write_text(json.dumps(scaling.stats.json_ready({
      "sweep": spec.replace(args.data, corpus["name"]), "corpus": corpus,
      "settings": {"scale": args.scale, "evals": args.evals, "lr": args.lr,
                   "bootstrap": args.bootstrap, "falling_threshold": FALLING,
                   "min_tail_evals": MIN_TAIL},
      "kaplan_2020": {"alpha_N": KAPLAN_ALPHA_N, "N_c": 8.8e13},
      "points": points,
      "fits": {key: {"fit": None if e["fit"] is None else e["fit"].as_dict(),
                     "notes": e["notes"]} for key, e in fits.items()}}), indent=2) + "\n")
  plot(points, fits, str(out.with_suffix(".png")))
  print(f"wrote {out}.md, {out}.json, {out}.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
