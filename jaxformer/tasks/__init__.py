"""Tasks: what a model is trained to do, one module per task behind one protocol
(`base.Task`: its pipeline and batch layout, loss, eval sums and metrics, extra state, what
throughput counts and what inference can do with it), and the registry.

A model family's registry entry names its task; a config's `posttrain.method` picks SFT,
DPO or GRPO (`task_for_run`). Adding a task is one module and one entry in the tuple below (see
docs/design/tasks.md for a worked example).
"""

from __future__ import annotations

from jaxformer.tasks import (captioning, classification, dpo, grpo, lm, mlm,
                             replaced_token_detection, seq2seq, sft)
from jaxformer.tasks.base import LossContext, LossSums, Task
from jaxformer.tasks.cross_entropy import CrossEntropyTask, cross_entropy, head_sums
from jaxformer.tasks.registry import (get, names, register, saved_run_data, task_for,
                                      task_for_run, unregister)

for _module in (lm, mlm, classification, seq2seq, replaced_token_detection, captioning, sft,
                dpo, grpo):
  for _task in _module.TASKS:
    register(_task)

__all__ = ["Task", "LossContext", "LossSums", "CrossEntropyTask", "cross_entropy", "head_sums",
           "get", "names", "register", "unregister", "task_for", "task_for_run",
           "saved_run_data"]
