"""Sweeps: expansion and validation, skip/resume/failure handling with a fake runner, summary
files, the dry-run CLI, the shipped sweep files, one real 2-point sweep, and the driver's
ownership of its trainings (signals, orphans, one status) with a fake trainer process."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jaxformer import sweep as sweep_lib
from jaxformer.sweep import runner as sweep_runner, status as sweep_status

BASE = "configs/shakespeare_char.py:tiny"
REPO = sweep_lib.REPO_ROOT


def _sweep(**kw):
  return dict(dict(base=BASE, overrides={"train.steps": 6}), **kw)


def test_product_order_names_and_flags():
  points = sweep_lib.expand(_sweep(product={"model.d_model": [32, 64],
                                            "optim.lr": [1e-3, 3e-3, 0.01]}))
  assert [p.index for p in points] == list(range(6))
  assert [(p.swept["model.d_model"], p.swept["optim.lr"]) for p in points][:4] == [
      (32, 1e-3), (32, 3e-3), (32, 0.01), (64, 1e-3)]
  assert points[0].name == "model.d_model=32,optim.lr=0.001"
  assert points[0].flags() == ["--config.train.steps=6", "--config.model.d_model=32",
                               "--config.optim.lr=0.001"]
  assert points[3].config.model.d_model == 64 and points[3].config.optim.lr == 1e-3
  assert points[3].config.train.steps == 6
  assert points[3].params["non_embedding"] > points[0].params["non_embedding"]


def test_zip_and_product_combine_with_name_template():
  points = sweep_lib.expand(_sweep(
      product={"optim.lr": [1e-3, 2e-3]},
      zip={"model.d_model": [32, 48, 64], "model.num_heads": [2, 3, 4]},
      name="lr{optim.lr:g}_d{model.d_model}_h{model.num_heads}_{index}"))
  assert len(points) == 6
  assert [p.name for p in points[:3]] == ["lr0.001_d32_h2_0", "lr0.001_d48_h3_1",
                                          "lr0.001_d64_h4_2"]
  assert points[4].config.model.num_heads == 3 and points[4].config.optim.lr == 2e-3


def test_command_is_the_train_command(tmp_path):
  point = sweep_lib.expand(_sweep(zip={"model.norm": ["rmsnorm"]}))[0]
  assert point.name == "model.norm=rmsnorm"
  assert point.command(BASE, str(tmp_path)) == [
      sys.executable, "-m", "jaxformer.train",
      f"--config={os.path.join(REPO, 'configs/shakespeare_char.py')}:tiny",
      f"--workdir={tmp_path / 'model.norm=rmsnorm'}", "--config.train.steps=6",
      "--config.model.norm=rmsnorm"]


@pytest.mark.parametrize("spec, match", [
    (dict(product={"model.d_modl": [32]}), "model.d_modl"),
    (dict(product={"modle.d_model": [32]}), "modle.d_model"),
    (dict(zip={"model.d_model": [32, 64], "optim.lr": [1e-3]}), "equal lengths"),
    (dict(), "empty"),
    (dict(product={"optim.lr": []}), r"product\['optim.lr'\]"),
    (dict(product={"optim.lr": [1e-3]}, zip={"optim.lr": [1e-3]}), "given twice"),
    (dict(product={"model.d_model": [30]}), "d_model"),            # 4 heads do not divide 30
    (dict(product={"model.d_model": ["wide"]}), "d_model"),
    (dict(product={"model.norm": [3]}), "model.norm"),             # int for a str field
    (dict(product={"optim.lr": [1e-3, 2e-3]}, name="same"), "repeat"),
    (dict(product={"optim.lr": [1e-3]}, name="{optim.beta}"), "template"),
    (dict(product={"optim.lr": [1e-3]}, typo=1), "typo"),
    # train's own range checks (config_checks.validate), for every point
    (dict(product={"optim.lr": [1e-3, 0.0]}), r"optim\.lr=0\.0.*finite number > 0"),
    (dict(zip={"train.batch_size": [8, 0]}), r"train\.batch_size=0"),
    (dict(product={"optim.b2": [0.99, 1.0]}), r"optim\.b2=1\.0"),
])
def test_invalid_sweeps_raise_before_running(spec, match):
  with pytest.raises(ValueError, match=match):
    sweep_lib.expand(_sweep(**spec))


def test_a_point_train_would_refuse_stops_the_sweep_before_any_point_runs(tmp_path):
  runner = FakeRunner()
  with pytest.raises(ValueError, match=r"sweep point 'lr0'.*optim\.lr=0\.0"):
    sweep_lib.run(_sweep(product={"optim.lr": [1e-3, 0.0]}, name="lr{optim.lr:g}"),
                  str(tmp_path), runner=runner)
  assert runner.calls == [] and os.listdir(tmp_path) == []


class FakeRunner:
  """Writes metrics.jsonl like train would: `stop_at` steps first (an interrupted run),
  fails for names in `fail`."""

  def __init__(self, steps=6, stop_at=None, fail=()):
    self.steps, self.stop_at, self.fail, self.calls = steps, stop_at, set(fail), []

  def __call__(self, command, log_path):
    workdir = next(a.split("=", 1)[1] for a in command if a.startswith("--workdir="))
    name = os.path.basename(workdir)
    self.calls.append(name)
    with open(log_path, "a") as f:
      f.write("fake run\n")
    if name in self.fail:
      return 1
    path = os.path.join(workdir, "metrics.jsonl")
    done = max((r["step"] for r in sweep_lib.read_metrics(workdir)), default=0)
    last = self.steps if self.stop_at is None else self.stop_at
    with open(path, "a") as f:
      for step in range(done + 1, last + 1):
        f.write(json.dumps({"step": step, "loss": 5.0 - step / 10}) + "\n")
        if step in (3, self.steps):
          f.write(json.dumps({"step": step, "eval_loss": 4.0 - step / 10,
                              "eval_accuracy": step / 100}) + "\n")
    return 0


def test_skip_finished_resume_interrupted_and_record_failures(tmp_path):
  spec = _sweep(product={"optim.lr": [1e-3, 2e-3, 3e-3]}, name="lr{optim.lr:g}")
  runner = FakeRunner(stop_at=3, fail={"lr0.002"})
  rows = sweep_lib.run(spec, str(tmp_path), runner=runner)
  assert runner.calls == ["lr0.001", "lr0.002", "lr0.003"]
  assert [r["status"] for r in rows] == ["incomplete", "failed", "incomplete"]
  assert rows[0]["final_step"] == 3 and rows[0]["eval_loss"] == pytest.approx(3.7)
  assert json.load(open(tmp_path / "lr0.002" / "sweep.json"))["returncode"] == 1

  runner.fail, runner.stop_at = set(), None
  rows = sweep_lib.run(spec, str(tmp_path), runner=runner, parallel=2)
  assert sorted(runner.calls[3:]) == ["lr0.001", "lr0.002", "lr0.003"]
  assert [r["status"] for r in rows] == ["done"] * 3
  records = sweep_lib.read_metrics(str(tmp_path / "lr0.001"))
  assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]    # resumed

  sweep_lib.run(spec, str(tmp_path), runner=runner)
  assert len(runner.calls) == 6                                               # all skipped


def test_summary_files(tmp_path):
  spec = _sweep(product={"model.d_model": [32, 64]}, name="d{model.d_model}")
  sweep_lib.run(spec, str(tmp_path), runner=FakeRunner(fail={"d64"}))
  rows = json.load(open(tmp_path / "summary.json"))
  points = sweep_lib.expand(spec)
  assert [r["name"] for r in rows] == ["d32", "d64"]
  done, failed = rows
  assert done["overrides"] == {"train.steps": 6, "model.d_model": 32}
  assert (done["status"], done["final_step"]) == ("done", 6)
  assert done["loss"] == pytest.approx(4.4) and done["eval_loss"] == pytest.approx(3.4)
  assert done["eval_accuracy"] == pytest.approx(0.06)
  assert done["params"] == points[0].params["non_embedding"]
  assert done["params_total"] == points[0].params["total"]
  assert done["tokens"] == 6 * 8 * 32                       # steps x batch x seq_len (tiny)
  assert done["wall_time_s"] >= 0
  assert failed["status"] == "failed" and failed["final_step"] is None
  assert failed["log"] == str(tmp_path / "d64" / "train.log")
  table = list(csv.DictReader(open(tmp_path / "summary.csv")))
  assert table[0]["model.d_model"] == "32" and table[0]["status"] == "done"
  assert float(table[0]["eval_loss"]) == pytest.approx(3.4)
  assert table[1]["status"] == "failed" and table[1]["loss"] == ""
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_only_and_only_index_select_points(tmp_path):
  spec = _sweep(product={"optim.lr": [1e-3, 2e-3, 3e-3]}, name="lr{optim.lr:g}")
  runner = FakeRunner()
  sweep_lib.run(spec, str(tmp_path), runner=runner, only_index=1)
  sweep_lib.run(spec, str(tmp_path), runner=runner, only="*3")
  assert runner.calls == ["lr0.002", "lr0.003"]
  statuses = [r["status"] for r in json.load(open(tmp_path / "summary.json"))]
  assert statuses == ["pending", "done", "done"]
  with pytest.raises(ValueError, match="only_index=3"):
    sweep_lib.run(spec, str(tmp_path), runner=runner, only_index=3)
  with pytest.raises(ValueError, match="matches no point"):
    sweep_lib.run(spec, str(tmp_path), runner=runner, only="x*")
  with pytest.raises(ValueError, match="parallel"):
    sweep_lib.run(spec, str(tmp_path), runner=runner, parallel=0)


def test_shipped_sweeps_are_valid():
  lr_width = sweep_lib.expand(sweep_lib.load_sweep("configs/sweeps/lr_width.py"))
  assert len(lr_width) == 6
  assert {p.config.model.mlp_dim for p in lr_width} == {128, 256}
  with pytest.raises(ValueError, match="shakespeare_char size"):
    sweep_lib.load_sweep("configs/sweeps/lr_width.py:huge")


def test_scaling_gpt_sweep_follows_kaplan_protocol(tmp_path):
  """The trunks of the wsd doubling study: >= 6 sizes of >= 2 layers over >= 30x, seeds at
  3 sizes, the width LR rule, a wsd schedule whose stable checkpoint is kept for the next
  length's branch, and the same warmup at every length of a chain."""
  from configs.sweeps import scaling_gpt

  corpus = tmp_path / "corpus.txt"
  corpus.write_text("def f(x):\n  return x + 1\n" * 50)
  points = sweep_lib.expand(sweep_lib.load_sweep(
      f"configs/sweeps/scaling_gpt.py:source={corpus}"))
  points.sort(key=lambda p: p.params["non_embedding"])
  sizes = sorted({p.params["non_embedding"] for p in points})
  assert len(sizes) >= 6 and max(sizes) >= 30 * min(sizes)
  assert all(p.config.model.num_layers >= 2 for p in points)     # Kaplan: 1-layer is off-trend
  seeds = {}
  for p in points:
    c = p.config
    seeds.setdefault(c.model.d_model, set()).add(c.train.seed)
    assert c.data.source == str(corpus) and c.model.vocab_size == len(set(corpus.read_text()))
    assert c.optim.schedule == "wsd" and c.train.steps == scaling_gpt.BASE_STEPS
    assert c.train.checkpoint_steps == (scaling_gpt.decay_start(c.train.steps),)
    assert c.train.steps % c.train.eval_every == 0
  assert sum(len(s) == 3 for s in seeds.values()) >= 3
  lrs = [p.config.optim.lr for p in points]
  assert lrs == sorted(lrs, reverse=True)                         # the width rule
  values = scaling_gpt.parse_arg(f"source={corpus}")
  longer = sweep_lib.expand(scaling_gpt.sweep_of(values, [((2, 16), 1, 4 * 1200)]))[0]
  assert longer.config.optim.warmup_steps == points[0].config.optim.warmup_steps
  assert longer.name == "L2_d16_lr0.0191_seed1_warm60_s4800"
  half = sweep_lib.expand(sweep_lib.load_sweep(
      f"configs/sweeps/scaling_gpt.py:source={corpus},scale=0.5,lr=0.002,seeds=2"),
      validate=False)
  assert {p.overrides["train.steps"] for p in half} == {600}
  assert {p.overrides["optim.lr"] for p in half} == {0.002} and len(half) == 9
  with pytest.raises(ValueError, match="source=PATH"):
    sweep_lib.load_sweep("configs/sweeps/scaling_gpt.py:scale=1")
  with pytest.raises(ValueError, match="key one of"):
    sweep_lib.load_sweep(f"configs/sweeps/scaling_gpt.py:source={corpus},steps=5")


