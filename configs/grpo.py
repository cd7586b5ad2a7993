"""GRPO with verifiable rewards (RLVR) on top of an SFT (or DPO) run (jaxformer/tasks/grpo.py,
jaxformer/posttrain/grpo.py).

    python -m jaxformer.train --config=configs/grpo.py:SFT_WORKDIR \\
        --config.data.source=prompts.jsonl --config.posttrain.reward=first_line_exact \\
        [--config.posttrain.stop='\\n'] --workdir=DIR

`arg` is the trained workdir to start from (or `hf:DIR`): its params start the policy and are
kept, frozen, as the reference; its model section (dropout off), tokenizer and seq_len are
used. Records: JSON Lines with 'prompt' and the fields the reward reads ('answer' for the
built-in rewards). train.batch_size counts completions: batch_size / num_generations prompts
per step. Logged: `loss` (the GRPO objective), `reward`, `reward_std`, `kl`,
`completion_length`, `clip_ratio/*`; evals `eval_reward`, `eval_kl`, ...
"""

import dataclasses

from ml_collections import config_dict

from configs import dpo
from jaxformer import run_settings

GRPO_KEYS = ("num_generations", "max_new_tokens", "temperature", "reward", "stop", "loss_type",
             "scale_rewards", "epsilon", "epsilon_high")


def get_config(arg=None):
  cfg = dpo.get_config(arg)              # dropout off, as for DPO (and trl's disable_dropout)
  cfg.posttrain.method = "grpo"
  defaults = {f.name: f.default for f in dataclasses.fields(run_settings.PosttrainSettings)}
  for key in GRPO_KEYS:       # a None default is a typed placeholder: --config.posttrain.* parses
    kind = {"epsilon_high": float}.get(key, str)
    cfg.posttrain[key] = (config_dict.placeholder(kind) if defaults[key] is None
                          else defaults[key])
  cfg.posttrain.beta = 0.04               # the KL weight of DeepSeekMath's GRPO
  cfg.optim.lr = 1e-6
  cfg.train.update(batch_size=16, eval_every=50, keep_best=0)
  return cfg
