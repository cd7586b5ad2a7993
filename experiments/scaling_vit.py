"""Accuracy vs model size for tiny ViTs: a width x depth sweep of `configs/vit_tiny.py`.

    python experiments/scaling_vit.py [--data=digits|mnist] [--workdir=runs/scaling_vit_<data>]
        [--steps=N] [--out=experiments/results/scaling_vit]

`digits` (default): scikit-learn's bundled 8x8 digits (no download; ~5 minutes on a 2-core
CPU). `mnist`: IDX files from $MNIST_DIR (default ../shared/data/mnist). Every size trains
with the config's own recipe and step count (or --steps); width and depth grow together with
head_dim 16 and mlp_dim 2 x d_model (the config's ratio). Each size is
`jaxformer.train.loop.train` in WORKDIR/L<layers>_d<width>, in this process (configs parsed by
`jaxformer.sweep.load_config`, exactly as the train command line), so a re-run reuses
finished sizes and only redraws. (`jaxformer.sweep.run` cannot summarize image runs yet:
its token count needs data.seq_len.)

Writes OUT.md (table + power-law fit of the test error, `jaxformer.scaling.fit_kaplan_n`, 95% bootstrap CIs), OUT.json
and OUT.png (test accuracy and error vs parameters).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxformer import scaling, sweep as sweep_lib  # noqa: E402
from jaxformer.train import loop  # noqa: E402

# (num_layers, d_model): head_dim 16, mlp_dim 2 * d_model.
SIZES = ((1, 16), (1, 32), (2, 48), (2, 64), (3, 96))
DATASETS = ("digits", "mnist")


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", default="digits", help="digits (bundled) or mnist")
  parser.add_argument("--workdir", default=None, help="default runs/scaling_vit_<data>")
  parser.add_argument("--steps", type=int, default=None,
                      help="training steps per size (default: the config's)")
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/scaling_vit"),
                      help="output path prefix: writes OUT.md, OUT.json, OUT.png")
  args = parser.parse_args(argv)
  if args.data not in DATASETS:
    raise ValueError(f"--data={args.data!r} must be one of {', '.join(DATASETS)}")
  if args.steps is not None and args.steps < 1:
    raise ValueError(f"--steps={args.steps} must be >= 1")
  args.workdir = args.workdir or f"runs/scaling_vit_{args.data}"
  return args


def mnist_dir() -> str:
  """The MNIST directory, absolute (points run as subprocesses), or a ValueError."""
  path = os.path.abspath(os.environ.get("MNIST_DIR", os.path.join(REPO_ROOT, "..", "shared",
                                                                   "data", "mnist")))
  if not os.path.isdir(path):
    raise ValueError(f"--data=mnist: no MNIST directory at {path}; set $MNIST_DIR to the "
                     "folder with the IDX files")
  return path


def size_overrides(data: str, steps: int | None, num_layers: int,
                   d_model: int) -> dict[str, object]:
  """`--config.*` overrides of configs/vit_tiny.py:<data> for one size."""
  overrides = {"model.num_layers": num_layers, "model.d_model": d_model,
               "model.num_heads": d_model // 16, "model.mlp_dim": 2 * d_model}
  if data == "mnist":
    overrides["data.source"] = "mnist:" + mnist_dir()
  if steps is not None:
    overrides["train.steps"] = steps
  return overrides


def wall_time(point_dir: str) -> float | None:
  """Training wall time saved by this script (run.json) or by jaxformer.sweep (sweep.json)."""
  for name in ("run.json", "sweep.json"):
    path = os.path.join(point_dir, name)
    if os.path.exists(path):
      with open(path) as f:
        return json.load(f).get("wall_time_s")
  return None


def train_size(data: str, steps: int | None, workdir: str, num_layers: int,
               d_model: int) -> dict:
  """Train (or reuse) one size; its row: name, sizes, params, final step and eval metrics."""
  name = f"L{num_layers}_d{d_model}"
  point_dir = os.path.join(workdir, name)
  config = sweep_lib.load_config(f"configs/vit_tiny.py:{data}",
                                 size_overrides(data, steps, num_layers, d_model))
  counts = scaling.count_params(config.model)
  finished = sweep_lib.is_finished(point_dir, config.train.steps)
  print(f"[scaling_vit] {name}: {'finished, reused' if finished else 'training'}", flush=True)
  start = time.perf_counter()
  last = loop.train(config, point_dir)
  if not finished:
    with open(os.path.join(point_dir, "run.json"), "w") as f:
      json.dump({"wall_time_s": round(time.perf_counter() - start, 3)}, f)
  return {"name": name, "num_layers": num_layers, "d_model": d_model,
          "params": counts["non_embedding"], "params_total": counts["total"],
          "final_step": last["step"], "eval_accuracy": last["eval_accuracy"],
          "eval_loss": last["eval_loss"], "wall_time_s": wall_time(point_dir)}


def error_fit(rows: list[dict]) -> dict | None:
  """Kaplan-style power law of the test error vs total parameters, or None if it cannot be
  fit (a perfect score, or too few sizes)."""
  n = np.array([r["params_total"] for r in rows], np.float64)
  error = 1.0 - np.array([r["eval_accuracy"] for r in rows])
  try:
    fit = scaling.fit_kaplan_n(n, error)
  except ValueError as e:
    print(f"warning: no power-law fit of the error: {e}")
    return None
  out = fit.as_dict()
  out["law"] = "error = (N_c / N)^alpha"
  out["params"] = {"alpha": fit.params["alpha_N"], "N_c": fit.params["N_c"]}
  out["ci"] = {"alpha": fit.ci("alpha_N"), "N_c": fit.ci("N_c")}
  return out


def report(data: str, rows: list[dict], fit: dict | None, png_name: str) -> str:
  lines = ["| run | layers | d_model | params (total) | non-emb. | test accuracy | test loss | "
           "train wall (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['name']} | {r['num_layers']} | {r['d_model']} | "
                 f"{r['params_total']:,} | {r['params']:,} | {r['eval_accuracy']:.2%} | "
                 f"{r['eval_loss']:.4f} | {r['wall_time_s'] or float('nan'):.0f} |")
  if fit is None:
    fit_text = "No power-law fit of the test error (see the warning in the script output)."
  else:
    p, ci = fit["params"], fit["ci"]
    fit_text = (f"Test error fit `{fit['law']}` (least squares in log-log, 95% bootstrap "
                f"intervals): alpha = {p['alpha']:.3f} [{ci['alpha'][0]:.3f}, "
                f"{ci['alpha'][1]:.3f}], N_c = {p['N_c']:.3g} [{ci['N_c'][0]:.3g}, "
                f"{ci['N_c'][1]:.3g}], RMS log residual {fit['rms_residual']:.4f}.")
  steps = sorted({r["final_step"] for r in rows})
  return "\n\n".join([
      f"# ViT scaling on {data}: test accuracy vs parameters",
      f"`configs/vit_tiny.py:{data}`, {len(rows)} sizes (head_dim 16, mlp 2x), "
      f"{', '.join(map(str, steps))} steps each, the config's recipe otherwise. Reproduce: "
      f"`python experiments/scaling_vit.py --data={data}` (finished runs are reused).",
      "\n".join(lines), fit_text, f"![accuracy vs parameters]({png_name})", ""])


def plot(data: str, rows: list[dict], fit: dict | None, path: str):
  n = np.array([r["params_total"] for r in rows], np.float64)
  accuracy = np.array([r["eval_accuracy"] for r in rows])
  fig, (ax_acc, ax_err) = plt.subplots(1, 2, figsize=(11, 4.3))
  ax_acc.semilogx(n, 100 * accuracy, "ko-")
  for r, x, y in zip(rows, n, accuracy):
    ax_acc.annotate(r["name"], (x, 100 * y), textcoords="offset points", xytext=(4, -12),
                    fontsize=8)
  ax_acc.set(xlabel="parameters (total)", ylabel="test accuracy (%)",
             title=f"ViT on {data}: accuracy vs size")
  ax_err.loglog(n, 1 - accuracy, "ko", label="test error")
  if fit is not None:
    grid = np.geomspace(n.min() / 1.5, n.max() * 1.5, 100)
    p = fit["params"]
    ax_err.loglog(grid, (p["N_c"] / grid) ** p["alpha"], "C3--",
                  label=f"{fit['law']}, alpha={p['alpha']:.3f}")
  ax_err.set(xlabel="parameters (total)", ylabel="test error", title="error vs size")
  ax_err.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  args = parse_args(argv)
  rows = [train_size(args.data, args.steps, args.workdir, *size) for size in SIZES]
  fit = error_fit(rows)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  text = report(args.data, rows, fit, out.name + ".png")
  print(text)
  out.with_suffix(".md").write_text(text)
  out.with_suffix(".json").write_text(json.dumps({
      "data": args.data,
      "points": rows,
      "error_fit": fit}, indent=2) + "\n")
  plot(args.data, rows, fit, str(out.with_suffix(".png")))
  print(f"wrote {out}.md, {out}.json, {out}.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
