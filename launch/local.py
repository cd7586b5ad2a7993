"""Run N copies of a command on this machine as one multi-process JAX job.

    python -m launch.local --num_processes=2 --devices_per_process=4 -- \
        python -m jaxformer.train --config=configs/shakespeare_char.py:tiny --workdir=/tmp/run

Each process gets JAXFORMER_COORDINATOR (a free localhost port), JAXFORMER_NUM_PROCESSES and
JAXFORMER_PROCESS_ID (read by `jaxformer.parallel.initialize()`) and its own CPU device count
through XLA_FLAGS, so multi-host code paths (per-process batches, collectives, Orbax
multi-process saves) can be exercised on a laptop. Output lines are prefixed with the process
id; SIGINT/SIGTERM are forwarded; when one process fails the others are stopped and the exit
code of the first failure is returned. From Python: `run_local` (wait for all) or
`start_local` (a `LocalJob` handle, e.g. to signal one process and see the others stop too).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

from jaxformer import cli

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
_GRACE_SECONDS = 10.0


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def process_env(base: Mapping[str, str], *, process_id: int, num_processes: int, port: int,
                devices_per_process: int, platform: str | None) -> dict[str, str]:
  """The environment of process `process_id`."""
  env = dict(base)
  flags = re.sub(rf"{_DEVICE_COUNT_FLAG}=\S+", "", env.get("XLA_FLAGS", "")).split()
  env["XLA_FLAGS"] = " ".join(flags + [f"{_DEVICE_COUNT_FLAG}={devices_per_process}"])
  if platform:
    env["JAX_PLATFORMS"] = platform
  env.update(JAXFORMER_COORDINATOR=f"localhost:{port}",
             JAXFORMER_NUM_PROCESSES=str(num_processes), JAXFORMER_PROCESS_ID=str(process_id))
  return env


class LocalJob:
  """The running processes (`procs`: signal one of them to test what the others do), their
  prefixed output and the order in which they failed."""

  def __init__(self, cmd: Sequence[str], envs: list[dict[str, str]], echo: bool):
    self.cmd, self.echo = list(cmd), echo
    self.lock = threading.Lock()
    self.lines: list[list[str]] = [[] for _ in envs]
    self.procs = [subprocess.Popen(self.cmd, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1,
                                   start_new_session=True) for env in envs]
    self.readers = [threading.Thread(target=self._read, args=(i,), daemon=True)
                    for i in range(len(envs))]
    for reader in self.readers:
      reader.start()
    self.failures: list[int] = []

  def _read(self, i: int):
    for line in self.procs[i].stdout:
      self.lines[i].append(line)
      if self.echo:
        with self.lock:
          sys.stdout.write(f"[{i}] {line}")
          sys.stdout.flush()

  def signal_all(self, signum: int):
    for proc in self.procs:
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signum)
        except ProcessLookupError:
          pass

  def wait(self, timeout: float | None) -> bool:
    """Wait for all; stop the rest after a failure. False if `timeout` ran out."""
    start, stop_sent = time.monotonic(), None
    while None in [p.poll() for p in self.procs]:       # poll every process each round
      for i, proc in enumerate(self.procs):
        if proc.returncode not in (None, 0) and i not in self.failures:
          self.failures.append(i)
      now = time.monotonic()
      if timeout is not None and now - start > timeout:
        self.signal_all(signal.SIGKILL)
        return False
      if self.failures and stop_sent is None:
        self.signal_all(signal.SIGTERM)
        stop_sent = now
      elif stop_sent is not None and now - stop_sent > _GRACE_SECONDS:
        self.signal_all(signal.SIGKILL)
      time.sleep(0.05)
    self.failures += [i for i, p in enumerate(self.procs) if p.returncode and
                      i not in self.failures]
    return True

  def results(self) -> list[subprocess.CompletedProcess]:
    for reader in self.readers:
      reader.join()
    return [subprocess.CompletedProcess(self.cmd, p.returncode, "".join(lines), None)
            for p, lines in zip(self.procs, self.lines)]

  def finish(self, timeout: float | None) -> list[subprocess.CompletedProcess]:
    """Wait for all (stopping the rest after a failure); TimeoutExpired, with the output so
    far, after killing all if `timeout` seconds pass."""
    if not self.wait(timeout):
      output = "".join(f"[{i}] {line}" for i, lines in enumerate(self.results())
                       for line in lines.stdout.splitlines(keepends=True))
      raise subprocess.TimeoutExpired(self.cmd, timeout, output=output)
    return self.results()


def start_local(cmd: Sequence[str], num_processes: int, devices_per_process: int,
                env: Mapping[str, str] | None = None, *, platform: str | None = "cpu",
                echo: bool = False) -> LocalJob:
  """Start `cmd` as processes 0..num_processes-1 of one job and return at once."""
  if num_processes < 1 or devices_per_process < 1:
    raise ValueError(f"num_processes={num_processes} and devices_per_process="
                     f"{devices_per_process} must be >= 1")
  if not cmd:
    raise ValueError("no command given: put it after '--'")
  port, base = free_port(), {**os.environ, **(env or {})}
  envs = [process_env(base, process_id=i, num_processes=num_processes, port=port,
                      devices_per_process=devices_per_process, platform=platform)
          for i in range(num_processes)]
  return LocalJob(cmd, envs, echo)


def _run(cmd, num_processes, devices_per_process, env, timeout, platform, echo) -> LocalJob:
  job = start_local(cmd, num_processes, devices_per_process, env, platform=platform, echo=echo)
  forward = threading.current_thread() is threading.main_thread()
  previous = {}
  if forward:
    for sig in (signal.SIGINT, signal.SIGTERM):
      previous[sig] = signal.signal(sig, lambda signum, frame: job.signal_all(signum))
  try:
    job.finish(timeout)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  return job


def run_local(cmd: Sequence[str], num_processes: int, devices_per_process: int,
              env: Mapping[str, str] | None = None, timeout: float | None = None, *,
              platform: str | None = "cpu", echo: bool = False
              ) -> list[subprocess.CompletedProcess]:
  """Run `cmd` as processes 0..num_processes-1 of one job; their CompletedProcess (stdout
  holds the merged stdout+stderr), in process order. Raises TimeoutExpired after killing
  all processes if `timeout` seconds pass."""
  return _run(cmd, num_processes, devices_per_process, env, timeout, platform, echo).results()


@cli.user_errors
def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  cmd = argv[argv.index("--") + 1:] if "--" in argv else []
  flags = argv[:argv.index("--")] if "--" in argv else argv
  parser = cli.ArgumentParser(prog="python -m launch.local", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--devices_per_process", type=int, default=1,
                      help="CPU devices per process (XLA_FLAGS)")
  parser.add_argument("--platform", default="cpu",
                      help="JAX_PLATFORMS for the processes ('' keeps the environment's)")
  parser.add_argument("--timeout", type=float, default=None, help="seconds; then kill all")
  args = parser.parse_args(flags)
  try:
    job = _run(cmd, args.num_processes, args.devices_per_process, None, args.timeout,
               args.platform or None, echo=True)
  except subprocess.TimeoutExpired:
    print(f"launch.local: timed out after {args.timeout}s; all processes killed", flush=True)
    return 124
  job.results()
  if not job.failures:
    return 0
  code = job.procs[job.failures[0]].returncode
  return code if code > 0 else 128 - code      # killed by signal N: 128 + N, as shells do


if __name__ == "__main__":
  sys.exit(main())
