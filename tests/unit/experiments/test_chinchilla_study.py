"""The analysis of experiments/scaling_chinchilla.py on runs made up from a known law (the
real study takes hours): the fits recover the law at exact FLOPs, seeds give sigma_seed,
the LR and schedule checks read the right runs, and the report is rebuilt from its JSON."""

import functools
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from experiments import report_check
from tests.repo_root import REPO

ROOT = REPO
LAW = {"E": 1.0, "A": 60.0, "B": 900.0, "alpha": 0.35, "beta": 0.38}
SIZES = [(f"L2_d{16 * (i + 1)}", int(2e3 * 2.1 ** i)) for i in range(9)]
BUDGETS = [1e11, 3.16e11, 1e12, 3.16e12, 1e13]


def _study():
  spec = importlib.util.spec_from_file_location(
      "scaling_chinchilla", ROOT / "experiments" / "scaling_chinchilla.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _fpt(n):
  return 6.0 * n * (1 + 3e3 / n ** 0.75)           # exact FLOPs/token above 6N, as for char GPTs


def _loss(n, d, rng, trunk_offset):
  law = LAW["E"] + LAW["A"] / n ** LAW["alpha"] + LAW["B"] / d ** LAW["beta"]
  return float(law * np.exp(trunk_offset + rng.normal(0, 0.002)))


def _results():
  rng = np.random.default_rng(0)
  points = []

  def add(stage, size, n, budget, seed, lr, offset, schedule="wsd"):
    d = int(budget / _fpt(n))
    points.append({"stage": stage, "name": f"{size}_s{d}_seed{seed}_{stage}_lr{lr:g}",
                   "size": size, "n": n, "n_non_embedding": int(n * 0.8), "d": d,
                   "steps": d // 1024, "flops": budget, "flops_per_token": _fpt(n),
                   "budget": budget, "lr": lr, "seed": seed, "schedule": schedule,
                   "trunk": f"{stage}/{size}/lr{lr:g}/seed{seed}",
                   "eval_loss": _loss(n, d, rng, offset), "wall_time_s": 1.0})

  for size, n in SIZES:
    for seed in (0, 1, 2):
      if seed and size not in ("L2_d48", "L2_d64", "L2_d80"):
        continue
      offset = rng.normal(0, 0.004)
      for budget in BUDGETS:
        d = budget / _fpt(n)
        if 2 <= d / n <= 2000:
          add("main" if seed == 0 else "seeds", size, n, budget, seed, 3e-3, offset)
  for lr, shift in ((1e-3, 0.03), (2e-3, 0.008), (4e-3, 0.0), (8e-3, 0.012), (1.6e-2, 0.05)):
    for size, n in SIZES[:3]:
      add("lr", size, n, 1e12, 0, lr, shift)
  for lr, shift in ((1.5e-3, 0.01), (6e-3, 0.02)):
    add("lr_check", "L2_d96", dict(SIZES)["L2_d96"], 1e13, 0, lr, shift)
  for seed in (0, 1, 2):
    add("cosine", "L2_d64", dict(SIZES)["L2_d64"], 1e12, seed, 3e-3, rng.normal(0, 0.004),
        schedule="cosine")
  setup = {"corpus": "made_up.txt", "vocab": 100, "train_chars": 10 ** 7, "budgets": BUDGETS,
           "tokens_per_step": 1024, "decay_fraction": 0.2,
           "learning_rates": [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], "lr_budget": 1e12,
           "seeds": [0, 1, 2], "seed_budget": 3.16e12, "cosine_budget": 1e12,
           "prediction_factor": 3.0, "bootstrap": 30,
           "family": [{"size": s, "n": n, "flops_per_token": _fpt(n)} for s, n in SIZES]}
  rule = {"k": 0.05, "p": 0.5, "p_ci": [0.3, 0.7], "optima": {16: 4e-3, 32: 4e-3, 48: 4e-3},
          "findings": []}
  return {"setup": setup, "rule": rule, "points": points}


@pytest.mark.slow
def test_study_analysis_recovers_a_known_law_and_renders_from_its_json(tmp_path, monkeypatch):
  # Approach 3 from 72 starts of the paper's grid, not 4,500 (10 fits with the back-tests:
  # minutes with the whole grid); the law's basin is inside them.
  from jaxformer import scaling
  from jaxformer.scaling import chinchilla
  from tests import scaling_grid
  monkeypatch.setattr(scaling, "fit_parametric", functools.partial(
      chinchilla.fit_parametric, starts=scaling_grid.small_grid(), bootstrap_starts=4))
  study = _study()
  results = _results()
  results["analysis"] = study.analyse(results, samples=16)
  a = results["analysis"]
  fit3 = a["fits"]["approach 3"]
  for key in ("alpha", "beta"):
    assert fit3["params"][key] == pytest.approx(LAW[key], rel=0.15)
  assert fit3["bootstrap_by_run"] and fit3["bootstrap_attempted"] == 16
  # the optimum at exact FLOPs is the minimiser of the true law at exact compute
  fpt = study.fpt_of(results["setup"])
  for row in a["optima"]:
    grid = np.geomspace(1e3, 1e8, 20001)
    true = LAW["A"] / grid ** LAW["alpha"] + LAW["B"] / (row["budget"] / fpt(grid)) ** LAW["beta"]
    assert row["approach 3"][0] == pytest.approx(grid[np.argmin(true)], rel=0.5)
  # three seeded sizes at >= 1 budget each: sigma_seed is their pooled sd
  noise = a["seed_noise"]
  assert noise["points"] >= 3 and 0 < noise["sigma_log"] < 0.02
  by_seed = [p for p in results["points"] if p["size"] == "L2_d64" and p["budget"] == 1e12
             and p["stage"] in ("main", "seeds")]
  assert len(by_seed) == 3
  # the LR table finds the grid optimum (4e-3 by construction) for each probed width
  assert {r["size"] for r in a["lr_table"]} == {s for s, _ in SIZES[:3]}
  assert all(r["optimum"] == pytest.approx(4e-3, rel=0.3) for r in a["lr_table"])
  (check,) = a["lr_check"]
  assert set(check) >= {"0.0015", "0.003", "0.006"}
  (cosine,) = a["cosine_check"]
  assert len(cosine["cosine"]) == len(cosine["wsd"]) == 3
  assert {"last", "each"} <= set(json.dumps(a["backtest"]).replace('"', " ").split())
  results["prediction"] = {
      "budget": 3e13, "size": "L2_d112", "n": 100000, "d": 10 ** 7, "steps": 9766,
      "flops": 3e13, "predicted_loss": 1.5, "predictive_interval": [1.45, 1.55],
      "mean_law_interval": [1.48, 1.52], "optimum_exact": {"n": 1e5, "d": 1e7},
      "predicted_at": "2026-11-24 12:00:00", "measured_loss": 1.51, "error": 0.01,
      "relative_error": 0.0067, "inside": True}
  text = json.loads(json.dumps(results, default=float))
  rendered = study.render(text)
  assert "inside the predictive interval" in rendered and "sigma_seed" in rendered
  assert rendered == study.render(json.loads(json.dumps(text)))
  refitted = study.refit(text)
  for name, params in refitted.items():
    for key, value in params.items():
      assert value == pytest.approx(a["fits"][name]["params"][key], rel=1e-6), (name, key)
  assert report_check.compare_estimates(refitted, study.stored(text)) == []
  study.plot(text, str(tmp_path / "study.png"))
  assert (tmp_path / "study.png").stat().st_size > 10_000
