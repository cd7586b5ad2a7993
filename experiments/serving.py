"""Serving latency and throughput through the real HTTP server, float vs int8 weights.

    python -m experiments.serving --workdir=runs/shakespeare_char [--larger=DIR]
        [--out=experiments/results/serving] [--report_only]

`--workdir` is the README model (`configs/shakespeare_char.py`, trained: `python -m
jaxformer.train --config=configs/shakespeare_char.py --workdir=DIR`). For each of float and
`--int8` weights it starts `python -m jaxformer.serve --workdir=DIR --port=0` as its own
process, warmed up (`--warmup`: every batch shape the load below can form is compiled
first, so no compilation is timed), then runs closed-loop clients: `concurrency` threads,
each sending its requests one after another (streamed, server-sent events), and times per
request the first token's arrival (TTFT) and the last's (total). Throughput is new tokens /
wall time of the whole load. Workloads:

  prefix64   a 64-token prompt, 1 new token: the latency of a 64-token prefix (the README
             model's context is 64 tokens, so it cannot add more after 64)
  gen32      a 32-token prompt, 32 new tokens (sampled, temperature 0.8, a seed per request)

and, with `--larger`, `gen64` (64-token prompt + 64 new tokens) on that run. Prompts are
windows of the validation split (the text's last 10%). It also measures the int8 model's
logits against the float model's on validation windows (max and mean |difference|, argmax
agreement, loss) and both params' bytes. Writes OUT.{md,json}; the report is render(json).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from experiments import report_check

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serving")
FORMAT = 1
CONCURRENCY = (1, 4, 16)
TARGET_MS = 50.0
WORKLOADS = {"prefix64": (64, 1), "gen32": (32, 32), "gen64": (64, 64)}
REQUESTS_PER_CLIENT = {1: 12, 4: 6, 16: 3}


# -- the server and its clients ---------------------------------------------------------------

class ServerProcess:
  """`python -m jaxformer.serve` on an ephemeral port, stopped with SIGINT."""

  def __init__(self, workdir: str, int8: bool, warmup: list[str], max_batch: int = 16):
    cmd = [sys.executable, "-m", "jaxformer.serve", f"--workdir={workdir}", "--port=0",
           f"--max_batch={max_batch}", "--batch_window_ms=5", f"--warmup={','.join(warmup)}"
           ] + (["--int8"] if int8 else [])
    self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                 cwd=str(report_check.REPO_ROOT))
    self.banner = ""
    deadline = time.time() + 900
    while time.time() < deadline:
      line = self.proc.stderr.readline()
      if not line and self.proc.poll() is not None:
        raise RuntimeError(f"the server exited: {self.banner}")
      self.banner += line
      found = re.search(r"at http://([\d.]+):(\d+)/v1", line)
      if found:
        self.host, self.port = found.group(1), int(found.group(2))
        self.param_bytes = int(re.search(r": ([\d,]+) bytes", line).group(1).replace(",", ""))
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()    # drain
        return
    raise RuntimeError("the server did not start in 900 s")

  def close(self) -> float:
    """SIGTERM, then wait; the seconds it took to exit."""
    start = time.perf_counter()
    self.proc.send_signal(signal.SIGTERM)
    self.proc.wait(timeout=60)
    return time.perf_counter() - start


def stream_request(host, port, body) -> tuple[float, float, int]:
  """(seconds to the first token's event, seconds to the end, tokens) of one streamed
  completion."""
  start = time.perf_counter()
  conn = http.client.HTTPConnection(host, port, timeout=600)
  conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
               {"Content-Type": "application/json"})
  resp = conn.getresponse()
  if resp.status != 200:
    raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]}")
  first, text = None, ""
  for raw in resp:
    line = raw.decode().strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
      continue
    chunk = json.loads(line[6:])["choices"][0]["text"]
    if chunk and first is None:
      first = time.perf_counter() - start
    text += chunk
  total = time.perf_counter() - start
  conn.close()
  return first if first is not None else total, total, len(text)


def prompts(tokenizer_text: str, length: int, count: int, seed: int = 0) -> list[str]:
  """`count` windows of `length` characters from the validation split (last 10%)."""
  val = tokenizer_text[int(len(tokenizer_text) * 0.9):]
  starts = np.random.default_rng(seed).integers(0, len(val) - length, size=count)
  return [val[s:s + length] for s in starts]


def run_load(server: ServerProcess, texts: list[str], new: int, concurrency: int) -> dict:
  """Closed-loop clients; per-request ttft/total (s) and the load's wall time."""
  per_client = REQUESTS_PER_CLIENT[concurrency]
  records, failures, lock = [], [], threading.Lock()

  def client(c):
    for i in range(per_client):
      k = c * per_client + i
      body = dict(prompt=texts[k % len(texts)], max_tokens=new, temperature=0.8, seed=k)
      try:
        ttft, total, n = stream_request(server.host, server.port, body)
      except OSError as e:             # counted, not hidden: the report shows failures
        with lock:
          failures.append(f"{type(e).__name__}: {e}")
        continue
      with lock:
        records.append({"ttft_s": ttft, "total_s": total, "tokens": n})

  start = time.perf_counter()
  threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  wall = time.perf_counter() - start
  return {"concurrency": concurrency, "requests": records, "failures": failures,
          "wall_s": wall}


def measure_model(name: str, workdir: str, workloads: list[str], text: str) -> dict:
  out = {"workdir": os.path.basename(os.path.normpath(workdir)), "weights": {}}
  for weights in ("float", "int8"):
    server = ServerProcess(workdir, int8=weights == "int8", warmup=[
        "{}:{}".format(*WORKLOADS[w]) for w in workloads])
    entry = {"param_bytes": server.param_bytes, "loads": {}}
    try:
      for workload in workloads:
        length, new = WORKLOADS[workload]
        texts = prompts(text, length, 64)
        entry["loads"][workload] = [run_load(server, texts, new, c) for c in CONCURRENCY]
        print(f"{name} {weights} {workload}: " + ", ".join(
            f"c={c} " + _summary_line(summarize_load(r))
            for c, r in zip(CONCURRENCY, entry["loads"][workload])), flush=True)
    finally:
      entry["shutdown_s"] = server.close()
    out["weights"][weights] = entry
  return out


def logits_gap(workdir: str, text: str, windows: int = 32) -> dict:
  """The int8 model's logits vs the float model's on validation windows of the model's
  context: max and mean |difference|, the float logits' max |value|, argmax agreement and
  the next-token loss of each."""
  import jax
  import jax.numpy as jnp
  from jaxformer import models
  from jaxformer.inference import load_run, quantize
  config, params, tokenizer = load_run(workdir)
  qparams = quantize.quantize_params(config.model, params)
  model = models.build(config.model)
  length = int(config.model.max_len)
  val = tokenizer.encode(text[int(len(text) * 0.9):])
  starts = np.random.default_rng(1).integers(0, len(val) - length - 1, size=windows)
  batch = np.stack([val[s:s + length + 1] for s in starts]).astype(np.int32)
  apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
  lf = np.asarray(apply(params, jnp.asarray(batch[:, :-1])), np.float64)
  lq = np.asarray(apply(qparams, jnp.asarray(batch[:, :-1])), np.float64)

  def loss(logits):
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
        -1, keepdims=True)) - logits.max(-1, keepdims=True)
    return float(-np.take_along_axis(logp, batch[:, 1:, None], -1).mean())
  diff = np.abs(lq - lf)
  return {"windows": windows, "length": length, "max_abs_diff": float(diff.max()),
          "mean_abs_diff": float(diff.mean()), "max_abs_logit": float(np.abs(lf).max()),
          "argmax_agreement": float((lf.argmax(-1) == lq.argmax(-1)).mean()),
          "loss_float": loss(lf), "loss_int8": loss(lq),
          "param_bytes_float": quantize.param_bytes(params),
          "param_bytes_int8": quantize.param_bytes(qparams)}


