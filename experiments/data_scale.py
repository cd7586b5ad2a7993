"""Preparing text corpora of growing size: memory, throughput, and the input pipeline's speed.

    python -m experiments.data_scale --out DIR [--sizes 0.1,0.5,2] [--tokenizers char,spm:bpe:4096]
        [--train_sizes 0.03,0.3,3] [--train_tokenizers char]

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

The training process (`--train_sizes`, GB on disk; `--sizes=` skips the part above): many
`.jsonl.gz` files of generated documents (`write_jsonl_corpus`, 8 MiB each), trained on by a
whole `python -m jaxformer.train` process (`configs/shakespeare_char.py:tiny`, 20 steps, an
evaluation), its peak resident memory measured per phase (`train_memory`): preparation
(scan, tokenizer, tokenize), pipeline (the packed-row index, the model's state), compile and
steps. Each run gets a fresh data_dir: it prepares the corpus from scratch.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
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
FILE_BYTES = 8 << 20                # the .jsonl.gz corpora: files of about 8 MiB each
# The phases of a training process, each begun by what it prints (console.announce writes
# "what ..." then " done in"): startup (imports, JAX), scan, tokenizer (made or trained),
# tokenize, pipeline (the packed-row index, the model's state, until "starting fresh"),
# compile (the first batches, the jitted steps, up to the first step's log line), steps.
TRAIN_PHASES = (("scan", "preparing data.source="), ("tokenizer", " done in"),
                ("tokenize", "tokenizing data.source="), ("pipeline", " done in"),
                ("compile", "starting fresh"), ("steps", "\nstep "))


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


def _bundled_words() -> np.ndarray:
  from jaxformer.data.corpus import sources
  return np.asarray(sorted(set(sources.BUNDLED["tinyshakespeare"].read_text(
      encoding="utf-8").split())))


def write_jsonl_corpus(directory: str, size_bytes: int, file_bytes: int = FILE_BYTES,
                       seed: int = 0) -> int:
  """`part-NNNNN.jsonl.gz` files of about `file_bytes` each (compressed, gzip level 1), in
  all about `size_bytes` on disk: one JSON line {"text": ...} per document of 20-400 words
  drawn from the bundled text's vocabulary, about one in ten followed by a newline (only its
  characters: a char vocabulary <= 65). Returns the number of files."""
  words = _bundled_words()
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  count = written = 0
  while written < size_bytes:
    path = os.path.join(directory, f"part-{count:05d}.jsonl.gz")
    with open(path, "wb") as raw:
      with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as f:
        while raw.tell() < min(file_bytes, size_bytes - written):
          n = 20_000
          separators = np.where(rng.random(n) < 0.1, "\n", " ")
          drawn = np.char.add(words[rng.integers(0, len(words), n)], separators)
          cuts = np.cumsum(rng.integers(20, 400, n // 20))
          f.write("".join(json.dumps({"text": "".join(d).strip()}) + "\n"
                          for d in np.split(drawn, cuts[cuts < n])).encode())
    written += os.path.getsize(path)
    count += 1
  return count


def _status_mb(pid: int, key: str = "VmRSS") -> float:
  try:
    with open(f"/proc/{pid}/status") as f:
      return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024
  except (OSError, StopIteration):          # gone, or a zombie
    return 0.0


def _rss_mb(pid: int) -> float:
  return _status_mb(pid)


def _reset_peak(pid: int):
  """Restart VmHWM at the current RSS (Linux >= 4.0: write 5 to clear_refs)."""
  try:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    pass


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


def train_memory(source: str, tokenizer: str, workdir: str, data_dir: str, *, steps: int = 20,
                 vocab_size: int | None = None, poll_s: float = 0.05) -> dict:
  """Peak resident memory of `python -m jaxformer.train` (configs/shakespeare_char.py:tiny on
  `source`, `steps` steps, one evaluation) per phase of the run (TRAIN_PHASES, found in its
  output as it prints): {phase: {'main_mb': the training process's VmHWM over the phase
  (reset at each phase start), 'worker_mb': the largest preparation worker's VmHWM,
  'total_mb': the largest sum of their RSS polled every `poll_s`, 'seconds'}}, plus
  'peak_mb' (the training process over the run)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cmd = [sys.executable, "-m", "jaxformer.train", "--config=configs/shakespeare_char.py:tiny",
         f"--workdir={workdir}", f"--config.data.source={source}",
         f"--config.data.tokenizer={tokenizer}", f"--config.data.data_dir={data_dir}",
         f"--config.train.steps={steps}", f"--config.train.eval_every={steps}",
         f"--config.train.log_every={max(steps // 4, 1)}", "--config.data.eval_batches=4",
         f"--config.optim.warmup_steps={max(steps // 4, 1)}"]
  if vocab_size is not None:
    cmd.append(f"--config.model.vocab_size={vocab_size}")
  env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
      [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
  log = os.path.join(os.path.dirname(workdir) or ".", os.path.basename(workdir) + ".log")
  proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)      # step lines go to stderr
  out = []

  def read():
    with open(log, "w") as f:
      for chunk in iter(lambda: os.read(proc.stdout.fileno(), 1 << 16), b""):
        out.append(chunk.decode(errors="replace"))
        f.write(out[-1])
        f.flush()
  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  phases, phase, seen, start = {}, "startup", 0, time.perf_counter()
  row = {"main_mb": 0.0, "worker_mb": 0.0, "total_mb": 0.0}

  def close_phase():
    row["main_mb"] = max(row["main_mb"], _status_mb(proc.pid, "VmHWM"))
    phases[phase] = {**row, "seconds": time.perf_counter() - start}

  while True:
    done = proc.poll() is not None
    workers = _descendants(proc.pid) if not done else []
    rss = [_rss_mb(p) for p in [proc.pid, *workers]]
    row["main_mb"] = max(row["main_mb"], _status_mb(proc.pid, "VmHWM"))
    row["worker_mb"] = max([row["worker_mb"], *(_status_mb(p, "VmHWM") for p in workers)])
    row["total_mb"] = max(row["total_mb"], sum(rss))
    text = "".join(out)
    while len(phases) < len(TRAIN_PHASES) and not done:
      name, marker = TRAIN_PHASES[len(phases)]
      at = text.find(marker, seen)
      if at < 0:
        break
      close_phase()
      _reset_peak(proc.pid)
      phase, seen, start = name, at + len(marker), time.perf_counter()
      now = _status_mb(proc.pid)
      row = {"main_mb": now, "worker_mb": 0.0, "total_mb": now}
    if done:
      break
    time.sleep(poll_s)
  close_phase()
  reader.join(timeout=5)
  if proc.returncode:
    raise RuntimeError(f"training on {source} with {tokenizer} failed (exit "
                       f"{proc.returncode}); see {log}")
  counts = re.search(r"\(([\d,]+) train \+ ([\d,]+) validation tokens\)", "".join(out))
  return {"phases": phases, "peak_mb": max(p["main_mb"] for p in phases.values()),
          "tokens": sum(int(c.replace(",", "")) for c in counts.groups()) if counts else 0}


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


