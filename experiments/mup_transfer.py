"""μP learning-rate transfer (Yang et al. 2022, Figure 1) on a real corpus, on a CPU.

    python -m experiments.mup_transfer --data=PATH/python_docs.txt
        [--workdir=runs/mup_transfer] [--widths 32 64 128 256] [--parallel=2]
        [--out=experiments/results/mup_transfer]
    python -m experiments.mup_transfer --report_only   # OUT.md/.png from OUT.json (`render`)

The README's character GPT (learned positions, LayerNorm, no biases, tied embeddings) with 2
layers and 4 heads (head dim = width / 4, mlp 4x) at each width, trained for the same steps
on the same batches under `standard` and `mup` (base width = the narrowest), at 7 peak
learning rates a factor 2 apart. Per width and parametrization the optimum is the vertex of
the parabola in log LR through the best grid LR and its neighbours (`scaling.lr_optimum`);
across widths, the slope s of log lr* against log width, with a 95% t-interval
(`scaling.lr_width_rule`), says how far the optimum moves: s = 0 under perfect
transfer, s ~ -1 when it halves each time the width doubles.

Prediction first: μP at its base width is the standard model bit for bit, so the standard
arm's sweep at the base width is μP's too. Its optimum is written to `prediction.json` in the
workdir after the standard arm and before any μP run, and never recomputed; the report gives
each width's error against it.

Every run is a `jaxformer.sweep` point (a `python -m jaxformer.train` process), so an
interrupted study resumes where it stopped and a re-run only re-analyses. Each run: batch 16
x 64 characters, warmup 10%, cosine to 10% of the peak, AdamW (0.9, 0.99), weight decay 0.1,
clip 1.0, one final eval on the same 40 validation batches (41K characters).
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
from experiments import report_check  # noqa: E402
from jaxformer import scaling, sweep as sweep_lib  # noqa: E402

LEARNING_RATES = tuple(float(f"{5e-4 * 2 ** i:.3g}") for i in range(7))   # 5e-4 .. 3.2e-2
PARAMETRIZATIONS = ("standard", "mup")
BASE = "configs/shakespeare_char.py:nanogpt_cpu"
LAYERS, HEADS = 2, 4


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help="a UTF-8 text corpus (e.g. python_docs.txt: "
                      "python -m experiments.python_docs_corpus builds it)")
  parser.add_argument("--workdir", default="runs/mup_transfer")
  parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256])
  parser.add_argument("--lrs", type=float, nargs="+", default=list(LEARNING_RATES))
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--parallel", type=int, default=2)
  parser.add_argument("--threads_per_run", type=int, default=1,
                      help="XLA:CPU threads of each run (0: XLA's default)")
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/mup_transfer"))
  parser.add_argument("--report_only", action="store_true",
                      help="rewrite OUT.md and OUT.png from OUT.json; train nothing")
  args = parser.parse_args(argv)
  if args.report_only:
    return args
  if not args.data or not os.path.isfile(args.data):
    parser.error(f"--data={args.data}: no such file (give the corpus, or --report_only)")
  if len(args.widths) < 3 or sorted(set(args.widths)) != args.widths:
    parser.error(f"--widths {args.widths}: give >= 3 increasing widths")
  if any(w % HEADS for w in args.widths):
    parser.error(f"--widths {args.widths}: each must be a multiple of {HEADS} (the heads)")
  if len(args.lrs) < 3:
    parser.error(f"--lrs {args.lrs}: give >= 3 learning rates")
  if args.steps < 20:
    parser.error(f"--steps={args.steps} must be >= 20")
  args.data = os.path.abspath(args.data)
  return args


def sweep_spec(args) -> dict:
  """Every (parametrization, width, LR) run as one `jaxformer.sweep` spec."""
  vocab_size = isoflop.corpus_info(args.data)[0]
  overrides = dict(isoflop.common_overrides(args.data, vocab_size))
  overrides.update({"model.num_layers": LAYERS, "model.num_heads": HEADS,
                    "model.mup_base_width": args.widths[0], "train.steps": args.steps,
                    "optim.warmup_steps": max(args.steps // 10, 1), "train.eval_every": args.steps,
                    "train.log_every": max(args.steps // 50, 1),
                    "train.checkpoint_every": args.steps})
  return dict(base=BASE, overrides=overrides,
              product={"model.parametrization": list(PARAMETRIZATIONS),
                       "optim.lr": list(args.lrs)},
              zip={"model.d_model": list(args.widths),
                   "model.mlp_dim": [4 * w for w in args.widths]},
              name="{model.parametrization}_d{model.d_model}_lr{optim.lr:g}")


DIVERGED = "non-finite steps in a row"     # the train loop's stop message (train/loop.py)


def diverged(workdir: str, name: str) -> bool:
  """Whether run `name` stopped because its loss went non-finite (a result: that LR is too
  large), rather than being interrupted (a run to resume)."""
  log = pathlib.Path(workdir, name, "train.log")
  return log.is_file() and DIVERGED in log.read_text(errors="replace")[-4000:]


def analyse(rows: list[dict], widths: list[int], kinds=PARAMETRIZATIONS) -> dict:
  """Per parametrization: the loss grid, each width's optimum and the transfer slope."""
  out = {}
  for kind in kinds:
    grid = {w: {} for w in widths}
    for row in rows:
      o = row["overrides"]
      if o["model.parametrization"] == kind:
        loss = row["eval_loss"] if row["status"] == "done" else None
        grid[o["model.d_model"]][o["optim.lr"]] = float("nan") if loss is None else loss
    optima = {w: scaling.lr_optimum(list(g), list(g.values())) for w, g in grid.items()}
    steps = [o["index"] for o in optima.values()]          # of the best LR in the sorted grid
    out[kind] = {"losses": {str(w): {f"{r:g}": g[r] for r in sorted(g)} for w, g in grid.items()},
                 "optima": {str(w): o for w, o in optima.items()},
                 "grid_steps_moved": max(steps) - min(steps),
                 "slope": scaling.lr_width_rule(widths, [optima[w]["lr"] for w in widths])}
  return out


