"""Loss vs model size by Kaplan et al.'s protocol: char GPTs of 6 sizes, each trained until
one more doubling of its tokens no longer moves its loss by more than the seed-to-seed noise,
for L(N) with N the non-embedding parameters.

    python -m jaxformer.sweep --workdir=DIR --parallel=2 \\
        --config='configs/sweeps/scaling_gpt.py:source=/path/corpus.txt'
    (the first length of every chain; experiments/scaling_gpt.py runs the whole adaptive
    study: it decides which chains to double, branches them and trains the branches)

Arguments (comma-separated key=value; `source` is required):
  source      a UTF-8 text file (split 90/10 into train/validation by characters; absolute)
  scale       multiplies the first length BASE_STEPS (default 1; e.g. 0.01 for a smoke test)
  lr          peak learning rate of every run, or "width" (default): lr = 0.268 d_model^-0.952,
              the width rule experiments/scaling_chinchilla.py fitted on python_docs.txt
              (smaller models want larger LRs: one LR for all would bias alpha_N)
  seeds       seeds of each SEEDED size (default 3; the other sizes train seed 0 only)
  max_epochs  the cap on a chain's length, in epochs of the training split (default 2)

Design (issue #30: every size of the cosine study was still falling, one seed each): per size
and seed one chain of warmup-stable-decay runs (`optim.schedule="wsd"`: constant LR, then
1-sqrt to 0 over the last 20% of the steps) of lengths BASE_STEPS x 1, 2, 4, ... Run j
trains to its length and decays at its end, and keeps its stable-phase checkpoint at its
decay start (`train.checkpoint_steps`); run j+1 is a branch of run j from that checkpoint
(`jaxformer.train.workdir.branch`): it continues the constant LR to its own decay start and
then decays. A wsd run's stable phase does not depend on its length, so run j+1 equals a
separate run of its length exactly (tests/unit/train/test_wsd.py), for 60% of its steps instead of all.
Each run is thus the trunk's cooldown at its length; the trunk is the chain of stable phases.
The warmup (5% of the first length) is the same for every length of a chain, which the
branches need (the resume check compares every learning rate taken).

Which chains get longer is decided from the finished runs (experiments/scaling_gpt.py's
`plan`): a size doubles until its last doubling improved its final eval loss by less than
sigma_seed, or its next length would pass `max_epochs` (then it is reported not converged).

Family: configs/sweeps/isoflop.py's (the README's nanoGPT-style char GPT, head_dim 16, mlp
4x, batch 16 x 64 tokens, `common_overrides`), with >= 2 layers (Kaplan et al. Fig. 6:
1-layer models fall off the non-embedding trend): N from 6.2K (2 x 16) to 231K (3 x 80),
37x. Evals every half of the first length (and at each run's end) on 40 x 32 validation
windows (82K tokens; the windows depend on the seed, so sigma_seed includes their sampling).

Throughput, measured in the cosine study (one XLA:CPU thread per run, two runs at once on the
2-core CPU, evals and start-up included), in tokens/s: MEASURED_TOKENS_PER_S.
experiments/scaling_gpt.py prints the study's FLOPs and time from them before training.
"""

from __future__ import annotations

import os

from configs.sweeps import isoflop
from jaxformer import run_settings

BASE = isoflop.BASE
# (num_layers, d_model), largest first: `jaxformer.sweep.run` starts points in order, so with
# parallel=2 the longest run starts at once and the rest queue beside it.
SIZES = ((3, 80), (2, 64), (2, 48), (2, 32), (2, 24), (2, 16))
SEEDED = ((2, 32), (2, 24), (2, 16))    # the sizes trained with `seeds` seeds: the cheapest
MEASURED_TOKENS_PER_S = {(3, 80): 9_900, (2, 64): 26_400, (2, 48): 35_600, (2, 32): 47_000,
                         (2, 24): 59_000, (2, 16): 67_000}
BASE_STEPS = 1200                  # the first length of every chain at scale 1 (1.2M tokens)
EVALS_PER_BASE = 2                 # evals per BASE_STEPS (and one at every run's end)
WARMUP_FRACTION = 0.05             # of the first length, then the same for every length
DECAY_FRACTION = 0.2               # wsd: the last 20% of each run's steps decay
MIN_LR_RATIO = 0.0                 # 1-sqrt to 0 (Hägele et al. 2024)
DEFAULTS = dict(scale="1", lr="width", seeds="3", max_epochs="2")
WIDTH_RULE = (0.268, 0.952)        # (k, p) of lr = k d_model^-p
EVAL_BATCH_SIZE = 32


