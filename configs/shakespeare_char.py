"""Character-level GPT on the bundled tiny Shakespeare: the README's main job.

`--config=configs/shakespeare_char.py` (default) and `:nanogpt_cpu` are the peer's published
CPU setup (nanoGPT, train_shakespeare_char on CPU): 4 layers, 4 heads, width 128, context 64,
batch 12, 2000 AdamW steps (betas 0.9/0.99, weight decay 0.1), lr 1e-3 with 100 warmup steps
and cosine decay to 1e-4, clip 1.0, no dropout, no biases, tied embeddings.
`:tiny` is a seconds-long smoke run of the same pipeline.
"""

from configs import common

SIZES = {
    "nanogpt_cpu": dict(model=dict(d_model=128, num_layers=4, num_heads=4, mlp_dim=512),
                        seq_len=64, batch_size=12, steps=2000, eval_every=250),
    "tiny": dict(model=dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=64),
                 seq_len=32, batch_size=8, steps=60, eval_every=30),
}


def get_config(arg=None):
  name, size = common.select("shakespeare_char", arg or "nanogpt_cpu", SIZES)
  model = common.model("decoder", f"shakespeare-char-{name}", vocab_size=65,
                       max_len=size["seq_len"], positions="learned", norm="layernorm",
                       ffn="mlp", use_bias=False, tie_embeddings=True, dropout_rate=0.0,
                       **size["model"])
  return common.config(
      model=model,
      data=common.data("tinyshakespeare", "char", size["seq_len"], eval_batches=20),
      train=common.train(size["steps"], size["batch_size"], eval_every=size["eval_every"],
                         checkpoint_every=500,
                         sample_tokens=500 if name != "tiny" else 80,
                         sample_prompt="\n"),
      optim=common.optim(1e-3, warmup_steps=100 if name != "tiny" else 10, b2=0.99,
                         weight_decay=0.1, clip=1.0, min_lr_ratio=0.1))
