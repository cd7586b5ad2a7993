"""IsoFLOP planning: which model sizes to train, for how many steps, at each FLOP budget.

Hoffmann et al. (2022, "Training Compute-Optimal Large Language Models", approach 2) train
several model sizes at each of several fixed budgets C and read the optimum off the minimum of
each IsoFLOP curve. This module plans such a study (NumPy only, no JAX):

    runs = plan_isoflop([6e11, 2e12, 6e12], candidates, tokens_per_step=1024)

- Around each budget's expected optimum N* (by default Chinchilla's rule of thumb D = 20 N,
  so N* = sqrt(C / 120); or any `optimum(C)`, e.g. a fitted law's `compute_optimal`), it picks
  `sizes_per_budget` candidates nearest to N* x spacing^k, k = -(m-1)/2 .. (m-1)/2.
- steps = round(C / (flops_per_token x tokens_per_step)) with flops_per_token = 6 N
  (Kaplan's and Chinchilla's C = 6 N D, the default) or a candidate's exact count
  (`flops="exact"`). Rounding to whole steps keeps every run within `tolerance` (2%) of its
  budget, else the plan is refused (the budget is too small for that model).
- Each run gets a warmup of `warmup_fraction` of its steps and a cosine schedule that ends at
  its own last step: Chinchilla found that a cosine cycle longer than the run overestimates
  the loss of short runs and biases the fitted optimum towards smaller models.

The model family is the list of `Candidate`s (name, N, model-config overrides, optionally the
exact FLOPs per token): `configs/sweeps/isoflop.py` builds it for GPT shapes with
`jaxformer.scaling.count_params`, and `to_sweep` turns a plan into a `jaxformer.sweep` spec.

Learning rate: `to_sweep(lr=...)` gives every run one peak LR, or an LR per run from a rule
(a function of the run, e.g. of its width). Under the standard parametrization the optimal LR
falls with width, so one LR for all sizes biases the fit (wide models overshoot, narrow ones
crawl): fit a rule with a small LR sweep at the smallest budget (what
`experiments/scaling_chinchilla.py` does: lr ~ width^-p). Under μP
(`model.parametrization="mup"`, `model.mup_base_width`; layers/parametrization.py) the optimal
LR does not move with width, so the LR tuned once on a narrow proxy of the base width is the
one `lr` for every run: put the two μP keys in `to_sweep(overrides=...)` (the IsoFLOP sweep
file's `mup_base_width=` argument does). μP covers width, not depth: keep the candidates'
depth fixed, or check the transfer across depths with a probe sweep
(`experiments/mup_transfer.py` measures it across widths).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxformer import run_settings

FLOPS_CONVENTIONS = ("6N", "exact")


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One model size of a family: `params` is the N of C = 6 N D (say which count it is where
  you build candidates), `overrides` the `--config.` fields that make this size (e.g.
  {"model.num_layers": 2, "model.d_model": 64}), `flops_per_token` the exact training FLOPs
  per token (needed only for `flops="exact"`)."""
  name: str
  params: int
  overrides: Mapping[str, Any]
  flops_per_token: float | None = None


@dataclasses.dataclass(frozen=True)
class PlannedRun:
  """One run of an IsoFLOP plan: `candidate` trained for `steps` steps of `tokens_per_step`
  tokens with `warmup_steps` of warmup and a cosine schedule ending at `steps`; `flops` is the
  compute of the run under the plan's convention, within the tolerance of `budget`."""
  budget: float
  candidate: Candidate
  steps: int
  tokens_per_step: int
  warmup_steps: int
  flops: float

  @property
  def tokens(self) -> int:
    return self.steps * self.tokens_per_step

  @property
  def name(self) -> str:
    return f"{self.candidate.name}_s{self.steps}"


def rule_of_thumb_optimum(budget: float, tokens_per_param: float = 20.0) -> float:
  """N* = sqrt(C / (6 x tokens_per_param)): the size for which C = 6 N D and D = 20 N
  (Hoffmann et al. 2022's rounded result)."""
  return math.sqrt(budget / (6.0 * tokens_per_param))