def _write_sweep_file(tmp_path, body: str) -> str:
  path = tmp_path / "my_sweep.py"
  path.write_text(f"def get_sweep(arg=None):\n  return {body}\n")
  return str(path)


def test_cli_dry_run_prints_commands_and_writes_nothing(tmp_path):
  path = _write_sweep_file(tmp_path, "dict(base='configs/shakespeare_char.py:tiny', "
                                     "product={'optim.lr': [0.001, 0.002]})")
  workdir = tmp_path / "out"
  result = subprocess.run(
      [sys.executable, "-m", "jaxformer.sweep", f"--config={path}", f"--workdir={workdir}",
       "--dry_run"], capture_output=True, text=True, cwd=REPO, check=True)
  lines = result.stdout.strip().splitlines()
  assert len(lines) == 2 and "--only_index" not in result.stdout
  assert lines[1].endswith(f"--workdir={workdir}/optim.lr=0.002 --config.optim.lr=0.002")
  assert " -m jaxformer.train --config=" in lines[0]
  assert not workdir.exists()


def test_cli_rejects_an_invalid_sweep(tmp_path):
  path = _write_sweep_file(tmp_path, "dict(base='configs/shakespeare_char.py:tiny', "
                                     "zip={'optim.lr': [1, 2], 'train.seed': [0]})")
  result = subprocess.run(
      [sys.executable, "-m", "jaxformer.sweep", f"--config={path}",
       f"--workdir={tmp_path / 'out'}"], capture_output=True, text=True, cwd=REPO)
  assert result.returncode != 0 and "equal lengths" in result.stderr
  assert not (tmp_path / "out").exists()


