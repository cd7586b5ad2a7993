"""IsoFLOP planning (`jaxformer.scaling.isoflop`): every planned run spends its budget, the
sizes bracket the expected optimum, each cosine ends at its run's last step, and a plan that
cannot be run is refused with the run and the fix named. Synthetic candidates (no JAX),
then the shipped `configs/sweeps/isoflop.py` end to end through `jaxformer.sweep`."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from jaxformer import scaling, sweep as sweep_lib
from jaxformer.scaling import isoflop

# ml_collections' config_flags loads config files with the deprecated load_module().
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

BUDGETS = [6e11, 2e12, 6e12]
TOKENS_PER_STEP = 1024


def _family(ratio=1.2, count=40, start=1e4):
  """Sizes `ratio` apart from `start`; exact FLOPs/token a bit above 6N (vocabulary and
  attention terms), as `flops_per_token(method="hoffmann")` gives for small models."""
  out = []
  for i in range(count):
    n = int(round(start * ratio ** i))
    out.append(scaling.Candidate(name=f"m{i}", params=n, overrides={"model.size": i},
                                 flops_per_token=6.0 * n * 1.15 + 5e4))
  return out


@pytest.mark.parametrize("flops", ["6N", "exact"])
def test_plan_spends_each_budget_with_bracketing_sizes(flops):
  """>= 5 distinct sizes per budget around N* = sqrt(C / 120), each run within 2% of its
  budget (rounding to whole steps: at most 0.5 / steps), warmup 5% of its steps."""
  family = _family()
  runs = scaling.plan_isoflop(BUDGETS[::-1], family, tokens_per_step=TOKENS_PER_STEP,
                              flops=flops)
  assert [r.budget for r in runs] == sorted(r.budget for r in runs)     # budgets sorted
  for budget in BUDGETS:
    mine = [r for r in runs if r.budget == budget]
    sizes = [r.candidate.params for r in mine]
    assert len(mine) == 5 and len(set(sizes)) == 5 and sizes == sorted(sizes)
    optimum = math.sqrt(budget / 120)
    assert min(sizes) < optimum < max(sizes)
    assert 1.5 < max(sizes) / optimum < 8 and 1.5 < optimum / min(sizes) < 8   # ~2^2 apart
    for run in mine:
      per_token = 6.0 * run.candidate.params if flops == "6N" else run.candidate.flops_per_token
      assert run.flops == pytest.approx(per_token * run.tokens, rel=1e-12)
      assert abs(run.flops / budget - 1) <= min(0.02, 0.5 / run.steps)
      assert run.tokens == run.steps * TOKENS_PER_STEP and run.steps >= 50
      assert run.warmup_steps == round(0.05 * run.steps)
      assert run.name == f"{run.candidate.name}_s{run.steps}"


def test_plan_around_a_fitted_optimum():
  """`optimum` moves the sizes to a fitted law's N_opt(C) (here Chinchilla's, ~2.4x the rule
  of thumb at these budgets): the middle size is the candidate nearest to it."""
  family = _family()
  law = scaling.HOFFMANN_2022
  runs = scaling.plan_isoflop(BUDGETS, family, tokens_per_step=TOKENS_PER_STEP,
                              optimum=lambda c: law.compute_optimal(c)[0], sizes_per_budget=7,
                              spacing=1.5, warmup_fraction=0.1)
  for budget in BUDGETS:
    mine = [r for r in runs if r.budget == budget]
    target = law.compute_optimal(budget)[0]
    nearest = min(family, key=lambda c: abs(math.log(c.params / target)))
    assert len(mine) == 7 and mine[3].candidate == nearest
    assert all(r.warmup_steps == round(0.1 * r.steps) for r in mine)


def test_to_sweep_ends_each_cosine_at_its_last_step():
  """Per point: decay_steps == train.steps (the cosine ends where the run ends, as
  Chinchilla found necessary), warmup, one eval at the end, ~200 loss records; the lr is
  per run when `lr` is a function of the run, shared when it is a number."""
  runs = scaling.plan_isoflop(BUDGETS, _family(), tokens_per_step=TOKENS_PER_STEP)
  rule = lambda run: 1e-2 * (run.candidate.params / 1e4) ** -0.5  # noqa: E731
  spec = scaling.to_sweep(runs, "configs/shakespeare_char.py:tiny", lr=rule,
                          overrides={"train.batch_size": 16})
  points = sweep_lib.expand(spec, validate=False)
  assert len(points) == len(runs) == 15
  assert len({p.name for p in points}) == 15
  for point, run in zip(points, runs):
    o = point.overrides
    assert o["train.steps"] == o["optim.decay_steps"] == run.steps
    assert o["optim.warmup_steps"] == run.warmup_steps
    assert o["optim.schedule"] == "cosine" and o["train.batch_size"] == 16
    assert o["optim.lr"] == pytest.approx(rule(run))
    assert o["train.eval_every"] == o["train.checkpoint_every"] == run.steps
    assert o["train.log_every"] == max(run.steps // 200, 1)
    assert o["model.size"] == run.candidate.overrides["model.size"]
    assert point.name == f"size{o['model.size']}_s{run.steps}"
  shared = scaling.to_sweep(runs, "configs/shakespeare_char.py:tiny", lr=3e-3, evals=4,
                            name="{index}")
  assert shared["overrides"]["optim.lr"] == 3e-3 and "optim.lr" not in shared["zip"]
  assert shared["zip"]["train.eval_every"] == [r.steps // 4 for r in runs]
  assert shared["name"] == "{index}"


@pytest.mark.parametrize("budgets,kwargs,match", [
    ([], {}, r"budgets is empty; give one or more FLOP budgets"),
    ([6e11, 0.0], {}, r"budget 0.0 must be a finite FLOP count > 0"),
    ([-2.5e3], {}, r"budget -2500.0 must be a finite FLOP count > 0"),
    ([float("nan")], {}, r"budget nan must be a finite FLOP count > 0"),
    ([6e11, 6e11], {}, r"repeat a value; give each once"),
    (BUDGETS, dict(tokens_per_step=0), r"tokens_per_step=0 must be an int >= 1"),
    (BUDGETS, dict(sizes_per_budget=2), r"sizes_per_budget=2 must be >= 3"),
    (BUDGETS, dict(spacing=1.0), r"spacing=1.0 must be > 1"),
    (BUDGETS, dict(flops="kaplan"), r"flops='kaplan' must be one of \('6N', 'exact'\)"),
    # Too coarse: sizes 4x apart cannot give 5 sizes 2x apart.
    (BUDGETS, dict(candidates=_family(ratio=4.0, count=12)),
     r"both map to candidate .* too coarse for spacing=2.0.*add shapes or raise spacing"),
    # The optimum (sqrt(6e15 / 120) = 7e6) is beyond the family's largest size (~9e4).
    ([6e15], dict(candidates=_family(count=12)),
     r"optimum \(7.07e\+06\) lies outside them"),
    (BUDGETS, dict(candidates=_family(count=3)),
     r"3 distinct candidate sizes cannot give sizes_per_budget=5; add model shapes"),
    # Runs that would repeat the corpus or be too short to train.
    (BUDGETS, dict(max_tokens=1e6),
     r"needs [\d,]+ tokens > max_tokens=1,000,000; lower the budget, narrow spacing or use "
     "a larger corpus"),
    (BUDGETS, dict(tokens_per_step=2 ** 16),
     r"gets \d+ steps of 65536 tokens \(min_steps=50.*raise the budget or lower "
     "tokens_per_step"),
    (BUDGETS, dict(candidates=[scaling.Candidate(c.name, c.params, c.overrides)
                               for c in _family()], flops="exact"),
     r"flops='exact' needs candidate 'm\d+' to carry flops_per_token"),
])
def test_plan_errors_name_the_problem_and_the_fix(budgets, kwargs, match):
  kwargs = dict(dict(candidates=_family(), tokens_per_step=TOKENS_PER_STEP), **kwargs)
  with pytest.raises(ValueError, match=match):
    scaling.plan_isoflop(budgets, **kwargs)


def test_a_refused_budget_names_the_smallest_budget_that_works():
  """The refusal computes the budgets that work with the family and data: the smallest one
  plans every run and no budget below it does (down to the least that could: min_steps of
  the cheapest model); with no budget for 5 sizes it names the sizes that work."""
  import re
  family = _family()
  kwargs = dict(tokens_per_step=TOKENS_PER_STEP, max_tokens=5e7, flops="exact")
  with pytest.raises(ValueError, match=r"both map to .*smallest budget that works \(rounded "
                                       r"up to 2 significant digits\) is") as e:
    scaling.plan_isoflop([1e9], family, **kwargs)         # N* = 2.9e3, below the family
  found = [float(b) for b in re.search(r"budgets that work: ([\d.e+/]+)\)",
                                        str(e.value)).group(1).split("/")]
  assert found == scaling.working_budgets(family, **kwargs)
  assert len(found) == 3 and all(b2 >= 3 * b1 for b1, b2 in zip(found, found[1:]))
  for budget in found:
    assert len(scaling.plan_isoflop([budget], family, **kwargs)) == 5
  least = 50 * TOKENS_PER_STEP * min(c.flops_per_token for c in family)
  unit = 10.0 ** (math.floor(math.log10(found[0])) - 1)      # found[0] has 2 digits: 5.8e10
  assert found[0] / unit == round(found[0] / unit)
  for budget in np.geomspace(least * 0.98, found[0] - unit, 200):   # below 5.7e10: none
    with pytest.raises(ValueError):
      scaling.plan_isoflop([budget], family, **kwargs)
  # a corpus too small for 5 sizes at any budget: fewer sizes are offered
  with pytest.raises(ValueError, match=r"no budget gives 5 sizes of this family with this data "
                                       r"\(spacing=2, max_tokens=300,000\); 4 sizes work "
                                       r"from 2.9e\+10 \(budgets that work: "):
    scaling.plan_isoflop([1e12], family, **dict(kwargs, max_tokens=3e5))


def test_isoflop_sweep_on_the_bundled_text(monkeypatch):
  """source=tinyshakespeare: 5 sizes fit no budget of its 2 epochs, and the refusal says so
  with what works; the sizes=3 command in the sweep file's docstring plans 9 runs."""
  from configs.sweeps import isoflop as sweep_file

  monkeypatch.setattr(sweep_file, "WIDTHS", tuple(range(16, 113, 16)))    # what they reach
  monkeypatch.setattr(sweep_file, "gpt_candidates", functools.cache(sweep_file.gpt_candidates))
  with pytest.raises(ValueError, match=r"no budget gives 5 sizes .*; 4 sizes work from "
                                       r"1.1e\+11"):
    sweep_file.get_sweep("source=tinyshakespeare")
  with pytest.raises(ValueError, match=r"digits\) is 5.4e\+10 \(budgets that work: "
                                       r"5.4e\+10/2.2e\+11/8.6e\+11\)"):
    sweep_file.get_sweep("source=tinyshakespeare,sizes=3")
  assert "budgets=5.4e10/2.2e11/8.6e11" in sweep_file.__doc__
  spec = sweep_file.get_sweep("source=tinyshakespeare,sizes=3,budgets=5.4e10/2.2e11/8.6e11")
  assert len(spec["zip"]["train.steps"]) == 9 and min(spec["zip"]["train.steps"]) >= 50
  assert spec["overrides"]["data.source"] == "tinyshakespeare"
  assert spec["overrides"]["model.vocab_size"] == 65


