"""The command lines' error policy: a user mistake is one line `error: ...` and exit code 2, no
traceback, nothing written; the workdir lock, --fresh, strict metrics, data file checks."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest

from jaxformer import cli, workdir_layout
from jaxformer.state import checkpoint
from jaxformer.train import metrics, workdir as workdir_lib
from tests.runs import config_flags, tiny_run_config
from tests.repo_root import REPO

ROOT = str(REPO)
CONFIG = os.path.join(ROOT, "configs", "shakespeare_char.py") + ":tiny"


def _cli(*args, cwd=None):
  return _python("-m", *args, cwd=cwd)


def _python(*args, cwd=None):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                        cwd=cwd or ROOT, env=env, timeout=240)


def _assert_user_error(result, *fragments):
  lines = result.stderr.strip().splitlines()
  assert result.returncode == cli.EXIT_USER_ERROR, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert lines[-1].startswith("error: "), lines[-3:]
  for fragment in fragments:
    assert fragment in lines[-1], lines[-1]


def _train(workdir, *overrides):
  return _cli("jaxformer.train", f"--config={CONFIG}", f"--workdir={workdir}", *overrides)


@pytest.mark.parametrize("overrides, fragments, subprocess_", [
    (["--config.model.nonexistent=3"], ["unknown config key 'model.nonexistent'"], True),
    (["--config.optim.lrr=3"], ["did you mean --config.optim.lr?"], False),
    (["--config.train.num_heads=2"], ["did you mean --config.model.num_heads?"], False),
    (["--config.optim.lr=abc"], ["--config.optim.lr=abc", "could not convert"], False),
])
def test_train_config_mistakes_are_one_line_and_write_nothing(tmp_path, capsys, overrides,
                                                              fragments, subprocess_):
  """One through `python -m jaxformer.train` (exit 2, one line, no workdir), the others
  through its flag parsing in-process (a subprocess costs ~3 s of CPU)."""
  if subprocess_:
    result = _train(tmp_path / "run", *overrides)
    _assert_user_error(result, *fragments)
    assert not (tmp_path / "run").exists()
    return
  with pytest.raises(SystemExit) as exit_info:
    _parse_train_flags(["train", f"--config={CONFIG}", f"--workdir={tmp_path / 'run'}",
                        *overrides])
  assert exit_info.value.code == cli.EXIT_USER_ERROR
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("field, value, fragment", [
    ("lr", -0.001, "optim.lr=-0.001 must be a finite number > 0"),
    ("warmup_steps", -10, "optim.warmup_steps=-10 must be an int >= 0"),
])
def test_out_of_range_values_are_one_line_and_write_nothing(tmp_path, capsys, field, value,
                                                            fragment):
  """In-process (the same path as `python -m jaxformer.train`'s main, without a process)."""
  from configs import shakespeare_char
  from jaxformer.train import loop
  cfg = shakespeare_char.get_config("tiny")
  cfg.optim[field] = value
  with pytest.raises(SystemExit) as exit_info:
    cli.user_errors(loop.train)(cfg, str(tmp_path / "run"))
  assert exit_info.value.code == cli.EXIT_USER_ERROR
  assert capsys.readouterr().err.strip() == f"error: {fragment}; set --config.optim.{field}=<value>"
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_config_files_that_do_not_load(tmp_path):
  _assert_user_error(_cli("jaxformer.train", "--config=/no/such/config.py",
                          f"--workdir={tmp_path / 'r'}"),
                     "--config=/no/such/config.py: the config file does not load",
                     "No such file")
  _assert_user_error(_cli("jaxformer.train", f"--config={CONFIG[:-len(':tiny')]}:huge",
                          f"--workdir={tmp_path / 'r'}"),
                     "unknown shakespeare_char config 'huge'; valid names")
  _assert_user_error(_cli("jaxformer.train", f"--config={CONFIG}"), "--workdir")


def test_full_disk_is_one_clear_error(tmp_path, monkeypatch):
  import errno
  from configs import shakespeare_char
  from jaxformer.train import loop
  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))
  monkeypatch.setattr(loop, "_train", full)
  with pytest.raises(ValueError, match=r"no space left on the device of --workdir=.*"
                                       r"metrics.jsonl.*resumes from the last complete"):
    loop.train(shakespeare_char.get_config("tiny"), str(tmp_path))
  from jaxformer.inference import sample_text
  with pytest.raises(ValueError, match=r"--max_new_tokens=-5 must be an int >= 1"):
    sample_text(None, None, None, prompt="a", max_new_tokens=-5)


