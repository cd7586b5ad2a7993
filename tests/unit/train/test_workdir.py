"""The workdir before any work (issue #40): members of the wrong kind, a start from step 0 over
an earlier run's results, the data's fingerprint, a stop before the first log, and
--branch_from refusals that leave nothing behind and whose suggested fixes work."""

import json
import os
import subprocess
import sys

import pytest

from jaxformer import run_settings, workdir_layout
from jaxformer.state import checkpoint
from jaxformer.train import data_record, loop, workdir as workdir_lib
from jaxformer.train.metrics import read
from tests.runs import tiny_run_config
from tests.user_errors import user_error
from tests.repo_root import REPO

ROOT = str(REPO)


def _listing(directory) -> dict:
  out = {}
  for root, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(root, name)
      if name == workdir_layout.LOCK:        # holds the last owner's pid and time
        continue
      out[path] = None if os.path.isdir(path) else open(path, "rb").read()
  return out


def _metrics(workdir, steps):
  with open(os.path.join(workdir, workdir_layout.METRICS), "w") as f:
    f.writelines(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in steps)


@pytest.mark.parametrize("name, make, problem", [
    (workdir_layout.CHECKPOINTS, "file", "is a file, where a run keeps a directory"),
    (workdir_layout.BEST, "file", "is a file"),
    (workdir_layout.LOGS, "file", "is a file"),
    (workdir_layout.METRICS, "dir", "is a directory, where a run keeps a file"),
    (workdir_layout.CONFIG, "dir", "is a directory"),
    (workdir_layout.LOCK, "dir", "is a directory"),
    (workdir_layout.DATA, "link", "is a link to"),
    ("events.out.tfevents.1.host", "dir", "is a directory"),
])
def test_a_member_of_the_wrong_kind_is_named_with_its_fix(tmp_path, name, make, problem):
  path = tmp_path / name
  {"file": lambda: path.write_text("x"), "dir": path.mkdir,
   "link": lambda: path.symlink_to(tmp_path / "gone")}[make]()
  cleared = name not in (workdir_layout.LOGS, workdir_layout.LOCK)
  message = user_error(lambda: workdir_lib.check_members(str(tmp_path)), name, problem,
                       "move it away or delete it")
  assert ("--fresh" in message) == cleared
  if cleared:          # the fix it names works: --fresh removes it, whatever it is
    workdir_lib.check_members(str(tmp_path), fresh=True)
    workdir_lib.clear(str(tmp_path))
    assert not os.path.lexists(path)
  else:                # --fresh leaves it (so it is not offered); deleting it works
    user_error(lambda: workdir_lib.check_members(str(tmp_path), fresh=True), name)
    path.unlink() if make == "file" else path.rmdir()
  (tmp_path / "notes.md").mkdir()              # not a member: not the run's business
  workdir_lib.check_members(str(tmp_path))


