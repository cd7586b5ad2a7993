"""Preparing text corpora of growing size: memory, throughput, and the input pipeline's speed.

    python -m experiments.data_scale --out DIR [--sizes 0.1,0.5,2] [--tokenizers char,spm:bpe:4096]

Builds one .txt corpus per size (GB) in a temporary directory: the bundled tiny Shakespeare,
then word salad drawn from its vocabulary (nothing large is committed). Prepares each with each
tokenizer in a fresh subprocess (`jaxformer.data.corpus.prepare`, one worker per core) and
reports its peak resident memory (polled from /proc every 0.2 s: the whole process tree, the
preparing process, the largest worker; ru_maxrss would count the forking parent's memory),
the throughput in MB of text per second (reading, tokenizer training, tokenizing), and how
many README batches per second (12 windows of 65
tokens) the stream pipeline reads from the prepared corpus, next to the README model's
training steps per second (`--config=configs/shakespeare_char.py`, measured here). Writes
`DIR/data_scale.md` and `DIR/data_scale.json`. Top-level imports stay light: the preparation's
spawned workers import this module.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

_PREPARE = """
import json, sys, time
from jaxformer.data.corpus import prepare
start = time.perf_counter()
corpus = prepare.prepare(sys.argv[1], sys.argv[2], options=prepare.Options(), workdir=sys.argv[3],
                         data_dir=sys.argv[4])
print(json.dumps({"seconds": time.perf_counter() - start,
                  "tokens": sum(len(corpus.stream(r)) for r in ("train", "validation"))}))
"""
_POLL_S = 0.2
README_BATCH, README_SEQ = 12, 64


def write_corpus(path: str, size_bytes: int, seed: int = 0):
  """The bundled text, then word salad from its vocabulary until `size_bytes`."""
  from jaxformer.data.corpus import sources
  bundled = sources.BUNDLED["tinyshakespeare"].read_text(encoding="utf-8")
  words = np.asarray(sorted(set(bundled.split())))
  rng = np.random.default_rng(seed)
  with open(path, "w", encoding="utf-8") as f:
    written = f.write(bundled)
    while written < size_bytes:
      n = 200_000
      separators = np.where(rng.random(n) < 0.1, "\n", " ")
      written += f.write("".join(np.char.add(words[rng.integers(0, len(words), n)],
                                             separators).tolist()))


def _rss_mb(pid: int) -> float:
  try:
    with open(f"/proc/{pid}/status") as f:
      return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
  except (OSError, StopIteration):          # gone, or a zombie
    return 0.0


def _descendants(pid: int) -> list[int]:
  parents = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
      except OSError:
        pass
  found, frontier = [], [pid]
  while frontier:
    children = [p for p, parent in parents.items() if parent in frontier]
    found += children
    frontier = children
  return found


def prepare_once(source: str, tokenizer: str, workdir: str, data_dir: str) -> dict:
  """The preparation in a fresh process, its resident memory polled (Linux /proc): the peak of
  the preparing process, of the largest worker, and of their sum."""
  proc = subprocess.Popen([sys.executable, "-c", _PREPARE, source, tokenizer, workdir,
                           data_dir], stdout=subprocess.PIPE, text=True)
  main = worker = total = 0.0
  while proc.poll() is None:
    rss = [_rss_mb(p) for p in [proc.pid, *_descendants(proc.pid)]]
    main, worker, total = max(main, rss[0]), max([worker, *rss[1:]]), max(total, sum(rss))
    time.sleep(_POLL_S)
  if proc.returncode:
    raise RuntimeError(f"preparing {source} with {tokenizer} failed")
  return {**json.loads(proc.stdout.read().splitlines()[-1]), "main_mb": main,
          "worker_mb": worker, "total_mb": total}


def pipeline_batches_per_second(source: str, tokenizer: str, workdir: str, data_dir: str,
                                steps: int = 2000) -> float:
  from ml_collections import ConfigDict

  from jaxformer.data import text
  cfg = ConfigDict(dict(source=source, tokenizer=tokenizer, seq_len=README_SEQ,
                        packing="stream"))
  p = text.make_text_pipeline(cfg, seed=0, global_batch_size=README_BATCH,
                              eval_batch_size=README_BATCH, workdir=workdir, data_dir=data_dir)
  p.train_batch(0)
  start = time.perf_counter()
  for step in range(1, steps + 1):
    p.train_batch(step)
  return steps / (time.perf_counter() - start)


def readme_steps_per_second(workdir: str) -> float:
  """Median steps/s of the README model over logged steps after the first (compiled) ones."""
  from configs import shakespeare_char
  from jaxformer.train import loop
  cfg = shakespeare_char.get_config()
  cfg.train.update(steps=120, log_every=20, eval_every=1000, checkpoint_every=1000,
                   sample_tokens=0)
  cfg.data.data_dir = os.path.join(workdir, "data")
  loop.train(cfg, workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rates = [r["tokens_per_sec"] for r in map(json.loads, f) if "tokens_per_sec" in r][1:]
  return float(np.median(rates)) / (README_BATCH * README_SEQ)


def table(rows: list[dict], readme_rate: float) -> str:
  lines = ["| corpus | tokenizer | tokens | prepare (s) | MB/s | peak RSS total (main / "
           "worker) MB | pipeline batches/s | README steps/s |", "|" + "---|" * 8]
  for r in rows:
    lines.append(f"| {r['gb']:.2f} GB | {r['tokenizer']} | {r['tokens'] / 1e6:,.0f} M | "
                 f"{r['seconds']:,.0f} | {r['mb_per_s']:.1f} | {r['total_mb']:,.0f} "
                 f"({r['main_mb']:,.0f} / {r['worker_mb']:,.0f}) | {r['batches_per_s']:,.0f} | "
                 f"{readme_rate:.1f} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="directory for data_scale.md/.json")
  parser.add_argument("--sizes", default="0.1,0.5,2", help="corpus sizes in GB")
  parser.add_argument("--tokenizers", default="char,spm:bpe:4096")
  parser.add_argument("--tmp", default=None, help="where the corpora are built (deleted after)")
  args = parser.parse_args(argv)
  sizes = [float(s) for s in args.sizes.split(",")]
  specs = args.tokenizers.split(",")
  os.makedirs(args.out, exist_ok=True)
  rows = []
  with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
    readme_rate = readme_steps_per_second(os.path.join(tmp, "readme"))
    print(f"README model: {readme_rate:.1f} steps/s", flush=True)
    for gb in sizes:
      source = os.path.join(tmp, f"corpus_{gb}.txt")
      write_corpus(source, int(gb * 1e9))
      size_mb = os.path.getsize(source) / 1e6
      for spec in specs:
        run, data_dir = os.path.join(tmp, f"run_{gb}_{spec}"), os.path.join(tmp, f"dd_{gb}")
        row = {"gb": size_mb / 1e3, "tokenizer": spec, **prepare_once(source, spec, run,
                                                                        data_dir)}
        row["mb_per_s"] = size_mb / row["seconds"]
        row["batches_per_s"] = pipeline_batches_per_second(source, spec, run, data_dir)
        rows.append(row)
        print(json.dumps(row), flush=True)
      os.remove(source)
      shutil.rmtree(os.path.join(tmp, f"dd_{gb}"))
  result = table(rows, readme_rate)
  print(result)
  with open(os.path.join(args.out, "data_scale.md"), "w") as f:
    f.write(result + "\n")
  with open(os.path.join(args.out, "data_scale.json"), "w") as f:
    json.dump({"rows": rows, "readme_steps_per_s": readme_rate}, f, indent=1)


if __name__ == "__main__":
  main()
