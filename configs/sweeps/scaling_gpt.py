"""GPT scaling sweep: 6 model sizes, one token budget, character-level Shakespeare.

Kaplan et al. (2020) style: loss against non-embedding parameters N at a fixed number of
training tokens (every point sees the same batches: same seed, batch 12 x 64 tokens). Widths
and depths grow together (head_dim 16, mlp 4x), N spans ~140x (12.6K .. 1.8M); `get_sweep`
counts N with `scaling.count_params` and refuses a span under 30x.

`:STEPS` sets the budget (default 400 steps = 307K tokens). Measured on a shared 2-core CPU:
9.6 min wall, 3.6 CPU-minutes for the 6 points; eval_loss 2.73 (12K) -> 2.28 (1.8M). Fit
`eval_loss` against `params` in summary.csv for the power law.
"""

from __future__ import annotations

from jaxformer import scaling
from configs import shakespeare_char

BASE = "configs/shakespeare_char.py:nanogpt_cpu"
# (num_layers, d_model): head_dim 16, mlp_dim 4 * d_model.
SIZES = ((1, 32), (2, 48), (2, 64), (3, 96), (4, 128), (4, 192))
DEFAULT_STEPS = 400
MIN_SPAN = 30


def non_embedding_params(num_layers: int, d_model: int) -> int:
  model = shakespeare_char.get_config("nanogpt_cpu").model
  model.update(num_layers=num_layers, d_model=d_model, num_heads=d_model // 16,
               mlp_dim=4 * d_model)
  return scaling.count_params(model)["non_embedding"]


def get_sweep(arg=None):
  steps = int(arg) if arg else DEFAULT_STEPS
  if steps < 10:
    raise ValueError(f"scaling_gpt sweep arg (train steps) must be >= 10; got {arg!r}")
  counts = [non_embedding_params(*size) for size in SIZES]
  if max(counts) < MIN_SPAN * min(counts):
    raise ValueError(f"scaling_gpt SIZES span {max(counts) / min(counts):.1f}x non-embedding "
                     f"parameters ({counts}); widen SIZES to at least {MIN_SPAN}x")
  return dict(
      base=BASE,
      zip={"model.num_layers": [n for n, _ in SIZES],
           "model.d_model": [d for _, d in SIZES],
           "model.num_heads": [d // 16 for _, d in SIZES],
           "model.mlp_dim": [4 * d for _, d in SIZES]},
      overrides={"train.steps": steps, "train.eval_every": steps,
                 "train.log_every": max(steps // 20, 1), "train.checkpoint_every": steps,
                 "optim.warmup_steps": max(steps // 20, 1), "train.sample_tokens": 0},
      name="L{model.num_layers}_d{model.d_model}",
  )
