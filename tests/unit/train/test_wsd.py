"""Warmup-stable-decay schedules and cooldown branches: the schedule against a NumPy reference,
and a branch of a longer wsd run that ends exactly where a run trained to that length ends."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxformer import run_settings
from jaxformer.state import optim
from jaxformer.train import config_checks, loop, workdir as workdir_lib
from jaxformer.train.metrics import read
from tests.runs import config_flags, tiny_run_config


def _wsd(total, *, lr=1.0, warmup=10, fraction=0.2, shape="1-sqrt", final=0.1, decay_steps=None):
  """float64 reference: linear warmup, lr until the last `fraction` of the steps, then decay."""
  end = decay_steps or total
  start = end - max(round(fraction * end), 1)
  out = []
  for s in range(total):
    if s < warmup:
      out.append(lr * (s + 1) / warmup)
      continue
    x = min(max((s - start) / (end - start), 0.0), 1.0)
    f = {"1-sqrt": 1 - np.sqrt(x), "linear": 1 - x, "cosine": 0.5 * (1 + np.cos(np.pi * x))}
    out.append(lr * final + (lr - lr * final) * f[shape])
  return np.array(out)


@pytest.mark.parametrize("shape", run_settings.DECAY_SHAPES)
@pytest.mark.parametrize("total, fraction, decay_steps", [(137, 0.2, None), (50, 1.0, None),
                                                          (90, 0.1, 70)])
def test_wsd_schedule_matches_reference(shape, total, fraction, decay_steps):
  o = run_settings.parse_section("optim", dict(lr=3e-3, schedule="wsd", warmup_steps=7,
                                               decay_fraction=fraction, decay_shape=shape,
                                               decay_steps=decay_steps, min_lr_ratio=0.1))
  got = np.asarray(optim.learning_rate_schedule(o, total)(np.arange(total)), np.float64)
  want = _wsd(total, lr=3e-3, warmup=7, fraction=fraction, shape=shape, final=0.1,
              decay_steps=decay_steps)
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)
  start = optim.wsd_decay_start(o, total)
  if start >= 7:                        # the stable phase ends where the decay starts
    assert got[start] == pytest.approx(3e-3) and got[start + 1] < 3e-3


def test_a_shorter_wsd_run_shares_the_stable_phase_of_a_longer_one():
  o = run_settings.parse_section("optim", dict(lr=1e-3, schedule="wsd", warmup_steps=5))
  long, short = optim.learning_rate_schedule(o, 1000), optim.learning_rate_schedule(o, 400)
  shared = np.arange(optim.wsd_decay_start(o, 400) + 1)
  np.testing.assert_array_equal(long(shared), short(shared))


def test_wsd_config_errors_name_the_field():
  cfg = tiny_run_config(steps=24)
  cfg.optim.update(schedule="wsd", warmup_steps=22)
  with pytest.raises(ValueError, match=r"optim.warmup_steps=22 runs into the decay .* step 19"):
    config_checks.validate(cfg)
  cfg = tiny_run_config(steps=24, checkpoint_steps=(8, 30))
  with pytest.raises(ValueError, match=r"train.checkpoint_steps=\(8, 30\) reaches past"):
    config_checks.validate(cfg)
  cfg = tiny_run_config(steps=24, checkpoint_steps=(16, 8))
  with pytest.raises(ValueError, match=r"train.checkpoint_steps=\(16, 8\) must be a tuple of "
                     "increasing"):
    config_checks.validate(cfg)
  for bad in ("runs/trunk", "runs/trunk@x", "@8"):
    with pytest.raises(ValueError, match=r"--branch_from=.*TRUNK_WORKDIR@STEP"):
      workdir_lib.parse_branch(bad)


def _wsd_config(steps, **train):
  cfg = tiny_run_config(steps=steps, eval_every=steps, **train)
  cfg.optim.update(schedule="wsd", warmup_steps=2, decay_fraction=0.25, min_lr_ratio=0.0)
  return cfg


@pytest.mark.slow
def test_cooldown_branch_equals_the_run_trained_to_its_length(tmp_path):
  """A 32-step wsd trunk keeps its stable checkpoint at step 18; a branch of it with
  train.steps=24 (decay from step 18) reproduces a separate 24-step wsd run exactly (same
  data order, same learning rates), through the CLI."""
  trunk, branch, direct = (str(tmp_path / n) for n in ("trunk", "branch", "direct"))
  loop.train(_wsd_config(32, checkpoint_steps=(18,)), trunk)
  loop.train(_wsd_config(24), direct)
  assert 18 in {int(p) for p in os.listdir(os.path.join(trunk, "checkpoints")) if p.isdigit()}
  command = [sys.executable, "-m", "jaxformer.train", "--config=configs/shakespeare_char.py:tiny",
             f"--workdir={branch}", f"--branch_from={trunk}@18",
             *[f for f in config_flags(_wsd_config(24))]]
  subprocess.run(command, check=True, capture_output=True, text=True)
  ours = {r["step"]: r for r in read(os.path.join(branch, "metrics.jsonl"))}
  theirs = {r["step"]: r for r in read(os.path.join(direct, "metrics.jsonl"))}
  assert sorted(ours) == sorted(theirs)           # the trunk's records up to 18, then its own
  for step in theirs:
    for key in ("loss", "lr", "eval_loss"):
      if key in theirs[step]:
        assert ours[step][key] == pytest.approx(theirs[step][key], rel=1e-5), (step, key)
  assert json.load(open(os.path.join(branch, "branched_from.json")))["step"] == 18
  # idempotent: branching again resumes the finished branch; another trunk step is refused
  assert not workdir_lib.branch(trunk, 18, branch)
  with pytest.raises(ValueError, match="not a branch of .* at step 24.*--fresh"):
    workdir_lib.branch(trunk, 24, branch)
  with pytest.raises(ValueError, match=r"no checkpoint at step 9 \(kept: \[18, .*checkpoint_steps"):
    workdir_lib.branch(trunk, 9, str(tmp_path / "other"))
  # a branch whose steps would change a learning rate already taken is refused on resume
  late = str(tmp_path / "late")
  workdir_lib.branch(trunk, 32, late)
  with pytest.raises(ValueError, match="would change the learning rate of the steps already"):
    loop.train(_wsd_config(24), late)
