"""Supervised fine-tuning of a trained decoder run (issue #32; jaxformer/posttrain).

    python -m jaxformer.train --config=configs/sft.py:SOURCE_WORKDIR \\
        --config.data.source=train.jsonl [--config.data.eval_source=eval.jsonl] --workdir=DIR

`arg` is the trained workdir to start from (or `hf:DIR`, a Hugging Face checkpoint with its
tokenizer.json; data.seq_len then defaults to min(max_len, 256)): its model section is copied (the params must have
its shapes), its latest checkpoint's params and its tokenizer are used; data.seq_len defaults
to its own. Records are JSON Lines with 'prompt' and 'response' (or chat 'messages'), see
jaxformer/posttrain/data.py; the loss is on response tokens only.

Rerunning the same command resumes DIR even once SOURCE_WORKDIR is gone: the run recorded
the source's config in DIR/posttrain_source.json at its start, and this file reads it (DIR
from the command line's --workdir) when the source holds no run.
"""

from ml_collections import config_dict

from configs import common
from jaxformer import models
from jaxformer.posttrain import start as posttrain_init


def get_config(arg=None):
  return posttrain_config(arg, "sft")


def posttrain_config(arg, method: str):
  """The config of `method` ('sft' | 'dpo') starting from the trained workdir `arg`."""
  if not arg:
    raise ValueError(f"configs/{method}.py needs the trained workdir to start from: "
                     f"--config=configs/{method}.py:WORKDIR")
  source = posttrain_init.source_config(arg)     # 'hf:DIR': the checkpoint's model only
  model = config_dict.ConfigDict(models.with_defaults(source.model))
  seq_len = source.data.get("seq_len") or min(model.get("max_len") or 256, 256)
  cfg = common.config(
      model=model,
      data=common.data("", None, seq_len, eval_source=config_dict.placeholder(str),
                       train_fraction=0.9, eval_batches=config_dict.placeholder(int)),
      train=common.train(200, 8, eval_every=50, log_every=10, checkpoint_every=50,
                         sample_tokens=0, attention_maps=False,
                         seed=source.train.get("seed", 0)),
      optim=common.optim(1e-4, schedule="constant", warmup_steps=10, weight_decay=0.0,
                         clip=1.0))
  cfg.posttrain = config_dict.ConfigDict(dict(method=method, init_from=arg, beta=0.1,
                                              label_smoothing=0.0))
  return cfg
