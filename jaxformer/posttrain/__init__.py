"""Post-training on top of a trained run (issue #32): supervised fine-tuning (SFT) on
prompt/response data, direct preference optimization (DPO) on preference pairs, and GRPO
with verifiable rewards (RLVR; `grpo.py`, `rewards.py`, task `jaxformer/tasks/grpo.py`).

Both reuse the training loop: SFT is the decoder's `lm` objective on packed prompt/response
rows whose weights are 1 on response tokens only (`data.py`); DPO's loss (`dpo.py`) is
trained on rows of (chosen, rejected) completions. Each is a task (`jaxformer/tasks/sft.py`,
`dpo.py`) that `posttrain.method` picks. A run starts from the params of a
trained workdir (`posttrain.init_from`, `start.py`) and uses that run's tokenizer.
See docs-wip/posttrain.md for the state of this work.
"""
