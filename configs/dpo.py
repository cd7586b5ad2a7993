"""Direct preference optimization of an SFT run (issue #32; jaxformer/posttrain/dpo.py).

    python -m jaxformer.train --config=configs/dpo.py:SFT_WORKDIR \\
        --config.data.source=pairs.jsonl [--config.posttrain.beta=0.1] --workdir=DIR

`arg` is the trained (SFT) workdir: its params start the policy and are kept, frozen, as the
reference (the train state's 'reference', checkpointed with it); its model section, tokenizer
and seq_len are used. Records: {"prompt", "chosen", "rejected"} JSON Lines. Logged:
`loss` (DPO), `dpo_rewards_*`, `dpo_kl`, `dpo_logps_*`; evals add `eval_accuracy` (reward
accuracy) and `eval_rewards_margin`, `eval_kl`, ...
"""

from configs import sft


def get_config(arg=None):
  cfg = sft.posttrain_config(arg, "dpo")
  cfg.optim.lr = 1e-5
  return cfg