def test_min_steps_and_tolerance():
  """A run is refused when it gets < min_steps steps, or when rounding to whole steps moves
  it more than `tolerance` off its budget (possible only for very short runs)."""
  big = scaling.Candidate("big", 10 ** 6, {"model.size": 0})
  budget = 6 * 10 ** 6 * TOKENS_PER_STEP * 40.4                 # 40.4 steps' worth
  with pytest.raises(ValueError, match=r"gets 40 steps .*min_steps=50"):
    isoflop.plan_run(budget, big, tokens_per_step=TOKENS_PER_STEP)
  run = isoflop.plan_run(budget, big, tokens_per_step=TOKENS_PER_STEP, min_steps=40)
  assert run.steps == 40 and run.flops / budget - 1 == pytest.approx(-0.4 / 40.4)
  with pytest.raises(ValueError, match=r"-1\.0% of the budget"):
    isoflop.plan_run(budget, big, tokens_per_step=TOKENS_PER_STEP, min_steps=40,
                      tolerance=0.005)


def test_to_sweep_errors():
  runs = scaling.plan_isoflop(BUDGETS[:1], _family(), tokens_per_step=TOKENS_PER_STEP)
  with pytest.raises(ValueError, match="the plan has no runs"):
    scaling.to_sweep([], "b.py", lr=1e-3)
  with pytest.raises(ValueError, match=r"learning rates .* must be > 0"):
    scaling.to_sweep(runs, "b.py", lr=lambda run: -1.0)
  with pytest.raises(ValueError, match=r"overrides \['train.steps'\] are set by the plan"):
    scaling.to_sweep(runs, "b.py", lr=1e-3, overrides={"train.steps": 10})
  odd = [runs[0], isoflop.PlannedRun(**dict(vars(runs[1]), candidate=scaling.Candidate(
      "odd", 5, {"model.other": 1})))]
  with pytest.raises(ValueError, match=r"candidate 'm\d+' lacks \['model.other'\]; every "
                                       "candidate must set the same fields"):
    scaling.to_sweep(odd, "b.py", lr=1e-3)


