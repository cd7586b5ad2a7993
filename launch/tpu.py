"""Cloud TPU VM (pod slice) launcher: the exact `gcloud compute tpus tpu-vm` commands.

    python -m launch.tpu create --tpu=NAME --zone=Z --accelerator=v5litepod-16 \\
        --version=v2-alpha-tpuv5-lite [--project=P] [--spot | --preemptible] [--dry_run]
    python -m launch.tpu setup  --tpu=NAME --zone=Z            # ship the code, pip install
    python -m launch.tpu run    --tpu=NAME --zone=Z -- python -m jaxformer.train --config=...
    python -m launch.tpu sweep  --tpu=NAME --zone=Z -- python -m jaxformer.sweep --config=...
    python -m launch.tpu delete --tpu=NAME --zone=Z

Why these choices:
- setup ships a `git archive` tarball of `--ref` (default HEAD) with `tpu-vm scp --worker=all`
  instead of cloning: the workers need no git credentials and run exactly a commit of this
  checkout (commit local changes first; uncommitted edits are not shipped). On each worker
  `launch/tpu_install.py` (added to the archive, so it is this checkout's installer whatever
  the ref) installs it into `~/<remote_dir>` (default `jaxformer`), then `pip install -e
  '.[tpu]'`. It never deletes what it did not write: it keeps a marker listing the files it
  installed and replaces or removes only those; anything else in the directory (a relative
  `--workdir` of a run started there, its checkpoints) stays, and a file of another origin
  in the archive's way refuses the install, unchanged, naming it. (Before, setup ran
  `rm -rf ~/<remote_dir>`, which deleted such runs.)
- run executes the command on every worker (`ssh --worker=all`): a pod slice is one JAX program
  over all hosts, and `jax.distributed` finds its peers on TPU by itself. gcloud waits for
  every worker and does not stop the others when one fails, so the remote wrapper starts
  the command in its own process group (`setsid`), records it under `~/.jaxformer-launch/`,
  and prints one tagged line when it exits non-zero; on that line (or a SIGINT/SIGTERM to
  the launcher) the launcher sends SIGTERM to the command's process group on every worker
  (a second ssh), then SIGKILL after `--stop_grace` seconds (or a second signal), and exits
  with the first failure's status. A worker that vanishes (its VM lost) prints no line: the
  others stop when their collectives fail.
- sweep runs one point at a time on the whole slice: one `ssh --worker=all` per point with
  `--only_index=I` appended to the sweep command (the points are counted here from the sweep
  file). Sweep points with a big model need every host anyway; use a workdir every worker can
  reach (a gs:// bucket or NFS) so all hosts agree on finished points.
- `--dry_run` prints the commands (`shlex.join`, copy-pasteable) and runs nothing; otherwise
  they run in order and the first failure stops the launcher with its exit status.
This module needs only the standard library (the `sweep` verb imports jaxformer.sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence

from jaxformer import cli, tpu_flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERBS = ("create", "delete", "setup", "run", "sweep")
INSTALLER = os.path.join(REPO_ROOT, "launch", "tpu_install.py")
ARCHIVE_TOP = "jaxformer"            # the archive's top directory (the installer strips it)
LAUNCH_DIR = "$HOME/.jaxformer-launch"   # on each worker: the running command's process group


def _base(args: argparse.Namespace, verb: str) -> list[str]:
  command = ["gcloud", "compute", "tpus", "tpu-vm", verb, args.tpu, f"--zone={args.zone}"]
  return command + ([f"--project={args.project}"] if args.project else [])


def _ssh(args: argparse.Namespace, remote: str) -> list[str]:
  return _base(args, "ssh") + ["--worker=all", f"--command={remote}"]


def create_commands(args: argparse.Namespace) -> list[list[str]]:
  if args.spot and args.preemptible:
    raise ValueError("--spot and --preemptible are exclusive; give one")
  command = _base(args, "create") + [f"--accelerator-type={args.accelerator}",
                                     f"--version={args.version}"]
  if args.spot:
    command.append("--spot")
  if args.preemptible:
    command.append("--preemptible")
  return [command]


def delete_commands(args: argparse.Namespace) -> list[list[str]]:
  return [_base(args, "delete") + ["--quiet"]]


def tarball_path(args: argparse.Namespace) -> str:
  return os.path.join("/tmp", f"{args.remote_dir.replace('/', '_')}-{args.tpu}.tar.gz")


def remote_tarball(args: argparse.Namespace) -> str:
  """Where scp puts the archive on each worker (the installer removes it)."""
  return f".jaxformer-setup-{args.remote_dir.replace('/', '_')}.tar.gz"


def setup_commands(args: argparse.Namespace) -> list[list[str]]:
  """git archive of `--ref` (+ the installer) -> scp to every worker -> install there
  (launch/tpu_install.py: never deletes what it did not write) and pip install."""
  tarball, remote_tar = tarball_path(args), remote_tarball(args)
  archive = ["git", "-C", REPO_ROOT, "archive", "--format=tar.gz", f"--prefix={ARCHIVE_TOP}/",
             f"--add-file={INSTALLER}", f"--output={tarball}", args.ref]
  scp = ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball, f"{args.tpu}:{remote_tar}",
         "--worker=all", f"--zone={args.zone}"] + (
             [f"--project={args.project}"] if args.project else [])
  return [archive, scp, _ssh(args, install_script(args))]


def install_script(args: argparse.Namespace) -> str:
  """The remote command of setup: the installer the archive carries, run on the archive
  (read straight from it: nothing else is unpacked first), then pip."""
  tar, target = shlex.quote(remote_tarball(args)), shlex.quote(args.remote_dir)
  member = f"{ARCHIVE_TOP}/{os.path.basename(INSTALLER)}"
  bootstrap = ("import sys, tarfile; "
               f"exec(tarfile.open(sys.argv[1]).extractfile({json.dumps(member)}).read())")
  return (f"python3 -c {shlex.quote(bootstrap)} {tar} {target} && cd {target} && "
          "pip install -e '.[tpu]'")


def run_script(args: argparse.Namespace, command: Sequence[str], launch_id: str) -> str:
  """The remote command of run (one line, for the worker's login shell, POSIX sh): `command`
  from the code directory in its own session and process group (`setsid`: a shell without a
  terminal has no job control), recorded so that `stop_script` can signal the group, and one
  tagged line if it fails. The command runs with the TPU compiler's overlap flags
  (`jaxformer.tpu_flags`) in LIBTPU_INIT_ARGS, merged into this machine's LIBTPU_INIT_ARGS
  (its flags win) and the groups of its JAXFORMER_TPU_FLAGS."""
  pid, stop = f"{LAUNCH_DIR}/{launch_id}.pid", f"{LAUNCH_DIR}/{launch_id}.stop"
  libtpu = tpu_flags.merge(os.environ.get(tpu_flags.ENV), tpu_flags.groups_from_env())
  env = f"{tpu_flags.ENV}={shlex.quote(libtpu)} " if libtpu else ""
  return (f'cd {shlex.quote(args.remote_dir)} || exit 1; mkdir -p "{LAUNCH_DIR}"; '
          f'{env}setsid {shlex.join(command)} & pid=$!; echo "$pid" > "{pid}"; '
          f'if [ -f "{stop}" ]; then kill -TERM -- "-$pid" 2>/dev/null; fi; '
          f'wait "$pid"; rc=$?; rm -f "{pid}" "{stop}"; '
          f'if [ "$rc" -ne 0 ]; then echo "jaxformer-launch {launch_id}: $(hostname) exited '
          f'with status $rc"; fi; exit "$rc"')


def stop_script(launch_id: str, sig: str = "TERM") -> str:
  """The remote command that signals the process group `run_script` recorded (and marks
  the launch stopped, for a worker whose command has not started yet)."""
  pid, stop = f"{LAUNCH_DIR}/{launch_id}.pid", f"{LAUNCH_DIR}/{launch_id}.stop"
  return (f'mkdir -p "{LAUNCH_DIR}" && touch "{stop}"; if [ -f "{pid}" ]; then '
          f'p=$(cat "{pid}"); kill -{sig} -- "-$p" 2>/dev/null || kill -{sig} "$p" 2>/dev/null; '
          'fi; true')


def failure_line(launch_id: str) -> re.Pattern:
  """The line `run_script` prints on a worker whose command failed: (host, status)."""
  return re.compile(rf"jaxformer-launch {re.escape(launch_id)}: (\S+) exited with status (\d+)")


def new_launch_id() -> str:
  return uuid.uuid4().hex[:12]


def run_jobs(args: argparse.Namespace, command: Sequence[str],
             launch_id: str | None = None) -> list[tuple[list[str], str]]:
  """(ssh argv, launch id): `command` on every worker, from the code directory."""
  launch_id = launch_id or new_launch_id()
  return [(_ssh(args, run_script(args, command, launch_id)), launch_id)]


def run_commands(args: argparse.Namespace, command: Sequence[str],
                 launch_id: str | None = None) -> list[list[str]]:
  return [argv for argv, _ in run_jobs(args, command, launch_id)]


def sweep_jobs(args: argparse.Namespace, command: Sequence[str], size: int | None = None,
               launch_id: str | None = None) -> list[tuple[list[str], str]]:
  """One `run` per sweep point (`--only_index=I`), in order; `size` defaults to the count."""
  if any(a.startswith("--only_index") for a in command):
    raise ValueError("the sweep verb adds --only_index itself; remove it from the command")
  if size is None:
    from jaxformer import sweep
    size = sweep.count_points(command)
  launch_id = launch_id or new_launch_id()
  return [run_jobs(args, [*command, f"--only_index={i}"], f"{launch_id}-{i}")[0]
          for i in range(size)]


def sweep_commands(args: argparse.Namespace, command: Sequence[str],
                   size: int | None = None) -> list[list[str]]:
  return [argv for argv, _ in sweep_jobs(args, command, size)]


def jobs(args: argparse.Namespace, command: Sequence[str]) -> list[tuple[list[str], str | None]]:
  """(argv, launch id of a watched run or None) of what `args.verb` runs, in order."""
  if args.verb in ("run", "sweep") and not command:
    raise ValueError(f"`{args.verb}` needs a command after `--`, e.g. "
                     "-- python -m jaxformer.train --config=configs/gpt2.py:small --workdir=DIR")
  if args.verb not in ("run", "sweep") and command:
    raise ValueError(f"`{args.verb}` takes no command after `--`; got {shlex.join(command)!r}")
  if args.stop_grace < 0:
    raise ValueError(f"--stop_grace={args.stop_grace} must be >= 0 (seconds)")
  if args.verb == "run":
    return run_jobs(args, command)
  if args.verb == "sweep":
    return sweep_jobs(args, command)
  return [(c, None) for c in {"create": create_commands, "delete": delete_commands,
                              "setup": setup_commands}[args.verb](args)]


def commands(args: argparse.Namespace, command: Sequence[str]) -> list[list[str]]:
  """The argv lists that `args.verb` runs, in order."""
  return [argv for argv, _ in jobs(args, command)]


def run_watched(args: argparse.Namespace, argv: list[str], launch_id: str) -> int:
  """Run one `ssh --worker=all` of `run_script`, echoing its output; when a worker reports a
  failure (or the launcher gets SIGINT/SIGTERM), stop the command on every worker: SIGTERM,
  then SIGKILL after --stop_grace seconds or a second signal. The first failure's status
  (128 + N for a signal N to the launcher; else gcloud's own)."""
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1, start_new_session=True)
  failures, signals, pattern = [], [], failure_line(launch_id)

  def read():
    for line in proc.stdout:
      sys.stdout.write(line)
      sys.stdout.flush()
      found = pattern.search(line)
      if found:
        failures.append((found.group(1), int(found.group(2))))

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  previous = {}
  if threading.current_thread() is threading.main_thread():
    for sig in (signal.SIGINT, signal.SIGTERM):
      previous[sig] = signal.signal(sig, lambda signum, frame: signals.append(signum))
  stage, since = None, 0.0
  try:
    while proc.poll() is None:
      now = time.monotonic()
      if stage is None and (failures or signals):
        why = (f"{failures[0][0]} exited with status {failures[0][1]}" if failures
               else f"got {signal.Signals(signals[0]).name}")
        print(f"launch.tpu: {why}: stopping the command on every worker (SIGTERM; SIGKILL "
              f"after {args.stop_grace:g}s)", flush=True)
        _stop(args, launch_id, "TERM")
        stage, since = "TERM", now
      elif stage == "TERM" and (now - since > args.stop_grace or len(signals) > 1):
        print("launch.tpu: sending SIGKILL to the command on every worker", flush=True)
        _stop(args, launch_id, "KILL")
        stage, since = "KILL", now
      elif stage == "KILL" and now - since > 30:
        os.killpg(proc.pid, signal.SIGKILL)       # the ssh sessions themselves
      time.sleep(0.1)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  reader.join(timeout=10)
  if failures:
    return failures[0][1]
  if signals:
    return 128 + signals[0]
  return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _stop(args: argparse.Namespace, launch_id: str, sig: str):
  subprocess.run(_ssh(args, stop_script(launch_id, sig)), stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, check=False)


def parser() -> cli.ArgumentParser:
  p = cli.ArgumentParser(prog="python -m launch.tpu", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("verb", choices=VERBS)
  p.add_argument("--tpu", required=True, help="TPU VM name")
  p.add_argument("--zone", required=True, help="e.g. us-west4-a")
  p.add_argument("--project", default=None, help="GCP project (default: gcloud's)")
  p.add_argument("--accelerator", default="v5litepod-16", help="create: accelerator type")
  p.add_argument("--version", default="v2-alpha-tpuv5-lite", help="create: TPU VM runtime")
  p.add_argument("--spot", action="store_true", help="create: a Spot VM")
  p.add_argument("--preemptible", action="store_true", help="create: a preemptible VM")
  p.add_argument("--ref", default="HEAD", help="setup: the git commit/branch to ship")
  p.add_argument("--remote_dir", default="jaxformer", help="code directory on the workers")
  p.add_argument("--stop_grace", type=float, default=60.0,
                 help="run/sweep: seconds between SIGTERM and SIGKILL when stopping the "
                 "workers after one failed")
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  return p


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """(launcher flags, the command after the first `--`)."""
  argv = list(argv)
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []


def main(argv: Sequence[str] | None = None) -> int:
  own, command = split_command(sys.argv[1:] if argv is None else argv)
  p = parser()
  args = p.parse_args(own)
  try:
    todo = jobs(args, command)
  except ValueError as e:
    p.error(str(e))
  for c, launch_id in todo:
    print(shlex.join(c), flush=True)
    if args.dry_run:
      continue
    code = (run_watched(args, c, launch_id) if launch_id
            else subprocess.run(c, check=False).returncode)
    if code:
      print(f"launch.tpu: exit status {code}; the commands after it were not run", flush=True)
      return code
  return 0


if __name__ == "__main__":
  sys.exit(main())