def _flops_per_token(candidate: Candidate, flops: str) -> float:
  if flops == "6N":
    return 6.0 * candidate.params
  if candidate.flops_per_token is None or candidate.flops_per_token <= 0:
    raise ValueError(f"flops='exact' needs candidate {candidate.name!r} to carry "
                     "flops_per_token; build candidates with it or use flops='6N'")
  return float(candidate.flops_per_token)


def _check(budgets: Sequence[float], candidates: Sequence[Candidate], tokens_per_step: int,
           sizes_per_budget: int, spacing: float, warmup_fraction: float, flops: str) -> None:
  if len(budgets) == 0:
    raise ValueError("plan_isoflop: budgets is empty; give one or more FLOP budgets, e.g. "
                     "[6e11, 2e12, 6e12]")
  for c in budgets:
    if not (np.isfinite(c) and c > 0):
      raise ValueError(f"plan_isoflop: budget {c!r} must be a finite FLOP count > 0")
  if len(set(budgets)) != len(budgets):
    raise ValueError(f"plan_isoflop: budgets {list(budgets)} repeat a value; give each once")
  if not isinstance(tokens_per_step, (int, np.integer)) or tokens_per_step < 1:
    raise ValueError(f"plan_isoflop: tokens_per_step={tokens_per_step!r} must be an int >= 1 "
                     "(batch_size x seq_len)")
  if sizes_per_budget < 3:
    raise ValueError(f"plan_isoflop: sizes_per_budget={sizes_per_budget} must be >= 3 (a "
                     "parabola through each IsoFLOP curve needs 3 points; use >= 5)")
  if not spacing > 1:
    raise ValueError(f"plan_isoflop: spacing={spacing} must be > 1 (the ratio between "
                     "neighbouring sizes, e.g. 2)")
  if not 0 <= warmup_fraction < 1:
    raise ValueError(f"plan_isoflop: warmup_fraction={warmup_fraction} must be in [0, 1)")
  if flops not in FLOPS_CONVENTIONS:
    raise ValueError(f"plan_isoflop: flops={flops!r} must be one of {FLOPS_CONVENTIONS}")
  sizes = [c.params for c in candidates]
  if any(n <= 0 for n in sizes):
    raise ValueError("plan_isoflop: every candidate needs params > 0")
  if len(set(sizes)) < sizes_per_budget:
    raise ValueError(f"plan_isoflop: {len(set(sizes))} distinct candidate sizes cannot give "
                     f"sizes_per_budget={sizes_per_budget}; add model shapes to the family")


def pick_sizes(candidates: Sequence[Candidate], center: float, count: int,
               spacing: float) -> list[Candidate]:
  """`count` distinct candidates nearest (in log N) to center x spacing^k, k centred on 0;
  ValueError when two targets would need the same candidate (the family is too coarse)."""
  by_size = {}
  for c in sorted(candidates, key=lambda c: c.params):
    by_size.setdefault(c.params, c)
  sizes = np.array(sorted(by_size), np.float64)
  chosen = []
  for k in np.arange(count) - (count - 1) / 2:
    target = center * spacing ** k
    n = sizes[np.argmin(np.abs(np.log(sizes) - np.log(target)))]
    if chosen and by_size[n] is chosen[-1]:
      where = ("lies outside them" if not sizes[0] <= center <= sizes[-1] else
               "lies among them, but they are too coarse there")
      raise ValueError(
          f"plan_isoflop: sizes {center * spacing ** k:.3g} and "
          f"{center * spacing ** (k - 1):.3g} both map to candidate {by_size[n].name!r} "
          f"(N={int(n):,}); the family's sizes are too coarse for spacing={spacing}, or "
          f"the budget's optimum ({center:.3g}) {where} ({int(sizes[0]):,} .. "
          f"{int(sizes[-1]):,}): add shapes or raise spacing")
    chosen.append(by_size[n])
  return chosen


