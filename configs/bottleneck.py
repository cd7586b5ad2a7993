"""The three models of the bottleneck experiment (experiments/bottleneck.py):
`--config=configs/bottleneck.py:{rnn,rnn_attention,transformer}`.

Why: Cho et al. (2014) squeeze the whole source into the encoder's last state; Bahdanau et al.
(2015) let the decoder re-read every encoder state; the Transformer keeps the re-reading and
drops the recurrence. Same task, data, batch size and seed for all three, so the main
difference is how the decoder sees the source. Sources have 5..100 symbols (of 16), so the
fixed context vector must hold up to 100 x 4 bits. Sized to train all three in about 16
CPU-minutes on a 2-core CPU (the attention RNN needs 1000 steps: at 500 it was still at 0.62
token accuracy); the task is `copy` unless `--config.data.source=synthetic:reverse`.
"""

from __future__ import annotations

from configs import common

SYMBOLS = 16
MIN_LEN, MAX_LEN = 5, 100
VOCAB = SYMBOLS + 3                       # PAD, BOS, EOS + symbols
_RNN = dict(vocab_size=VOCAB, embed_dim=32, hidden_dim=128, cell="gru")
MODELS = {
    "rnn": dict(family="rnn_seq2seq", attention=False, **_RNN),
    "rnn_attention": dict(family="rnn_seq2seq", attention=True, attention_dim=64, **_RNN),
    "transformer": dict(family="seq2seq", vocab_size=VOCAB, d_model=64, num_encoder_layers=2,
                        num_decoder_layers=2, num_heads=4, mlp_dim=256, pre_norm=True,
                        dropout_rate=0.0, attention_dropout_rate=0.0),
}
STEPS = {"rnn": 1000, "rnn_attention": 1000, "transformer": 600}
LR = {"rnn": 3e-3, "rnn_attention": 3e-3, "transformer": 1e-3}


def get_config(arg=None):
  name, fields = common.select("bottleneck", arg, MODELS, default="rnn_attention")
  fields = dict(fields)
  model = common.model(fields.pop("family"), f"bottleneck-{name}", **fields)
  return common.config(
      model=model,
      data=common.data("synthetic:copy", None, None, vocab_size=SYMBOLS, min_len=MIN_LEN,
                       max_len=MAX_LEN, num_train=200_000, num_eval=500),
      train=common.train(STEPS[name], 32, eval_every=100, log_every=50,
                         checkpoint_every=STEPS[name], best_metric="eval_accuracy",
                         eval_batch_size=250, attention_maps=False),
      optim=common.optim(LR[name], warmup_steps=50, weight_decay=0.0, b2=0.98,
                         min_lr_ratio=0.1))
