"""MoE vs dense GPT at equal active parameters on tiny Shakespeare: validation-loss curves.

    python -m experiments.moe_vs_dense [--workdir=runs/moe_vs_dense] [--steps=2000]

Trains `configs/moe_gpt.py:{dense,switch,mixtral}` (the nanogpt_cpu setup with its FFN
swapped; same active FFN parameters and FLOPs per token) on the same batches and writes
`experiments/results/moe_vs_dense.{md,png}`: eval loss at every eval, final train loss, MoE
router statistics. Finished runs are not retrained (the loop returns at once).
"""

from __future__ import annotations

import argparse
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from configs import moe_gpt  # noqa: E402
from jaxformer import scaling  # noqa: E402
from jaxformer.train import train  # noqa: E402
from jaxformer.train.metrics import read  # noqa: E402

VARIANTS = ("dense", "switch", "mixtral")
RESULTS = ROOT / "experiments" / "results"


def run(variant: str, workdir: pathlib.Path, steps: int) -> list[dict]:
  config = moe_gpt.get_config(variant)
  config.train.update(steps=steps, eval_every=max(steps // 8, 1), sample_tokens=0,
                      checkpoint_every=steps)
  train(config, str(workdir / variant))
  return read(workdir / variant / "metrics.jsonl")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="runs/moe_vs_dense")
  parser.add_argument("--steps", type=int, default=2000)
  args = parser.parse_args()
  workdir = pathlib.Path(args.workdir)
  curves = {v: run(v, workdir, args.steps) for v in VARIANTS}

  lines = ["| model | total params | active params | final eval_loss | best eval_loss | "
           "dropped | load-balance loss |", "|---|---:|---:|---:|---:|---:|---:|"]
  fig = Figure(figsize=(6.4, 4.2), dpi=100)
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  for variant, records in curves.items():
    evals = [r for r in records if "eval_loss" in r]
    train_records = [r for r in records if "loss" in r]
    counts = scaling.count_params(moe_gpt.get_config(variant).model)
    last = train_records[-1]
    dropped = f"{last['moe_dropped_fraction']:.3f}" if "moe_dropped_fraction" in last else "-"
    balance = (f"{last['moe_load_balance_loss']:.3f}" if "moe_load_balance_loss" in last
               else "-")
    lines.append(f"| {variant} | {counts['total']:,} | {counts['active']:,} | "
                 f"{evals[-1]['eval_loss']:.4f} | {min(r['eval_loss'] for r in evals):.4f} | "
                 f"{dropped} | {balance} |")
    ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], marker="o",
            label=f"{variant} ({counts['active'] / 1e6:.2f}M active)")
  ax.set_xlabel("step")
  ax.set_ylabel("validation loss")
  ax.set_title("MoE vs dense at equal active parameters (tiny Shakespeare)")
  ax.legend()
  ax.grid(alpha=0.3)
  RESULTS.mkdir(parents=True, exist_ok=True)
  fig.savefig(RESULTS / "moe_vs_dense.png")
  table = "\n".join(lines)
  (RESULTS / "moe_vs_dense.md").write_text(
      f"# MoE vs dense ({args.steps} steps, `python -m experiments.moe_vs_dense`)\n\n"
      f"{table}\n\n![curves](moe_vs_dense.png)\n")
  print(table)


if __name__ == "__main__":
  main()