# Two real 4-step points cost ~14 s of CPU each (process start, data, compile).
@pytest.mark.slow
def test_end_to_end_two_real_points(tmp_path):
  spec = dict(base=BASE, product={"optim.lr": [1e-3, 3e-3]}, name="lr{optim.lr:g}",
              overrides={"train.steps": 4, "data.eval_batches": 2, "train.sample_tokens": 0})
  rows = sweep_lib.run(spec, str(tmp_path))
  assert [r["status"] for r in rows] == ["done", "done"], open(rows[0]["log"]).read()[-2000:]
  assert all(r["final_step"] == 4 and r["eval_loss"] > 0 for r in rows)
  assert rows[0]["loss"] != rows[1]["loss"]                 # the lr override reached train
  rows = sweep_lib.run(spec, str(tmp_path), runner=FakeRunner(fail={"lr0.001", "lr0.003"}))
  assert [r["status"] for r in rows] == ["done", "done"]   # finished: runner not called


# --- The driver owns its trainings: signals, orphans, one status (issue #26) -------------------
# A stand-in for `python -m jaxformer.train` (a real training costs ~15 s of CPU): the same
# --workdir= argument and workdir lock, one metrics record at start, then it waits for a `go`
# file (finishing the run) or a stop signal (exit 0, as train does after saving). Every signal
# it gets is appended to signals.jsonl; a `stubborn` file in its workdir makes it ignore them
# (a save that hangs).
FAKE_TRAINER = r'''
import json, os, signal, sys, time
from jaxformer.train import workdir as workdir_lib

args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
workdir = args["workdir"]
steps = int(args.get("config.train.steps", 6))
received = []

def handle(signum, frame):
  received.append(signum)
  with open(os.path.join(workdir, "signals.jsonl"), "a") as f:
    f.write(json.dumps(signum) + "\n")

def write(record):
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")

os.makedirs(workdir, exist_ok=True)
try:
  lock = workdir_lib.Lock(workdir).__enter__()
except ValueError as e:
  sys.exit(f"error: {e}")
for sig in (signal.SIGTERM, signal.SIGINT):
  signal.signal(sig, handle)
write({"step": 1, "loss": 1.0})
with open(os.path.join(workdir, "started"), "w") as f:
  f.write(str(os.getpid()))
stubborn = os.path.exists(os.path.join(workdir, "stubborn"))
while not os.path.exists(os.path.join(workdir, "go")) and (stubborn or not received):
  time.sleep(0.02)
if not received:
  for step in range(2, steps + 1):
    write({"step": step, "loss": 1.0})
  write({"step": steps, "eval_loss": 1.0})
'''

