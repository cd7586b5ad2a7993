"""Routing discipline over a training run: do attention heads collapse (entropy -> 0) or
become redundant (several heads attending alike)?

    python -m experiments.routing_discipline [--workdir=runs/routing_discipline] [--steps=N]

Trains the README model (configs/shakespeare_char.py: 4 layers x 4 heads, width 128, context
64, 2000 steps) with `train.evaluators=("heads",)` and an eval every EVAL_EVERY steps, with
`model.head_gates=True` so that the model is the `readme` model of experiments/head_pruning.py
(same config and seed: the same training), whose per-head ablation losses the report compares
with. At every eval the trainer's 'heads' evaluator (`jaxformer.evaluate.routing`) reads the
attention weights of the first 8 rows of the first eval batch and logs, per layer, the mean
and min normalised entropy of its heads (entropy / log of the visible keys: 1 uniform, 0
one-hot), their mean pairwise similarity (1 - Jensen-Shannon / ln 2) and the mean similarity
of each head to its most similar other head; the per-head arrays are in
<workdir>/heads/step_<step>.json. This script collects them into OUT.json and draws OUT.png
(resumable: a finished run is not retrained). `--report_only` rewrites OUT.md and OUT.png from
OUT.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from configs import shakespeare_char  # noqa: E402
from experiments import report_check  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "routing_discipline")
PRUNING = os.path.join(os.path.dirname(RESULTS), "head_pruning.json")
EVAL_EVERY = 50
FORMAT = 1
COLLAPSED = 0.1                # a head whose normalised entropy is below this has collapsed
REDUNDANT = 0.9                # a pair of heads whose similarity is above this is redundant
ALPHA = 0.05                   # the permutation tests' level


def experiment_config(steps: int | None = None):
  config = shakespeare_char.get_config()
  config.model.head_gates = True
  config.train.update(sample_tokens=0, attention_maps=False, eval_every=EVAL_EVERY,
                      evaluators=("heads",))
  if steps is not None:
    config.train.update(steps=steps, eval_every=max(1, min(EVAL_EVERY, steps)))
  return config


def collect(run_dir: str, config) -> dict:
  """The run's heads records and eval losses, as OUT.json holds them."""
  from jaxformer.train.metrics import read
  evals = {r["step"]: r["eval_loss"] for r in read(os.path.join(run_dir, "metrics.jsonl"))
           if "eval_loss" in r}
  steps = []
  for path in sorted(glob.glob(os.path.join(run_dir, "heads", "step_*.json"))):
    with open(path) as f:
      record = json.load(f)
    steps.append({"step": record["step"], "eval_loss": evals.get(record["step"]),
                  "layers": record["layers"], "scalars": record["scalars"],
                  "heads": [{k: layer[k] for k in ("entropy", "normalized_entropy",
                                                    "similarity", "partner",
                                                    "partner_similarity")}
                            for layer in record["heads"]]})
  m = config.model
  results = {"format": FORMAT, "model": {"layers": m.num_layers, "heads": m.num_heads,
                                         "d_model": m.d_model,
                                         "seq_len": config.data.seq_len,
                                         "steps": config.train.steps,
                                         "head_gates": bool(m.head_gates)},
             "eval_every": config.train.eval_every, "rows": 8, "steps": steps}
  if os.path.exists(PRUNING):
    with open(PRUNING) as f:
      readme = json.load(f)["models"]["readme"]
    results["head_pruning"] = {"train_eval_loss": readme["train_eval_loss"],
                               "ablation_loss": readme["ablation_loss"]}
  return results


PERMUTATIONS = 2000


def _ranks(a) -> np.ndarray:
  """Ranks with ties averaged (a head and its partner share one similarity)."""
  from scipy import stats
  return stats.rankdata(np.ravel(a)).astype(np.float64)


