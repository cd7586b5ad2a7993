"""End-to-end training: a short real run, exact resume, preemption, bad configs."""

import json
import os
import shutil
import signal

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import get_config
from jaxformer import cli, inference, parallel, run_settings
from jaxformer.state import checkpoint, optim, train_state
from jaxformer.inference import load_run, sample_text
from jaxformer.train import config_checks, evaluation, loop
from jaxformer.train.metrics import read
from tests.runs import on_one_device, tiny_run_config
from tests.repo_root import REPO

DETERMINISTIC = ("step", "loss", "lr", "grad_norm", "skipped", "eval_loss", "eval_accuracy")


def deterministic(records):
  return [{k: r[k] for k in DETERMINISTIC if k in r} for r in records]


@pytest.mark.slow
def test_short_run_learns_and_resume_reproduces_uninterrupted_run(tmp_path, monkeypatch):
  on_one_device(monkeypatch)          # what it learns and resumes, not the mesh: 1 device
  cfg = tiny_run_config(sample_tokens=80, sample_every=12)
  full = str(tmp_path / "full")
  loop.train(cfg, full)
  records = read(os.path.join(full, "metrics.jsonl"))
  losses = [r["loss"] for r in records if "loss" in r]
  assert losses[-1] < losses[0] - 0.3          # it learns
  assert {"config.json", "tokenizer.json", "checkpoints"} <= set(os.listdir(full))

  # preempted at step 10 (not a checkpoint multiple), then resumed by re-running
  parted = str(tmp_path / "parted")
  loop.train(cfg, parted, stop_after=10)
  assert max(r["step"] for r in read(os.path.join(parted, "metrics.jsonl"))) == 8
  with open(os.path.join(parted, "metrics.jsonl"), "a") as f:
    f.write('{"step": 12, "loss": 3.1')        # a torn last line (a kill mid-write)
  loop.train(cfg, parted)
  assert deterministic(read(os.path.join(parted, "metrics.jsonl"))) == deterministic(records)
  # already finished: re-running returns at once
  assert loop.train(cfg, parted)["step"] == 24

  # sampling from the run: the sample written at the end, and seeded reproducible samples
  with open(os.path.join(full, "samples.txt")) as f:
    assert [l for l in f.read().splitlines() if l.startswith("--- step")] == [
        "--- step 12", "--- step 24"]
  config, params, tokenizer = load_run(full)
  text = sample_text(config, params, tokenizer, prompt="ROMEO:", max_new_tokens=70, seed=4)
  assert text.startswith("ROMEO:") and len(text) == 76        # crosses max_len=32 in chunks
  assert text == sample_text(config, params, tokenizer, prompt="ROMEO:", max_new_tokens=70,
                             seed=4)
  with pytest.raises(ValueError, match="no training run"):
    load_run(str(tmp_path / "nothing"))
  _, best_params, _ = load_run(full, which="best")      # eval at 24 was the best (lowest)
  jax.tree.map(np.testing.assert_array_equal, best_params, params)
  from jaxformer.inference.restore import checkpoint_step     # what `sample` prints
  assert [checkpoint_step(full, w) for w in ("latest", "best", "16")] == [24, 24, 16]
  assert checkpoint_step(str(tmp_path / "nothing"), "best") is None


def test_one_process_stops_after_the_step_during_which_it_was_signalled():
  previous = signal.getsignal(signal.SIGTERM)
  with parallel.StopRequest(3) as stop:
    assert not stop.reached(4)
    os.kill(os.getpid(), signal.SIGTERM)       # its handler runs before the next line
    assert stop.reached(5)
  assert signal.getsignal(signal.SIGTERM) is previous


_BLOCKED_MAIN_THREAD = """
import signal, time
from jaxformer.parallel import StopRequest
with StopRequest(0) as stop:
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
  print("ready", flush=True)
  time.sleep(60)                # a main thread that never returns to Python (e.g. in XLA)
print("slept through", flush=True)
"""


_STALLED = """
import time
from jaxformer.parallel import watchdog
with watchdog.Watchdog(1.0, resume_hint="; rerun"):
  time.sleep(2)                 # set-up: not watched
  watchdog.beat("reading data", 7)
  time.sleep(60)                # a read that never returns
"""