# `python -m jaxformer.sweep` itself (absl flags, the error policy, main's exit), with the
# train command pointed at FAKE_TRAINER; validation, tested above, is stubbed so that this
# process does not load JAX.
DRIVER = r'''
import signal
import sys
# a terminal's foreground job: Ctrl-C is not ignored (a job started with `&` in a script
# inherits SIGINT ignored, which the sweep rightly leaves ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
from ml_collections import ConfigDict
from jaxformer import cli, sweep as sweep_lib
from jaxformer.sweep import __main__ as sweep_cli, config as sweep_config

fake = sys.argv.pop(1)
from jaxformer import run_settings
SETTINGS = run_settings.RunSettings(
    train=run_settings.parse_section("train", {"steps": 6, "batch_size": 8}), optim=None,
    data=run_settings.parse_section("data", {"source": "fake"}), mesh=None)
sweep_config.validated = lambda base, overrides, name: (
    ConfigDict({"train": {"steps": 6, "batch_size": 8}, "data": {}}), SETTINGS, None)
train_command = sweep_lib.Point.command
sweep_lib.Point.command = lambda self, base, workdir: [
    sys.executable, fake, *train_command(self, base, workdir)[3:]]
sweep_cli._define_flags()
cli.run_absl(sweep_cli.main)
'''