def plan_isoflop(budgets: Sequence[float], candidates: Sequence[Candidate], *,
                 tokens_per_step: int, sizes_per_budget: int = 5, spacing: float = 2.0,
                 optimum: Callable[[float], float] | None = None,
                 warmup_fraction: float = 0.05, max_tokens: float | None = None,
                 min_steps: int = 50, flops: str = "6N",
                 tolerance: float = 0.02) -> list[PlannedRun]:
  """The runs of an IsoFLOP study, budget by budget (see the module docstring).

  `optimum(C)` gives each budget's expected optimal N (default `rule_of_thumb_optimum`).
  `max_tokens` (e.g. 2 epochs of the corpus) and `min_steps` refuse runs that would repeat the
  data too often or be too short to train; the error names the run and the fix, and the
  budgets that do work with this family and data (`working_budgets`), or, when none does,
  the fewest-sizes alternative that works.
  """
  budgets = [float(c) for c in budgets]
  _check(budgets, candidates, tokens_per_step, sizes_per_budget, spacing, warmup_fraction,
         flops)
  settings = dict(tokens_per_step=tokens_per_step, spacing=spacing, optimum=optimum,
                  warmup_fraction=warmup_fraction, max_tokens=max_tokens,
                  min_steps=min_steps, flops=flops, tolerance=tolerance)
  try:
    return _plan(budgets, candidates, sizes_per_budget=sizes_per_budget, **settings)
  except ValueError as e:
    try:
      hint = _what_works(candidates, sizes_per_budget, settings)
    except ValueError:          # not a matter of the budget (e.g. a candidate without FLOPs)
      raise e from None
    raise ValueError(f"{e}; {hint}") from None


def _plan(budgets, candidates, *, tokens_per_step, sizes_per_budget, spacing, optimum,
          warmup_fraction, max_tokens, min_steps, flops, tolerance) -> list[PlannedRun]:
  optimum = optimum or rule_of_thumb_optimum
  return [plan_run(budget, candidate, tokens_per_step=tokens_per_step, flops=flops,
                   warmup_fraction=warmup_fraction, max_tokens=max_tokens,
                   min_steps=min_steps, tolerance=tolerance)
          for budget in sorted(budgets)
          for candidate in pick_sizes(candidates, float(optimum(budget)), sizes_per_budget,
                                      spacing)]


def _works(budget: float, candidates, sizes_per_budget: int, settings: dict) -> bool:
  try:
    _plan([budget], candidates, sizes_per_budget=sizes_per_budget, **settings)
  except ValueError:
    return False
  return True


def _round_up(x: float, digits: int) -> float:
  """`x` rounded up to `digits` significant digits."""
  scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
  return math.ceil(x / scale - 1e-9) * scale


def working_budgets(candidates: Sequence[Candidate], *, tokens_per_step: int,
                    sizes_per_budget: int = 5, spacing: float = 2.0,
                    optimum: Callable[[float], float] | None = None,
                    warmup_fraction: float = 0.05, max_tokens: float | None = None,
                    min_steps: int = 50, flops: str = "6N", tolerance: float = 0.02,
                    count: int = 3, ratio: float = 3.0) -> list[float]:
  """Budgets at which `plan_isoflop` (same arguments) plans every run: the smallest, then up
  to `count - 1` more, each the smallest at least `ratio` x the previous; [] when none does.

  Computed, not searched on a grid: whether a budget works changes only where a run's steps
  cross min_steps or its tokens max_tokens (a budget proportional to each candidate's FLOPs
  per token), or where one of the size targets N*(C) x spacing^k crosses the midpoint (in
  log N) of two neighbouring candidate sizes (C from inverting `optimum`, increasing in C).
  Between two such budgets it works everywhere or nowhere, so one budget of each interval is
  tried; an answer is the interval's lower end rounded up to 2 or 3 significant digits
  (checked to work). Rounding to whole steps is assumed within `tolerance`, which holds
  from min_steps >= 1 / (2 tolerance) (25 at 2%)."""
  settings = dict(tokens_per_step=tokens_per_step, spacing=spacing, optimum=optimum,
                  warmup_fraction=warmup_fraction, max_tokens=max_tokens,
                  min_steps=min_steps, flops=flops, tolerance=tolerance)
  return _working(candidates, sizes_per_budget, settings, count=count, ratio=ratio)


