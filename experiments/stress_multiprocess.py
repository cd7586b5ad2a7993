"""Repeated 2-process training runs under CPU load: does any of them hang?

    python -m experiments.stress_multiprocess [--runs 20] [--busy 2] [--timeout 600] [--out DIR]

Each run is the command that hung 2 of 11 times before the fix (docs/design/parallelism.md,
"No process waits forever"):
`launch.local`, 2 processes x 2 CPU devices, `configs/shakespeare_char.py:tiny` for 40 steps,
an asynchronous checkpoint every 10 and an evaluation every 20 (so each evaluation follows an
asynchronous checkpoint still being written). `--busy` processes spin beside it the whole time
(the load under which the hang showed). A run that does not end within `--timeout` seconds is
a hang: every process's Python stack is printed (py-spy, when installed) and it is killed.
Prints one line per run and a summary table; writes `DIR/stress_multiprocess.json` with
`--out`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spin():
  while True:
    pass


def _command(workdir: str, steps: int) -> list[str]:
  return [sys.executable, "-m", "launch.local", "--num_processes=2", "--devices_per_process=2",
          "--", sys.executable, "-m", "jaxformer.train",
          "--config=" + os.path.join(ROOT, "configs", "shakespeare_char.py") + ":tiny",
          f"--workdir={workdir}", f"--config.train.steps={steps}",
          "--config.train.checkpoint_every=10", "--config.train.eval_every=20"]


def _stacks(pids) -> str:
  if shutil.which("py-spy") is None:
    return "(py-spy not installed: no stacks)"
  return "\n".join(subprocess.run(["py-spy", "dump", "--pid", str(p)], capture_output=True,
                                  text=True).stdout for p in pids)


def one_run(workdir: str, steps: int, timeout: float) -> dict:
  start = time.monotonic()
  proc = subprocess.Popen(_command(workdir, steps), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  try:
    output, _ = proc.communicate(timeout=timeout)
    hung = False
  except subprocess.TimeoutExpired:
    children = subprocess.run(["pgrep", "-f", f"--workdir={workdir}"], capture_output=True,
                              text=True).stdout.split()
    print(_stacks(children), flush=True)
    subprocess.run(["pkill", "-KILL", "-f", f"--workdir={workdir}"], check=False)
    proc.kill()
    output, _ = proc.communicate()
    hung = True
  evals = output.count("eval_loss")
  return {"seconds": round(time.monotonic() - start, 1), "returncode": proc.returncode,
          "hung": hung, "finished": f"step {steps}/{steps}" in output and evals >= 1,
          "tail": output.strip().splitlines()[-3:]}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--runs", type=int, default=20)
  parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the runs")
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--timeout", type=float, default=600.0)
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
  for s in spinners:
    s.start()
  results = []
  try:
    with tempfile.TemporaryDirectory() as tmp:
      for i in range(args.runs):
        r = one_run(os.path.join(tmp, f"run{i}"), args.steps, args.timeout)
        results.append(r)
        print(f"run {i + 1:>3d}/{args.runs}: exit {r['returncode']}, {r['seconds']:.0f} s"
              f"{', HUNG' if r['hung'] else ''}{'' if r['finished'] else ', not finished'}",
              flush=True)
  finally:
    for s in spinners:
      s.terminate()
  ok = sum(r["returncode"] == 0 and r["finished"] for r in results)
  hung = sum(r["hung"] for r in results)
  seconds = sorted(r["seconds"] for r in results)
  print("\n| runs | finished | failed | hung | busy loops | median s | max s |")
  print("|---:|---:|---:|---:|---:|---:|---:|")
  print(f"| {len(results)} | {ok} | {len(results) - ok - hung} | {hung} | {args.busy} | "
        f"{seconds[len(seconds) // 2]:.0f} | {seconds[-1]:.0f} |")
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "stress_multiprocess.json"), "w") as f:
      json.dump({"args": vars(args), "runs": results}, f, indent=1)
  return 0 if ok == len(results) else 1


if __name__ == "__main__":
  sys.exit(main())