def _seeds_sweep(seeds):
  return dict(base=BASE, product={"train.seed": seeds}, name="s{train.seed}",
              overrides={"train.steps": 6})


@pytest.fixture
def fakes(tmp_path):
  """The folder of the fake trainer and driver scripts; a fake still alive at the end is
  killed (by the pid in its `started` file) so that a failing test leaves nothing running."""
  scripts = tmp_path / "scripts"
  scripts.mkdir()
  (scripts / "fake_trainer.py").write_text(FAKE_TRAINER)
  (scripts / "driver.py").write_text(DRIVER)
  yield scripts
  for started in tmp_path.glob("**/started"):
    pid = started.read_text()
    try:
      with open(f"/proc/{pid}/cmdline") as f:
        if "fake_trainer.py" in f.read():
          os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError):          # exited (or no /proc)
      pass


def _wait_for(condition, what, timeout=30.0):
  deadline = time.monotonic() + timeout
  while not condition():
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.02)


def _start_driver(tmp_path, scripts, seeds, *flags):
  sweep_file = _write_sweep_file(tmp_path, repr(_seeds_sweep(seeds)))
  return subprocess.Popen(
      [sys.executable, str(scripts / "driver.py"), str(scripts / "fake_trainer.py"),
       f"--config={sweep_file}", f"--workdir={tmp_path / 'out'}", *flags],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)          # its own process group, as a terminal's job has


def _finish(driver):
  try:
    out, err = driver.communicate(timeout=30)
  except subprocess.TimeoutExpired:
    os.killpg(driver.pid, signal.SIGKILL)
    out, err = driver.communicate()
    pytest.fail(f"the sweep driver did not exit:\n{out}\n{err}")
  return driver.returncode, out, err


