"""Mixture-of-experts vs dense GPT on the bundled tiny Shakespeare, on a laptop CPU.

`--config=configs/moe_gpt.py:{switch,mixtral,dense,tiny}`: the `nanogpt_cpu` setup of
configs/shakespeare_char.py (4 layers, width 128, context 64, batch 12, 2000 steps) with its
FFN swapped, so validation-loss curves compare at equal *active* parameters per token:
- `dense`: GELU MLP, hidden 512.
- `switch`: 8 GELU experts of hidden 512, top-1, capacity dispatch (factor 1.25), raw gates,
  router jitter 0.01 (Switch Transformer).
- `mixtral`: 8 GELU experts of hidden 256, top-2, dropless, renormalised gates (Mixtral's
  routing; GELU instead of SwiGLU keeps 2 x 256 = 512 active hidden units).
Both MoE variants have ~8x/4x the dense FFN parameters but the same FFN FLOPs (plus a
128 x 8 router per layer). `tiny` is a seconds-long smoke run of `switch`.
"""

from configs import common

GPT = dict(d_model=128, num_layers=4, num_heads=4)
SIZES = {
    "dense": dict(mlp_dim=512),
    "switch": dict(mlp_dim=512, num_experts=8, experts_per_token=1, moe_dispatch="capacity",
                   moe_capacity_factor=1.25, moe_renormalize=False, moe_router_jitter=0.01),
    "mixtral": dict(mlp_dim=256, num_experts=8, experts_per_token=2, moe_dispatch="dropless",
                    moe_renormalize=True),
    "tiny": dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=64, num_experts=4,
                 experts_per_token=1, moe_dispatch="capacity", moe_renormalize=False),
}


def get_config(arg=None):
  name, variant = common.select("moe_gpt", arg, SIZES)
  tiny = name == "tiny"
  seq_len, batch_size, steps = (32, 8, 60) if tiny else (64, 12, 2000)
  model = common.model("decoder", f"moe-gpt-{name}", vocab_size=65, max_len=seq_len,
                       positions="learned", norm="layernorm", ffn="mlp", activation="gelu",
                       use_bias=False, tie_embeddings=True, dropout_rate=0.0, moe_gated=False,
                       **(variant if tiny else dict(GPT, **variant)))
  return common.config(
      model=model,
      data=common.data("tinyshakespeare", "char", seq_len, eval_batches=20),
      train=common.train(steps, batch_size, eval_every=30 if tiny else 250,
                         checkpoint_every=500,
                         sample_tokens=80 if tiny else 500, sample_prompt="\n"),
      optim=common.optim(1e-3, warmup_steps=10 if tiny else 100, b2=0.99, weight_decay=0.1,
                         clip=1.0, min_lr_ratio=0.1),
      reference=None if tiny else common.reference(
          source="jaxformer MoE ablation: switch / mixtral / dense share active parameters"))
