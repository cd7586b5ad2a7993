"""BERT pre-training with both objectives, masked LM and next-sentence prediction, on the
bundled tiny Shakespeare (characters): `--config=configs/bert_nsp_shakespeare.py[:tiny]`.

`model.nsp=True` adds the next-sentence head on the pooled [CLS] state; the data are sentence
pairs `[CLS] A [SEP] B [SEP]` of seq_len characters (`data/text.py` NSPPipeline: B follows A
half of the time, else a span from elsewhere; 15% of A and B masked as in BERT), the loss is
MLM mean + NSP mean (BertForPreTraining's), and eval reports `eval_nsp_accuracy` next to the
masked-token `eval_accuracy`. The [MASK]/[CLS]/[SEP] ids 65/66/67 are appended to the
65-character vocabulary (model vocab 68).
"""

from configs import common

SIZES = {
    "small": dict(d_model=128, num_layers=4, num_heads=4, mlp_dim=512, seq_len=128,
                  batch_size=32, steps=2000, eval_every=250, warmup=100),
    "tiny": dict(d_model=64, num_layers=2, num_heads=4, mlp_dim=256, seq_len=64,
                 batch_size=32, steps=500, eval_every=100, warmup=50),
}


def get_config(arg=None):
  name, size = common.select("bert_nsp_shakespeare", arg, SIZES, default="small")
  model = common.model(
      "bert", f"bert-nsp-shakespeare-{name}", vocab_size=68, d_model=size["d_model"],
      num_layers=size["num_layers"], num_heads=size["num_heads"], mlp_dim=size["mlp_dim"],
      max_len=size["seq_len"], nsp=True, dropout_rate=0.0, attention_dropout_rate=0.0)
  return common.config(
      model=model,
      data=common.data("tinyshakespeare", "char", size["seq_len"], mask_rate=0.15,
                       eval_batches=20),
      train=common.train(size["steps"], size["batch_size"], eval_every=size["eval_every"],
                         checkpoint_every=500),
      optim=common.optim(1e-3, warmup_steps=size["warmup"], b2=0.99, weight_decay=0.01,
                         min_lr_ratio=0.1))
