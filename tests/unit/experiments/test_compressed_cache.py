"""experiments/compressed_cache.py's committed report against its JSON: the markdown is
render(json), every summary number is what the per-row values give, and each stated verdict
follows from its interval (or value) by the rule the report states."""

import math

import numpy as np
import pytest

from experiments import compressed_cache as cc
from experiments import report_check

NAME = "compressed_cache"


@pytest.fixture(scope="module")
def results():
  return report_check.load(report_check.RESULTS / NAME)


def test_report_is_render_of_json_and_summary_is_the_rows(results):
  assert results["format"] == cc.FORMAT
  assert report_check.check(NAME) == []


def test_numbers_recomputed_from_the_rows(results):
  for model, r in results["models"].items():
    s = results["summary"][model]
    full = np.asarray(r["evals"]["full"]["row_nll"])
    assert len(full) == results["rows"]
    assert s["full"]["ppl"] == pytest.approx(math.exp(full.mean()), rel=1e-9)
    for name, e in r["evals"].items():
      nll = np.asarray(e["row_nll"])
      assert s[name]["dnll"] == pytest.approx((nll - full).mean(), abs=1e-12)
      lo, hi = s[name]["dnll_ci"]
      assert lo <= s[name]["dnll"] + 1e-12 and s[name]["dnll"] <= hi + 1e-12
      b = cc.budget_of(name)
      if b is not None:                     # within / beyond split by the needle's distance
        acc = np.asarray(e["needle_tf"])
        beyond = np.asarray(results["needle_distance"]) > b - 1
        if beyond.any():
          assert s[name]["needle_beyond"] == pytest.approx(acc[beyond].mean())


def test_each_verdict_follows_from_its_measurement(results):
  text = (report_check.RESULTS / f"{NAME}.md").read_text()
  listed = cc.claims(results)
  assert len(listed) >= 10
  for c in listed:
    assert f"| {c['claim']} |" in text and c["verdict"] in ("holds", "fails", "unresolved")
    if c["ci"] is not None:
      lo, hi = c["ci"]
      threshold = 0.01 if c["id"].endswith("/int8") else 0.0
      want = "holds" if hi < threshold else "fails" if lo > threshold else "unresolved"
      assert c["verdict"] == want, c
  by_id = {c["id"]: c for c in listed}
  control = results["summary"]["needle_tuned"]["_control"]["needle"]
  for b in results["budgets"]:
    c = by_id.get(f"needle_tuned/window/{b}/beyond")
    if c is not None:
      assert (c["verdict"] == "holds") == (c["value"] <= control + 0.05)


def test_policies_and_verdict_rule():
  assert cc.policy_of("full") is None
  p = cc.policy_of("sinks/16")
  assert (p.kind, p.budget, p.num_sinks) == ("sinks", 16, cc.SINKS)
  assert cc.policy_of("int8").dtype == "int8" and cc.budget_of("int8") is None
  assert cc.verdict([-0.2, -0.1]) == "holds" and cc.verdict([0.1, 0.2]) == "fails"
  assert cc.verdict([-0.1, 0.1]) == "unresolved"
  assert cc.verdict([0.0, 0.009], below=0.01) == "holds"