def _spearman(a, b, *, within_rows: bool = False) -> tuple[float, float]:
  """(Spearman's rank correlation of the [L, H] arrays `a` and `b`, its two-sided permutation
  p-value over PERMUTATIONS seeded shuffles). `within_rows`: ranks taken within each layer and
  shuffled within each layer, so differences between layers do not count."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if within_rows:
    ra, rb = np.concatenate([_ranks(r) for r in a]), np.concatenate([_ranks(r) for r in b])
  else:
    ra, rb = _ranks(a), _ranks(b)
  rho = float(np.corrcoef(ra, rb)[0, 1])
  rng = np.random.default_rng(0)
  width = a.shape[1]

  def shuffled():
    if not within_rows:
      return rng.permutation(rb)
    return np.concatenate([rng.permutation(rb[i:i + width]) for i in range(0, len(rb), width)])
  null = np.array([np.corrcoef(ra, shuffled())[0, 1] for _ in range(PERMUTATIONS)])
  return rho, float((np.sum(np.abs(null) >= abs(rho) - 1e-12) + 1) / (PERMUTATIONS + 1))


def summarize(results: dict) -> dict:
  """What the report says, from the JSON alone."""
  steps = results["steps"]
  first, last = steps[0], steps[-1]
  layers = len(last["layers"])

  def per_layer(record, key):
    return [record["scalars"][f"{key}/{i}"] for i in range(layers)]

  norm_last = np.array([h["normalized_entropy"] for h in last["heads"]])      # [L, H]
  quarter = next(r for r in steps if r["step"] >= 0.75 * last["step"])
  redundancy = np.array([per_layer(r, "redundancy") for r in steps])          # [evals, L]
  lowest = np.argmin(redundancy, axis=0)
  sims = [np.array(h["similarity"]) for h in last["heads"]]
  off = [s[~np.eye(len(s), dtype=bool)] for s in sims]
  out = {
      "first_step": first["step"], "last_step": last["step"],
      "entropy_first": per_layer(first, "entropy"), "entropy_last": per_layer(last, "entropy"),
      "min_entropy_last": per_layer(last, "min_entropy"),
      "redundancy_first": per_layer(first, "redundancy"),
      "redundancy_last": per_layer(last, "redundancy"),
      "partner_last": per_layer(last, "partner"),
      "quarter_step": quarter["step"], "entropy_quarter": per_layer(quarter, "entropy"),
      "redundancy_min": [float(redundancy[lowest[i], i]) for i in range(layers)],
      "redundancy_min_step": [steps[j]["step"] for j in lowest],
      "cross_layer_first": first["scalars"].get("cross_layer_redundancy"),
      "cross_layer_last": last["scalars"].get("cross_layer_redundancy"),
      "collapsed_heads": int(np.sum(norm_last < COLLAPSED)),
      "redundant_pairs": int(sum(np.sum(o > REDUNDANT) for o in off) // 2),
      "max_pair_similarity": float(max(o.max() for o in off)),
      "lowest_entropy_head": [int(i) for i in np.unravel_index(np.argmin(norm_last),
                                                                norm_last.shape)],
      "lowest_entropy": float(norm_last.min()),
      "final_eval_loss": last["eval_loss"],
  }
  pruning = results.get("head_pruning")
  if pruning is not None:
    ablation = np.array(pruning["ablation_loss"])
    partner = np.array([h["partner_similarity"] for h in last["heads"]])
    out["same_model"] = (last["eval_loss"] is not None and
                         abs(last["eval_loss"] - pruning["train_eval_loss"]) < 1e-3)
    out["spearman_entropy_ablation"], out["p_entropy_ablation"] = _spearman(norm_last, ablation)
    out["spearman_partner_ablation"], out["p_partner_ablation"] = _spearman(partner, ablation)
    out["within_entropy_ablation"], out["p_within_entropy_ablation"] = _spearman(
        norm_last, ablation, within_rows=True)
    out["within_partner_ablation"], out["p_within_partner_ablation"] = _spearman(
        partner, ablation, within_rows=True)
    out["most_needed_layer"] = int(np.argmax(ablation.mean(axis=1)))
    out["most_alike_layer"] = int(np.argmax(partner.mean(axis=1)))
    out["per_head"] = [
        {"layer": i, "head": j, "entropy": float(norm_last[i, j]),
         "partner": last["heads"][i]["partner"][j],
         "partner_similarity": float(partner[i, j]), "ablation_loss": float(ablation[i, j])}
        for i in range(layers) for j in range(norm_last.shape[1])]
  return out


def _row(values) -> str:
  return " ".join(f"{v:.3f}" for v in values)


def _signed(values) -> str:
  return " ".join(f"{v:+.3f}" for v in values)


def render(results: dict) -> str:
  s = summarize(results)
  m = results["model"]
  lines = [
      "# Routing discipline: head entropy and redundancy over training",
      "",
      f"The README model ({m['layers']} layers x {m['heads']} heads, width {m['d_model']}, "
      f"context {m['seq_len']}, {m['steps']} steps, `model.head_gates=True` as in "
      "head_pruning's `readme` model) trained with `train.evaluators=(\"heads\",)`: at every "
      f"eval ({results['eval_every']} steps) the attention weights of {results['rows']} rows "
      "of the first eval batch. Entropy: per head, the mean over query rows of entropy / "
      "log(visible keys) (1: uniform over the causal prefix, 0: one key); rows with a single "
      "visible key left out. Similarity of two heads: 1 - JS / ln 2 per row, averaged "
      "(1: identical maps). Redundancy: mean pairwise similarity of a layer's heads; "
      "partner: mean over a layer's heads of the similarity to its most similar other head "
      "(any layer). Regenerate: `python -m experiments.routing_discipline` (report only: "
      "`--report_only`).",
      "",
      "| step | eval loss | entropy per layer | min entropy per layer | redundancy per layer "
      "| partner per layer | cross-layer |",
      "|---:|---:|---|---|---|---|---:|"]
  layers = len(results["steps"][-1]["layers"])
  for r in results["steps"]:
    sc = r["scalars"]
    loss = f"{r['eval_loss']:.4f}" if r["eval_loss"] is not None else ""
    lines.append(
        f"| {r['step']} | {loss} | {_row(sc[f'entropy/{i}'] for i in range(layers))} | "
        f"{_row(sc[f'min_entropy/{i}'] for i in range(layers))} | "
        f"{_row(sc[f'redundancy/{i}'] for i in range(layers))} | "
        f"{_row(sc[f'partner/{i}'] for i in range(layers))} | "
        f"{sc.get('cross_layer_redundancy', float('nan')):.3f} |")
  collapse = ("no head collapsed" if s["collapsed_heads"] == 0 else
              f"{s['collapsed_heads']} heads collapsed")
  rise = [b - a for a, b in zip(s["redundancy_min"], s["redundancy_last"])]
  drift = [b - a for a, b in zip(s["entropy_quarter"], s["entropy_last"])]
  lines += [
      "",
      "## Verdict",
      "",
      f"- Collapse: **no**. From step {s['first_step']} to {s['last_step']} the mean "
      f"normalised entropy per layer went {_row(s['entropy_first'])} -> "
      f"{_row(s['entropy_last'])}: the heads focus (about half of the uniform entropy is "
      f"gone) and then settle; from step {s['quarter_step']} to {s['last_step']} it moved "
      f"by {_signed(drift)}. {collapse.capitalize()} (normalised entropy < {COLLAPSED}); "
      f"the most focused head, layer {s['lowest_entropy_head'][0]} head "
      f"{s['lowest_entropy_head'][1]}, ends at {s['lowest_entropy']:.3f}.",
      f"- Redundancy: **no**. The mean pairwise similarity within each layer went "
      f"{_row(s['redundancy_first'])} -> {_row(s['redundancy_last'])}: the heads "
      f"differentiate as they leave uniform attention. Each layer's lowest value "
      f"({_row(s['redundancy_min'])}, at steps "
      f"{' '.join(str(x) for x in s['redundancy_min_step'])}) is followed by a slow rise of "
      f"{_signed(rise)} to the end while the entropy stays flat; "
      f"{s['redundant_pairs']} pairs of heads in one layer end above {REDUNDANT} "
      f"(the most similar pair: {s['max_pair_similarity']:.3f}); across layers the mean "
      f"nearest-head similarity went {s['cross_layer_first']:.3f} -> "
      f"{s['cross_layer_last']:.3f}.",
  ]
  if "spearman_entropy_ablation" in s:
    same = ("the same model: final eval loss "
            f"{s['final_eval_loss']:.4f}, as there" if s["same_model"] else
            "NOT the same final eval loss as head_pruning's `readme` model, so this comparison "
            "is across two trainings")
    lines += [
        f"- Against [head_pruning.md](head_pruning.md) ({same}): over the "
        f"{m['layers'] * m['heads']} heads, Spearman's rank correlation of the calibration "
        "loss with the head removed alone (higher: a more needed head) with the head's final "
        f"normalised entropy is {s['spearman_entropy_ablation']:+.2f} (permutation p = "
        f"{s['p_entropy_ablation']:.4f}), with its similarity to its nearest other head "
        f"{s['spearman_partner_ablation']:+.2f} (p = {s['p_partner_ablation']:.4f}). "
        "Ranked within each layer (4 heads, shuffled within layers, so differences between "
        f"layers do not count): {s['within_entropy_ablation']:+.2f} (p = "
        f"{s['p_within_entropy_ablation']:.4f}) and {s['within_partner_ablation']:+.2f} (p = "
        f"{s['p_within_partner_ablation']:.4f}). "
        + ("Focus goes with being needed within layers too. " if
           s["p_within_entropy_ablation"] < ALPHA else
           "The entropy's correlation is a difference between layers. ")
        + (f"The similarity's is a difference between layers (layer {s['most_needed_layer']} "
           "holds the most needed heads" + (", which are also the most alike" if
                                            s["most_alike_layer"] == s["most_needed_layer"]
                                            else "") +
           "); within a layer it is within chance. " if s["p_within_partner_ablation"] >= ALPHA else
           "The similarity's holds within layers too. ")
        + ("So the hypothesis that a head with a near twin is the one to prune is not "
           "supported: heads similar to another head are not the less needed ones."
           if s["spearman_partner_ablation"] >= 0 or s["p_partner_ablation"] >= ALPHA else
           "Heads with a near twin are the less needed, as redundancy would predict."),
        "",
        "| layer | head | entropy | nearest head (layer, head) | its similarity | ablation loss |",
        "|---:|---:|---:|---|---:|---:|"]
    for h in s["per_head"]:
      partner = h["partner"][0].split("layers_")[-1].split("/")[0]
      lines.append(f"| {h['layer']} | {h['head']} | {h['entropy']:.3f} | "
                   f"({partner}, {h['partner'][1]}) | {h['partner_similarity']:.3f} | "
                   f"{h['ablation_loss']:.4f} |")
  lines += ["", "![entropy and redundancy per layer](routing_discipline.png)", ""]
  return "\n".join(lines)


def refit(results: dict) -> dict:
  """The verdict's numbers recomputed from the per-head arrays (what the scalars summarise)."""
  out = {}
  for r in results["steps"]:
    for i, h in enumerate(r["heads"]):
      sim = np.array(h["similarity"])
      out[f"{r['step']}/{i}"] = {
          "entropy": float(np.mean(h["normalized_entropy"])),
          "min_entropy": float(np.min(h["normalized_entropy"])),
          "redundancy": float(np.mean(sim[~np.eye(len(sim), dtype=bool)])),
          "partner": float(np.mean(h["partner_similarity"]))}
  return out


