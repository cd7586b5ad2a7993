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
  checkout (commit local changes first; uncommitted edits are not shipped). Each worker gets
  `~/<remote_dir>` (default `jaxformer`) and `pip install -e '.[tpu]'`.
- run executes the command on every worker (`ssh --worker=all`): a pod slice is one JAX program
  over all hosts, and `jax.distributed` finds its peers on TPU by itself.
- sweep runs one point at a time on the whole slice: one `ssh --worker=all` per point with
  `--only_index=I` appended to the sweep command (the points are counted here from the sweep
  file). Sweep points with a big model need every host anyway; use a workdir every worker can
  reach (a gs:// bucket or NFS) so all hosts agree on finished points.
- `--dry_run` prints the commands (`shlex.join`, copy-pasteable) and runs nothing; otherwise
  they run in order and the first failure stops the launcher.
This module needs only the standard library (the `sweep` verb imports jaxformer.sweep).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

from jaxformer import cli

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERBS = ("create", "delete", "setup", "run", "sweep")


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
  return os.path.join("/tmp", f"{args.remote_dir}-{args.tpu}.tar.gz")


def setup_commands(args: argparse.Namespace) -> list[list[str]]:
  """git archive of `--ref` -> scp to every worker -> unpack and pip install there."""
  tarball = tarball_path(args)
  remote_tar = f"{args.remote_dir}.tar.gz"
  archive = ["git", "-C", REPO_ROOT, "archive", "--format=tar.gz",
             f"--prefix={args.remote_dir}/", f"--output={tarball}", args.ref]
  scp = ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball, f"{args.tpu}:{remote_tar}",
         "--worker=all", f"--zone={args.zone}"] + (
             [f"--project={args.project}"] if args.project else [])
  install = (f"rm -rf {shlex.quote(args.remote_dir)} && tar -xzf {shlex.quote(remote_tar)} && "
             f"cd {shlex.quote(args.remote_dir)} && pip install -e '.[tpu]'")
  return [archive, scp, _ssh(args, install)]


def run_commands(args: argparse.Namespace, command: Sequence[str]) -> list[list[str]]:
  """`command` on every worker, from the code directory."""
  return [_ssh(args, f"cd {shlex.quote(args.remote_dir)} && {shlex.join(command)}")]


def sweep_commands(args: argparse.Namespace, command: Sequence[str],
                   size: int | None = None) -> list[list[str]]:
  """One `run` per sweep point (`--only_index=I`), in order; `size` defaults to the count."""
  if any(a.startswith("--only_index") for a in command):
    raise ValueError("the sweep verb adds --only_index itself; remove it from the command")
  if size is None:
    from jaxformer import sweep
    size = sweep.count_points(command)
  return [run_commands(args, [*command, f"--only_index={i}"])[0] for i in range(size)]


def commands(args: argparse.Namespace, command: Sequence[str]) -> list[list[str]]:
  """The argv lists that `args.verb` runs, in order."""
  if args.verb in ("run", "sweep") and not command:
    raise ValueError(f"`{args.verb}` needs a command after `--`, e.g. "
                     "-- python -m jaxformer.train --config=configs/gpt2.py:small --workdir=DIR")
  if args.verb not in ("run", "sweep") and command:
    raise ValueError(f"`{args.verb}` takes no command after `--`; got {shlex.join(command)!r}")
  if args.verb == "run":
    return run_commands(args, command)
  if args.verb == "sweep":
    return sweep_commands(args, command)
  return {"create": create_commands, "delete": delete_commands,
          "setup": setup_commands}[args.verb](args)


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
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  return p


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """(launcher flags, the command after the first `--`)."""
  argv = list(argv)
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []


def main(argv: Sequence[str] | None = None):
  own, command = split_command(sys.argv[1:] if argv is None else argv)
  p = parser()
  args = p.parse_args(own)
  try:
    todo = commands(args, command)
  except ValueError as e:
    p.error(str(e))
  for c in todo:
    print(shlex.join(c), flush=True)
    if not args.dry_run:
      subprocess.run(c, check=True)


if __name__ == "__main__":
  main()
