"""TPU and Slurm launchers: exact gcloud argv, sbatch script contents, quoting, dry runs."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from jaxformer import sweep as sweep_lib
from launch import slurm, tpu

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
                     "--prefix=jaxformer/", "--output=/tmp/jaxformer-pod.tar.gz", "v1"]
  assert scp == GCLOUD + ["scp", "/tmp/jaxformer-pod.tar.gz", "pod:jaxformer.tar.gz",
                          "--worker=all", "--zone=us-west4-a"]
  assert ssh == GCLOUD + [
      "ssh", "pod", "--zone=us-west4-a", "--worker=all",
      "--command=rm -rf jaxformer && tar -xzf jaxformer.tar.gz && cd jaxformer && "
      "pip install -e '.[tpu]'"]


def test_run_quotes_the_command_for_the_remote_shell():
  [ssh] = tpu.commands(_tpu_args("run"), TRAIN)
  assert ssh[:7] == GCLOUD + ["ssh", "pod", "--zone=us-west4-a"]
  assert ssh[7:] == ["--worker=all", "--command=cd jaxformer && python -m jaxformer.train "
                     "--config=configs/gpt2.py:small '--workdir=gs://bucket/my run'"]
  remote = ssh[-1].split("=", 1)[1]
  assert shlex.split(remote)[3:] == TRAIN                  # the worker's shell gets TRAIN back
  with pytest.raises(ValueError, match="needs a command"):
    tpu.commands(_tpu_args("run"), [])


def test_sweep_runs_one_point_per_ssh(tmp_path):
  path = tmp_path / "s.py"
  path.write_text("def get_sweep(arg=None):\n  return dict(base='configs/shakespeare_char.py',"
                  " product={'optim.lr': [1e-3, 2e-3, 3e-3]})\n")
  command = ["python", "-m", "jaxformer.sweep", f"--config={path}", "--workdir=gs://b/s"]
  assert sweep_lib.count_points(command) == 3
  ssh = tpu.commands(_tpu_args("sweep"), command)
  assert [c[-1].rsplit(" ", 1)[1] for c in ssh] == [f"--only_index={i}" for i in range(3)]
  assert ssh[0][-1].startswith(f"--command=cd jaxformer && python -m jaxformer.sweep "
                               f"--config={path} --workdir=gs://b/s")
  with pytest.raises(ValueError, match="only_index"):
    tpu.sweep_commands(_tpu_args("sweep"), [*command, "--only_index=1"], size=3)
  with pytest.raises(ValueError, match="jaxformer.sweep"):
    sweep_lib.count_points(TRAIN)


def test_tpu_cli_dry_run_prints_and_runs_nothing(monkeypatch, capsys):
  calls = []
  monkeypatch.setattr(tpu.subprocess, "run", lambda c, check: calls.append((c, check)))
  tpu.main(["run", "--tpu=pod", "--zone=z", "--dry_run", "--", *TRAIN])
  assert not calls
  printed = capsys.readouterr().out.strip()
  assert shlex.split(printed) == GCLOUD + [
      "ssh", "pod", "--zone=z", "--worker=all", "--command=cd jaxformer && " + shlex.join(TRAIN)]
  tpu.main(["delete", "--tpu=pod", "--zone=z"])
  assert calls == [(GCLOUD + ["delete", "pod", "--zone=z", "--quiet"], True)]


def test_tpu_cli_subprocess():
  result = subprocess.run([sys.executable, "-m", "launch.tpu", "create", "--tpu=p", "--zone=z",
                           "--dry_run"], capture_output=True, text=True, cwd=tpu.REPO_ROOT,
                          check=True)
  assert result.stdout == ("gcloud compute tpus tpu-vm create p --zone=z "
                           "--accelerator-type=v5litepod-16 --version=v2-alpha-tpuv5-lite\n")
  bad = subprocess.run([sys.executable, "-m", "launch.tpu", "run", "--tpu=p", "--zone=z"],
                       capture_output=True, text=True, cwd=tpu.REPO_ROOT)
  assert bad.returncode == 2 and "needs a command after `--`" in bad.stderr


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