def _statuses(out):
  """{point: status} from sweep.json, summary.json and summary.csv, which must agree."""
  summary = {r["name"]: r["status"] for r in json.load(open(out / "summary.json"))}
  table = {r["name"]: r["status"] for r in csv.DictReader(open(out / "summary.csv"))}
  assert summary == table
  for name, status in summary.items():
    if (out / name / "sweep.json").exists():
      assert json.load(open(out / name / "sweep.json"))["status"] == status, name
  return summary


def test_ctrl_c_reaches_each_training_once_starts_nothing_and_exits_130(tmp_path, fakes):
  driver = _start_driver(tmp_path, fakes, [0, 1, 2], "--parallel=2")
  out = tmp_path / "out"
  _wait_for(lambda: (out / "s0" / "started").exists() and (out / "s1" / "started").exists(),
            "two trainings to start")
  os.killpg(driver.pid, signal.SIGINT)   # a terminal's Ctrl-C: the whole foreground group
  code, stdout, stderr = _finish(driver)
  assert code == 130, stdout + stderr
  assert "Traceback" not in stderr and "stopped by SIGINT: 2 point(s) interrupted, 1 not " \
      "started" in stdout
  for name in ("s0", "s1"):          # forwarded by the driver, and only by it
    assert (out / name / "signals.jsonl").read_text().split() == [str(int(signal.SIGINT))]
    record = json.load(open(out / name / "sweep.json"))
    assert (record["signal"], record["returncode"]) == ("SIGINT", 0)
  assert not (out / "s2").exists()
  assert _statuses(out) == {"s0": "interrupted", "s1": "interrupted", "s2": "pending"}


def test_sigterm_stops_the_sweep_and_a_second_one_kills_a_hung_training(tmp_path, fakes):
  out = tmp_path / "out"
  (out / "s1").mkdir(parents=True)
  (out / "s1" / "stubborn").touch()        # s1 never finishes saving
  driver = _start_driver(tmp_path, fakes, [0, 1], "--parallel=2")
  _wait_for(lambda: (out / "s0" / "started").exists() and (out / "s1" / "started").exists(),
            "two trainings to start")
  driver.send_signal(signal.SIGTERM)       # the driver alone, as a scheduler stops a job
  _wait_for(lambda: (out / "s0" / "sweep.json").exists() and
            (out / "s1" / "signals.jsonl").exists(), "s0 to stop and s1 to get SIGTERM")
  assert driver.poll() is None             # still waiting for s1
  driver.send_signal(signal.SIGTERM)
  code, stdout, stderr = _finish(driver)
  assert code == 143 and "Traceback" not in stderr, stdout + stderr
  assert json.load(open(out / "s0" / "sweep.json"))["returncode"] == 0
  killed = json.load(open(out / "s1" / "sweep.json"))
  assert (killed["signal"], killed["returncode"]) == ("SIGTERM", -signal.SIGKILL)
  with pytest.raises(ProcessLookupError):
    os.kill(int((out / "s1" / "started").read_text()), 0)
  assert _statuses(out) == {"s0": "interrupted", "s1": "interrupted"}


