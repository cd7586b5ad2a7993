"""BERT masked-language modelling on the bundled tiny Shakespeare (characters):
`--config=configs/bert_mlm_shakespeare.py[:tiny]`.

A small post-norm BERT encoder trained with BERT's masking (15% of positions: 80% [MASK],
10% random, 10% unchanged) on 128-character windows; the [MASK] id is appended to the
65-character vocabulary (model vocab 66). Eval reports loss and accuracy on masked positions.
"""

from configs import common

SIZES = {
    "small": dict(d_model=128, num_layers=4, num_heads=4, mlp_dim=512, seq_len=128,
                  batch_size=32, steps=2000, eval_every=250),
    "tiny": dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=64, seq_len=32,
                 batch_size=8, steps=60, eval_every=30),
}


def get_config(arg=None):
  name, size = common.select("bert_mlm_shakespeare", arg, SIZES, default="small")
  model = common.model(
      "bert", f"bert-mlm-shakespeare-{name}", vocab_size=66, d_model=size["d_model"],
      num_layers=size["num_layers"], num_heads=size["num_heads"], mlp_dim=size["mlp_dim"],
      max_len=size["seq_len"], dropout_rate=0.0, attention_dropout_rate=0.0)
  return common.config(
      model=model,
      data=common.data("tinyshakespeare", "char", size["seq_len"], mask_rate=0.15,
                       eval_batches=20),
      train=common.train(size["steps"], size["batch_size"], eval_every=size["eval_every"],
                         checkpoint_every=500),
      optim=common.optim(1e-3, warmup_steps=100 if name != "tiny" else 10, b2=0.99,
                         weight_decay=0.01, min_lr_ratio=0.1))