@contextlib.contextmanager
def _small_tmpfs(path, size: str):
  """A real file system of `size` at `path` (root only; the test is skipped elsewhere)."""
  path.mkdir()
  if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                          str(path)], capture_output=True).returncode:
    pytest.skip("mounting a small tmpfs needs root")
  try:
    yield path
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)


# The child trains with the free-space check off, so the disk fills inside Orbax's
# asynchronous writers (what happens when something else fills the disk after the check).
_UNCHECKED_TRAIN = ("import runpy, sys; from jaxformer.state import checkpoint; "
                    "checkpoint.check_free_space = lambda *a, **k: None; "
                    "sys.argv[0] = 'jaxformer.train'; "
                    "runpy.run_module('jaxformer.train', run_name='__main__')")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The metrics of an uninterrupted in-process run of a config, trained once per module
  (on first use: the full-disk cases share it)."""
  done = {}
  def records(cfg):
    key = cfg.to_json()
    if key not in done:
      from jaxformer.train import loop
      from jaxformer.train.metrics import read
      workdir = tmp_path_factory.mktemp("whole")
      loop.train(cfg, str(workdir))
      done[key] = read(workdir / "metrics.jsonl")
    return done[key]
  return records


@pytest.mark.slow
@pytest.mark.parametrize("checked", [True, False], ids=["checked_first", "fills_mid_write"])
def test_a_really_full_disk_is_one_line_and_the_rerun_resumes_identically(tmp_path, checked,
                                                                          uninterrupted):
  """A 2 MB tmpfs as the workdir fills up during the run, found by the free-space check or
  by Orbax's writers mid-checkpoint: one `error:` line naming the workdir, exit 2, no
  traceback; with space freed, the rerun resumes and writes the metrics of an uninterrupted
  run."""
  from jaxformer.train.metrics import read
  cfg = tiny_run_config(steps=16, checkpoint_every=2, keep_checkpoints=8, log_every=2,
                        eval_every=8, eval_batches=1)
  flags = config_flags(cfg)
  with _small_tmpfs(tmp_path / "disk", "2m") as disk:       # fills after ~6 checkpoints
    run = disk / "run"
    args = [f"--config={CONFIG}", f"--workdir={run}", *flags]
    result = _train(run, *flags) if checked else _python("-c", _UNCHECKED_TRAIN, *args)
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines[-1].startswith(f"error: no space left on the device of --workdir='{run}'")
    assert sum(l.startswith("error:") for l in lines) == 1
    subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
    from jaxformer.train import loop     # the rerun in this process: a JAX import less
    loop.train(cfg, str(run))            # from its last complete checkpoint
    resumed = read(run / "metrics.jsonl")
  keep = ("step", "loss", "grad_norm", "eval_loss")
  whole = uninterrupted(cfg)
  assert [{k: r[k] for k in keep if k in r} for r in resumed] == [
      {k: r[k] for k in keep if k in r} for r in whole]


@pytest.mark.slow
def test_rejected_first_attempt_does_not_block_the_corrected_rerun(tmp_path, capsys):
  run = tmp_path / "run"
  _assert_user_error(_train(run, "--config.model.vocab_size=32"),
                     "model.vocab_size=32", "--config.model.vocab_size=65")
  assert not (run / "config.json").exists()
  from jaxformer.train import loop
  cfg = tiny_run_config(steps=1, eval_every=1, log_every=1, eval_batches=1)
  assert loop.train(cfg, str(run))["step"] == 1
  assert f"{run}: starting fresh" in capsys.readouterr().out
  assert (run / "config.json").exists()


def test_bad_workdirs_and_data_files(tmp_path, capsys):
  """One through the command line (the one-line contract end to end), the others through the
  same wrapper in-process (each subprocess costs a JAX import)."""
  (tmp_path / "afile").write_text("x")
  _assert_user_error(_train(tmp_path / "afile"), "is a file, not a directory")
  from configs import shakespeare_char
  from jaxformer.train import loop

  def user_error(workdir, source=None):
    cfg = shakespeare_char.get_config("tiny")
    if source is not None:
      cfg.data.source = str(source)
    with pytest.raises(SystemExit) as exit_info:
      cli.user_errors(loop.train)(cfg, str(workdir))
    assert exit_info.value.code == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    return err

  assert "is not a writable directory" in user_error("/proc/jaxformer_run")
  latin = tmp_path / "latin.txt"
  latin.write_bytes(("hello\n" * 50).encode() + "caf\xe9".encode("latin-1"))
  err = user_error(tmp_path / "r1", latin)
  assert "is not UTF-8 text (byte offset 303" in err and "latin.txt" in err
  binary = tmp_path / "data.txt"                # named as text, holding binary bytes
  binary.write_bytes(b"abc" * 9 + b"\0\1\2")
  assert "is a binary file (a NUL byte at byte offset 27)" in user_error(tmp_path / "r2", binary)
  other = tmp_path / "data.bin"                 # not a kind of source jaxformer reads
  other.write_bytes(b"abc")
  assert "a directory or glob of them" in user_error(tmp_path / "r3", other)


# --- mistakes that once gave a traceback (issue #40): each case fails before any compile ----

_BUGGY_CONFIG = """from configs import shakespeare_char