def test_the_watchdog_stops_a_stalled_run_with_its_stacks():
  import subprocess
  import sys
  root = str(REPO)
  result = subprocess.run([sys.executable, "-c", _STALLED], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PYTHONPATH": root,
                                           "JAX_PLATFORMS": "cpu"})
  lines = result.stderr.splitlines()
  assert result.returncode == 75, result.stderr
  assert lines[0].startswith("error: no progress for 1 s (the run, in reading data at step 7; "
                             "train.stall_timeout=1 s); stopping this process so the job "
                             "stops; rerun; the stacks of its threads follow"), lines[0]
  assert any("line 7 in <module>" in line for line in lines), result.stderr   # the sleep


def test_a_second_stop_signal_exits_at_once_even_with_the_main_thread_blocked():
  """The signals are read off the main thread: the first asks for the agreed stop, the
  second exits with 128 + its number and one line (the issue's hung job ignored SIGTERM)."""
  import subprocess
  import sys
  root = str(REPO)
  proc = subprocess.Popen([sys.executable, "-c", _BLOCKED_MAIN_THREAD], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"})
  assert proc.stdout.readline() == "ready\n"
  proc.send_signal(signal.SIGTERM)
  assert "SIGTERM: stopping after this step" in proc.stderr.readline()
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=30)        # far less than the 60 s sleep
  assert proc.returncode == 128 + signal.SIGINT and "slept through" not in out
  assert err.strip() == ("error: a second stop signal (SIGINT): exiting now without saving; a "
                         "rerun resumes from the last complete checkpoint")


@pytest.mark.slow
def test_corrupted_latest_checkpoint_falls_back_to_previous(tmp_path, caplog, monkeypatch):
  """Under μP (width 32, base 16: LR groups in the optimizer, logits and attention
  multipliers), so the resume also checks that μP's train state round-trips exactly."""
  on_one_device(monkeypatch)
  cfg = tiny_run_config(steps=16)
  cfg.model.update(parametrization="mup", mup_base_width=16)
  workdir = str(tmp_path / "run")
  loop.train(cfg, workdir)
  first = deterministic(read(os.path.join(workdir, "metrics.jsonl")))
  latest = os.path.join(workdir, "checkpoints", "16")
  for root, _, files in os.walk(latest):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  before = _listing(workdir)
  step8 = load_run(workdir)[1]                       # a reader skips it and moves nothing
  assert "unreadable" in caplog.text and _listing(workdir) == before
  loop.train(cfg, workdir)
  assert os.path.isdir(latest + ".unreadable")       # the owner moves it aside, not deleted
  records = read(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in records if "loss" in r] == [4, 8, 12, 16]   # resumed from 8
  # steps 9-16 again from the step-8 checkpoint: the same records, bit for bit
  assert deterministic(records) == first
  assert jax.tree.leaves(step8)[0].shape == jax.tree.leaves(load_run(workdir)[1])[0].shape
  for root, _, files in os.walk(os.path.join(workdir, "best")):      # a corrupt best/
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  with pytest.raises(ValueError, match=r"best checkpoint in .*best is unreadable.*latest"):
    load_run(workdir, which="best")


@pytest.mark.parametrize("family, tokenizer_vocab, match", [
    ("vit", 65, "'vit' model .*language models"),
    ("seq2seq", 65, "'seq2seq' model .*language models"),
    ("decoder", None, "no tokenizer .*tokenizer.json is missing"),
    ("decoder", 70, "tokenizer has 70 ids but model.vocab_size=65"),
])
def test_sample_refuses_runs_it_cannot_sample_from(family, tokenizer_vocab, match):
  """With a complete model section, as a saved run's config.json has."""
  from configs import seq2seq_synthetic, shakespeare_char, vit_tiny
  from jaxformer.data.tokenizers import CharTokenizer
  config = {"vit": lambda: vit_tiny.get_config("digits"),
            "seq2seq": lambda: seq2seq_synthetic.get_config("copy"),
            "decoder": lambda: shakespeare_char.get_config("tiny")}[family]()
  if family == "decoder":
    config.model.vocab_size = 65
  tokenizer = None if tokenizer_vocab is None else CharTokenizer(
      "".join(chr(0x100 + i) for i in range(tokenizer_vocab)))
  with pytest.raises(ValueError, match=match):
    sample_text(config, None, tokenizer, prompt="a", max_new_tokens=3)


def _listing(workdir):
  """Every path under `workdir` with its size and mtime (what a reader must not change)."""
  out = {}
  for root, dirs, files in os.walk(workdir):
    for name in dirs + files:
      path = os.path.join(root, name)
      out[path] = (os.path.getsize(path), os.path.getmtime(path))
  return out


