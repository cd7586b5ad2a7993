"""A tiny DPO run from a trained workdir: the reference stays the source's params, the policy
moves, rewards and margins are logged, and the run resumes exactly, without its source."""

import json
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import dpo as dpo_config
from jaxformer.inference import load_run
from jaxformer.state import checkpoint, train_state
from jaxformer.train import loop
from jaxformer.train.metrics import read
from tests.runs import on_one_device, tiny_run_config


def _pairs(path, n=48):
  rng = np.random.default_rng(1)
  with open(path, "w") as f:
    for i in range(n):
      good = "ab"[int(rng.integers(2))] * 4
      f.write(json.dumps({"prompt": f"Say {good} {chr(97 + i % 26)}{chr(97 + i // 26)}:\n", "chosen": good + ".\n",
                          "rejected": "zz" + good[:2] + "\n"}) + "\n")


def _config(source, data):
  cfg = dpo_config.get_config(source)
  cfg.data.source, cfg.data.eval_batches = data, 1
  cfg.optim.update(lr=1e-3, warmup_steps=1)
  cfg.train.update(steps=6, batch_size=8, log_every=2, eval_every=3, checkpoint_every=3)
  return cfg


@pytest.mark.slow
def test_tiny_dpo_run_trains_against_a_frozen_reference_and_resumes_exactly(tmp_path,
                                                                            monkeypatch):
  """...and resumes with its source workdir deleted (its config, tokenizer and reference are
  in its own workdir)."""
  on_one_device(monkeypatch)          # what it trains and resumes, not the mesh: 1 device
  source = str(tmp_path / "source")
  loop.train(tiny_run_config(steps=8, checkpoint_every=8, eval_every=8, log_every=4), source)
  _, src_params, _ = load_run(source)
  data = str(tmp_path / "pairs.jsonl")
  _pairs(data)
  cfg = _config(source, data)
  full, parted = str(tmp_path / "full"), str(tmp_path / "parted")
  loop.train(cfg, full)
  loop.train(cfg, parted, stop_after=4)
  assert os.path.exists(os.path.join(parted, "posttrain_source.json"))
  shutil.rmtree(source)
  monkeypatch.setattr("sys.argv", ["train", f"--config=configs/dpo.py:{source}",
                                   f"--workdir={parted}"])      # as rerunning the command
  resumed = _config(source, data)
  assert resumed.to_json() == cfg.to_json()
  loop.train(resumed, parted)
  records = read(os.path.join(full, "metrics.jsonl"))
  keys = ("step", "loss", "grad_norm", "dpo_rewards_margin", "eval_loss", "eval_accuracy",
          "eval_logratio")
  strip = lambda rs: [{k: r[k] for k in keys if k in r} for r in rs]
  assert strip(read(os.path.join(parted, "metrics.jsonl"))) == strip(records)
  train = [r for r in records if "loss" in r]
  assert abs(train[0]["loss"] - np.log(2)) < 0.05       # policy == reference at the start
  assert train[-1]["loss"] < train[0]["loss"] and train[-1]["dpo_rewards_margin"] > 0
  evals = [r for r in records if "eval_loss" in r]
  assert {"eval_rewards_margin", "eval_logratio", "eval_rewards_chosen"} <= set(evals[-1])
  # the checkpoint keeps the reference equal to the source's params; the policy moved
  _, _, init_boxed = train_state.train_state_fns(ConfigDict(train_state.read_config(full)))
  ckpts = checkpoint.Checkpoints(os.path.join(full, "checkpoints"), read_only=True)
  step, state = ckpts.restore_latest(nn.unbox(jax.eval_shape(init_boxed)))
  ckpts.close()
  assert step == 6
  same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), state["reference"], src_params)
  moved = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), state["params"], src_params)
  assert all(jax.tree.leaves(same)) and not all(jax.tree.leaves(moved))
