"""Head gates and pruning: does removing attention heads hurt perplexity more or less than
disabling whole layers, at the same fraction of attention removed?

    python -m experiments.head_pruning [--models=readme,deep] [--workdir=runs/head_pruning]

(`--models=readme` and `--models=deep` can run at once in two processes on one workdir; a last
run with both then only reads their cached evaluations and writes the report.)

Trains each model with `model.head_gates=True` (a learned scalar per head on its q.k logits)
with `jaxformer.train.loop.train` in `<workdir>/<model>` (resumable: a finished run is not
retrained, an interrupted one resumes from its checkpoint), then removes a fraction of the
attention heads (all L x H heads of the model = 1) and measures validation perplexity on the
whole Shakespeare validation split (consecutive windows):

  gate        heads with the smallest |gate| removed
  importance  Michel et al. (2019) importance |dL/d xi_h| (xi_h a mask on the head's output),
              one-shot, on 16 calibration batches of the training split, l2-normalised per
              layer; least important removed
  importance_raw  the same scores without the per-layer normalisation
  ablation    heads ordered by the calibration loss with each head removed alone (least
              harmful first): the measured counterpart of `importance`, chosen the same way
              as the layers below
  random      random heads (3 draws; a control)
  layer       all heads of whole layers (attention sub-layer skipped), layers chosen by the
              calibration loss with each layer's attention dropped alone (least harmful first)
  block       whole residual blocks skipped (attention and FFN), chosen the same way; removes
              the FFN too, so it is not an equal-compute comparison, shown for reference

Removing a head zeroes its output (its slice of the output projection), see
`jaxformer.models.heads`. Intervals: 95% bootstrap over the evaluation windows (paired between
methods, 1000 resamples). Each evaluation is cached in `<workdir>/<model>/pruning.json`, so a
rerun only computes what is missing. Writes `<out>.md`, `<out>.json`, `<out>.png`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from configs import shakespeare_char  # noqa: E402
from experiments import report_check  # noqa: E402
from jaxformer import models, tasks  # noqa: E402
from jaxformer.data import text  # noqa: E402
from jaxformer.inference import load_run  # noqa: E402
from jaxformer.models import heads  # noqa: E402
from jaxformer.train import loop  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "head_pruning")
METHODS = ("gate", "importance", "importance_raw", "ablation", "random", "layer", "block")
HEAD_METHODS = ("importance", "importance_raw", "ablation", "gate", "random")
LABELS = {"gate": "heads by gate magnitude", "importance": "heads by importance (Michel et al.)",
          "importance_raw": "heads by importance, not normalised per layer",
          "ablation": "heads by ablation loss",
          "random": "random heads (mean of 3)", "layer": "whole layers' attention",
          "block": "whole blocks (attention + FFN)"}
CALIBRATION_BATCHES = 16
RANDOM_DRAWS = 3
BOOTSTRAP = 1000
EVAL_BATCH = 64
FORMAT = 1


def experiment_config(name: str, steps: int | None = None):
  """The README model (`readme`: 4 layers x 4 heads, width 128) or a deeper one (`deep`: 8
  layers x 8 heads at the same width, context and steps), both with head gates."""
  config = shakespeare_char.get_config()
  if name == "deep":
    config.model.update(num_layers=8, num_heads=8)
  elif name != "readme":
    raise ValueError(f"--models: {name!r} is not one of ['readme', 'deep']")
  config.model.head_gates = True
  config.train.sample_tokens = 0
  if steps is not None:
    if steps < 1:
      raise ValueError(f"--steps={steps} must be >= 1")
    config.train.update(steps=steps, eval_every=steps)
  return config


def fractions(num_layers: int, num_heads: int) -> list[float]:
  """Fractions of attention removed: multiples of 1 / L (whole layers land on the grid), and
  of 1 / (2 L) for models of <= 4 layers."""
  step = 2 * num_layers if num_layers <= 4 else num_layers
  return [i / step for i in range(step)]


class Evaluator:
  """Per-window validation NLL of params (one compile), and calibration-set losses."""

  def __init__(self, config, run_dir: str):
    self.module = models.build(config.model)
    self.task = tasks.task_for(config.model)
    data = config.data.copy_and_resolve_references()
    data.eval_batches = None                       # the whole validation split
    pipe = text.make_text_pipeline(data, "lm", seed=config.train.seed,
                                   global_batch_size=config.train.batch_size,
                                   eval_batch_size=EVAL_BATCH, workdir=run_dir,
                                   data_dir=config.data.get("data_dir"))
    self.batches = [jax.tree.map(jnp.asarray, b) for b in pipe.eval_batches()]
    # calibration: training-split windows of steps the run never drew
    self.calibration = [jax.tree.map(jnp.asarray, pipe.train_batch(10 ** 6 + i))
                        for i in range(CALIBRATION_BATCHES)]
    task, module = self.task, self.module

    def row_nll(params, batch):
      sums = task.eval_sums(module, params, batch)
      return sums["nll"], sums["count"]
    self._sums = jax.jit(row_nll)

    def loss(params, batch):
      sums = task.eval_sums(module, params, batch)
      return sums["nll"] / jnp.maximum(sums["count"], 1.0)
    self.loss = loss
    self._loss = jax.jit(loss)

  def nll(self, params) -> tuple[np.ndarray, np.ndarray]:
    """(NLL sum, token count) per eval batch."""
    out = [jax.device_get(self._sums(params, b)) for b in self.batches]
    return np.array([o[0] for o in out], np.float64), np.array([o[1] for o in out], np.float64)

  def calibration_loss(self, params) -> float:
    return float(np.mean([self._loss(params, b) for b in self.calibration]))


def keep_for(method: str, fraction: float, params, ev: Evaluator, cache: dict,
             draw: int = 0):
  """(pruned params, keep mask [L, H]) for `method` at `fraction`."""
  num_layers, num_heads = heads.num_heads(params)
  if method in ("gate", "importance", "importance_raw", "ablation", "random"):
    if method == "ablation" and "ablation" not in cache:
      alone = np.zeros((num_layers, num_heads))
      for i in range(num_layers):
        for j in range(num_heads):
          keep = np.ones((num_layers, num_heads), bool)
          keep[i, j] = False
          alone[i, j] = ev.calibration_loss(heads.prune_heads(params, keep))
      cache["ablation"] = alone.tolist()
    if method == "ablation":
      scores = np.asarray(cache["ablation"])
    elif method == "gate":
      scores = np.abs(heads.gates(params))
    elif method in ("importance", "importance_raw"):
      if method not in cache:
        cache[method] = heads.head_importance(ev.loss, params, ev.calibration,
                                              normalize=method == "importance").tolist()
      scores = np.asarray(cache[method])
    else:
      scores = np.random.default_rng(draw).random((num_layers, num_heads))
    keep = heads.keep_lowest_removed(scores, fraction)
    return heads.prune_heads(params, keep), keep
  k = fraction * num_layers
  if abs(k - round(k)) > 1e-9:
    return None, None
  key = f"{method}_order"
  if key not in cache:                     # calibration loss with each layer dropped alone
    alone = [ev.calibration_loss(heads.drop_layers(
        params, np.arange(num_layers) != i, whole_block=method == "block"))
        for i in range(num_layers)]
    cache[key] = [int(i) for i in np.argsort(alone, kind="stable")]
  keep_layers = np.ones(num_layers, bool)
  keep_layers[cache[key][:int(round(k))]] = False
  keep = np.repeat(keep_layers[:, None], num_heads, 1)
  return heads.drop_layers(params, keep_layers, whole_block=method == "block"), keep


def evaluate_model(name: str, config, workdir: str) -> dict:
  """Train (or resume) the model, then every (method, fraction), cached in pruning.json;
  returns the model's raw record (the per-batch NLL of every evaluation)."""
  run_dir = os.path.join(workdir, name)
  loop.train(config, run_dir)
  config, params, _ = load_run(run_dir)
  cache_path = os.path.join(run_dir, "pruning.json")
  cache = {}
  if os.path.exists(cache_path):
    with open(cache_path) as f:
      cache = json.load(f)
  cache.setdefault("evals", {})
  ev = Evaluator(config, run_dir)
  num_layers, num_heads = heads.num_heads(params)

  def save():
    with open(cache_path + ".tmp", "w") as f:
      json.dump(cache, f)
    os.replace(cache_path + ".tmp", cache_path)

  for fraction in fractions(num_layers, num_heads):
    for method in METHODS:
      for draw in range(RANDOM_DRAWS if method == "random" else 1):
        key = f"{method}/{fraction:.6f}/{draw}"
        if key in cache["evals"]:
          continue
        pruned, keep = keep_for(method, fraction, params, ev, cache, draw)
        if pruned is None:
          continue
        nll, count = ev.nll(pruned)
        cache["evals"][key] = {"nll": nll.tolist(), "count": count.tolist(),
                               "keep": keep.astype(int).tolist()}
        save()
        print(f"{name} {key}: ppl {math.exp(nll.sum() / count.sum()):.3f}", flush=True)
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    last_eval = [r for r in map(json.loads, f) if "eval_loss" in r][-1]
  model = config.model
  return {"name": name, "layers": num_layers, "heads": num_heads, "d_model": model.d_model,
          "seq_len": config.data.seq_len, "steps": config.train.steps,
          "params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
          "train_eval_loss": last_eval["eval_loss"],
          "gates": heads.gates(params).tolist(), "importance": cache.get("importance"),
          "importance_raw": cache.get("importance_raw"), "ablation_loss": cache.get("ablation"),
          "layer_order": cache.get("layer_order"), "block_order": cache.get("block_order"),
          "evals": {k: {"nll": v["nll"], "count": v["count"], "keep": v["keep"]}
                    for k, v in sorted(cache["evals"].items())}}