# ---------------------------------------------------------------------- configs/sweeps/isoflop.py

def _corpus(path, chars: int) -> str:
  """Random text over 30 characters (the family's vocabulary is the corpus's characters)."""
  alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz .,\n", np.uint8)
  path.write_bytes(np.random.default_rng(0).choice(alphabet, chars).tobytes())
  return str(path)


def test_isoflop_sweep_file_end_to_end(tmp_path, monkeypatch):
  """get_sweep -> as_sweep -> expand (every point's config parsed and its model built), with
  budgets at the small end of the family (3e11 and 1e12 FLOPs: 5 sizes each of >= 2 layers,
  >= 50 steps of 1024 tokens). The corpus must hold 2 epochs of the longest run.
  Widths are cut to <= 160 (counting all 38 shapes is ~4x slower)."""
  from configs.sweeps import isoflop

  monkeypatch.setattr(isoflop, "WIDTHS", tuple(range(16, 161, 16)))
  monkeypatch.setattr(isoflop, "gpt_candidates", functools.cache(isoflop.gpt_candidates))
  source = _corpus(tmp_path / "corpus.txt", 3_600_000)
  spec = isoflop.get_sweep(f"source={source},budgets=3e11/1e12,lr=2e-3")
  points = sweep_lib.expand(sweep_lib.as_sweep(spec))
  assert len(points) == 10 and len({p.name for p in points}) == 10
  runs = isoflop.plan(source, [3e11, 1e12])
  tokens_per_step = isoflop.BATCH_SIZE * isoflop.SEQ_LEN
  for point, run in zip(points, runs):
    cfg = point.config
    assert cfg.train.steps == cfg.optim.decay_steps == run.steps >= 50
    assert cfg.optim.warmup_steps == round(0.05 * run.steps)
    assert cfg.optim.schedule == "cosine" and cfg.optim.lr == 2e-3
    assert cfg.train.batch_size * cfg.data.seq_len == tokens_per_step == 1024
    assert cfg.model.vocab_size == 30 and cfg.data.source == source
    assert cfg.model.d_model == run.candidate.overrides["model.d_model"]
    # N is the total count of the model the point builds; FLOPs are the exact count.
    assert point.params["total"] == run.candidate.params
    assert abs(run.flops / run.budget - 1) <= 0.02
    assert run.tokens <= 2 * 0.9 * 3_600_000
  for budget in (3e11, 1e12):
    sizes = [r.candidate.params for r in runs if r.budget == budget]
    assert len(set(sizes)) == 5 and min(sizes) < math.sqrt(budget / 120) < max(sizes)
  # μP: one LR for every size; heads of 16 grow in number, so head_dim is set
  mup = isoflop.get_sweep(f"source={source},budgets=3e11/1e12,lr=2e-3,mup_base_width=32")
  assert {k: mup["overrides"][k] for k in ("model.parametrization", "model.mup_base_width",
                                           "model.head_dim", "optim.lr")} == {
      "model.parametrization": "mup", "model.mup_base_width": 32, "model.head_dim": 16,
      "optim.lr": 2e-3}
  assert "model.parametrization" not in spec["overrides"]       # standard unless asked