def prediction_errors(prediction: dict, result: dict, widths: list[int]) -> list[dict]:
  """Per width: μP's measured optimum against the prediction (ratio, and grid steps between
  the best grid LRs)."""
  rates = sorted(float(r) for r in prediction["from_runs"])
  out = []
  for w in widths[1:]:
    opt = result["mup"]["optima"][str(w)]
    out.append({"width": w, "measured_lr": opt["lr"], "ratio": opt["lr"] / prediction["predicted_lr"],
                "grid_steps": opt["index"] - rates.index(prediction["predicted_best_grid_lr"]),
                "edge": opt["edge"]})
  return out


def _fmt_loss(x: float) -> str:
  return "diverged" if not np.isfinite(x) else f"{x:.4f}"


def grid_table(result: dict, rates: list[float]) -> str:
  lines = ["| parametrization | width | " + " | ".join(f"lr {r:g}" for r in rates) +
           " | optimum (vertex) |", "|---|---:|" + "---:|" * (len(rates) + 1)]
  for kind, r in result.items():
    for w, losses in r["losses"].items():
      best = r["optima"][w]
      cells = [f"**{_fmt_loss(losses[f'{x:g}'])}**" if x == best["best_grid_lr"]
               else _fmt_loss(losses[f"{x:g}"]) for x in rates]
      edge = " (grid edge)" if best["edge"] else ""
      lines.append(f"| {kind} | {w} | " + " | ".join(cells) + f" | {best['lr']:.3g}{edge} |")
  return "\n".join(lines)


def summary_table(result: dict, widths: list[int]) -> str:
  lines = ["| parametrization | best grid LR per width (" + ", ".join(map(str, widths)) +
           ") | grid steps moved | optimum moves by | slope s of log lr* vs log width "
           "(95% CI) |", "|---|---|---:|---:|---|"]
  for kind, r in result.items():
    best = ", ".join(f"{r['optima'][str(w)]['best_grid_lr']:g}" for w in widths)
    s = r["slope"]
    lines.append(f"| {kind} | {best} | {r['grid_steps_moved']} | {s['shift_factor']:.2f}x | "
                 f"{s['slope']:+.2f} [{s['ci'][0]:+.2f}, {s['ci'][1]:+.2f}] |")
  return "\n".join(lines)