# -- the report --------------------------------------------------------------------------------

def _pct(values, q):
  return float(np.percentile(np.asarray(values, np.float64), q))


def summarize_load(load: dict) -> dict:
  """p50/p95 of TTFT and total (ms), new tokens/s over the load's wall time."""
  ttft = [r["ttft_s"] * 1e3 for r in load["requests"]]
  total = [r["total_s"] * 1e3 for r in load["requests"]]
  tokens = sum(r["tokens"] for r in load["requests"])
  return {"concurrency": load["concurrency"], "requests": len(load["requests"]),
          "failed": len(load["failures"]),
          "ttft_p50_ms": _pct(ttft, 50), "ttft_p95_ms": _pct(ttft, 95),
          "total_p50_ms": _pct(total, 50), "total_p95_ms": _pct(total, 95),
          "tokens_per_s": tokens / load["wall_s"]}


def _summary_line(s: dict) -> str:
  return (f"ttft p50 {s['ttft_p50_ms']:.1f} ms, total p50 {s['total_p50_ms']:.1f} ms, "
          f"{s['tokens_per_s']:.0f} tok/s")


def target_verdict(results: dict) -> dict:
  """The 64-token-prefix target: per weights, the concurrency-1 p50 and p95 latency of
  prefix64 on the README model, and whether p95 < TARGET_MS."""
  out = {}
  for weights, entry in results["models"]["readme"]["weights"].items():
    s = summarize_load(entry["loads"]["prefix64"][0])
    out[weights] = {"p50_ms": s["total_p50_ms"], "p95_ms": s["total_p95_ms"],
                    "met": s["total_p95_ms"] < TARGET_MS}
  return out


