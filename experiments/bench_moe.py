"""Step time of the MoE FFN vs a dense FFN with the same active parameters.

Why: a sparse layer only pays off if routing + dispatch cost little next to the expert matmuls.
Each row times one jitted forward+backward (gradients of params and input) and reports the
median of `--repeats` runs and its ratio to the dense FFN: GELU MLPs of width d_model, experts
of hidden `--hidden`, top-k routing, so the dense FFN has hidden k * hidden (equal FLOPs).
Dispatch modes: dropless (grouped matmul: `ragged_dot`, or padded blocks on CPU) and capacity
(factor 1.25, one-hot einsums). Prints a Markdown table.

Usage: python -m experiments.bench_moe [--tokens 4096] [--d_model 256] [--hidden 512]
"""

from __future__ import annotations

import argparse


import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments.timing import median_seconds  # noqa: E402
from jaxformer.layers.mlp import Mlp  # noqa: E402
from jaxformer.layers.moe import MoE  # noqa: E402
from jaxformer.layers.block_settings import MoESettings  # noqa: E402


def step_time(module: nn.Module, x, repeats: int) -> float:
  """Median seconds of a jitted forward+backward of sum(module(x)^2)."""
  params = jax.jit(module.init)(jax.random.key(0), x)["params"]
  grad = jax.jit(jax.grad(lambda p, x: jnp.sum(jnp.square(module.apply({"params": p}, x))),
                          (0, 1)))
  return median_seconds(grad, params, x, repeats=repeats)


def rows(args) -> list[tuple]:
  x = jax.random.normal(jax.random.key(1), (args.tokens // args.seq_len, args.seq_len,
                                            args.d_model))
  k = args.top_k
  dense = step_time(Mlp(hidden_dim=k * args.hidden, use_bias=False), x, args.repeats)
  out = [("dense", "-", "-", dense, 1.0)]
  for experts in args.experts:
    for dispatch in ("dropless", "capacity"):
      moe = MoE(MoESettings(num_experts=experts, experts_per_token=k, gated=False,
                            dispatch=dispatch), hidden_dim=args.hidden, activation="gelu")
      t = step_time(moe, x, args.repeats)
      out.append((dispatch, experts, k, t, t / dense))
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=4096)
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--hidden", type=int, default=512)
  parser.add_argument("--top_k", type=int, default=2)
  parser.add_argument("--experts", type=int, nargs="+", default=[4, 8, 16])
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()
  print(f"{jax.default_backend()}: {args.tokens} tokens, d_model {args.d_model}, "
        f"expert hidden {args.hidden}, top-{args.top_k}; fwd+bwd, median of {args.repeats}\n")
  print("| FFN | experts | top-k | ms / step | vs dense |")
  print("|---|---|---|---|---|")
  for name, experts, k, t, ratio in rows(args):
    print(f"| {name} | {experts} | {k} | {t * 1e3:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
  main()