@pytest.mark.slow
def test_sample_reads_a_run_whose_training_deletes_the_checkpoint_it_reads(tmp_path,
                                                                             monkeypatch):
  """The training deletes old checkpoints while it runs: a reader that lists step N and finds
  it gone when it restores takes the next one, and writes nothing."""
  import orbax.checkpoint as ocp
  workdir = str(tmp_path / "run")
  loop.train(tiny_run_config(steps=16), workdir)
  restore = ocp.CheckpointManager.restore
  deleted, before = [], {}

  def deleted_meanwhile(self, step, *args, **kwargs):
    if not deleted:                                # the training removes it right now
      deleted.append(step)
      shutil.rmtree(os.path.join(workdir, "checkpoints", str(step)))
      before.update(_listing(workdir))
    return restore(self, step, *args, **kwargs)
  monkeypatch.setattr(ocp.CheckpointManager, "restore", deleted_meanwhile)
  config, params, tokenizer = load_run(workdir)
  assert deleted == [16] and _listing(workdir) == before
  assert sample_text(config, params, tokenizer, prompt="A", max_new_tokens=3, seed=0)


def _saved_run(tmp_path, taken: int = 24, **train):
  """A workdir whose config.json is the tiny config's (what a first run writes), with a
  checkpoint directory at step `taken` (the steps a resume would continue)."""
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / str(taken)).mkdir(parents=True)
  cfg = tiny_run_config(**train)
  (workdir / "config.json").write_text(cfg.to_json())
  return cfg, str(workdir)


@pytest.mark.parametrize("field, value", [
    ("train.seed", 1), ("train.batch_size", 16), ("data.seq_len", 16),
    ("data.tokenizer", "spm:bpe:300"), ("data.source", "other.txt"), ("optim.lr", 2e-3),
    ("optim.schedule", "linear"), ("optim.warmup_steps", 3), ("train.label_smoothing", 0.1),
])
def test_resume_refuses_what_changes_the_steps(tmp_path, field, value):
  cfg, workdir = _saved_run(tmp_path)
  section, key = field.split(".")
  cfg[section][key] = value
  with pytest.raises(ValueError, match=rf"trained with {field}=.*--config\.{field}.*--fresh"):
    config_checks.check_workdir_config(cfg, workdir, fresh=False)
  config_checks.check_workdir_config(cfg, workdir, fresh=True)


def test_resume_accepts_bookkeeping_changes_and_steps_that_keep_the_schedule(tmp_path):
  cfg, workdir = _saved_run(tmp_path)
  cfg.train.update(eval_every=6, log_every=2, keep_checkpoints=5, sample_tokens=40)
  cfg.data.eval_batches = 4
  cfg.mesh.data = 2
  config_checks.check_workdir_config(cfg, workdir, fresh=False)
  cfg.train.steps = 48                 # cosine over train.steps: the first 24 LRs would move
  with pytest.raises(ValueError, match=r"optim.decay_steps=24 to keep its schedule"):
    config_checks.check_workdir_config(cfg, workdir, fresh=False)
  cfg.optim.decay_steps = 24
  config_checks.check_workdir_config(cfg, workdir, fresh=False)
  cfg, workdir = _saved_run(tmp_path / "constant")
  cfg.optim.schedule = "constant"
  (tmp_path / "constant" / "run" / "config.json").write_text(cfg.to_json())
  cfg.train.steps = 100                # a constant LR: extending changes nothing taken
  config_checks.check_workdir_config(cfg, workdir, fresh=False)
  cfg, workdir = _saved_run(tmp_path / "stopped", taken=8)
  cfg.train.steps = 12                 # the LRs of steps 8..11 move, but none was taken yet
  config_checks.check_workdir_config(cfg, workdir, fresh=False)


def test_resume_may_change_keep_checkpoint_every_only_where_the_kept_ones_stay(tmp_path):
  cfg, workdir = _saved_run(tmp_path, keep_checkpoint_every=16)
  for value in (16, 8):                # 8 divides 16: every step kept so far stays kept
    cfg.train.keep_checkpoint_every = value
    config_checks.check_workdir_config(cfg, workdir, fresh=False)
  for value in (0, 32):
    cfg.train.keep_checkpoint_every = value
    with pytest.raises(ValueError, match=rf"keeps a checkpoint every 16 steps; "
                       rf"train.keep_checkpoint_every={value} would delete them.*--fresh"):
      config_checks.check_workdir_config(cfg, workdir, fresh=False)
    config_checks.check_workdir_config(cfg, workdir, fresh=True)