def render(results: dict) -> str:
  lines = ["# Serving: latency and throughput through the HTTP server, float vs int8", "",
           f"`python -m experiments.serving` on {results['machine']}. The server is `python "
           "-m jaxformer.serve` in its own process; clients are closed-loop threads "
           "(each sends its next request when the last one ends), streaming; every batch "
           "shape was compiled before timing (`--warmup`). TTFT: time to the first token's "
           "event; total: to the last. Throughput: new tokens / wall time of the load (for "
           "prefix64, one new token per 64-token prompt). GPU: not measured.",
           ""]
  verdict = target_verdict(results)
  parts = []
  for weights, v in verdict.items():
    parts.append(f"{weights} p50 {v['p50_ms']:.1f} ms, p95 {v['p95_ms']:.1f} ms: "
                 f"{'met' if v['met'] else 'NOT met'}")
  lines += [f"**Target: < {TARGET_MS:.0f} ms latency for a 64-token prefix** (README model, "
            "one request at a time, p95): " + "; ".join(parts) + " (on this loaded CPU).", ""]
  for name, model in results["models"].items():
    lines += [f"## {name} (`{model['workdir']}`)", "",
              "| weights | params (bytes) | workload | concurrency | requests (failed) | TTFT "
              "p50 / p95 (ms) | total p50 / p95 (ms) | tokens/s |",
              "|---|---|---|---|---|---|---|---|"]
    for weights, entry in model["weights"].items():
      for workload, loads in entry["loads"].items():
        for load in loads:
          s = summarize_load(load)
          lines.append(f"| {weights} | {entry['param_bytes']:,} | {workload} | "
                       f"{s['concurrency']} | {s['requests']} ({s['failed']}) | "
                       f"{s['ttft_p50_ms']:.1f} / "
                       f"{s['ttft_p95_ms']:.1f} | {s['total_p50_ms']:.1f} / "
                       f"{s['total_p95_ms']:.1f} | {s['tokens_per_s']:.0f} |")
    lines.append("")
    shutdowns = ", ".join(f"{w} {e['shutdown_s']:.2f} s" for w, e in model["weights"].items())
    lines += [f"Server shutdown (SIGTERM to exit): {shutdowns}.", ""]
  gap = results["logits_gap"]
  ratio = gap["param_bytes_float"] / gap["param_bytes_int8"]
  lines += ["## int8 vs float logits (README model)", "",
            f"On {gap['windows']} validation windows of {gap['length']} tokens: max |logit "
            f"difference| {gap['max_abs_diff']:.4f} (largest |logit| {gap['max_abs_logit']:.2f}),"
            f" mean {gap['mean_abs_diff']:.5f}; next-token argmax agreement "
            f"{gap['argmax_agreement'] * 100:.2f}%; loss {gap['loss_float']:.4f} (float) vs "
            f"{gap['loss_int8']:.4f} (int8). Params: {gap['param_bytes_float']:,} bytes float, "
            f"{gap['param_bytes_int8']:,} int8 ({ratio:.2f}x smaller; the embedding table "
            "stays float).", ""]
  lines += [results["notes"], ""]
  return "\n".join(lines)


def refit(results: dict) -> dict:
  del results
  return {}


def stored(results: dict) -> dict:
  del results
  return {}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", help="the README model's trained run")
  parser.add_argument("--larger", default=None, help="a larger decoder's run (gen64)")
  parser.add_argument("--out", default=RESULTS, help="results prefix (.md, .json)")
  parser.add_argument("--notes", default="", help="a paragraph for the report's end")
  parser.add_argument("--report_only", action="store_true",
                      help="rewrite OUT.md from OUT.json")
  args = parser.parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render)
  if not args.workdir:
    parser.error("--workdir is required (the README model's trained run)")
  from jaxformer.data.corpus import sources
  text = sources.BUNDLED["tinyshakespeare"].read_text()
  results = {"format": FORMAT, "target_ms": TARGET_MS,
             "machine": f"this CPU ({os.cpu_count()} cores, shared with other jobs: "
                        "timings are inflated by the load)",
             "notes": args.notes, "models": {}}
  results["logits_gap"] = logits_gap(args.workdir, text)
  results["models"]["readme"] = measure_model("readme", args.workdir, ["prefix64", "gen32"],
                                              text)
  if args.larger:
    results["models"]["larger"] = measure_model("larger", args.larger, ["gen64"], text)
  print(report_check.write(args.out, results, render))
  print(f"wrote {args.out}.{{md,json}}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