def get_config(arg=None):
  config = shakespeare_char.get_config("tiny")
  config.train.steps = {value}
  return config
"""


def _parse_train_flags(argv):
  """`python -m jaxformer.train`'s flag parsing in-process: its --config file flag on a fresh
  FlagValues (config_flags reads the overrides from `sys_argv`), through the CLIs' parser."""
  from absl import flags
  from ml_collections import config_flags as ml_config_flags
  fv = flags.FlagValues()
  ml_config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                     sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  cli.absl_flags_parser(argv, fv)


def _train_main(tmp_path, **data):
  """`jaxformer.train`'s main in-process: shakespeare_char:tiny with `data` fields set."""
  from configs import shakespeare_char
  from jaxformer.train import loop
  cfg = shakespeare_char.get_config("tiny")
  cfg.data.update({"data_dir": str(tmp_path / "data"), **data})
  cli.user_errors(loop.train)(cfg, str(tmp_path / "run"))


def _gz_sources(tmp_path):
  import gzip
  (tmp_path / "glob").mkdir()
  for name in ("a", "b"):
    with gzip.open(tmp_path / "glob" / f"{name}.jsonl.gz", "wt") as f:
      f.writelines(json.dumps({"text": f"document {i} of {name}"}) + "\n" for i in range(500))
  whole = (tmp_path / "glob" / "b.jsonl.gz").read_bytes()
  (tmp_path / "glob" / "b.jsonl.gz").write_bytes(whole[:len(whole) // 2])      # cut short
  (tmp_path / "plain.jsonl.gz").write_text('{"text": "not compressed"}\n' * 50)


def _config_file(tmp_path, value):
  (tmp_path / "buggy.py").write_text(_BUGGY_CONFIG.format(value=value))
  return f"--config={tmp_path / 'buggy.py'}"


def _diverged(tmp_path):
  """What the loop raises after train.max_skipped_steps non-finite steps in a row (trained
  to that point in tests/e2e/test_train.py)."""
  import types
  from jaxformer.train import loop
  run = types.SimpleNamespace(settings=types.SimpleNamespace(train=types.SimpleNamespace(
      max_skipped_steps=3)), ckpts=types.SimpleNamespace(manager=types.SimpleNamespace(
          latest_step=lambda: 10)), workdir=str(tmp_path))
  cli.user_errors(loop._check_finite)(run, 13, {"finite": False, "skipped": 3})


_MISTAKES = {   # case: (what the user runs, in-process where it can be, fragments of the line)
    "gz_truncated_in_a_glob": (
        lambda t: _train_main(t, source=str(t / "glob" / "*.jsonl.gz")),
        ["b.jsonl.gz is a truncated gzip file", "replace it with a complete copy"]),
    "gz_that_is_not_gzip": (
        lambda t: _train_main(t, source=str(t / "plain.jsonl.gz")),
        ["plain.jsonl.gz is not gzip-compressed", "drop the .gz"]),
    "config_path_wrong_with_override": (
        lambda t: _parse_train_flags(["train", f"--config={t / 'nope.py'}", "--workdir=w",
                                      "--config.train.steps=3"]),
        ["nope.py: the config file does not load: No such file or directory"]),
    "override_under_a_string_leaf": (
        lambda t: _parse_train_flags(["train", f"--config={CONFIG}", "--workdir=w",
                                      "--config.data.source.path=x"]),
        ["--config.data.source.path", "'data.source' is a str",
         "set it whole: --config.data.source=<value>"]),
    "config_file_raises": (
        lambda t: _parse_train_flags(["train", _config_file(t, "undefined * 2"),
                                      "--workdir=w", "--config.train.steps=3"]),
        ["the config file raised NameError at", "buggy.py:6 (in get_config)",
         "name 'undefined' is not defined"]),
    "config_file_raises_not_a_bad_override": (       # was "an override names no config key"
        lambda t: _parse_train_flags(["train", _config_file(t, "config.train.stepz"),
                                      "--workdir=w", "--config.train.steps=3"]),
        ["the config file raised AttributeError at", "buggy.py:6", "'stepz'"]),
    "learning_rate_diverged": (
        _diverged, ["3 non-finite steps in a row at step 13", "lower optim.lr"]),
    "data_dir_under_proc": (
        lambda t: _train_main(t, data_dir="/proc/jaxformer_data"),
        ["data.data_dir='/proc/jaxformer_data' is not a writable directory",
         "--config.data.data_dir"]),
    "plan_json_unwritable": (             # a subprocess: plan's flags are global ones
        lambda t: _cli("jaxformer.plan", "--config=configs/gpt2.py:tiny", "--topology=v5e:2x2",
                       f"--json={t / 'missing' / 'plan.json'}"),
        ["--json=", "missing/plan.json", "does not exist"]),
}


@pytest.mark.parametrize("case", sorted(_MISTAKES))
def test_mistakes_that_were_tracebacks_are_one_line(case, tmp_path, capsys):
  """Each: exit code 2 and one `error:` line (the last) naming the field or file; refused
  before anything compiles (the plan prints no plan)."""
  run, fragments = _MISTAKES[case]
  _gz_sources(tmp_path)
  try:
    result = run(tmp_path)
  except SystemExit as e:
    code, err = e.code, capsys.readouterr().err
  else:
    code, err = result.returncode, result.stderr
    assert "compiled in" not in result.stdout
  lines = err.strip().splitlines()
  assert code == cli.EXIT_USER_ERROR and "Traceback" not in err, err[-3000:]
  assert [l for l in lines if l.startswith("error: ")] == lines[-1:], lines[-5:]
  for fragment in fragments:
    assert fragment in lines[-1], (fragment, lines[-1])


def test_sample_and_launcher_mistakes(tmp_path, capsys):
  """Each command line once through a subprocess; the sample's workdir mistakes through
  its main's own wrapper in-process (a subprocess costs ~1.5 s of CPU)."""
  from jaxformer.inference import load_run
  (tmp_path / "run").mkdir()
  for fragment in ("holds no training run", "config.json is not valid JSON"):
    with pytest.raises(SystemExit) as exit_info:
      cli.user_errors(load_run)(str(tmp_path / "run"))
    assert exit_info.value.code == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and fragment in err, err
    (tmp_path / "run" / "config.json").write_text("{broken")
  _assert_user_error(_cli("jaxformer.sample", f"--workdir={tmp_path / 'run'}",
                          "--max_new_tokens=x"), "--max_new_tokens")
  _assert_user_error(_cli("jaxformer.sweep", "--config=configs/sweeps/nope.py",
                          f"--workdir={tmp_path / 'sw'}"), "nope.py")
  _assert_user_error(_cli("launch.slurm", "--nodes=0", "--", "python", "x"), "--nodes=0")
  _assert_user_error(_cli("launch.local", "--bogus"), "unrecognized arguments: --bogus")


def test_print_config_prints_the_checked_config_and_trains_nothing(tmp_path):
  result = _cli("jaxformer.train", f"--config={CONFIG}", "--config.train.steps=31",
                "--print_config", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  printed = json.loads(result.stdout)
  assert printed["train"]["steps"] == 31 and printed["model"]["family"] == "decoder"
  assert list(tmp_path.iterdir()) == []
  _assert_user_error(_cli("jaxformer.train", f"--config={CONFIG}", "--config.optim.lr=-1",
                          "--print_config"), "optim.lr")


def test_help_is_success():
  """absl exits 1 after printing --help; asked-for help exits 0 (scripts check it)."""
  result = _cli("jaxformer.train", "--help")
  assert result.returncode == 0 and "--workdir" in result.stdout + result.stderr


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu not installed")
def test_no_libtpu_lines_on_a_machine_without_tpus():
  """With libtpu installed and no TPU, JAX's look for one printed libtpu's warnings and five
  E0000 lines; importing jaxformer first gives libtpu the placeholders that silence it."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_PLATFORMS", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")}
  env["PYTHONPATH"] = ROOT
  result = subprocess.run([sys.executable, "-c", "import jaxformer, jax; print(jax.devices())"],
                          capture_output=True, text=True, env=env, timeout=120)
  assert result.returncode == 0 and "Cpu" in result.stdout
  assert "E0000" not in result.stderr and "TPU_WORKER_HOSTNAMES" not in result.stderr, \
      result.stderr


def test_sample_without_checkpoints_says_so_and_creates_nothing(tmp_path):
  from configs import shakespeare_char
  from jaxformer.inference import load_run
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(shakespeare_char.get_config("tiny").to_json())
  for which in ("latest", "best"):
    with pytest.raises(ValueError, match=f"has no {which} checkpoint yet"):
      load_run(str(run), which=which)
  assert sorted(os.listdir(run)) == ["config.json"]


def test_unexpected_errors_keep_their_traceback():
  from jaxformer.train import config_checks
  with pytest.raises(SystemExit) as exit_info:    # raised by jaxformer's validation
    cli.user_errors(config_checks.validate)(_bad_steps())
  assert exit_info.value.code == cli.EXIT_USER_ERROR
  with pytest.raises(ValueError):                 # raised outside jaxformer (here: the test)
    cli.user_errors(lambda: (_ for _ in ()).throw(ValueError("a bug elsewhere")))()
  with pytest.raises(KeyError):
    cli.user_errors(lambda: {}["x"])()
  import numpy as np
  with pytest.raises(ValueError):           # raised inside NumPy: not a user mistake
    cli.user_errors(lambda: np.reshape(np.zeros(3), (2, 2)))()


def _bad_steps():
  from configs import shakespeare_char
  cfg = shakespeare_char.get_config("tiny")
  cfg.train.steps = 0
  return cfg


def test_workdir_lock_refuses_a_second_run_and_survives_a_killed_owner(tmp_path):
  with workdir_lib.Lock(str(tmp_path)):
    with pytest.raises(ValueError, match=r"is in use by another training \(pid \d+ on"):
      with workdir_lib.Lock(str(tmp_path)):
        pass
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
       "from jaxformer.train import workdir as w; l = w.Lock(sys.argv[2]).__enter__(); "
       "print('held', flush=True); time.sleep(60)", ROOT, str(tmp_path)],
      stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == "held"
  with pytest.raises(ValueError, match=f"pid {holder.pid}"):
    workdir_lib.Lock(str(tmp_path)).__enter__()
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  with workdir_lib.Lock(str(tmp_path)):      # the dead owner's lock is gone with it
    assert f"pid {os.getpid()}" in open(tmp_path / workdir_layout.LOCK).read()


def test_a_second_training_on_a_locked_workdir_touches_nothing(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  with workdir_lib.Lock(str(run)):
    _assert_user_error(_train(run), "is in use by another training")
  assert os.listdir(run) == [workdir_layout.LOCK]


def test_fresh_clears_every_artifact(tmp_path):
  for name in ("checkpoints", "best", "attention"):
    (tmp_path / name).mkdir()
  for name in ("metrics.jsonl", "samples.txt", "curves.png", "config.json",
               "events.out.tfevents.1.host", "notes.md"):
    (tmp_path / name).write_text("x")
  removed = workdir_lib.clear(str(tmp_path))
  assert "samples.txt" in removed and "events.out.tfevents.1.host" in removed
  assert sorted(os.listdir(tmp_path)) == ["notes.md"]       # not the run's: kept


def test_metrics_are_strict_json_and_read_back_non_finite(tmp_path):
  path = tmp_path / "metrics.jsonl"
  writer = metrics.MetricsWriter(str(path))
  writer.write({"step": 1, "loss": float("nan"), "grad_norm": float("inf"),
                "moe_load": [0.5, float("-inf")]})
  def refuse(constant):
    raise AssertionError(f"non-standard JSON constant {constant}")
  for line in path.read_text().splitlines():
    json.loads(line, parse_constant=refuse)
  [record] = metrics.read(str(path))
  assert record["loss"] != record["loss"] and record["grad_norm"] == float("inf")
  assert record["moe_load"] == [0.5, float("-inf")]


def test_moving_an_unreadable_checkpoint_aside_never_collides(tmp_path):
  base = str(tmp_path / "7.unreadable")
  assert checkpoint._unused_name(base) == base
  os.makedirs(base)
  os.makedirs(base + ".1")
  assert checkpoint._unused_name(base) == base + ".2"


def test_callbacks_into_a_closed_event_loop_are_dropped_and_other_unraisables_kept(monkeypatch):
  """What TensorStore's completion callbacks raise once Orbax has closed its loop after a
  failed write: dropped (the run reports the failure once); any other unraisable is printed."""
  import asyncio
  import types
  loop = asyncio.new_event_loop()
  loop.close()
  def unraisable(call):
    try:
      call()
    except RuntimeError as e:
      return types.SimpleNamespace(exc_type=RuntimeError, exc_value=e,
                                   exc_traceback=e.__traceback__, err_msg=None, object=None)
  passed_on = []
  monkeypatch.setattr(cli, "_default_unraisablehook", passed_on.append)
  cli._unraisablehook(unraisable(lambda: loop.call_soon_threadsafe(print)))
  assert passed_on == []
  def other():
    raise RuntimeError("a real bug")
  cli._unraisablehook(unraisable(other))
  assert [str(args.exc_value) for args in passed_on] == ["a real bug"]