@pytest.mark.slow
def test_kept_checkpoints_survive_rotation_and_resume_and_the_latest_still_loads(tmp_path,
                                                                                 monkeypatch):
  on_one_device(monkeypatch)
  cfg = tiny_run_config(steps=12, checkpoint_every=2, keep_checkpoints=2,
                        keep_checkpoint_every=4, eval_every=12)
  workdir = str(tmp_path / "run")
  loop.train(cfg, workdir, stop_after=7)      # a save at 7, off the kept grid
  ckpts = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"), read_only=True)
  assert sorted(ckpts.manager.all_steps()) == [4, 6, 7]
  ckpts.close()
  loop.train(cfg, workdir)
  # the last 2 (10, 12) and the multiples of 4; 2, 6 and 7 rotated away
  ckpts = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"), read_only=True)
  assert sorted(ckpts.manager.all_steps()) == [4, 8, 10, 12]
  config, params, _ = load_run(workdir)
  abstract = nn.unbox(jax.eval_shape(train_state.train_state_fns(config)[2]))
  step, latest = ckpts.restore_latest(abstract)
  assert step == 12
  jax.tree.map(np.testing.assert_array_equal, params, latest["params"])
  kept = ckpts.manager.restore(4, args=ocp.args.StandardRestore(abstract))
  assert int(kept["step"]) == 4 and int(latest["step"]) == 12
  ckpts.close()


@pytest.mark.parametrize("field, value, match", [
    ("model.vocab_size", 60, "model.vocab_size=60"),
    ("data.seq_len", 64, "data.seq_len=64 exceeds model.max_len=32"),
    ("data.source", "/no/such/file.txt", "data.source='/no/such/file.txt'"),
    ("train.steps", 0, "train.steps=0"),
    ("optim.schedule", "step", "optim.schedule='step'"),
    ("model.family", "nope", "model.family='nope'"),
    ("train.profile_steps", "23-25", "train.profile_steps='23-25' reaches past"),
    ("train.eval_batch_size", 12, "train.eval_batch_size=12 is not divisible by mesh.data=8"),
    ("train.keep_checkpoint_every", 12, r"train.keep_checkpoint_every=12 must be a multiple of "
     r"train.checkpoint_every=8 .*set it to 16, or 0"),
])
def test_bad_config_is_rejected_naming_the_field(tmp_path, field, value, match):
  cfg = tiny_run_config()
  section, key = field.split(".")
  cfg[section][key] = value
  with pytest.raises(ValueError, match=match):
    loop.train(cfg, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")     # before any step


def test_warmup_longer_than_the_run_is_said_before_the_first_step(caplog):
  cfg = tiny_run_config(steps=8)
  config_checks.validate(cfg)                            # tiny: warmup 10 > 8 steps
  assert "optim.warmup_steps=10 is not shorter than train.steps=8" in caplog.text


def test_lr_schedule_and_decay_mask():
  cfg = get_config("gpt2", "tiny").optim
  cfg.update(lr=1.0, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
  sched = optim.learning_rate_schedule(run_settings.parse_section("optim", cfg), 110)
  np.testing.assert_allclose([sched(0), sched(9), sched(10), sched(60), sched(110)],
                             [0.1, 1.0, 1.0, 0.55, 0.1], atol=1e-6)
  params = {"embed": {"embedding": np.zeros((5, 3))}, "ln": {"scale": np.zeros(3)},
            "dense": {"kernel": np.zeros((3, 3)), "bias": np.zeros(3)}}
  assert optim.decay_mask(params) == {"embed": {"embedding": False}, "ln": {"scale": False},
                                      "dense": {"kernel": True, "bias": False}}


def test_non_finite_steps_are_skipped_then_stop_the_run(tmp_path):
  cfg = tiny_run_config(max_skipped_steps=3)
  cfg.optim.update(lr=1e6, warmup_steps=0, clip=0.0)           # diverges within a few steps
  workdir = str(tmp_path / "run")
  with pytest.raises(FloatingPointError, match=r"3 non-finite steps in a row at step \d+; "
                     "stopping: no checkpoint was saved before it") as info:
    loop.train(cfg, workdir)
  assert cli.is_user_error(info.value)          # the CLIs: one line, exit code 2
  assert not os.listdir(os.path.join(workdir, "checkpoints"))     # nothing bad was saved
  records = open(os.path.join(workdir, "metrics.jsonl")).read()
  assert "NaN" not in records.replace('"NaN"', "")                # strict JSON


@pytest.mark.parametrize("smoothing, z", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-3), (0.2, 1e-2)])
def test_cross_entropy_matches_float64_reference(smoothing, z):
  from jaxformer.tasks import cross_entropy
  rng = np.random.default_rng(0)
  logits = (rng.normal(size=(3, 7, 13)) * 3).astype(np.float32)
  targets = rng.integers(0, 13, size=(3, 7))
  x = logits.astype(np.float64)
  log_z = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
  labels = np.eye(13)[targets] * (1 - smoothing) + smoothing / 13
  want = log_z - (labels * x).sum(-1) + z * log_z ** 2
  nll = log_z - np.take_along_axis(x, targets[..., None], -1)[..., 0]
  objective, got_nll = cross_entropy(logits, targets, label_smoothing=smoothing, z_loss=z)
  np.testing.assert_allclose(objective, want, rtol=1e-5)
  np.testing.assert_allclose(got_nll, nll, rtol=1e-5)


