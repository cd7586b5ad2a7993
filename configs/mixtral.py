"""Mixtral (Jiang et al., 2024): `--config=configs/mixtral.py:{8x7b,tiny}`.

Mistral-7B with every FFN replaced by a sparse mixture of 8 SwiGLU experts, 2 per token
(softmax router over experts, top-2 weights renormalised), RoPE theta 1e6, no sliding
window, 32768 context. `reference.params` / `reference.active_params` are the Hugging Face
MixtralForCausalLM total (46.7B) and the per-token active count (~12.9B).

`tiny`: char-level (vocab 65), 4 experts / top-2, GQA, RoPE, RMSNorm, untied head.
"""

from configs import common
from configs import llama

SIZES = {
    "8x7b": dict(
        model=dict(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32,
                   num_kv_heads=8, mlp_dim=14336, num_experts=8, experts_per_token=2,
                   rope_theta=1e6, window=None, max_len=32768),
        data=("mistral", 8192), params=46_702_792_704, active_params=12_880_000_000,
        source="Hugging Face MixtralForCausalLM (mistralai/Mixtral-8x7B-v0.1)"),
    "tiny": dict(
        model=dict(vocab_size=65, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   mlp_dim=128, num_experts=4, experts_per_token=2, rope_theta=1e6,
                   window=None, max_len=256),
        data=("char", 128), params=None, active_params=None, source=""),
}


def get_config(arg=None):
  name, size = common.select("mixtral", arg, SIZES)
  extra = {} if size["params"] is None else {"active_params": size["active_params"]}
  return llama.assemble(f"mixtral-{name}", size, **extra)
