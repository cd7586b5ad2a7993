"""Loss vs model size by Kaplan et al.'s protocol: char GPTs of 6 sizes, each trained near
convergence on one corpus, for L(N) with N the non-embedding parameters.

    python -m jaxformer.sweep --workdir=DIR --parallel=2 \\
        --config='configs/sweeps/scaling_gpt.py:source=/path/corpus.txt'
    (experiments/scaling_gpt.py runs this sweep, then fits and reports)

Arguments (comma-separated key=value; `source` is required):
  source  a UTF-8 text file (split 90/10 into train/validation by characters; made absolute)
  scale   multiplies every size's step budget (default 1; e.g. 0.002 for a smoke test)
  evals   evaluations per run (default 20); a point's loss is the best of them (early stopping)
  lr      peak learning rate of every run, or "width" (default): lr = 0.268 d_model^-0.952,
          the width rule experiments/scaling_chinchilla.py fitted on python_docs.txt (smaller
          models want larger LRs: one LR for all would bias alpha_N)

Why this protocol (Kaplan et al. 2020, section 3.1 and Fig. 1): L(N) = (N_c / N)^alpha_N is
the loss of models trained to near convergence on the same data, early-stopped, with N
counting non-embedding parameters. A fixed token budget for every size (this sweep before)
measures under-training instead: there D/N fell from 25 to 0.2 with size and alpha_N came
out 0.033 against Kaplan's 0.076. So each size gets its own budget here, from ~820 tokens
per non-embedding parameter (smallest) to ~50 (largest, the most a 30-minute CPU budget
allows), and the report checks whether each eval curve had flattened.

Why a constant tail: the cosine reaches its floor (10% of the peak) at 80% of the steps and
stays there (`optim.decay_steps`), so the last 20% of a run, 5 of its 20 evals, train at one
LR: a loss still falling there is still learning, not annealing. With the cosine ending at the
last step (the first version) every size's tail fell by 0.12-0.19 nats per doubling of tokens,
which could not tell the two apart.

Family: configs/sweeps/isoflop.py's (the README's nanoGPT-style char GPT, head_dim 16,
mlp 4x, batch 16 x 64 tokens, `common_overrides`), with >= 2 layers (Kaplan et al. Fig. 6:
1-layer models fall off the non-embedding trend): N from 6.2K (2 x 16) to 231K (3 x 80),
37x. Each run: warmup 5% of its steps, cosine to 10% of the peak at 80% of its steps, then
constant; `evals` evaluations on the same 40 x 32 validation windows (82K tokens), a checkpoint
at each eval.

Time: two single-threaded runs at a time on the 2-core CPU; throughput measured in the first
sweep at --scale=0.4 (wall time of each run, start-up and evals included): 3 x 80 ~8.0K
tokens/s, 2 x 64 27K, 2 x 48 34K, 2 x 32 37K, the two smallest ~37K after ~20 s of start-up.
At scale 1 the largest run takes ~24 min alone and the other five, one after another beside
it, ~20 min: ~25 min wall, plus ~2 min of fits (1000 bootstrap resamples).
"""

from __future__ import annotations

import os

from configs.sweeps import isoflop

BASE = isoflop.BASE
# (num_layers, d_model, steps at scale 1), largest first: `jaxformer.sweep.run` starts points
# in order, so with parallel=2 the longest run starts at once and the rest queue beside it.
SIZES = ((3, 80, 11_000), (2, 64, 10_000), (2, 48, 8_000), (2, 32, 7_000), (2, 24, 5_000),
         (2, 16, 5_000))
DECAY_FRACTION = 0.8               # the cosine ends here; the rest is at its floor
DEFAULTS = dict(scale="1", evals="20", lr="width")
WIDTH_RULE = (0.268, 0.952)        # (k, p) of lr = k d_model^-p
EVAL_BATCH_SIZE = 32


def parse_arg(arg: str | None) -> dict:
  """'source=...,scale=...' -> {source, scale, evals, lr} typed; ValueError naming the key."""
  values = isoflop.parse_key_values("scaling_gpt", arg, DEFAULTS)
  try:
    out = dict(source=os.path.abspath(os.path.expanduser(values["source"])),
               scale=float(values["scale"]),
               evals=int(values["evals"]),
               lr=values["lr"] if values["lr"] == "width" else float(values["lr"]))
  except ValueError as e:
    raise ValueError(f"scaling_gpt sweep arg {arg!r}: {e}; scale and lr are numbers, evals "
                     "an int") from e
  if not (out["scale"] > 0 and (out["lr"] == "width" or out["lr"] > 0) and out["evals"] >= 1):
    raise ValueError(f"scaling_gpt sweep arg {arg!r}: scale and lr must be > 0, evals >= 1")
  return out


def lr_of(lr, d_model: int) -> float:
  if lr != "width":
    return lr
  k, p = WIDTH_RULE
  return float(f"{k * d_model ** -p:.3g}")


def steps_of(scale: float) -> list[int]:
  return [max(int(round(steps * scale)), 1) for _, _, steps in SIZES]


def get_sweep(arg=None):
  values = parse_arg(arg)
  vocab_size, _ = isoflop.corpus_info(values["source"])
  steps = steps_of(values["scale"])
  every = [max(s // values["evals"], 1) for s in steps]
  fields = [isoflop.model_fields(layers, d) for layers, d, _ in SIZES]
  zipped = {key: [f[key] for f in fields] for key in fields[0]}
  zipped.update({
      "train.steps": steps, "train.eval_every": every, "train.checkpoint_every": every,
      "train.log_every": [max(s // 100, 1) for s in steps],
      "optim.warmup_steps": [max(s // 20, 1) for s in steps],
      "optim.decay_steps": [max(int(round(DECAY_FRACTION * s)), 1) for s in steps],
      "optim.lr": [lr_of(values["lr"], d) for _, d, _ in SIZES],   # zipped: names carry it
  })
  overrides = dict(isoflop.common_overrides(values["source"], vocab_size),
                   **{"train.eval_batch_size": EVAL_BATCH_SIZE, "optim.schedule": "cosine"})
  return dict(base=BASE, zip=zipped, overrides=overrides,
              name="L{model.num_layers}_d{model.d_model}_s{train.steps}_lr{optim.lr:g}"
                   "_decay{optim.decay_steps}")
