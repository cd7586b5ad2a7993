"""GPT-3 (Brown et al., 2020, Table 2.1):
`--config=configs/gpt3.py:{small,medium,large,xl,2.7b,6.7b,13b,175b,tiny}`.

GPT-2 architecture (pre-norm, learned positions, tanh GELU, biases, tied head, vocab 50257)
at n_ctx = 2048, mlp_dim = 4 * d_model. We use dense attention everywhere (the paper
alternates dense and locally banded sparse attention layers; the pattern adds no parameters).

Table 2.1 values kept as printed, except two inconsistencies:
- GPT-3 XL: the paper lists n_heads = 24, d_head = 128, but 24 * 128 = 3072 != d_model = 2048
  (and with d_attn = 3072 the model would have ~1.5B, not 1.3B, parameters). We use
  16 heads x 128 = 2048, which gives 1.32B, matching the stated 1.3B.
- GPT-3 13B: the paper prints d_model = 5140, a typo for 5120 (= 40 heads x 128).

`reference` holds the paper's row: params, n_heads / d_head as printed, batch size in tokens
and learning rate. train.batch_size is that batch in 2048-token sequences (0.5M = 256 x 2048;
3.2M -> 1536 sequences, 3.1M tokens, as in Megatron/OPT reproductions); optim follows section
2.3 / appendix B: Adam b1 0.9, b2 0.95, eps 1e-8, clip 1.0, weight decay 0.1, linear warmup
over 375M tokens, cosine decay to 10% over 260B tokens (then constant; we stop at 300B).
"""

from configs import common

N_CTX = 2048
# name: (n_layers, d_model, n_heads used, d_head, paper n_heads, paper params,
#        paper batch size (tokens, as printed), batch size in 2048-token sequences, paper lr)
SIZES = {
    "small": (12, 768, 12, 64, 12, 125e6, "0.5M", 256, 6.0e-4),
    "medium": (24, 1024, 16, 64, 16, 350e6, "0.5M", 256, 3.0e-4),
    "large": (24, 1536, 16, 96, 16, 760e6, "0.5M", 256, 2.5e-4),
    "xl": (24, 2048, 16, 128, 24, 1.3e9, "1M", 512, 2.0e-4),   # paper: 24 heads (inconsistent)
    "2.7b": (32, 2560, 32, 80, 32, 2.7e9, "1M", 512, 1.6e-4),
    "6.7b": (32, 4096, 32, 128, 32, 6.7e9, "2M", 1024, 1.2e-4),
    "13b": (40, 5120, 40, 128, 40, 13.0e9, "2M", 1024, 1.0e-4),  # paper: d_model 5140 (typo)
    "175b": (96, 12288, 96, 128, 96, 175.0e9, "3.2M", 1536, 0.6e-4),
    "tiny": (2, 64, 4, 16, None, None, None, 32, 1e-3),
}
TRAIN_TOKENS = 300e9
WARMUP_TOKENS = 375e6
DECAY_TOKENS = 260e9


def get_config(arg=None):
  name, row = common.select("gpt3", arg, SIZES)
  n_layers, d_model, n_heads, d_head, paper_heads, params, batch_tokens, batch_size, lr = row
  assert n_heads * d_head == d_model, name
  if name == "tiny":
    model = common.model(
        "decoder", "gpt3-tiny", vocab_size=65, d_model=d_model, num_layers=n_layers,
        num_heads=n_heads, mlp_dim=4 * d_model, max_len=256, positions="learned",
        norm="layernorm", norm_eps=1e-5, ffn="mlp", activation=None, use_bias=True,
        tie_embeddings=True, dtype="float32")
    return common.config(
        model=model, data=common.data("tinyshakespeare", "char", 128),
        train=common.train(2000, batch_size, eval_every=200, log_every=20, checkpoint_every=500),
        optim=common.optim(lr, warmup_steps=100, b2=0.99))
  model = common.model(
      "decoder", f"gpt3-{name}", vocab_size=50257, d_model=d_model, num_layers=n_layers,
      num_heads=n_heads, mlp_dim=4 * d_model, max_len=N_CTX, positions="learned",
      norm="layernorm", norm_eps=1e-5, ffn="mlp", activation=None, use_bias=True,
      tie_embeddings=True, dropout_rate=0.0, dtype="bfloat16")
  tokens_per_step = batch_size * N_CTX
  return common.config(
      model=model,
      data=common.data("tinyshakespeare", "gpt2", N_CTX),
      train=common.train(round(TRAIN_TOKENS / tokens_per_step), batch_size, eval_every=2000,
                         log_every=50, checkpoint_every=5000),
      optim=common.optim(lr, warmup_steps=round(WARMUP_TOKENS / tokens_per_step),
                         weight_decay=0.1, b2=0.95, decay_steps=round(DECAY_TOKENS /
                                                                      tokens_per_step)),
      reference=common.reference(
          round(params), source="Brown et al. 2020, Table 2.1", params_key="total",
          n_heads=paper_heads, d_head=d_head, batch_tokens=batch_tokens, lr=lr,
          note=("paper lists 24 heads x d_head 128 (3072 != d_model 2048); we use 16 x 128"
                if name == "xl" else "")))