@pytest.mark.slow
def test_vit_on_digits_trains_keeps_best_and_writes_observability_files(tmp_path, monkeypatch):
  on_one_device(monkeypatch)
  from tests.unit.train.test_observability import tb_events
  import configs.vit_tiny as vt
  cfg = vt.get_config("digits")
  cfg.optim.update(lr=3e-3, warmup_steps=5)
  cfg.train.update(steps=40, eval_every=20, log_every=10, checkpoint_every=40,
                   profile_steps="3-4")
  workdir = str(tmp_path / "vit")
  last = loop.train(cfg, workdir)
  assert last["step"] == 40 and last["eval_accuracy"] > 0.4      # chance is 0.1
  records = read(os.path.join(workdir, "metrics.jsonl"))
  assert all("images_per_sec" in r for r in records if "loss" in r and r["step"] > 10)
  events = tb_events(workdir)
  assert [step for step, _ in events["scalars"]["eval_accuracy"]] == [20, 40]
  assert [step for step, *_ in events["images"]["attention"]] == [20, 40]
  assert os.path.getsize(os.path.join(workdir, "curves.png")) > 1000
  assert os.listdir(os.path.join(workdir, "profile"))
  assert sorted(os.listdir(os.path.join(workdir, "attention"))) == [
      "step_000020.png", "step_000040.png"]
  assert all(0 < r["attention_entropy"] <= np.log(17) + 1e-5
             for r in records if "eval_loss" in r)        # 16 patches + [CLS]
  best = [r for r in records if "eval_accuracy" in r]
  best_step = max(best, key=lambda r: r["eval_accuracy"])["step"]
  assert os.path.isdir(os.path.join(workdir, "best", str(best_step)))


def test_attention_map_layer_choice():
  from jaxformer.train.attention_maps import pick_layer
  w = lambda *shape: np.zeros(shape)
  name, got = pick_layer({"decoder/layers_2/self_attention": w(1, 2, 3, 3),
                          "decoder/layers_10/self_attention": w(1, 2, 3, 3) + 1,
                          "encoder/layers_11/self_attention": w(1, 2, 5, 5)})
  assert name == "decoder/layers_10/self_attention" and got.shape == (2, 3, 3) and got[0, 0, 0] == 1
  scanned = np.arange(2 * 1 * 2 * 3 * 4).reshape(2, 1, 2, 3, 4)
  name, got = pick_layer({"decoder/layers/cross_attention": scanned,
                          "decoder/layers/self_attention": w(2, 1, 2, 3, 3)})
  assert name == "decoder/layers/cross_attention"
  np.testing.assert_array_equal(got, scanned[-1, 0])