def _ppl(nll, count, idx=None):
  if idx is None:
    return float(np.exp(np.sum(nll) / np.sum(count)))
  return np.exp(nll[idx].sum(-1) / count[idx].sum(-1))


def _draws(evals, method, fraction):
  return [evals[k] for d in range(RANDOM_DRAWS) if (k := f"{method}/{fraction:.6f}/{d}") in evals]


def summarize(record: dict) -> dict:
  """From a model's raw evaluations: per method and fraction the perplexity and its 95%
  bootstrap interval over eval batches, and at each whole-layer fraction the paired
  differences (head pruning - whole layers' attention); the same resamples everywhere."""
  evals, num_layers = record["evals"], record["layers"]
  n = len(next(iter(evals.values()))["nll"])
  idx = np.random.default_rng(0).integers(0, n, (BOOTSTRAP, n))

  def curve_point(method, fraction):
    draws = _draws(evals, method, fraction)
    if not draws:
      return None
    nll = np.mean([d["nll"] for d in draws], 0)
    count = np.asarray(draws[0]["count"])
    return nll, count

  curves = {}
  for method in METHODS:
    rows = []
    for fraction in fractions(num_layers, record["heads"]):
      point = curve_point(method, fraction)
      if point is None:
        continue
      boot = _ppl(*point, idx)
      rows.append({"fraction": fraction, "perplexity": _ppl(*point),
                   "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]})
    curves[method] = rows
  comparisons = []
  for k in range(1, num_layers):
    fraction = k / num_layers
    points = {m: curve_point(m, fraction) for m in ("layer",) + HEAD_METHODS}
    if any(p is None for p in points.values()):
      continue
    layer = _ppl(*points["layer"], idx)
    row = {"fraction": fraction, "layer": _ppl(*points["layer"])}
    for m in HEAD_METHODS:
      diff = _ppl(*points[m], idx) - layer
      row[m] = _ppl(*points[m])
      row[f"{m}_minus_layer_ci95"] = [float(np.percentile(diff, 2.5)),
                                      float(np.percentile(diff, 97.5))]
    comparisons.append(row)
  return {"curves": curves, "comparisons": comparisons}


def verdict(comparisons: list[dict], method: str = "importance") -> str:
  """How removing heads by `method` compares with removing whole layers' attention, by the
  paired 95% intervals at the whole-layer fractions: 'less' / 'more' (at every one), 'at most'
  / 'at least' (less / more at some, indistinguishable at the others, e.g. where both remove
  the same heads), 'no difference', or 'mixed' (less at some, more at others)."""
  signs = {("less" if c[f"{method}_minus_layer_ci95"][1] < 0 else
            "more" if c[f"{method}_minus_layer_ci95"][0] > 0 else "same") for c in comparisons}
  if signs == {"same"}:
    return "no difference"
  if "less" in signs and "more" in signs:
    return "mixed"
  if "less" in signs:
    return "less" if signs == {"less"} else "at most"
  return "more" if signs == {"more"} else "at least"


PHRASES = {"less": "**less** than", "more": "**more** than",
           "at most": "**less than or as much as**", "at least": "**more than or as much as**",
           "no difference": "**no differently** from",
           "mixed": "**less at some fractions, more at others,** than"}


def _cell(row):
  return "" if row is None else (f"{row['perplexity']:.3f} "
                                 f"[{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]")


def _ci(c, m):
  low, high = c[f"{m}_minus_layer_ci95"]
  return f"{c[m]:.3f} ({low:+.3f}, {high:+.3f})"


def render(results: dict) -> str:
  """The report, from the JSON alone (the raw per-batch evaluations)."""
  lines = ["# Head pruning vs dropping whole layers", "",
           "Validation perplexity (the whole Shakespeare validation split, consecutive windows) "
           "of character-level models trained with `model.head_gates=True` (a learned scalar "
           "per head on its q.k logits), after removing a fraction of all attention heads. "
           "Removing a head zeroes its output (its slice of the output projection). Brackets: "
           f"95% bootstrap intervals over eval batches ({results['bootstrap']} resamples, the "
           "same for every method, so differences are paired). Head importance: Michel et al. "
           f"(2019) |dL/d xi_h| on {results['calibration_batches']} training-split batches, "
           "one-shot, l2-normalised per layer. Layers (and blocks) are dropped least harmful "
           "first, by the calibration loss with each one dropped alone. Regenerate: "
           "`python -m experiments.head_pruning` (report only: `--report_only`).", ""]
  for name, r in results["models"].items():
    summary = summarize(r)
    lines += [f"## `{name}`: {r['layers']} layers x {r['heads']} heads, width {r['d_model']}, "
              f"context {r['seq_len']}, {r['params']:,} params, {r['steps']} steps", "",
              f"Final training eval loss {r['train_eval_loss']:.4f}; "
              f"{int(np.sum(next(iter(r['evals'].values()))['count'])):,} eval tokens.", "",
              "| removed | " + " | ".join(LABELS[m] for m in METHODS) + " |",
              "|---:|" + "---:|" * len(METHODS)]
    for f in fractions(r["layers"], r["heads"]):
      cells = [_cell(next((x for x in summary["curves"][m] if abs(x["fraction"] - f) < 1e-9),
                          None)) for m in METHODS]
      lines.append(f"| {f:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "At whole-layer fractions: perplexity with heads removed, and (in brackets) "
              "the 95% interval of its difference from removing whole layers' attention "
              "(negative: removing heads hurts less):", "",
              "| removed | whole layers | " + " | ".join(LABELS[m] for m in HEAD_METHODS) + " |",
              "|---:|---:|" + "---:|" * len(HEAD_METHODS)]
    for c in summary["comparisons"]:
      lines.append(f"| {c['fraction']:.3f} | {c['layer']:.3f} | "
                   + " | ".join(_ci(c, m) for m in HEAD_METHODS) + " |")
    lines += ["", "Verdict (paired 95% intervals at every whole-layer fraction): removing heads "
              "hurts perplexity, against removing whole layers' attention: " + "; ".join(
                  f"{LABELS[m]}: {PHRASES[verdict(summary['comparisons'], m)]} layers"
                  for m in HEAD_METHODS) + ".", "",
              "Learned gates (one row per layer): " + "; ".join(
                  " ".join(f"{v:.2f}" for v in row) for row in r["gates"]),
              "", f"Layers in drop order (attention / whole block): {r['layer_order']} / "
              f"{r['block_order']}", ""]
  return "\n".join(lines)


def refit(results: dict) -> dict:
  """Every curve point's perplexity recomputed from the raw evaluations."""
  return {f"{name}/{m}": {f"{row['fraction']:.6f}": row["perplexity"]
                          for row in summarize(r)["curves"][m]}
          for name, r in results["models"].items() for m in METHODS}


def stored(results: dict) -> dict:
  return {f"{name}/{m}": {f"{row['fraction']:.6f}": row["perplexity"]
                          for row in r["curves"][m]}
          for name, r in results["models"].items() for m in METHODS}


def plot(results: dict, path: str) -> None:
  models_ = results["models"]
  fig, axes = plt.subplots(1, len(models_), figsize=(6 * len(models_), 4.2), squeeze=False)
  for ax, (name, r) in zip(axes[0], models_.items()):
    curves = summarize(r)["curves"]
    for m in METHODS:
      rows = curves[m]
      x = [row["fraction"] for row in rows]
      line, = ax.plot(x, [row["perplexity"] for row in rows],
                      "o-" if m in ("layer", "block") else ".-", label=LABELS[m])
      ax.fill_between(x, [row["ci95"][0] for row in rows], [row["ci95"][1] for row in rows],
                      color=line.get_color(), alpha=0.2)
    ax.set(xlabel="fraction of attention heads removed", ylabel="validation perplexity",
           yscale="log", title=f"{name}: {r['layers']} layers x {r['heads']} heads")
    ax.grid(alpha=0.3, which="both")
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def results_json(records: dict) -> dict:
  models_ = {}
  for name, r in records.items():
    summary = summarize(r)
    models_[name] = {**r, "curves": summary["curves"], "comparisons": summary["comparisons"]}
  return {"format": FORMAT, "bootstrap": BOOTSTRAP, "calibration_batches": CALIBRATION_BATCHES,
          "random_draws": RANDOM_DRAWS, "models": models_}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="readme,deep")
  parser.add_argument("--workdir", default="runs/head_pruning")
  parser.add_argument("--steps", type=int, default=None, help="override the configs' steps")
  parser.add_argument("--out", default=RESULTS, help="results prefix (.md, .json, .png)")
  parser.add_argument("--report_only", action="store_true",
                      help="rewrite OUT.md and OUT.png from OUT.json")
  args = parser.parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  configs = {n: experiment_config(n, args.steps) for n in args.models.split(",")}
  records = {n: evaluate_model(n, c, args.workdir) for n, c in configs.items()}
  print(report_check.write(args.out, results_json(records), render, plot))
  print(f"wrote {args.out}.{{md,json,png}}")
  return 0


if __name__ == "__main__":
  main()
