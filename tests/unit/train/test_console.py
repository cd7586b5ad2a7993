"""What the command lines print: third-party log records off by default, --verbosity on,
first-time work announced in one line, and one-time work done once by process 0 of a job."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from jaxformer import console
from launch.local import run_local
from tests.repo_root import REPO

ROOT = str(REPO)
SITE = os.path.join(os.sep, "venv", "lib", "python3.11", "site-packages")


def _record(path: str, level: int) -> logging.LogRecord:
  return logging.LogRecord("absl", level, path, 1, "message", None, None)


@pytest.mark.parametrize("path, level, shown", [
    (os.path.join(SITE, "tensorflow_datasets", "core", "dataset_builder.py"), logging.WARNING,
     False),
    (os.path.join(SITE, "orbax", "checkpoint", "manager.py"), logging.INFO, False),
    (os.path.join(SITE, "tensorflow_datasets", "core", "dataset_builder.py"), logging.ERROR,
     True),
    (os.path.join(ROOT, "jaxformer", "train", "loop.py"), logging.WARNING, True),
    (os.path.join(SITE, "jax", "_src", "xla_bridge.py"), logging.WARNING, True),
])
def test_third_party_records_below_error_are_dropped(path, level, shown):
  assert console.ThirdPartyFilter().filter(_record(path, level)) is shown


def test_a_third_party_thread_failing_at_interpreter_exit_is_dropped():
  """Orbax's writer thread, still running when the CLI exits after a full disk's one line,
  logs an ERROR with concurrent.futures' refusal; other third-party errors stay shown."""
  orbax = os.path.join(SITE, "orbax", "checkpoint", "_src", "futures", "future.py")

  def record(error):
    return logging.LogRecord("absl", logging.ERROR, orbax, 1, "raised an exception", None,
                             (type(error), error, None))

  keep = console.ThirdPartyFilter()
  assert not keep.filter(record(RuntimeError(
      "cannot schedule new futures after interpreter shutdown")))
  assert keep.filter(record(RuntimeError("something else")))


# A CLI under jaxformer's policy that logs what a run meets: a warning of TFDS's, one of
# jaxformer's, an INFO line of jaxformer's (records made as if logged from those files).
_CLI = textwrap.dedent("""
    import logging, os, sys
    from jaxformer import cli

    def log(path, level, message):
      if logging.getLogger().isEnabledFor(level):
        logging.getLogger().handle(logging.LogRecord("x", level, path, 1, message, None, None))

    def main(argv):
      tfds = os.path.join(os.sep, "site-packages", "tensorflow_datasets", "core", "b.py")
      ours = os.path.join(os.getcwd(), "jaxformer", "train", "loop.py")
      log(tfds, logging.WARNING, "Using custom data configuration")
      log(ours, logging.WARNING, "our own warning")
      log(ours, logging.INFO, "an info line")
      print("progress")

    cli.run_absl(main)
""")


@pytest.mark.parametrize("flags, shown, hidden", [
    ([], ["our own warning", "progress"], ["Using custom data configuration", "an info line"]),
    (["--verbosity=0"], ["Using custom data configuration", "our own warning", "an info line"],
     []),
    (["--verbosity=-2"], ["progress"], ["Using custom", "our own warning", "an info line"]),
])
def test_default_console_is_quiet_and_verbosity_works(flags, shown, hidden):
  out = subprocess.run([sys.executable, "-c", _CLI, *flags], capture_output=True, text=True,
                       cwd=ROOT, check=True)
  text = out.stdout + out.stderr
  assert all(s in text for s in shown), text
  assert not any(h in text for h in hidden), text


def test_announce_is_one_line_with_the_time(capsys):
  with console.announce("preparing x") as note:
    note.details = "3 records"
  assert capsys.readouterr().out.startswith("preparing x ... done in 0.0 s (3 records)\n")
  with pytest.raises(ValueError), console.announce("preparing y"):
    raise ValueError("bad")
  assert capsys.readouterr().out == "preparing y ... failed\n"


# Two calls in one job (matched by their order): one that succeeds, then one that fails on
# process 0; one two-process start for both cases.
_ONCE = textwrap.dedent("""
    import os, sys, time
    from jaxformer import parallel
    import jax
    parallel.initialize()

    def work(log, fail):
      with open(log, "a") as f:
        f.write(f"start {jax.process_index()}\\n")
      time.sleep(0.5)
      if fail and jax.process_index() == 0:
        raise ValueError("data.source='x' is empty")
      with open(log, "a") as f:
        f.write(f"end {jax.process_index()}\\n")
      return jax.process_index()

    for log, fail in ((sys.argv[1], False), (sys.argv[2], True)):
      try:
        print("result", parallel.process_zero_first(lambda: work(log, fail),
                                                    "preparing the data"), flush=True)
      except ValueError as e:
        print("error", e, flush=True)
""")


def test_process_zero_does_one_time_work_first_and_others_learn_of_its_failure(tmp_path):
  ok, fail = tmp_path / "ok", tmp_path / "fail"
  results = run_local([sys.executable, "-c", _ONCE, str(ok), str(fail)], 2, 1,
                      env={"PYTHONPATH": ROOT}, timeout=120)
  outputs = [r.stdout for r in results]
  assert ok.read_text().split("\n") == ["start 0", "end 0", "start 1", "end 1", ""]
  assert "result 0" in outputs[0] and "result 1" in outputs[1]
  assert fail.read_text() == "start 0\n"               # process 1 never started the work
  assert "error data.source='x' is empty" in outputs[0]
  assert ("error process 0 failed while preparing the data (ValueError: data.source='x' is "
          "empty); see its output") in outputs[1], outputs[1]


_ROUTED = r'''
import logging, sys
from absl import flags, logging as absl_logging
from jaxformer import console
flags.FLAGS(["prog"])
absl_logging.use_absl_handler()          # what absl.app.run does
absl_logging.set_verbosity(absl_logging.INFO)
console.route_process_output(1, 2, sys.argv[1])
print("a progress line")
absl_logging.warning("an absl warning")
logging.warning("a logging warning")
absl_logging.info("an info record")
'''


def test_a_routed_process_shows_each_warning_once_and_logs_everything(tmp_path):
  """Process i > 0: its console shows warnings once (not absl's copy as well), and its log
  file holds its whole output, warnings included."""
  result = subprocess.run([sys.executable, "-c", _ROUTED, str(tmp_path)], capture_output=True,
                          text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          timeout=120)
  assert result.returncode == 0, result.stderr
  console = result.stdout + result.stderr
  assert console.count("an absl warning") == 1 and console.count("a logging warning") == 1
  assert "a progress line" not in console
  log = (tmp_path / "logs" / "process_1.log").read_text()
  assert "a progress line" in log and "an absl warning" in log and "a logging warning" in log


def test_coroutines_never_awaited_are_not_reported_at_the_default_verbosity():
  """What Orbax leaves when an asynchronous save fails (a disk full mid-write): Python's
  'coroutine ... was never awaited' RuntimeWarning at exit would follow the run's one line."""
  code = ("import gc\nfrom jaxformer import console\n"
          "console.configure_logging(verbosity_given=False)\n"
          "async def save():\n  pass\n"
          "save()\ngc.collect()\nprint('done')\n")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert result.returncode == 0 and result.stdout == "done\n", result.stderr
  assert "never awaited" not in result.stderr and "tracemalloc" not in result.stderr