@pytest.mark.slow
def test_bfloat16_pallas_run_then_a_changed_model_is_refused_unless_fresh(tmp_path):
  """bf16 compute with model.attention_impl='pallas' end to end: the sharded train step (data
  parallel over the test's 8 devices), eval, checkpoint, KV-cache sampling; float32 params.
  It resumes with attention_impl/dtype changed; another model is refused, unless --fresh."""
  cfg = tiny_run_config(steps=6, log_every=2, eval_every=6, sample_tokens=8)
  cfg.model.update(dtype="bfloat16", attention_impl="pallas", attention_block_sizes=(16, 16))
  workdir = str(tmp_path / "bf16")
  loop.train(cfg, workdir)
  records = read(os.path.join(workdir, "metrics.jsonl"))
  losses = [r["loss"] for r in records if "loss" in r]
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  assert np.isfinite([r["eval_loss"] for r in records if "eval_loss" in r]).all()
  config, params, _ = load_run(workdir)
  assert config.model.attention_impl == "pallas"
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype("float32")}
  with open(os.path.join(workdir, "samples.txt")) as f:
    assert "--- step 6" in f.read()

  # execution-only fields may change on resume: continue 6 -> 8 on the xla path in float32
  cfg.model.update(dtype="float32", attention_impl="xla", attention_block_sizes=None)
  cfg.train.update(steps=8, eval_every=8, sample_tokens=0)
  loop.train(cfg, workdir)
  assert [r["step"] for r in read(os.path.join(workdir, "metrics.jsonl")) if "loss" in r] == [
      2, 4, 6, 8]
  cfg.model.d_model = 48
  cfg.train.update(steps=2, eval_every=2)
  with pytest.raises(ValueError, match=r"different model \(fields \['d_model'\]\)"):
    loop.train(cfg, workdir)
  loop.train(cfg, workdir, fresh=True)
  assert json.load(open(os.path.join(workdir, "config.json")))["model"]["d_model"] == 48


def test_resume_check_treats_keys_a_saved_run_lacks_as_their_defaults(tmp_path):
  """A run saved before a config key existed (or with a partial model section) resumes when
  the key is at its default, and is refused when it is not."""
  cfg = tiny_run_config(steps=2)
  saved = json.loads(cfg.to_json())
  for key in ("moe_grouped_matmul", "pre_norm", "param_dtype", "window"):
    del saved["model"][key]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  config_checks.check_workdir_config(cfg, str(tmp_path), fresh=False)
  cfg.model.pre_norm = False
  with pytest.raises(ValueError, match=r"different model \(fields \['pre_norm'\]\)"):
    config_checks.check_workdir_config(cfg, str(tmp_path), fresh=False)


@pytest.mark.slow
def test_tensor_parallel_run_with_a_padded_vocabulary_samples(tmp_path):
  """The README's tensor-parallel command pads the vocabulary (65 chars -> a multiple of
  mesh.model); here 512, so most ids have no character: the end-of-training sample and later
  samples decode, for several seeds."""
  cfg = tiny_run_config(steps=2, log_every=1, eval_every=2, checkpoint_every=2, sample_tokens=40)
  cfg.mesh.update(data=-1, model=2, fsdp=True)
  cfg.model.update(vocab_size=512, parametrization="mup", mup_base_width=16)  # μP restores too
  workdir = str(tmp_path / "tp")
  loop.train(cfg, workdir)
  with open(os.path.join(workdir, "samples.txt")) as f:
    assert f.read().startswith("--- step 2\n")
  config, params, tokenizer = load_run(workdir)
  for seed in range(3):
    assert len(sample_text(config, params, tokenizer, prompt="ROMEO:", max_new_tokens=50,
                           seed=seed)) == 56


def test_a_failing_end_of_training_sample_does_not_fail_the_run(tmp_path, monkeypatch, capsys):
  def broken(*args, **kwargs):
    raise RuntimeError("sampler exploded")
  monkeypatch.setattr(inference, "sample_text", broken)
  workdir = str(tmp_path / "run")
  last = loop.train(tiny_run_config(steps=4, eval_every=4, checkpoint_every=4, sample_tokens=10),
                    workdir)
  assert last["step"] == 4 and os.path.isdir(os.path.join(workdir, "checkpoints", "4"))
  assert "sample after 4 steps failed (RuntimeError: sampler exploded)" in capsys.readouterr().out


def test_an_exception_mid_run_still_finishes_the_checkpoint_and_closes_writers(tmp_path,
                                                                             monkeypatch):
  """The shutdown runs in `finally`: a crash after a checkpoint save was started leaves that
  checkpoint complete (not a temporary directory) and the next run resumes from it."""
  calls = {"evals": 0}
  real_evaluate = evaluation.evaluate
  def crash_on_second_eval(*args, **kwargs):
    calls["evals"] += 1
    if calls["evals"] == 2:
      raise RuntimeError("boom")
    return real_evaluate(*args, **kwargs)
  monkeypatch.setattr(evaluation, "evaluate", crash_on_second_eval)
  workdir = str(tmp_path / "run")
  cfg = tiny_run_config(steps=16, eval_every=8, checkpoint_every=4)
  with pytest.raises(RuntimeError, match="boom"):
    loop.train(cfg, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", "4", "8"]
  monkeypatch.setattr(evaluation, "evaluate", real_evaluate)
  assert loop.train(cfg, workdir)["step"] == 16
