"""Encoder-decoder Transformer on a synthetic sequence task:
`--config=configs/seq2seq_synthetic.py:{reverse,copy,recall}`.

Tasks are generated on the fly (`data.source = "synthetic:<task>"`): copy or reverse a random
sequence of 16 symbols with length 5..`data.max_len`, or associative recall (key-value pairs,
then a query key; the target is its value). Eval reports token and whole-sequence accuracy.
Swap the model for the RNN baselines with `--config.model` overrides in experiments/bottleneck.py.
"""

from configs import common

TASKS = {"reverse": dict(max_len=24), "copy": dict(max_len=24), "recall": dict(max_len=8)}


def get_config(arg=None):
  task, size = common.select("seq2seq_synthetic", arg, TASKS, default="reverse")
  symbols = 16
  model = common.model(
      "seq2seq", f"transformer-synthetic-{task}", vocab_size=symbols + 3, d_model=64,
      num_encoder_layers=2, num_decoder_layers=2, num_heads=4, mlp_dim=256, pre_norm=True,
      dropout_rate=0.0, attention_dropout_rate=0.0)
  return common.config(
      model=model,
      data=common.data(f"synthetic:{task}", None, None, vocab_size=symbols, min_len=5,
                       max_len=size["max_len"], num_train=100_000, num_eval=1_000),
      train=common.train(1500, 64, eval_every=250, log_every=50, checkpoint_every=500,
                         best_metric="eval_accuracy", eval_batch_size=250),
      optim=common.optim(1e-3, warmup_steps=100, weight_decay=0.0, b2=0.98,
                         min_lr_ratio=0.1))
