"""Llama-style decoders: `--config=configs/llama.py:{llama2-7b,llama2-70b,llama3-8b,
llama3-70b,mistral-7b,tiny}`.

Pre-norm decoder with RoPE, RMSNorm (eps 1e-5), SwiGLU FFN, no biases, untied output head
(`lm_head`), grouped-query attention (num_kv_heads) and, for Mistral, sliding-window attention
(each query sees `window` keys to its left plus itself). `reference.params` is the Hugging
Face parameter count (LlamaForCausalLM / MistralForCausalLM, output head included).

Optimizer: the Llama 2 recipe (Touvron et al., 2023): AdamW b1 0.9, b2 0.95, eps 1e-5,
lr 3e-4 (1.5e-4 for 70B, their Table 1) with 2000 warmup steps and cosine decay to 10%,
weight decay 0.1, clip 1.0, 4M-token batches. (Llama 3 and Mistral did not publish theirs for
these sizes; the Llama 2 recipe of the same size.)

`tiny`: a character-level (vocab 65) model with every feature of the big ones: RoPE, GQA
(4 query heads over 2 kv heads), SwiGLU, RMSNorm, untied head and a sliding window (32)
shorter than the training sequence (128), so the window actually masks.
"""

from configs import common

# name: model fields that differ between sizes, data (tokenizer, seq_len), HF count, source
# and, where it is not 3e-4, the peak learning rate.
SIZES = {
    "llama2-7b": dict(
        model=dict(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32,
                   num_kv_heads=32, mlp_dim=11008, rope_theta=10_000.0, max_len=4096),
        data=("llama2", 4096), params=6_738_415_616,
        source="Hugging Face LlamaForCausalLM (meta-llama/Llama-2-7b-hf)"),
    "llama2-70b": dict(
        model=dict(vocab_size=32000, d_model=8192, num_layers=80, num_heads=64,
                   num_kv_heads=8, mlp_dim=28672, rope_theta=10_000.0, max_len=4096),
        data=("llama2", 4096), params=68_976_648_192,
        source="Hugging Face LlamaForCausalLM (meta-llama/Llama-2-70b-hf)", lr=1.5e-4),
    "llama3-8b": dict(
        model=dict(vocab_size=128256, d_model=4096, num_layers=32, num_heads=32,
                   num_kv_heads=8, mlp_dim=14336, rope_theta=500_000.0, max_len=8192),
        data=("llama3", 8192), params=8_030_261_248,
        source="Hugging Face LlamaForCausalLM (meta-llama/Meta-Llama-3-8B)"),
    "llama3-70b": dict(
        model=dict(vocab_size=128256, d_model=8192, num_layers=80, num_heads=64,
                   num_kv_heads=8, mlp_dim=28672, rope_theta=500_000.0, max_len=8192),
        data=("llama3", 8192), params=70_553_706_496,
        source="Hugging Face LlamaForCausalLM (meta-llama/Meta-Llama-3-70B)", lr=1.5e-4),
    "mistral-7b": dict(
        model=dict(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32,
                   num_kv_heads=8, mlp_dim=14336, rope_theta=10_000.0, window=4096,
                   max_len=32768),
        data=("mistral", 8192), params=7_241_732_096,
        source="Hugging Face MistralForCausalLM (mistralai/Mistral-7B-v0.1)"),
    "tiny": dict(
        model=dict(vocab_size=65, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   mlp_dim=128, rope_theta=10_000.0, window=32, max_len=256),
        data=("char", 128), params=None, source=""),
}

# The Llama architecture, shared with configs/mixtral.py.
LLAMA = dict(positions="rope", norm="rmsnorm", norm_eps=1e-5, ffn="swiglu", activation=None,
             use_bias=False, tie_embeddings=False, dropout_rate=0.0)


def get_config(arg=None):
  name, size = common.select("llama", arg, SIZES)
  return assemble("llama-tiny" if name == "tiny" else name, size)


def assemble(name: str, size: dict, **reference):
  """The full config of a Llama-architecture model (shared with configs/mixtral.py): the
  Llama 2 recipe at 4M-token batches, or a laptop run for the tiny sizes."""
  tiny = size["params"] is None
  model = common.model("decoder", name, dtype="float32" if tiny else "bfloat16", **LLAMA,
                       **size["model"])
  tokenizer, seq_len = size["data"]
  data = common.data("tinyshakespeare", tokenizer, seq_len)
  if tiny:
    return common.config(
        model=model, data=data,
        train=common.train(2000, 32, eval_every=200, log_every=20, checkpoint_every=500),
        optim=common.optim(1e-3, warmup_steps=100, b2=0.99))
  return common.config(
      model=model, data=data,
      train=common.train(500_000, 4 * 2**20 // seq_len, eval_every=2000, log_every=50,
                         checkpoint_every=5000),
      optim=common.optim(size.get("lr", 3e-4), warmup_steps=2000, weight_decay=0.1, b2=0.95,
                         eps=1e-5),
      reference=common.reference(size["params"], source=size["source"], params_key="total",
                                 **reference))
