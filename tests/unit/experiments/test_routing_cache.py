"""experiments/routing_cache.py: its data (the recall rows, the recurrence of rare characters)
and its committed report's claims against its JSON."""

import numpy as np

from experiments import report_check, routing_cache as rc


def test_recall_rows_hold_distinct_keys_and_queries_answered_by_their_values():
  tokens, mask = rc.recall_batch(np.random.default_rng(0), 64, rc.LENGTHS)
  assert tokens.shape == mask.shape == (64, 4 * max(rc.LENGTHS))
  for row, m in zip(tokens, mask):
    n = int(np.argmax(m)) // 2                      # first answer at 2 n + 1
    assert n in rc.LENGTHS and m.sum() == n
    keys, values = row[:2 * n:2], row[1:2 * n:2]
    assert len(set(keys)) == n and sorted(row[2 * n:4 * n:2]) == sorted(keys) and keys.min() >= 1 and keys.max() <= rc.NUM_KEYS
    assert values.min() > rc.NUM_KEYS
    table = dict(zip(keys, values))
    for i in np.flatnonzero(m):
      assert row[i] == table[row[i - 1]]
    assert (row[4 * n:] == 0).all()


def test_recurrence_marks_targets_already_seen_in_the_window():
  inputs = np.array([[5, 1, 2, 9]])
  targets = np.array([[1, 2, 5, 1]])               # target t follows inputs[:t + 1]
  np.testing.assert_array_equal(rc.recurrence(inputs, targets), [[False, False, True, True]])
  rare = rc.rare_set(np.array([0] * 1000 + [1] * 2 + [3]), 5)
  np.testing.assert_array_equal(rare, [False, True, False, True, False])


def test_the_report_states_what_its_json_gives():
  """The verdict per variant follows the stored ratios and the 20% line, and the learned-slot
  cache crosses it in every seed; the sentences on the window and on rare copies follow the
  numbers; the learned routing cache recalls nothing (chance); the parameter counts are the
  ones the docs claim."""
  results = report_check.load(report_check.RESULTS / "routing_cache")
  text = (report_check.RESULTS / "routing_cache.md").read_text()
  s = rc.summarize(results)
  assert s == results["summary"]
  for v, r in s.items():
    if v != "softmax":
      assert rc.verdict_line(v, r) in text
      assert r["falsified"] == (r["ratio"] > rc.FALSIFY)
  soft, cache = s["softmax"], s["routing_cache_16"]
  assert cache["falsified"] and rc.seeds_over_line(cache) == len(results["setup"]["seeds"]) >= 3
  assert rc.window_line(s, results["setup"]) in text and rc.rare_copy_line(s) in text
  assert ("in all 3 seeds" in text) == all(
      x < 1.0 for x in s["window_16"]["ratio_per_seed"].values())
  assert ("does not measure copying" in text) == (
      cache["rare_copy"]["recurring"]["accuracy"] >= soft["rare_copy"]["recurring"]["accuracy"])
  for depth in ("0", "0.5", "1"):      # at 600 steps no model copies the needle (measured)
    assert cache["needle"][depth]["accuracy"][2] <= cache["needle_chance"]
  for n in map(str, results["setup"]["lengths"]):  # learned slots: recall at chance
    assert cache["recall"][n][1] <= 1 / rc.NUM_VALUES <= cache["recall"][n][2] + 0.01
  assert s["linear"]["params"] == soft["params"] == s["window_16"]["params"]
  d, layers = 128, results["setup"]["layers"]
  assert soft["params"] - cache["params"] == layers * (2 * d * d - 2 * 16 * d)
  assert s["routing_prefix_16"]["params"] - soft["params"] == layers * 16 * d