def test_rerun_after_the_driver_was_killed_never_starts_a_second_training(
    tmp_path, fakes, monkeypatch, capsys):
  out = tmp_path / "out"
  driver = _start_driver(tmp_path, fakes, [0, 1], "--parallel=2")
  _wait_for(lambda: (out / "s0" / "started").exists() and (out / "s1" / "started").exists(),
            "two trainings to start")
  driver.kill()                            # SIGKILL the driver alone: its trainings live on
  driver.communicate()
  orphans = {name: int((out / name / "started").read_text()) for name in ("s0", "s1")}

  spec = _seeds_sweep([0, 1])
  train_command = sweep_lib.Point.command
  monkeypatch.setattr(sweep_lib.Point, "command", lambda self, base, workdir: [
      sys.executable, str(fakes / "fake_trainer.py"), *train_command(self, base, workdir)[3:]])
  started = []

  def runner(command, log):
    started.append(command)
    return sweep_lib.subprocess_runner(command, log)

  # Waiting (the default): s0's orphan finishes meanwhile; the point is done, never failed.
  monkeypatch.setattr(sweep_runner, "WAIT_POLL_S", 0.05)
  ask, held = sweep_status.lock_holder, []

  def lock_holder(point_dir):              # let s0's orphan finish once the sweep waits on it
    owner = ask(point_dir)
    if owner and point_dir.endswith("s0"):
      held.append(owner)
      if len(held) == 2:                   # the initial summary asked, then the point did
        (out / "s0" / "go").touch()
    return owner
  monkeypatch.setattr(sweep_status, "lock_holder", lock_holder)
  rows = sweep_lib.run(spec, str(out), runner=runner, only="s0")
  printed = capsys.readouterr().out
  assert f"pid {orphans['s0']} on " in printed and "waiting for it to exit" in printed
  assert "finished by the other training, skipped" in printed
  assert started == [] and rows[0]["status"] == "done"
  assert json.load(open(out / "s0" / "sweep.json"))["trained_by"].startswith(
      f"pid {orphans['s0']} on ")
  assert _statuses(out) == {"s0": "done", "s1": "running"}

  # --if_running=skip: one line naming the point, the pid and what to do; nothing started.
  rows = sweep_lib.run(spec, str(out), runner=runner, only="s1", if_running="skip")
  lines = [l for l in capsys.readouterr().out.splitlines() if "s1:" in l]
  assert len(lines) == 1 and f"pid {orphans['s1']} on " in lines[0]
  assert f"kill {orphans['s1']}" in lines[0] and "not started (--if_running=skip)" in lines[0]
  assert started == [] and rows[0]["status"] == "running"
  assert _statuses(out) == {"s0": "done", "s1": "running"}
  os.kill(orphans["s1"], 0)                # left alone


@pytest.mark.parametrize("facts, status", [
    (dict(finished=True, owner="pid 1 on h", record={"returncode": 1}), "done"),
    (dict(owner="pid 1 on h", record={"returncode": 2}), "running"),   # lost the lock race
    (dict(record={"returncode": -9, "signal": "SIGTERM"}), "interrupted"),
    (dict(record={"returncode": 0, "signal": "SIGINT"}), "interrupted"),
    (dict(record={"returncode": 1}), "failed"),
    (dict(record={"returncode": 0}, trained=True), "incomplete"),
    (dict(trained=True), "incomplete"),    # e.g. its driver was killed, then the training
    (dict(), "pending"),
])
def test_point_status_is_decided_in_one_place(facts, status):
  facts = dict(dict(finished=False, owner=None, record={}, trained=False), **facts)
  assert sweep_lib.point_status(**facts) == status


def test_sweep_json_follows_a_point_finished_by_hand(tmp_path):
  spec = _sweep(product={"optim.lr": [1e-3, 2e-3]}, name="lr{optim.lr:g}")
  runner = FakeRunner(stop_at=3)
  sweep_lib.run(spec, str(tmp_path), runner=runner, only="lr0.001")
  record = json.load(open(tmp_path / "lr0.001" / "sweep.json"))
  assert record["status"] == "incomplete"
  runner.stop_at = None
  runner(["train", f"--workdir={tmp_path / 'lr0.001'}"], str(tmp_path / "by_hand.log"))
  sweep_lib.run(spec, str(tmp_path), runner=runner, only="lr0.002")
  assert _statuses(tmp_path) == {"lr0.001": "done", "lr0.002": "done"}
  assert json.load(open(tmp_path / "lr0.001" / "sweep.json"))["status"] == "done"


def test_cli_rejects_a_bad_if_running_in_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "jaxformer.sweep", "--config=x.py", f"--workdir={tmp_path}",
       "--if_running=later"], capture_output=True, text=True, cwd=REPO)
  assert result.returncode == 2 and result.stdout == ""
  assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
  assert "if_running" in result.stderr and "wait" in result.stderr