def plot(results: dict, path: str):
  """Loss vs LR per width for each parametrization, with the vertices, from the JSON alone."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  result, widths, rates = results["result"], results["widths"], results["lrs"]
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
  finite = [v for r in result.values() for g in r["losses"].values() for v in g.values()
            if np.isfinite(v)]
  top = min(max(finite), min(finite) + 1.5)
  colors = plt.cm.viridis(np.linspace(0, 0.9, len(widths)))
  for ax, (kind, r) in zip(axes, result.items()):
    for color, w in zip(colors, widths):
      losses = [r["losses"][str(w)][f"{x:g}"] for x in rates]
      ax.plot(np.log2(rates), np.minimum(np.nan_to_num(losses, nan=top), top), "o-",
              color=color, label=f"width {w}")
      opt = r["optima"][str(w)]
      ax.plot(np.log2(opt["lr"]), opt["best_loss"], "*", color=color, ms=14, mec="k")
    s = r["slope"]
    ax.set_title(f"{'μP' if kind == 'mup' else 'standard'}: lr* ~ width^{s['slope']:+.2f} "
                 f"[{s['ci'][0]:+.2f}, {s['ci'][1]:+.2f}]")
    ax.set_xlabel("log2 peak learning rate (star: the vertex, at the best grid loss)")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("final validation loss (nats/char)")
  axes[0].set_ylim(top=top)
  axes[1].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def best_loss_table(result: dict, widths: list[int]) -> str:
  """The best run of each arm per width: does transfer cost (or buy) loss?"""
  lines = ["| width | best standard (lr) | best μP (lr) | μP - standard |", "|---:|---|---|---:|"]
  for w in widths:
    s, m = (result[k]["optima"][str(w)] for k in PARAMETRIZATIONS)
    lines.append(f"| {w} | {s['best_loss']:.4f} ({s['best_grid_lr']:g}) | {m['best_loss']:.4f} "
                 f"({m['best_grid_lr']:g}) | {m['best_loss'] - s['best_loss']:+.4f} |")
  return "\n".join(lines)


def prediction_table(prediction: dict, errors: list[dict]) -> str:
  lines = ["| width | predicted lr* | measured lr* (μP) | measured / predicted | grid steps off |",
           "|---:|---:|---:|---:|---:|"]
  for e in errors:
    edge = " (grid edge)" if e["edge"] else ""
    lines.append(f"| {e['width']} | {prediction['predicted_lr']:.3g} | {e['measured_lr']:.3g}"
                 f"{edge} | {e['ratio']:.2f} | {e['grid_steps']:+d} |")
  return "\n".join(lines)


def results_of(args, result: dict, rows: list[dict], prediction: dict, wall_s: float) -> dict:
  """OUT.json: the settings, the prediction and its errors, every run's loss, the analysis."""
  out = pathlib.Path(args.out)
  rates = sorted(args.lrs)
  run_wall = sum(r["wall_time_s"] or 0 for r in rows)
  errors = prediction_errors(prediction, result, args.widths)
  base = str(args.widths[0])
  same_at_base = result["standard"]["losses"][base] == result["mup"]["losses"][base]
  return {"data": os.path.basename(args.data), "widths": args.widths, "lrs": rates,
          "prediction": prediction, "prediction_errors": errors,
          "mup_equals_standard_at_base_width": same_at_base,
          "steps": args.steps, "layers": LAYERS, "heads": HEADS, "mup_base_width": args.widths[0],
          "tokens_per_step": isoflop.TOKENS_PER_STEP, "result": result,
          "runs": [{"name": r["name"], "eval_loss": r["eval_loss"],
                    "wall_time_s": r["wall_time_s"]} for r in rows],
          "wall_time_s": {"this_invocation": round(wall_s, 1), "sum_of_runs": round(run_wall, 1)},
          "parallel": args.parallel, "threads_per_run": args.threads_per_run,
          "png": out.name + ".png", "written": time.strftime("%Y-%m-%d %H:%M:%S")}


def refit(results: dict) -> dict:
  """{parametrization: {slope, k, lr_<width>...}}: each width's optimum (`scaling.lr_optimum`)
  and the transfer slope (`scaling.lr_width_rule`) recomputed from the JSON's loss grid."""
  out = {}
  widths = results["widths"]
  for kind, r in results["result"].items():
    optima = {}
    for w in widths:
      grid = {float(lr): loss for lr, loss in r["losses"][str(w)].items()}
      optima[w] = scaling.lr_optimum(list(grid), list(grid.values()))["lr"]
    slope = scaling.lr_width_rule(widths, [optima[w] for w in widths])
    out[kind] = {"slope": slope["slope"], "k": slope["k"],
                 **{f"lr_{w}": optima[w] for w in widths}}
  return out


def stored(results: dict) -> dict:
  """What `refit` recomputes, as the JSON stores it."""
  return {kind: {"slope": r["slope"]["slope"], "k": r["slope"]["k"],
                 **{f"lr_{w}": r["optima"][str(w)]["lr"] for w in results["widths"]}}
          for kind, r in results["result"].items()}