def test_isoflop_sweep_file_argument_errors(tmp_path):
  """Without `source` (or with a bad one) the sweep says what to pass."""
  from configs.sweeps import isoflop

  with pytest.raises(ValueError, match=r"isoflop sweep needs source=PATH \(a text corpus\)"):
    isoflop.get_sweep()
  with pytest.raises(ValueError, match="needs source=PATH"):
    isoflop.get_sweep("budgets=1e11/3e11")
  with pytest.raises(ValueError, match=r"expected key=value with key one of source, budgets"):
    isoflop.get_sweep("source=x,budget=1e11")
  with pytest.raises(ValueError, match=r"source='/nonexistent.txt': no such file"):
    isoflop.get_sweep("source=/nonexistent.txt")
  with pytest.raises(ValueError, match=r"budgets are '/'-separated numbers"):
    isoflop.get_sweep(f"source={tmp_path / 'x.txt'},budgets=1e11;3e11")
  with pytest.raises(ValueError, match=r"sizes and mup_base_width ints"):
    isoflop.get_sweep(f"source={tmp_path / 'x.txt'},mup_base_width=wide")


def test_wsd_plan_gives_each_size_one_trunk_and_branches_at_their_decay_starts():
  """Each candidate's runs over the budgets become one trunk (its longest run) whose kept
  checkpoints are the shorter runs' decay starts; the cost is the trunk plus the decays."""
  family = _family()
  runs = scaling.plan_isoflop(BUDGETS, family, tokens_per_step=TOKENS_PER_STEP, flops="exact")
  trunks = scaling.plan_wsd(runs, decay_fraction=0.2, min_warmup_steps=20)
  assert sorted(t.candidate.name for t in trunks) == sorted({r.candidate.name for r in runs})
  for trunk in trunks:
    mine = sorted(r.steps for r in runs if r.candidate.name == trunk.candidate.name)
    assert [r.steps for r in trunk.runs] == mine and trunk.steps == mine[-1]
    assert trunk.checkpoint_steps == tuple(s - max(round(0.2 * s), 1) for s in mine[:-1])
    assert trunk.warmup_steps == max(round(0.05 * mine[0]), 20)
    per_step = trunk.runs[-1].flops / trunk.steps
    assert trunk.flops == pytest.approx(per_step * (mine[-1] + sum(round(0.2 * s)
                                                                   for s in mine[:-1])))
  shared = [t for t in trunks if len(t.runs) > 1]
  assert shared                      # neighbouring budgets share sizes: their runs branch
  shortest = min(r.steps for r in runs)
  with pytest.raises(ValueError, match=f"inside its warmup of {shortest} steps"):
    scaling.plan_wsd(runs, min_warmup_steps=shortest)


