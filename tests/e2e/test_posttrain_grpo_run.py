"""A tiny GRPO run from a trained workdir through the one trainer: completions sampled and
scored between steps, the reference stays the source's params, the policy moves, the reward
and KL are logged, and a run stopped half way resumes to the same metrics."""

import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import grpo as grpo_config
from jaxformer.inference import load_run
from jaxformer.state import checkpoint, train_state
from jaxformer.train import loop
from jaxformer.train.metrics import read
from tests.runs import tiny_run_config


@pytest.mark.slow
def test_tiny_grpo_run_trains_against_a_frozen_reference_and_resumes_exactly(tmp_path):
  source = str(tmp_path / "source")
  loop.train(tiny_run_config(steps=4, checkpoint_every=4, eval_every=4, log_every=4), source)
  _, src_params, _ = load_run(source)
  data = tmp_path / "prompts.jsonl"
  data.write_text("".join(json.dumps({"prompt": f"say {chr(97 + i % 26)}{chr(97 + i // 26)}:",
                                      "answer": "e"}) + "\n" for i in range(40)))
  cfg = grpo_config.get_config(source)
  cfg.data.source, cfg.data.eval_source, cfg.data.eval_batches = str(data), str(data), 1
  cfg.posttrain.update(reward="contains_answer", stop="\n", max_new_tokens=6,
                       num_generations=4, beta=0.1)
  cfg.optim.update(lr=3e-3, warmup_steps=1)
  cfg.train.update(steps=4, batch_size=16, log_every=1, eval_every=2, checkpoint_every=2)
  full, parted = str(tmp_path / "full"), str(tmp_path / "parted")
  loop.train(cfg, full)
  loop.train(cfg, parted, stop_after=2)
  loop.train(cfg, parted)
  records = read(os.path.join(full, "metrics.jsonl"))
  keys = ("step", "loss", "grad_norm", "reward", "kl", "completion_length", "eval_loss",
          "eval_reward", "eval_kl")
  strip = lambda rs: [{k: r[k] for k in keys if k in r} for r in rs]
  assert strip(read(os.path.join(parted, "metrics.jsonl"))) == strip(records)
  train = [r for r in records if "reward" in r]
  assert len(train) == 4 and train[0]["kl"] == pytest.approx(0, abs=1e-6)   # policy == ref
  assert train[-1]["kl"] > 0                                                # then it moved
  assert any(r["frac_reward_zero_std"] < 1 for r in train)    # some group had a signal
  assert all(0 < r["completion_length"] <= 6 for r in train)
  evals = [r for r in records if "eval_reward" in r]
  assert [e["step"] for e in evals] == [2, 4] and {"eval_kl", "eval_completion_length"} <= set(
      evals[-1])
  _, _, init_boxed = train_state.train_state_fns(ConfigDict(train_state.read_config(full)))
  ckpts = checkpoint.Checkpoints(os.path.join(full, "checkpoints"), read_only=True)
  step, state = ckpts.restore_latest(nn.unbox(jax.eval_shape(init_boxed)))
  ckpts.close()
  assert step == 4
  same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), state["reference"], src_params)
  moved = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), state["params"], src_params)
  assert all(jax.tree.leaves(same)) and not all(jax.tree.leaves(moved))
