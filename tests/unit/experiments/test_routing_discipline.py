"""experiments/results/routing_discipline.md's claims against its JSON, recomputed here from
the per-head arrays (not through the script's `summarize`): no collapse, no redundancy, the
same model as head_pruning's `readme`, and the rank correlations with its ablation losses
(scipy's spearmanr)."""

import numpy as np
import pytest
from scipy import stats

from experiments import report_check, routing_discipline as rd

RESULTS = report_check.load(report_check.RESULTS / "routing_discipline")
TEXT = (report_check.RESULTS / "routing_discipline.md").read_text()
STEPS = RESULTS["steps"]
FIRST, LAST = STEPS[0], STEPS[-1]


def _norm(record) -> np.ndarray:
  return np.array([h["normalized_entropy"] for h in record["heads"]])       # [L, H]


def _within(record) -> np.ndarray:
  """[L] mean off-diagonal similarity of each layer's heads."""
  return np.array([np.asarray(h["similarity"])[~np.eye(len(h["similarity"]), dtype=bool)].mean()
                   for h in record["heads"]])


def test_the_run_evaluated_every_50_steps_to_the_end():
  assert [r["step"] for r in STEPS] == list(range(50, 2001, 50))
  assert _norm(LAST).shape == (4, 4)


def test_no_head_collapsed_the_heads_focused_and_settled():
  assert "Collapse: **no**" in TEXT and "No head collapsed" in TEXT
  assert _norm(LAST).min() > rd.COLLAPSED
  fell = _norm(FIRST).mean(1) - _norm(LAST).mean(1)
  assert np.all(fell > 0.3), fell                       # "about half of the uniform entropy"
  quarter = next(r for r in STEPS if r["step"] >= 1500)
  assert np.all(np.abs(_norm(LAST).mean(1) - _norm(quarter).mean(1)) < 0.01)   # settled


def test_the_heads_did_not_become_redundant():
  assert "Redundancy: **no**" in TEXT
  assert np.all(_within(LAST) < _within(FIRST) - 0.1)
  for h in LAST["heads"]:
    sim = np.asarray(h["similarity"])
    assert sim[~np.eye(len(sim), dtype=bool)].max() < rd.REDUNDANT
  lowest = np.array([_within(r) for r in STEPS]).min(0)
  assert np.all(_within(LAST) > lowest)                  # "followed by a slow rise"


def test_it_is_head_prunings_model_and_the_correlations_hold():
  pruning = RESULTS["head_pruning"]
  assert LAST["eval_loss"] == pytest.approx(pruning["train_eval_loss"], abs=1e-4)
  assert "the same model: final eval loss 1.7868" in TEXT
  ablation = np.asarray(pruning["ablation_loss"])
  partner = np.array([h["partner_similarity"] for h in LAST["heads"]])
  s = rd.summarize(RESULTS)
  for values, key in ((_norm(LAST), "entropy"), (partner, "partner")):
    rho = stats.spearmanr(values.ravel(), ablation.ravel()).statistic
    assert s[f"spearman_{key}_ablation"] == pytest.approx(rho, abs=1e-12)
    within = np.corrcoef(stats.rankdata(values, axis=1).ravel(),
                         stats.rankdata(ablation, axis=1).ravel())[0, 1]
    assert s[f"within_{key}_ablation"] == pytest.approx(within, abs=1e-12)
  assert s["spearman_entropy_ablation"] < -0.5 and s["p_entropy_ablation"] < rd.ALPHA
  assert s["within_entropy_ablation"] < -0.5 and s["p_within_entropy_ablation"] < rd.ALPHA
  assert s["spearman_partner_ablation"] > 0.5 and s["p_within_partner_ablation"] > rd.ALPHA
  assert int(np.argmax(ablation.mean(1))) == int(np.argmax(partner.mean(1))) == 0
  assert "Focus goes with being needed within layers too" in TEXT
  assert "is not supported" in TEXT