def test_wsd_sweeps_link_each_branch_to_its_trunk_and_keep_its_start():
  family = _family()
  runs = scaling.plan_isoflop(BUDGETS, family, tokens_per_step=TOKENS_PER_STEP, flops="exact")
  trunks = scaling.plan_wsd(runs)
  specs = scaling.wsd_sweeps(trunks, "configs/shakespeare_char.py:tiny", lr=lambda c: 1e-3,
                             name="m{model.size}_s{train.steps}_seed{train.seed}",
                             seeds=(0, 1))
  t, b = specs["trunks"]["zip"], specs["branches"]["zip"]
  assert len(t["train.steps"]) == 2 * len(trunks)
  assert len(b["train.steps"]) == 2 * sum(len(tr.runs) - 1 for tr in trunks)
  costs = [next(tr.flops for tr in trunks if tr.candidate.overrides["model.size"] == size)
           for size in t["model.size"]]
  assert costs == sorted(costs, reverse=True)          # the longest trunks start first
  for branch, trunk, step in specs["links"]:
    assert b["model.size"][branch] == t["model.size"][trunk]
    assert b["train.seed"][branch] == t["train.seed"][trunk]
    assert b["optim.warmup_steps"][branch] == t["optim.warmup_steps"][trunk]
    assert step == b["train.steps"][branch] - max(round(0.2 * b["train.steps"][branch]), 1)
    assert step in t["train.checkpoint_steps"][trunk] and step < t["train.steps"][trunk]
  assert specs["trunks"]["overrides"]["optim.schedule"] == "wsd"
  with pytest.raises(ValueError, match=r"overrides \['optim.schedule'\] are set by the plan"):
    scaling.wsd_sweeps(trunks, "x", lr=1e-3, name="n", overrides={"optim.schedule": "cosine"})