def parse_arg(arg: str | None) -> dict:
  """'source=...,scale=...' -> {source, scale, lr, seeds, max_epochs} typed; ValueError
  naming the key."""
  values = isoflop.parse_key_values("scaling_gpt", arg, DEFAULTS)
  try:
    out = dict(source=os.path.abspath(os.path.expanduser(values["source"])),
               scale=float(values["scale"]),
               lr=values["lr"] if values["lr"] == "width" else float(values["lr"]),
               seeds=int(values["seeds"]), max_epochs=float(values["max_epochs"]))
  except ValueError as e:
    raise ValueError(f"scaling_gpt sweep arg {arg!r}: {e}; scale, lr and max_epochs are "
                     "numbers, seeds an int") from e
  if not (out["scale"] > 0 and (out["lr"] == "width" or out["lr"] > 0) and out["seeds"] >= 1
          and out["max_epochs"] > 0):
    raise ValueError(f"scaling_gpt sweep arg {arg!r}: scale, lr and max_epochs must be > 0, "
                     "seeds >= 1")
  return out


def lr_of(lr, d_model: int) -> float:
  if lr != "width":
    return lr
  k, p = WIDTH_RULE
  return float(f"{k * d_model ** -p:.3g}")


def size_name(size) -> str:
  return f"L{size[0]}_d{size[1]}"


def seeds_of(seeds: int) -> dict[str, tuple[int, ...]]:
  """{size name: its seeds}: `seeds` seeds at the SEEDED sizes, seed 0 elsewhere."""
  return {size_name(s): tuple(range(seeds)) if s in SEEDED else (0,) for s in SIZES}


def base_steps(scale: float) -> int:
  """The first length; a multiple of 2 x EVALS_PER_BASE so every eval lands on a step."""
  unit = 2 * EVALS_PER_BASE
  return max(int(round(BASE_STEPS * scale / unit)) * unit, unit)


def lengths(scale: float, max_epochs: float, train_chars: int) -> list[int]:
  """The chain's lengths in steps: base x 1, 2, 4, ... while the tokens stay within
  `max_epochs` of the training split (at least the first)."""
  first = base_steps(scale)
  cap = max_epochs * train_chars / isoflop.TOKENS_PER_STEP
  out = [first]
  while 2 * out[-1] <= cap:
    out.append(2 * out[-1])
  return out


def decay_start(steps: int) -> int:
  """The trainer's `run_settings.wsd_decay_start` of a run of `steps`: the stable checkpoint
  the next length branches from."""
  return run_settings.wsd_decay_start(steps, DECAY_FRACTION)


NAME = ("L{model.num_layers}_d{model.d_model}_lr{optim.lr:g}_seed{train.seed}"
        "_warm{optim.warmup_steps}_s{train.steps}")
# A run's directory names its chain (size, LR, seed, warmup: the first length) and its length,
# so another --scale or --lr never resumes a run of another schedule.


def run_overrides(values: dict, size, seed: int, steps: int) -> dict:
  """The overrides of one run of a chain (its length `steps`)."""
  first = base_steps(values["scale"])
  every = first // EVALS_PER_BASE
  return {**isoflop.model_fields(*size), "train.seed": seed, "train.steps": steps,
          "train.eval_every": every, "train.checkpoint_every": every,
          "train.log_every": max(every // 10, 1),
          "train.checkpoint_steps": (decay_start(steps),),
          "optim.warmup_steps": max(int(round(WARMUP_FRACTION * first)), 1),
          "optim.lr": lr_of(values["lr"], size[1])}


def sweep_of(values: dict, runs) -> dict:
  """The sweep of `runs`, each (size, seed, steps): zipped, one point per run."""
  vocab_size, _ = isoflop.corpus_info(values["source"])
  rows = [run_overrides(values, size, seed, steps) for size, seed, steps in runs]
  zipped = {key: [r[key] for r in rows] for key in rows[0]}
  overrides = dict(isoflop.common_overrides(values["source"], vocab_size),
                   **{"train.eval_batch_size": EVAL_BATCH_SIZE, "optim.schedule": "wsd",
                      "optim.decay_fraction": DECAY_FRACTION, "optim.decay_shape": "1-sqrt",
                      "optim.min_lr_ratio": MIN_LR_RATIO})
  return dict(base=BASE, zip=zipped, overrides=overrides, name=NAME)


def get_sweep(arg=None):
  """The first length of every chain (the trunks); the study adds the longer ones."""
  values = parse_arg(arg)
  first = base_steps(values["scale"])
  seeds = seeds_of(values["seeds"])
  runs = [(size, seed, first) for size in SIZES for seed in seeds[size_name(size)]]
  return sweep_of(values, runs)
