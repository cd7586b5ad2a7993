"""TPU and Slurm launchers: exact gcloud argv, sbatch script contents, quoting, dry runs."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from jaxformer import sweep as sweep_lib
from launch import slurm, tpu, tpu_install

TRAIN = ["python", "-m", "jaxformer.train", "--config=configs/gpt2.py:small",
         "--workdir=gs://bucket/my run"]
GCLOUD = ["gcloud", "compute", "tpus", "tpu-vm"]


def _tpu_args(verb, *extra):
  return tpu.parser().parse_args([verb, "--tpu=pod", "--zone=us-west4-a", *extra])


def test_create_and_delete_commands():
  args = _tpu_args("create", "--accelerator=v5litepod-16", "--version=v2-alpha-tpuv5-lite",
                   "--project=proj", "--spot")
  assert tpu.commands(args, []) == [GCLOUD + [
      "create", "pod", "--zone=us-west4-a", "--project=proj", "--accelerator-type=v5litepod-16",
      "--version=v2-alpha-tpuv5-lite", "--spot"]]
  assert tpu.commands(_tpu_args("create", "--preemptible"), [])[0][-1] == "--preemptible"
  assert tpu.commands(_tpu_args("delete"), []) == [
      GCLOUD + ["delete", "pod", "--zone=us-west4-a", "--quiet"]]
  with pytest.raises(ValueError, match="exclusive"):
    tpu.commands(_tpu_args("create", "--spot", "--preemptible"), [])
  with pytest.raises(ValueError, match="no command"):
    tpu.commands(_tpu_args("delete"), ["ls"])


def test_setup_ships_a_git_archive_and_installs():
  archive, scp, ssh = tpu.commands(_tpu_args("setup", "--ref=v1"), [])
  assert archive == ["git", "-C", tpu.REPO_ROOT, "archive", "--format=tar.gz",
                     "--prefix=jaxformer/", f"--add-file={tpu.INSTALLER}",
                     "--output=/tmp/jaxformer-pod.tar.gz", "v1"]
  assert scp == GCLOUD + ["scp", "/tmp/jaxformer-pod.tar.gz",
                          "pod:.jaxformer-setup-jaxformer.tar.gz", "--worker=all",
                          "--zone=us-west4-a"]
  assert ssh[:-1] == GCLOUD + ["ssh", "pod", "--zone=us-west4-a", "--worker=all"]
  remote = shlex.split(ssh[-1].removeprefix("--command="))
  assert remote[:2] == ["python3", "-c"] and "rm" not in remote
  assert remote[3:] == [".jaxformer-setup-jaxformer.tar.gz", "jaxformer", "&&", "cd",
                        "jaxformer", "&&", "pip", "install", "-e", ".[tpu]"]


def _archive(path, files: dict, commit="c1"):
  """A tarball laid out as `git archive --prefix=jaxformer/` writes it."""
  with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT,
                    pax_headers={"comment": commit}) as tar:
    for name, text in files.items():
      data = text.encode()
      info = tarfile.TarInfo(f"jaxformer/{name}")
      info.size, info.mode = len(data), 0o644
      tar.addfile(info, io.BytesIO(data))
  return str(path)


def _tree(root):
  return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f)).read()
          for d, _, files in os.walk(root) for f in files if f != tpu_install.MARKER}


def test_setup_installer_never_deletes_or_overwrites_what_it_did_not_write(tmp_path):
  """Before: setup ran `rm -rf ~/jaxformer`, deleting a relative --workdir's checkpoints
  there. Now only files of its own install are replaced or removed; anything else in the
  way refuses the install with nothing changed."""
  target = str(tmp_path / "jaxformer")
  v1 = {"README.md": "v1", "jaxformer/a.py": "a1", "jaxformer/old/gone.py": "x"}
  assert "3 file(s) written" in tpu_install.install(_archive(tmp_path / "1.tgz", v1), target)
  assert _tree(target) == v1
  run = {"runs/shakespeare/checkpoints/8/state": "ckpt", "notes.txt": "mine",
         "jaxformer/a.py.orig": "user"}
  for name, text in run.items():
    os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
    open(os.path.join(target, name), "w").write(text)
  v2 = {"README.md": "v1", "jaxformer/a.py": "a2", "jaxformer/b.py": "b2"}
  line = tpu_install.install(_archive(tmp_path / "2.tgz", v2, "c2"), target)
  assert line == ("installed c2 into " + target + ": 2 file(s) written, 1 removed, "
                  "1 unchanged")
  assert _tree(target) == {**v2, **run}           # the run and the user's files stay
  assert not os.path.exists(os.path.join(target, "jaxformer", "old"))   # emptied: pruned
  # refused, with nothing changed: a file it wrote and the user changed since, a user file
  # where the archive has one, a target from before the marker whose files differ
  open(os.path.join(target, "jaxformer", "a.py"), "w").write("edited on the worker")
  before = _tree(target)
  v3 = {"README.md": "v3", "jaxformer/a.py": "a3", "notes.txt": "tracked now"}
  with pytest.raises(tpu_install.Refused) as info:
    tpu_install.install(_archive(tmp_path / "3.tgz", v3), target)
  message = str(info.value)
  assert "1 file(s) it installed were changed since (jaxformer/a.py)" in message
  assert "1 path(s) it did not install are in the way (notes.txt)" in message
  assert "nothing was changed" in message and _tree(target) == before
  os.remove(os.path.join(target, tpu_install.MARKER))        # as an older launcher left it
  with pytest.raises(tpu_install.Refused, match="in the way"):
    tpu_install.install(_archive(tmp_path / "4.tgz", v2), target)
  assert _tree(target) == before
  # files that already are the archive's are adopted (a rerun after an interrupted install)
  fresh = str(tmp_path / "fresh")
  os.makedirs(os.path.join(fresh, "jaxformer"))
  open(os.path.join(fresh, "jaxformer", "a.py"), "w").write("a2")
  assert "1 unchanged" in tpu_install.install(_archive(tmp_path / "5.tgz", v2), fresh)


def test_setup_remote_command_keeps_a_run_in_the_code_directory(tmp_path):
  """The rendered archive and remote install commands, run here against a temp HOME with a
  run's workdir inside the default code directory (~/jaxformer/runs/...), twice."""
  if subprocess.run(["git", "-C", tpu.REPO_ROOT, "rev-parse"], capture_output=True).returncode:
    pytest.skip("not a git checkout")
  args = _tpu_args("setup")
  archive, _, ssh = tpu.commands(args, [])
  tarball = str(tmp_path / "code.tar.gz")
  archive = [a if not a.startswith("--output=") else f"--output={tarball}" for a in archive]
  if subprocess.run(archive, capture_output=True).returncode:
    pytest.skip("git archive has no --add-file (git < 2.35)")
  home, bin_dir = tmp_path / "home", tmp_path / "bin"
  home.mkdir(), bin_dir.mkdir()
  (bin_dir / "pip").write_text(f"#!/bin/sh\necho \"pip $* in $PWD\" >> {home}/pip.log\n")
  (bin_dir / "pip").chmod(0o755)
  env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
  remote = ssh[-1].removeprefix("--command=")
  checkpoint = home / "jaxformer" / "runs" / "tiny" / "checkpoints" / "8" / "state"
  for attempt in range(2):
    shutil.copy(tarball, home / tpu.remote_tarball(args))      # what scp puts there
    done = subprocess.run(["sh", "-c", remote], cwd=home, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert (home / "jaxformer" / "jaxformer" / "train" / "loop.py").exists()
    assert not (home / tpu.remote_tarball(args)).exists()
    if attempt == 0:
      checkpoint.parent.mkdir(parents=True)
      checkpoint.write_text("kept")
  assert checkpoint.read_text() == "kept"
  assert (home / "pip.log").read_text().count(f"pip install -e .[tpu] in {home}/jaxformer") == 2
  # a code directory an older launcher made (no marker, other files): refused, kept
  (home / "jaxformer" / tpu_install.MARKER).unlink()
  (home / "jaxformer" / "README.md").write_text("older code")
  shutil.copy(tarball, home / tpu.remote_tarball(args))
  done = subprocess.run(["sh", "-c", remote], cwd=home, env=env, capture_output=True,
                        text=True)
  assert done.returncode == 3 and "README.md" in done.stderr and "nothing was changed" in \
      done.stderr
  assert checkpoint.read_text() == "kept" and (home / "pip.log").read_text().count("pip") == 2


def test_run_quotes_the_command_for_the_remote_shell():
  [ssh] = tpu.commands(_tpu_args("run"), TRAIN)
  assert ssh[:7] == GCLOUD + ["ssh", "pod", "--zone=us-west4-a"]
  assert ssh[7] == "--worker=all"
  remote = shlex.split(ssh[8].removeprefix("--command="))
  assert remote[:4] == ["cd", "jaxformer", "||", "exit"]
  start = remote.index("setsid")
  assert remote[start + 1:start + 1 + len(TRAIN)] == TRAIN     # the worker's shell gets TRAIN
  assert remote[start + 1 + len(TRAIN)] == "&"
  with pytest.raises(ValueError, match="needs a command"):
    tpu.commands(_tpu_args("run"), [])


FAKE_GCLOUD = """#!{python}
# gcloud compute tpus tpu-vm ssh NAME --zone=Z --worker=all --command=C: C in `sh -c` on every
# fake worker at once (HOME=$FAKE_TPU_ROOT/w<i>), output passed through; exit 1 if any failed
import os, subprocess, sys
args = sys.argv[1:]
assert args[:4] == ["compute", "tpus", "tpu-vm", "ssh"] and "--worker=all" in args, args
command = [a for a in args if a.startswith("--command=")][0].split("=", 1)[1]
root = os.environ["FAKE_TPU_ROOT"]
procs = []
for w in range(int(os.environ["FAKE_TPU_WORKERS"])):
  home = os.path.join(root, f"w{{w}}")
  os.makedirs(os.path.join(home, "jaxformer"), exist_ok=True)
  procs.append(subprocess.Popen(["sh", "-c", command], cwd=home,
                                env={{**os.environ, "HOME": home, "FAKE_WORKER": str(w)}}))
sys.exit(1 if any([p.wait() for p in procs]) else 0)
"""

# each worker runs until stopped (noting the SIGTERM), but with FAKE_FAIL set worker 1 fails
# (exit 3) once worker 0 is ready to be stopped
WORKER = """
import os, signal, sys, time
root, me = os.environ["FAKE_TPU_ROOT"], os.environ["FAKE_WORKER"]
def stopped(signum, frame):
  open(os.path.join(os.environ["HOME"], "stopped"), "w").write(str(signum))
  sys.exit(143)
if me == "1" and os.environ.get("FAKE_FAIL"):
  while not os.path.exists(os.path.join(root, "ready0")):
    time.sleep(0.05)
  print("worker 1 fails", flush=True)
  sys.exit(3)
signal.signal(signal.SIGTERM, stopped)
open(os.path.join(root, "ready" + me), "w").close()
time.sleep(90)
"""


@pytest.mark.parametrize("fail", [True, False])
def test_run_stops_every_worker_when_one_fails(tmp_path, fail):
  """Before: one `ssh --worker=all`; gcloud waits for every worker, so a failed worker left
  the others running (hung in their collectives), and a Ctrl-C to the launcher left every
  worker's command running. Now the failing worker's tagged line (or a SIGTERM/SIGINT to the
  launcher) makes the launcher SIGTERM the command on every worker; it exits with the
  failure's status (143 for its own SIGTERM). A fake gcloud runs the remote commands here
  (2 workers)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "gcloud").write_text(FAKE_GCLOUD.format(python=sys.executable))
  (bin_dir / "gcloud").chmod(0o755)
  root = tmp_path / "workers"
  env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_TPU_ROOT": str(root),
         "FAKE_TPU_WORKERS": "2", **({"FAKE_FAIL": "1"} if fail else {})}
  launcher = subprocess.Popen(
      [sys.executable, "-m", "launch.tpu", "run", "--tpu=pod", "--zone=z", "--stop_grace=20",
       "--", sys.executable, "-c", WORKER], cwd=tpu.REPO_ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    if not fail:
      while not all((root / f"ready{w}").exists() for w in range(2)):
        assert launcher.poll() is None, launcher.stdout.read()
        time.sleep(0.05)
      launcher.send_signal(signal.SIGTERM)
    out, _ = launcher.communicate(timeout=60)       # a hang guard: the workers sleep 90 s
  finally:
    launcher.kill()
  assert launcher.returncode == (3 if fail else 128 + signal.SIGTERM), out
  stopped = [w for w in range(2) if (root / f"w{w}" / "stopped").exists()]
  assert stopped == ([0] if fail else [0, 1])
  assert all((root / f"w{w}" / "stopped").read_text() == str(int(signal.SIGTERM))
             for w in stopped)
  why = r"\S+ exited with status 3" if fail else "got SIGTERM"
  assert re.search(rf"launch.tpu: {why}: stopping the command on every worker", out), out
  assert "SIGKILL to" not in out                      # it stopped within the grace
  assert not list((root / "w0" / ".jaxformer-launch").glob("*.pid"))


def _slurm_args(*flags):
  return slurm.parser().parse_args(list(flags))


def test_sbatch_script_for_multi_node_training():
  args = _slurm_args("--nodes=2", "--ntasks-per-node=4", "--gpus_per_node=4",
                     "--cpus_per_task=12", "--time=1-02:00:00", "--partition=gpu",
                     "--account=lab", "--module=cuda/12.4", "--venv=/opt/my env",
                     "--env=XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true a")
  lines = slurm.render(args, TRAIN).splitlines()
  assert lines[0] == "#!/bin/bash"
  assert [l for l in lines if l.startswith("#SBATCH")] == [
      "#SBATCH --job-name=jaxformer", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
      "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=12", "#SBATCH --time=1-02:00:00",
      "#SBATCH --output=slurm_logs/%x-%j.out", "#SBATCH --partition=gpu",
      "#SBATCH --account=lab"]
  assert "module load cuda/12.4" in lines
  assert "source '/opt/my env/bin/activate'" in lines
  assert "export XLA_FLAGS='--xla_gpu_enable_latency_hiding_scheduler=true a'" in lines
  assert lines[-1] == ("srun --kill-on-bad-exit=1 python -m jaxformer.train "
                       "--config=configs/gpt2.py:small '--workdir=gs://bucket/my run'")
  assert shlex.split(lines[-1])[2:] == TRAIN
  assert not any("--array" in l for l in lines)


def test_sbatch_job_array_for_a_sweep():
  command = ["python", "-m", "jaxformer.sweep", "--config=configs/sweeps/lr_width.py",
             "--workdir=/scratch/sw"]
  script = slurm.render(_slurm_args("--max_parallel=2", "--gpus_per_node=0"), command)
  lines = script.splitlines()
  assert "#SBATCH --array=0-5%2" in lines                       # lr_width has 6 points
  assert "#SBATCH --output=slurm_logs/%x-%A_%a.out" in lines
  assert not any("gpus-per-node" in l for l in lines)
  assert lines[-1] == ("srun --kill-on-bad-exit=1 python -m jaxformer.sweep "
                       "--config=configs/sweeps/lr_width.py --workdir=/scratch/sw "
                       '--only_index="$SLURM_ARRAY_TASK_ID"')
  assert "#SBATCH --array=0-2" in slurm.render(_slurm_args(), command, array_size=3)


@pytest.mark.parametrize("flags, command, match", [
    ((), [], "after `--`"),
    (("--time=soon",), TRAIN, "--time"),
    (("--nodes=0",), TRAIN, "--nodes"),
    (("--env=1X=2",), TRAIN, "NAME=VALUE"),
    ((), ["python", "-m", "jaxformer.sweep", "--config=x.py", "--only_index=0"], "only_index"),
])
def test_bad_slurm_input(flags, command, match):
  with pytest.raises(ValueError, match=match):
    slurm.render(_slurm_args(*flags), command, array_size=1)


def test_slurm_cli_writes_or_prints(tmp_path, capsys, monkeypatch):
  out = tmp_path / "job.sbatch"
  calls = []
  monkeypatch.setattr(slurm.subprocess, "run", lambda c, check: calls.append((c, check)))
  monkeypatch.chdir(tmp_path)
  slurm.main(["--nodes=2", f"--out={out}", "--submit", "--", *TRAIN])
  assert out.read_text() == slurm.render(_slurm_args("--nodes=2"), TRAIN)
  assert calls == [(["sbatch", str(out)], True)] and (tmp_path / "slurm_logs").is_dir()
  slurm.main(["--", *TRAIN])
  assert capsys.readouterr().out.endswith(shlex.join(TRAIN) + "\n")
  with pytest.raises(SystemExit):
    slurm.main(["--submit", "--", *TRAIN])


@pytest.mark.parametrize("flags, want", [
    ((), ["1 node(s) x 1 task(s) = 1 process(es), 8 GPU(s) per process",
          "task 0: local_device_ids=[0, 1, 2, 3, 4, 5, 6, 7]"]),
    (("--nodes=2", "--ntasks_per_node=8"), ["= 16 process(es), 1 GPU(s) per process",
                                            "task 5: local_device_ids=[5]"]),
    (("--nodes=2", "--ntasks_per_node=8", "--gpus_per_task=1"),
     ["= 16 process(es), 1 GPU(s) per process", "task 5: local_device_ids=[0] (of its visible "
      "GPUs 5)"]),
    (("--ntasks_per_node=4",), ["task 1: local_device_ids=[2, 3]"]),
    (("--ntasks_per_node=3",), ["task 2: local_device_ids=[4, 5]",
                                "warning: 2 of 8 GPUs per node drive no process"]),
    (("--gpus_per_node=0",), ["CPU only"]),
])
def test_slurm_dry_run_prints_processes_and_their_gpus(capsys, flags, want):
  slurm.main([*flags, "--dry_run", "--", *TRAIN])
  out = capsys.readouterr().out
  assert all(w in out for w in want), out
  assert out.rstrip().endswith(shlex.join(TRAIN))
  if "--gpus_per_task=1" in flags:
    assert "#SBATCH --gpus-per-task=1" in out and "--gpus-per-node" not in out


@pytest.mark.parametrize("flags, match", [
    (("--ntasks_per_node=9",), "at most one task per GPU"),
    (("--ntasks_per_node=4", "--gpus_per_task=4"), "needs more than --gpus_per_node=8"),
    (("--gpus_per_task=0",), "--gpus_per_task=0 must be >= 1"),
])
def test_bad_slurm_layouts(flags, match):
  with pytest.raises(ValueError, match=match):
    slurm.render(_slurm_args(*flags), TRAIN)