def stored(results: dict) -> dict:
  return {f"{r['step']}/{i}": {k: r["scalars"][f"{k}/{i}"]
                               for k in ("entropy", "min_entropy", "redundancy", "partner")}
          for r in results["steps"] for i in range(len(r["heads"]))}


def plot(results: dict, path: str) -> None:
  steps = [r["step"] for r in results["steps"]]
  layers = len(results["steps"][-1]["layers"])
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
  for key, ax, title in (("entropy", axes[0], "mean normalised entropy"),
                         ("min_entropy", axes[1], "min normalised entropy (most focused head)"),
                         ("redundancy", axes[2], "redundancy (mean pairwise similarity)")):
    for i in range(layers):
      ax.plot(steps, [r["scalars"][f"{key}/{i}"] for r in results["steps"]], marker="o",
              markersize=2, label=f"layer {i}")
    if key == "redundancy":
      ax.plot(steps, [r["scalars"].get("cross_layer_redundancy") for r in results["steps"]],
              "k--", label="nearest head in another layer")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize="small")
  axes[2].legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="runs/routing_discipline")
  parser.add_argument("--steps", type=int, default=None, help="override the config's steps")
  parser.add_argument("--out", default=RESULTS, help="results prefix (.md, .json, .png)")
  parser.add_argument("--report_only", action="store_true",
                      help="rewrite OUT.md and OUT.png from OUT.json")
  args = parser.parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  from jaxformer.train import loop
  config = experiment_config(args.steps)
  loop.train(config, args.workdir)
  print(report_check.write(args.out, collect(args.workdir, config), render, plot))
  print(f"wrote {args.out}.{{md,json,png}}")
  return 0


if __name__ == "__main__":
  main()
