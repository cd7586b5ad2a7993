"""Direct preference optimization of an SFT run (issue #32; jaxformer/posttrain/dpo.py).

    python -m jaxformer.train --config=configs/dpo.py:SFT_WORKDIR \\
        --config.data.source=pairs.jsonl [--config.posttrain.beta=0.1] --workdir=DIR

`arg` is the trained (SFT) workdir: its params start the policy and are kept, frozen, as the
reference (the train state's 'reference', checkpointed with it); its model section (dropout
off), tokenizer and seq_len are used; `hf:DIR` starts from a Hugging Face checkpoint instead. Records: {"prompt", "chosen", "rejected"} JSON Lines. Logged:
`loss` (DPO), `dpo_rewards_*`, `dpo_logratio`, `dpo_logps_*`; evals add `eval_accuracy` (reward
accuracy) and `eval_rewards_margin`, `eval_logratio`, ...
"""

from configs import sft


def get_config(arg=None):
  cfg = sft.posttrain_config(arg, "dpo")
  cfg.optim.lr = 1e-5
  # dropout off, as trl's DPOConfig(disable_dropout=True): a stochastic policy against the
  # deterministic reference would bias the log-ratios (the loss starts at log 2 exactly)
  for key in cfg.model.keys():
    if "dropout" in key and isinstance(cfg.model[key], float):
      cfg.model[key] = 0.0
  return cfg