def test_checkpoints_as_a_file_is_refused_before_any_work(tmp_path):
  """In-process: refused before the data, the lock or Orbax; and Orbax is never handed it."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / workdir_layout.CHECKPOINTS).write_text("not a directory")
  _metrics(workdir, [4, 8, 24])
  before = _listing(workdir)
  user_error(lambda: loop.train(tiny_run_config(), str(workdir)), "checkpoints is a file")
  assert _listing(workdir) == before
  user_error(lambda: checkpoint.Checkpoints(workdir / workdir_layout.CHECKPOINTS),
             "is a file, not a directory of checkpoints")


def test_cli_checkpoints_as_a_file_is_one_line_and_exit_2(tmp_path):
  """What issue #40 found on a finished run's workdir: four Orbax tracebacks and a process that
  never exited, after overwriting metrics.jsonl."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / workdir_layout.CHECKPOINTS).write_text("x")
  _metrics(workdir, [4, 8, 24])
  before = _listing(workdir)
  out = subprocess.run([sys.executable, "-m", "jaxformer.train",
                        "--config=configs/shakespeare_char.py:tiny", f"--workdir={workdir}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert out.returncode == 2 and len(errors) == 1, out.stderr[-2000:]
  assert "checkpoints is a file" in errors[0] and "Traceback" not in out.stderr
  assert _listing(workdir) == before


def test_a_start_from_step_0_never_overwrites_a_saved_runs_results(tmp_path):
  w = str(tmp_path)
  check = lambda: workdir_lib.check_nothing_overwritten(w, 8, 24)   # saves at 8, ends at 24
  check()                                                 # empty: a first start
  _metrics(w, [4, 8])        # stopped before its first checkpoint was complete: written again
  check()
  _metrics(w, [4, 8, 12])
  message = user_error(check, "metrics.jsonl up to step 12", "checkpoints/ is missing",
                       "would overwrite them", "rerun with --fresh")
  (tmp_path / workdir_layout.CHECKPOINTS / "8.orbax-checkpoint-tmp-3").mkdir(parents=True)
  check()                                                 # its first save was interrupted
  (tmp_path / workdir_layout.CHECKPOINTS / "8.orbax-checkpoint-tmp-3").rename(
      tmp_path / workdir_layout.CHECKPOINTS / "8.unreadable")
  user_error(check, "unreadable (8.unreadable)")
  os.remove(tmp_path / workdir_layout.METRICS)
  (tmp_path / workdir_layout.BEST / "16").mkdir(parents=True)
  user_error(check, "best/ at steps [16]")
  (tmp_path / workdir_layout.CHECKPOINTS / "16").mkdir()
  check()                                                 # a resume: restore decides
  os.rmdir(tmp_path / workdir_layout.CHECKPOINTS / "16")
  os.rmdir(tmp_path / workdir_layout.BEST / "16")
  _metrics(w, [4])                          # a finished 4-step run: its last save was waited for
  user_error(lambda: workdir_lib.check_nothing_overwritten(w, 4, 4), "up to step 4")
  # through train: refused before anything is read or written
  before = _listing(w)
  user_error(lambda: loop.train(tiny_run_config(steps=4), w), "metrics.jsonl up to step 4")
  assert _listing(w) == before
  assert "--fresh" in message


def test_a_run_whose_every_checkpoint_is_unreadable_is_not_restarted_over_its_results(
    tmp_path):
  """Found only when Orbax fails to restore them: refused after they are moved aside."""
  cfg = tiny_run_config()
  w = tmp_path / "run"
  (w / workdir_layout.CHECKPOINTS / "24").mkdir(parents=True)
  (w / workdir_layout.CHECKPOINTS / "24" / "garbage").write_text("x")
  (w / workdir_layout.CONFIG).write_text(cfg.to_json())
  _metrics(w, [4, 8, 12, 16, 20, 24])
  metrics_before = (w / workdir_layout.METRICS).read_text()
  user_error(lambda: loop.train(cfg, str(w)), "unreadable (24.unreadable)", "--fresh")
  assert (w / workdir_layout.METRICS).read_text() == metrics_before


def test_data_record_refuses_a_changed_source_with_the_ways_out(tmp_path):
  cfg = run_settings.parse(tiny_run_config())
  w = str(tmp_path)
  old, new = {"kind": "text", "sha256": "a" * 64}, {"kind": "text", "sha256": "b" * 64}
  assert data_record.check(w, cfg, None, taken=0, data_changed_ok=False) is None
  first = data_record.check(w, cfg, old, taken=0, data_changed_ok=False)  # none recorded yet
  data_record.write(w, first)
  assert data_record.check(w, cfg, old, taken=8, data_changed_ok=False) is None
  message = user_error(lambda: data_record.check(w, cfg, new, taken=8, data_changed_ok=False),
                       "data.source='tinyshakespeare' changed", "aaaaaaaaaaaa",
                       "bbbbbbbbbbbb", "after step 8", "a new --workdir", "--fresh",
                       "--data_changed_ok")
  accepted = data_record.check(w, cfg, new, taken=8, data_changed_ok=True)
  assert accepted["fingerprint"] == new and accepted["earlier"][0]["until_step"] == 8
  (tmp_path / workdir_layout.BRANCH).write_text("{}")      # a branch: only the ways that work
  message = user_error(lambda: data_record.check(w, cfg, new, taken=8, data_changed_ok=False),
                       "--data_changed_ok")
  assert "--fresh" not in message and "new --workdir" not in message


def test_a_files_fingerprint_follows_the_content_not_the_mtime(tmp_path):
  cfg = tiny_run_config()
  source = tmp_path / "sft.jsonl"
  source.write_text('{"prompt": "a", "response": "b"}\n' * 100)
  cfg.data.source = str(source)
  first = data_record.fingerprint(cfg, pipeline=None)
  os.utime(source, (1, 1))
  assert data_record.fingerprint(cfg, pipeline=None) == first
  source.write_text('{"prompt": "a", "response": "c"}\n' * 100)
  assert data_record.fingerprint(cfg, pipeline=None)["sha256"] != first["sha256"]
  images = tmp_path / "images"
  (images / "train" / "0").mkdir(parents=True)
  (images / "train" / "0" / "a.png").write_bytes(b"png")
  cfg.data.source = f"images:{images}"
  first = data_record.fingerprint(cfg, pipeline=None)
  (images / "train" / "0" / "b.png").write_bytes(b"png")
  assert data_record.fingerprint(cfg, pipeline=None)["files"] == first["files"] + 1
  cfg.data.source = "synthetic:copy"
  assert data_record.fingerprint(cfg, pipeline=None) is None


def test_a_text_corpus_fingerprint_is_its_content(tmp_path):
  """The prepared corpus's SHA-256 of its text: a touch re-prepares (new cache key) to the
  same fingerprint; an edit does not."""
  from jaxformer.data import text
  cfg = tiny_run_config()
  source = tmp_path / "corpus.txt"
  source.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50)
  cfg.data.update(source=str(source), workers=1)

  def fingerprint():
    pipeline = text.make_text_pipeline(cfg.data, seed=0, global_batch_size=8,
                                       eval_batch_size=8, workdir=str(tmp_path / "run"),
                                       data_dir=str(tmp_path / "cache"))
    os.remove(tmp_path / "run" / "tokenizer.json")
    return data_record.fingerprint(cfg, pipeline)
  first = fingerprint()
  assert first["kind"] == "text"
  os.utime(source, (1, 1))
  assert fingerprint() == first and len(os.listdir(tmp_path / "cache" / "jaxformer_corpora")) == 2
  source.write_text(source.read_text().replace("speak", "Speak"))
  assert fingerprint() != first


@pytest.mark.slow
def test_a_resume_on_a_changed_source_is_refused_unless_meant(tmp_path):
  """Also: a stop before the first logged step ends cleanly (it crashed on the missing
  metrics.jsonl) and the run resumes from its checkpoint."""
  text = open(os.path.join(ROOT, "jaxformer", "data", "assets", "tinyshakespeare.txt")).read()
  source = tmp_path / "corpus.txt"
  source.write_text(text)
  cfg = tiny_run_config(log_every=4)
  cfg.data.update(source=str(source), data_dir=str(tmp_path / "cache"))
  w = str(tmp_path / "run")
  loop.train(cfg, w, stop_after=2)                     # stopped before the first log
  assert not os.path.exists(os.path.join(w, workdir_layout.METRICS))
  assert workdir_lib.checkpoint_steps(w) == [2]
  recorded = json.load(open(os.path.join(w, workdir_layout.DATA)))
  assert recorded["fingerprint"]["kind"] == "text" and recorded["since_step"] == 0
  source.write_text(text.replace("ROMEO", "JULIET"))
  before = _listing(w)
  user_error(lambda: loop.train(cfg, w), f"data.source={str(source)!r} changed",
             "after step 2", "--data_changed_ok")
  assert _listing(w) == before
  loop.train(cfg, w, data_changed_ok=True, stop_after=2)
  assert [r["step"] for r in read(os.path.join(w, workdir_layout.METRICS))] == [4]
  record = json.load(open(os.path.join(w, workdir_layout.DATA)))
  assert record["earlier"][0]["fingerprint"] == recorded["fingerprint"]
  assert record["since_step"] == 2 and record["fingerprint"] != recorded["fingerprint"]


# --branch_from


def _fake_trunk(path, config, steps=(8,)):
  """A trunk as branch() sees it: config.json and kept checkpoint directories."""
  os.makedirs(path)
  with open(os.path.join(path, workdir_layout.CONFIG), "w") as f:
    f.write(config.to_json())
  for step in steps:
    os.makedirs(os.path.join(path, workdir_layout.CHECKPOINTS, str(step), "state"))
    open(os.path.join(path, workdir_layout.CHECKPOINTS, str(step), "state", "x"), "w").close()


def _constant(**train):
  cfg = tiny_run_config(**train)
  cfg.optim.update(schedule="constant", warmup_steps=0)
  return cfg


def test_branch_refusals_name_the_fault_and_leave_nothing(tmp_path):
  trunk, dst = str(tmp_path / "trunk"), str(tmp_path / "branch")
  _fake_trunk(trunk, _constant(steps=16))
  user_error(lambda: workdir_lib.branch(str(tmp_path / "trunkk"), 8, dst),
             f"no such run: {tmp_path / 'trunkk'}")
  user_error(lambda: workdir_lib.branch(trunk, 5, dst), "no checkpoint at step 5 (kept: [8])",
             "branch from a kept step")
  bad = _constant(steps=12)
  bad.data.seq_len = 16
  message = user_error(lambda: workdir_lib.branch(trunk, 8, dst, config=bad),
                       "--branch_from=", "the trunk is a run trained with data.seq_len=32",
                       "drop --config.data.seq_len")
  assert "--fresh" not in message and "new --workdir" not in message
  bad = _constant(steps=12)
  bad.train.steps = 0
  user_error(lambda: workdir_lib.branch(trunk, 8, dst, config=bad), "train.steps")
  assert not os.path.exists(dst)
  # a workdir holding another run: refused; the --fresh it suggests works
  other = tmp_path / "other"
  other.mkdir()
  (other / workdir_layout.CONFIG).write_text("{}")
  _metrics(other, [4])
  user_error(lambda: workdir_lib.branch(trunk, 8, str(other), config=_constant(steps=12)),
             "not a branch of", "add --fresh")
  assert workdir_lib.branch(trunk, 8, str(other), config=_constant(steps=12), fresh=True)
  assert workdir_lib.checkpoint_steps(str(other)) == [8] and workdir_lib.is_unstarted_branch(
      str(other))


@pytest.mark.slow
def test_a_branch_refused_after_its_copy_is_discarded_and_the_fix_works(tmp_path):
  """train_branch (what --branch_from runs): the mesh check refuses it after the copy (it
  needs the data); nothing stays; the corrected command trains the branch."""
  trunk, dst = str(tmp_path / "trunk"), str(tmp_path / "branch")
  loop.train(_constant(steps=8, checkpoint_every=4), trunk)
  bad = _constant(steps=12)
  bad.mesh.data = 3                     # 8 devices, batch 8: refused in setup, not branch()
  with pytest.raises(ValueError):
    workdir_lib.train_branch(bad, dst, trunk, 4)
  assert not os.path.exists(dst)
  workdir_lib.train_branch(_constant(steps=12), dst, trunk, 4)
  assert workdir_lib.checkpoint_steps(dst)[-1] == 12
  assert json.load(open(os.path.join(dst, workdir_layout.DATA))) == json.load(
      open(os.path.join(trunk, workdir_layout.DATA)))