def _inverse(optimum: Callable[[float], float], size: float) -> float:
  """The budget C with optimum(C) = size (optimum increasing), by bisection in log C."""
  lo, hi = math.log(1e-6), math.log(1e60)
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if optimum(math.exp(mid)) < size else (lo, mid)
  return math.exp(hi)


def _working(candidates, sizes_per_budget: int, settings: dict, *, count: int = 3,
             ratio: float = 3.0) -> list[float]:
  per_token = [_flops_per_token(c, settings["flops"]) for c in candidates]
  tokens_per_step, max_tokens = settings["tokens_per_step"], settings["max_tokens"]
  optimum = settings["optimum"] or rule_of_thumb_optimum
  events = [(settings["min_steps"] - 0.5) * tokens_per_step * f for f in per_token]
  if max_tokens is not None:
    events += [(max_tokens // tokens_per_step + 0.5) * tokens_per_step * f for f in per_token]
  sizes = sorted({c.params for c in candidates})
  offsets = np.arange(sizes_per_budget) - (sizes_per_budget - 1) / 2
  events += [_inverse(optimum, math.sqrt(a * b) / settings["spacing"] ** k)
             for a, b in zip(sizes, sizes[1:]) for k in offsets]
  low = min(events[:len(per_token)])            # fewer than min_steps for every candidate
  high = max(events[len(per_token):2 * len(per_token)]) if max_tokens is not None else None
  events = sorted({e for e in events if e >= low and (high is None or e <= high)})
  if high is None:
    events.append(events[-1] * 1e3)
  works = lambda b: _works(float(b), candidates, sizes_per_budget, settings)
  found: list[float] = []
  for lo, hi in zip(events, events[1:]):
    if found and hi <= found[-1] * ratio:
      continue
    lo = max(lo, found[-1] * ratio) if found else lo
    if not works(math.sqrt(lo * hi)):
      continue
    budget = next((r for r in (_round_up(lo * (1 + 1e-12), 2), _round_up(lo * (1 + 1e-12), 3))
                   if r < hi and works(r)), math.sqrt(lo * hi))
    found.append(budget)
    if len(found) == count:
      break
  return found


def _what_works(candidates, sizes_per_budget: int, settings: dict) -> str:
  """The refusal's hint: the budgets that work, or fewer sizes that work, or neither."""
  budgets = _working(candidates, sizes_per_budget, settings)
  if budgets:
    return (f"with this family and data the smallest budget that works (rounded up to 2 "
            f"significant digits) is {budgets[0]:.3g} "
            f"(budgets that work: {'/'.join(f'{b:.3g}' for b in budgets)})")
  for sizes in range(sizes_per_budget - 1, 2, -1):
    budgets = _working(candidates, sizes, settings)
    if budgets:
      return (f"no budget gives {sizes_per_budget} sizes of this family with this data "
              f"(spacing={settings['spacing']:g}, max_tokens={settings['max_tokens'] or 0:,.0f}); "
              f"{sizes} sizes work from {budgets[0]:.3g} (budgets that work: "
              f"{'/'.join(f'{b:.3g}' for b in budgets)}), or use a larger corpus")
  return ("no budget gives even 3 sizes of this family with this data: use a larger corpus "
          "or add smaller shapes")


def plan_run(budget: float, candidate: Candidate, *, tokens_per_step: int,
             flops: str = "6N", warmup_fraction: float = 0.05,
             max_tokens: float | None = None, min_steps: int = 50,
             tolerance: float = 0.02) -> PlannedRun:
  """One run of `candidate` spending `budget` FLOPs (see `plan_isoflop`), or a ValueError
  naming the run and the fix when it would be too short, off budget or repeat the data."""
  per_token = _flops_per_token(candidate, flops)
  steps = int(round(budget / (per_token * tokens_per_step)))
  used = per_token * tokens_per_step * steps
  if steps < min_steps or abs(used / budget - 1) > tolerance:
    raise ValueError(
        f"plan_isoflop: {candidate.name} (N={candidate.params:,}) at budget {budget:.3g} "
        f"gets {steps} steps of {tokens_per_step} tokens (min_steps={min_steps}, "
        f"{used / budget - 1:+.1%} of the budget); raise the budget or lower "
        "tokens_per_step")
  if max_tokens is not None and steps * tokens_per_step > max_tokens:
    raise ValueError(
        f"plan_isoflop: {candidate.name} (N={candidate.params:,}) at budget {budget:.3g} "
        f"needs {steps * tokens_per_step:,} tokens > max_tokens={int(max_tokens):,}; "
        "lower the budget, narrow spacing or use a larger corpus")
  return PlannedRun(budget=float(budget), candidate=candidate, steps=steps,
                    tokens_per_step=int(tokens_per_step),
                    warmup_steps=int(round(warmup_fraction * steps)), flops=used)


def to_sweep(runs: Sequence[PlannedRun], base: str, *,
             lr: float | Callable[[PlannedRun], float],
             overrides: Mapping[str, Any] | None = None, evals: int = 1,
             logs: int = 200, name: str | None = None) -> dict:
  """A `jaxformer.sweep` spec training `runs` from the config `base`: per run its model
  overrides, `train.steps`, `optim.warmup_steps` and a cosine schedule ending at the last step
  (`optim.decay_steps` = steps), `evals` evaluations and about `logs` training-loss records
  (approach 1 reads the loss curves). `overrides` apply to every run (data, batch, ...).
  `lr` is one peak learning rate for every run, or a function of the run (a width rule).
  `name` is the sweep's point-name template (default: the candidate fields and the steps, so
  a point keeps its directory when budgets are added to the plan)."""
  if not runs:
    raise ValueError("to_sweep: the plan has no runs")
  rates = [float(lr(run)) if callable(lr) else float(lr) for run in runs]
  if not all(np.isfinite(r) and r > 0 for r in rates):
    raise ValueError(f"to_sweep: learning rates {rates} must be > 0")
  fields = sorted({key for run in runs for key in run.candidate.overrides})
  for run in runs:
    missing = set(fields) - set(run.candidate.overrides)
    if missing:
      raise ValueError(f"to_sweep: candidate {run.candidate.name!r} lacks {sorted(missing)}; "
                       "every candidate must set the same fields")
  zipped = {key: [run.candidate.overrides[key] for run in runs] for key in fields}
  zipped.update({
      "train.steps": [run.steps for run in runs],
      "optim.warmup_steps": [run.warmup_steps for run in runs],
      "optim.decay_steps": [run.steps for run in runs],
      "train.eval_every": [max(run.steps // max(evals, 1), 1) for run in runs],
      "train.log_every": [max(run.steps // max(logs, 1), 1) for run in runs],
      "train.checkpoint_every": [run.steps for run in runs],
  })
  fixed = dict(overrides or {})
  fixed["optim.schedule"] = "cosine"
  if callable(lr):
    zipped["optim.lr"] = rates
  else:
    fixed["optim.lr"] = rates[0]
  clash = sorted(set(fixed) & set(zipped))
  if clash:
    raise ValueError(f"to_sweep: overrides {clash} are set by the plan; drop them")
  default = "_".join(f"{k.rsplit('.', 1)[-1]}{{{k}}}" for k in fields) + "_s{train.steps}"
  return dict(base=base, zip=zipped, overrides=fixed, name=name or default)


def lr_optimum(rates: Sequence[float], losses: Sequence[float]) -> dict:
  """The optimum of a learning-rate grid: the best grid LR, and the vertex of the parabola
  in log LR through it and its two neighbours (the best grid LR, flagged `edge`, when it is
  at the end of the grid: the optimum may lie outside). Non-finite losses (diverged runs)
  count as worse than any finite one."""
  order = np.argsort(rates)
  rates = np.asarray(rates, np.float64)[order]
  losses = np.asarray(losses, np.float64)[order]
  if rates.size < 3 or not np.isfinite(losses).any():
    raise ValueError(f"an LR grid needs >= 3 rates and a finite loss; got {rates.size} rates, "
                     f"losses {losses.tolist()}")
  finite = np.where(np.isfinite(losses), losses, np.inf)
  i = int(np.argmin(finite))
  out = {"best_grid_lr": float(rates[i]), "best_loss": float(losses[i]), "index": i,
         "edge": i in (0, rates.size - 1), "lr": float(rates[i])}
  if not out["edge"] and np.isfinite(finite[i - 1:i + 2]).all():
    c2, c1, _ = np.polyfit(np.log(rates[i - 1:i + 2]), finite[i - 1:i + 2], 2)
    if c2 > 0:
      out["lr"] = float(np.exp(-c1 / (2 * c2)))
  return out


def lr_width_rule(widths: Sequence[int], optimal_lrs: Sequence[float],
                  level: float = 0.95) -> dict:
  """lr* = k width^slope by least squares in log-log, with a `level` t-interval on the slope
  (>= 3 widths): slope = 0 is perfect transfer across widths (μP's promise), -1 an optimum
  that halves each time the width doubles. `shift_factor`: largest / smallest optimum."""
  from scipy import stats as scipy_stats

  x, y = np.log(np.asarray(widths, np.float64)), np.log(np.asarray(optimal_lrs, np.float64))
  if x.size < 3:
    raise ValueError(f"an LR width rule needs >= 3 widths for an interval; got {x.size}")
  fit = scipy_stats.linregress(x, y)
  half = scipy_stats.t.ppf(0.5 + level / 2, x.size - 2) * fit.stderr
  return {"k": float(np.exp(fit.intercept)), "slope": float(fit.slope),
          "ci": [float(fit.slope - half), float(fit.slope + half)], "level": level,
          "shift_factor": float(np.exp(y.max() - y.min()))}


@dataclasses.dataclass(frozen=True)
class Trunk:
  """The planned runs of one candidate as one warmup-stable-decay run and its cooldown
  branches (Hägele et al. 2024): `runs` sorted by steps, the last trained in full (the
  trunk), each shorter one a branch of the trunk's checkpoint at its decay start, trained for
  its decay only. Every run shares the trunk's `warmup_steps` and stable learning rate, so a
  branch ends exactly where a separate wsd run of its length would."""
  candidate: Candidate
  runs: tuple[PlannedRun, ...]
  warmup_steps: int
  decay_fraction: float

  @property
  def steps(self) -> int:
    return self.runs[-1].steps

  def start(self, run: PlannedRun) -> int:
    """The trunk step `run` branches from (its own decay start)."""
    return run_settings.wsd_decay_start(run.steps, self.decay_fraction)

  @property
  def checkpoint_steps(self) -> tuple[int, ...]:
    return tuple(sorted({self.start(r) for r in self.runs[:-1]}))

  @property
  def flops(self) -> float:
    """Compute of the trunk and its branches' decays (what the plan costs)."""
    per_step = self.runs[-1].flops / self.steps
    return per_step * (self.steps + sum(r.steps - self.start(r) for r in self.runs[:-1]))


def plan_wsd(runs: Sequence[PlannedRun], *, decay_fraction: float = 0.2,
             warmup_fraction: float = 0.05, min_warmup_steps: int = 1) -> list[Trunk]:
  """`runs` (e.g. `plan_isoflop`'s, over many budgets) grouped into one `Trunk` per
  candidate: the longest run is trained, the others branch from it. Warmup: `warmup_fraction`
  of the candidate's shortest run, at least `min_warmup_steps` (one warmup for all its runs).
  Runs of equal length are one run. ValueError when the warmup would reach a branch's decay."""
  if not 0 < decay_fraction <= 1:
    raise ValueError(f"plan_wsd: decay_fraction={decay_fraction} must be in (0, 1]")
  by_candidate: dict[str, dict[int, PlannedRun]] = {}
  for run in runs:
    by_candidate.setdefault(run.candidate.name, {}).setdefault(run.steps, run)
  trunks = []
  for name, by_steps in by_candidate.items():
    ordered = tuple(by_steps[s] for s in sorted(by_steps))
    warmup = max(int(round(warmup_fraction * ordered[0].steps)), min_warmup_steps, 1)
    first = run_settings.wsd_decay_start(ordered[0].steps, decay_fraction)
    if warmup > first:
      raise ValueError(f"plan_wsd: {name}'s shortest run ({ordered[0].steps} steps) decays "
                       f"from step {first}, inside its warmup of {warmup} steps; lower "
                       "warmup_fraction or decay_fraction")
    trunks.append(Trunk(ordered[0].candidate, ordered, warmup, decay_fraction))
  return trunks


def wsd_sweeps(trunks: Sequence[Trunk], base: str, *,
               lr: float | Callable[[Candidate], float], name: str,
               overrides: Mapping[str, Any] | None = None, seeds: Sequence[int] = (0,),
               logs: int = 200) -> dict:
  """`jaxformer.sweep` specs for `trunks` x `seeds`: {"trunks": spec, "branches": spec,
  "links": [(branch index, trunk index, trunk step), ...]} (indices of the specs' points in
  order; `jaxformer.sweep.run_branched` runs them). Trunks keep a checkpoint at every branch
  start; every run has one eval at its end and about `logs` training-loss records. `lr` is
  one peak LR or a function of the candidate; `name` the point-name template (it must use the
  model fields, `train.steps`, `optim.lr` and `train.seed` to be unique)."""
  if not trunks:
    raise ValueError("wsd_sweeps: no trunks")
  fields = sorted({key for t in trunks for key in t.candidate.overrides})

  def rows(pairs):
    zipped: dict[str, list] = {key: [] for key in fields}
    for key in ("train.steps", "optim.warmup_steps", "optim.lr", "train.seed",
                "train.eval_every", "train.log_every", "train.checkpoint_every"):
      zipped[key] = []
    for trunk, run, seed in pairs:
      for key in fields:
        zipped[key].append(trunk.candidate.overrides[key])
      rate = float(lr(trunk.candidate)) if callable(lr) else float(lr)
      if not (np.isfinite(rate) and rate > 0):
        raise ValueError(f"wsd_sweeps: learning rate {rate} of {trunk.candidate.name} must be > 0")
      zipped["train.steps"].append(run.steps)
      zipped["optim.warmup_steps"].append(trunk.warmup_steps)
      zipped["optim.lr"].append(rate)
      zipped["train.seed"].append(int(seed))
      zipped["train.eval_every"].append(run.steps)
      zipped["train.log_every"].append(max(run.steps // max(logs, 1), 1))
      zipped["train.checkpoint_every"].append(run.steps)
    return zipped

  fixed = dict(overrides or {})
  clash = sorted(set(fixed) & {"optim.schedule", "optim.decay_fraction", "train.steps"})
  if clash:
    raise ValueError(f"wsd_sweeps: overrides {clash} are set by the plan; drop them")
  fixed.update({"optim.schedule": "wsd", "optim.decay_fraction": trunks[0].decay_fraction})
  # longest first, so the sweep's last minutes are not one long trunk alone
  trunk_rows = sorted(((t, t.runs[-1], s) for t in trunks for s in seeds),
                      key=lambda r: -r[0].flops)
  branch_rows, links = [], []
  for i, (trunk, _, seed) in enumerate(trunk_rows):
    for run in trunk.runs[:-1]:
      links.append((len(branch_rows), i, trunk.start(run)))
      branch_rows.append((trunk, run, seed))
  trunk_zip = rows(trunk_rows)
  trunk_zip["train.checkpoint_steps"] = [t.checkpoint_steps for t, _, _ in trunk_rows]
  specs = {"trunks": dict(base=base, zip=trunk_zip, overrides=fixed, name=name),
           "branches": None, "links": links}
  if branch_rows:
    specs["branches"] = dict(base=base, zip=rows(branch_rows), overrides=fixed, name=name)
  return specs
