"""experiments/serving.py: the committed report is render(json), and its claims follow from
the JSON's raw per-request timings (percentiles, throughput, the 50 ms target's verdict, the
int8 params' bytes and logits gap)."""

import numpy as np
import pytest

from experiments import report_check, serving


@pytest.fixture(scope="module")
def results():
  return report_check.load(report_check.RESULTS / "serving")


def test_report_is_render_of_its_json(results):
  assert results["format"] == serving.FORMAT
  assert report_check.check("serving") == []


def test_summaries_are_the_raw_timings_percentiles():
  load = {"concurrency": 2, "wall_s": 2.0, "failures": [],
          "requests": [{"ttft_s": t / 1e3, "total_s": 2 * t / 1e3, "tokens": 3}
                       for t in (10, 20, 30, 40, 100)]}
  s = serving.summarize_load(load)
  assert s["ttft_p50_ms"] == pytest.approx(30) and s["total_p50_ms"] == pytest.approx(60)
  assert s["ttft_p95_ms"] == pytest.approx(np.percentile([10, 20, 30, 40, 100], 95))
  assert s["tokens_per_s"] == pytest.approx(15 / 2.0)


def test_loads_are_complete_and_the_verdict_follows(results):
  text = (report_check.RESULTS / "serving.md").read_text()
  assert "GPU: not measured" in text and "shared with other jobs" in results["machine"]
  for model in results["models"].values():
    for entry in model["weights"].values():
      for workload, loads in entry["loads"].items():
        _, new = serving.WORKLOADS[workload]
        assert [l["concurrency"] for l in loads] == list(serving.CONCURRENCY)
        for load in loads:
          assert not load["failures"] and len(load["requests"]) == (load["concurrency"]
                                           * serving.REQUESTS_PER_CLIENT[load["concurrency"]])
          for r in load["requests"]:
            assert r["tokens"] == new and 0 < r["ttft_s"] <= r["total_s"] <= load["wall_s"]
      assert entry["shutdown_s"] < 60
  verdict = serving.target_verdict(results)
  for weights, v in verdict.items():
    assert v["met"] == (v["p95_ms"] < serving.TARGET_MS)
    assert f"{weights} p50 {v['p50_ms']:.1f} ms, p95 {v['p95_ms']:.1f} ms: " + (
        "met" if v["met"] else "NOT met") in text


def test_int8_is_smaller_and_close(results):
  gap = results["logits_gap"]
  readme = results["models"]["readme"]["weights"]
  assert readme["int8"]["param_bytes"] == gap["param_bytes_int8"]
  assert readme["float"]["param_bytes"] == gap["param_bytes_float"]
  assert gap["param_bytes_int8"] < 0.5 * gap["param_bytes_float"]
  assert 0 < gap["max_abs_diff"] < 0.1 * gap["max_abs_logit"]
  assert gap["argmax_agreement"] > 0.95 and abs(gap["loss_int8"] - gap["loss_float"]) < 0.05