def render(results: dict) -> str:
  """The markdown report, from the results (OUT.json) alone."""
  result, widths, rates = results["result"], results["widths"], results["lrs"]
  prediction, errors = results["prediction"], results["prediction_errors"]
  run_wall = results["wall_time_s"]["sum_of_runs"]
  wall_s = results["wall_time_s"]["this_invocation"]
  parallel, threads = results.get("parallel", 2), results.get("threads_per_run", 1)
  same_at_base = results["mup_equals_standard_at_base_width"]
  layers, heads = results["layers"], results["heads"]
  text = [
      "# μP learning-rate transfer on a character-level GPT (CPU)", "",
      f"Corpus `{results['data']}` (characters, 90/10 split). Model: the README's "
      f"char GPT with {layers} layers and {heads} heads at widths {widths} (mlp 4x, head "
      f"dim width/{heads}); {results['steps']} steps of 16 x 64 characters, warmup 10%, cosine to "
      "10%, AdamW (0.9, 0.99), weight decay 0.1, clip 1.0; the same batches for every run. "
      f"μP base width {results['mup_base_width']} (so both parametrizations are the same model "
      "there). Loss: final validation loss on 40 fixed batches. Optimum: vertex of the parabola "
      "in log LR through the best grid LR and its neighbours; slope: least squares of log "
      "optimum vs log width with a 95% t-interval (2 degrees of freedom for 4 widths).", "",
      f"Reproduce: `python -m experiments.mup_transfer --data=PATH/{results['data']}`"
      f" (finished runs are reused). Training: {run_wall / 60:.1f} min summed over the "
      f"{len(results['runs'])} processes, {parallel} at a time with {threads} XLA "
      f"thread each (about {run_wall / 60 / parallel:.0f} min of wall clock on a 2-core "
      f"CPU); this invocation {wall_s / 60:.1f} min.", "",
      "## Where the optimum sits", "", summary_table(result, widths), "",
      "## Prediction", "",
      f"Written {prediction['predicted_at']}, after the standard arm and before any μP run "
      f"finished: μP's optimum at every width = the base width's, lr* = "
      f"{prediction['predicted_lr']:.3g} (best grid LR {prediction['predicted_best_grid_lr']:g})."
      f" At the base width μP reproduced the standard runs' losses "
      f"{'exactly (all 7 equal)' if same_at_base else 'NOT exactly: see the grid'}.", "",
      prediction_table(prediction, errors), "",
      "## Best loss per width", "",
      "Only the LR is tuned; μP's other base hyperparameters (output and attention "
      "multipliers, init scales) are the standard model's.", "",
      best_loss_table(result, widths), "",
      f"![transfer]({results.get('png', 'mup_transfer.png')})", "", "## Every run", "",
      grid_table(result, rates), ""]
  return "\n".join(text)


def write_report(args, result: dict, rows: list[dict], prediction: dict, wall_s: float):
  text = report_check.write(args.out, results_of(args, result, rows, prediction, wall_s),
                            render, plot)
  print(text)


def run_arm(args, kind: str) -> list[dict] | None:
  """Train the arm's runs not finished yet; None (after saying which) if some did not finish
  for another reason than a diverged loss."""
  rows = sweep_lib.run(sweep_spec(args), args.workdir, parallel=args.parallel,
                       only=f"{kind}_*")
  failed = [r["name"] for r in rows
            if r["status"] != "done" and not diverged(args.workdir, r["name"])]
  if failed:
    print(f"error: runs {failed} did not finish; see their train.log in {args.workdir} and "
          "re-run to resume", file=sys.stderr)
    return None
  return rows


def predict(args, standard_rows: list[dict]) -> dict:
  """μP's optimal LR at every width = the base width's optimum under standard (the same
  model there). Written once, before the μP arm trains, and read back on re-runs."""
  path = pathlib.Path(args.workdir) / "prediction.json"
  if path.exists():
    return json.loads(path.read_text())
  base = analyse(standard_rows, args.widths, kinds=("standard",))["standard"]
  best = base["optima"][str(args.widths[0])]
  out = {"what": f"μP's optimal peak LR at widths {args.widths[1:]}, predicted from the base "
                 f"width ({args.widths[0]}) alone: μP at its base width is the standard model "
                 f"bit for bit, so the standard d{args.widths[0]} sweep is μP's",
         "predicted_lr": best["lr"], "predicted_best_grid_lr": best["best_grid_lr"],
         "base_width": args.widths[0], "from_runs": base["losses"][str(args.widths[0])],
         "predicted_at": time.strftime("%Y-%m-%d %H:%M:%S")}
  path.write_text(json.dumps(out, indent=2) + "\n")
  return out


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  if args.threads_per_run:
    sweep_lib.limit_xla_threads(args.threads_per_run)
  start = time.perf_counter()
  standard = run_arm(args, "standard")
  if standard is None:
    return 1
  prediction = predict(args, standard)
  mup_rows = run_arm(args, "mup")
  if mup_rows is None:
    return 1
  rows = standard + mup_rows
  result = analyse(rows, args.widths)
  write_report(args, result, rows, prediction, time.perf_counter() - start)
  return 0


if __name__ == "__main__":
  sys.exit(main())