def train_table(rows: list[dict]) -> str:
  phases = [name for name, _ in (("startup", ""), *TRAIN_PHASES)]
  lines = ["| corpus | files | tokens | tokenizer | " + " | ".join(phases) +
           " | peak (largest worker / tree) MB | wall (s) |", "|" + "---|" * (len(phases) + 6)]
  for r in rows:
    got = r["phases"]
    cells = [f"{got[p]['main_mb']:,.0f}" if p in got else "-" for p in phases]
    worker = max(p["worker_mb"] for p in got.values())
    total = max(p["total_mb"] for p in got.values())
    lines.append(f"| {r['gb'] * 1e3:,.0f} MB | {r['files']:,} | {r['tokens'] / 1e6:,.0f} M | "
                 f"{r['tokenizer']} | " + " | ".join(cells) +
                 f" | **{r['peak_mb']:,.0f}** ({worker:,.0f} / {total:,.0f}) | "
                 f"{sum(p['seconds'] for p in got.values()):,.0f} |")
  if len(rows) > 1:
    lines.append(f"\nPeak of the training process, largest corpus / smallest: "
                 f"{rows[-1]['peak_mb'] / rows[0]['peak_mb']:.2f}x")
  return "\n".join(lines)


def train_rows(sizes: list[float], specs: list[str], tmp: str) -> list[dict]:
  """`train_memory` of each corpus size (GB of .jsonl.gz on disk) and tokenizer."""
  rows = []
  for gb in sizes:
    corpus = os.path.join(tmp, f"jsonl_{gb}")
    files = write_jsonl_corpus(corpus, int(gb * 1e9))
    on_disk = sum(e.stat().st_size for e in os.scandir(corpus))
    for spec in specs:
      run, data_dir = os.path.join(tmp, f"train_{gb}_{spec}"), os.path.join(tmp, f"tdd_{gb}")
      vocab = None if spec == "char" else int(spec.rsplit(":", 1)[1])
      got = train_memory(os.path.join(corpus, "*.jsonl.gz"), spec, run, data_dir,
                         vocab_size=vocab)
      rows.append({"gb": on_disk / 1e9, "files": files, "tokenizer": spec, **got})
      print(json.dumps(rows[-1]), flush=True)
      shutil.rmtree(data_dir)
      shutil.rmtree(run)
    shutil.rmtree(corpus)
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="directory for data_scale.md/.json")
  parser.add_argument("--sizes", default="0.1,0.5,2", help="corpus sizes in GB")
  parser.add_argument("--tokenizers", default="char,spm:bpe:4096")
  parser.add_argument("--train_sizes", default="0.03,0.3,3",
                      help="GB of .jsonl.gz files a training process reads (empty: none)")
  parser.add_argument("--train_tokenizers", default="char")
  parser.add_argument("--tmp", default=None, help="where the corpora are built (deleted after)")
  args = parser.parse_args(argv)
  sizes = [float(s) for s in args.sizes.split(",") if s]
  specs = args.tokenizers.split(",")
  os.makedirs(args.out, exist_ok=True)
  rows, trained, readme_rate, results = [], [], None, []
  with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
    if sizes:
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
    trained = train_rows([float(s) for s in args.train_sizes.split(",") if s],
                         args.train_tokenizers.split(","), tmp)
  if rows:
    results.append(table(rows, readme_rate))
  if trained:
    results.append("Peak RSS (MB) of the training process per phase:\n\n" + train_table(trained))
  print("\n\n".join(results))
  with open(os.path.join(args.out, "data_scale.md"), "w") as f:
    f.write("\n\n".join(results) + "\n")
  with open(os.path.join(args.out, "data_scale.json"), "w") as f:
    json.dump({"rows": rows, "readme_steps_per_s": readme_rate, "train_rows": trained}, f,
              indent=1)


if __name__ == "__main__":
  main()
