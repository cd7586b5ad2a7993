"""nanoGPT's CPU Shakespeare setup in jaxformer: final validation loss and throughput.

    python -m experiments.nanogpt_cpu [--workdir=/tmp/nanogpt_cpu]

Trains `configs/shakespeare_char.py:nanogpt_cpu` from scratch (4 layers, 4 heads, width 128,
context 64, batch 12, 2000 steps) and prints a table: validation loss at the last step, median
training tokens/s over the logged windows (eval excluded) and wall time. The peer's published
figures on this 2-core machine: ~1.88 validation loss, ~16k tokens/s (PyTorch, CPU).
"""

import argparse
import shutil
import statistics
import time

from configs import shakespeare_char
from jaxformer.train import train
from jaxformer.train.metrics import read

PEER = {"eval_loss": 1.88, "tokens_per_sec": 16_000}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="/tmp/nanogpt_cpu")
  parser.add_argument("--steps", type=int, default=2000)
  args = parser.parse_args()
  shutil.rmtree(args.workdir, ignore_errors=True)
  config = shakespeare_char.get_config("nanogpt_cpu")
  config.train.steps = args.steps
  config.train.sample_tokens = 0
  start = time.perf_counter()
  last = train(config, args.workdir)
  wall = time.perf_counter() - start
  records = read(f"{args.workdir}/metrics.jsonl")
  speed = statistics.median(r["tokens_per_sec"] for r in records if "tokens_per_sec" in r)
  print("\n| metric | jaxformer | peer (nanoGPT, PyTorch CPU) |\n|---|---:|---:|")
  print(f"| eval_loss @ step {last['step']} | {last['eval_loss']:.4f} | ~{PEER['eval_loss']} |")
  print(f"| train tokens/s (median) | {speed:,.0f} | ~{PEER['tokens_per_sec']:,} |")
  print(f"| wall time (s), incl. compile + evals | {wall:.0f} | ~180 |")


if __name__ == "__main__":
  main()
