"""experiments/tpu_plans.py: every row's recipe is a config the trainer accepts on its slice,
and the committed report is what the script renders from its committed JSON."""

import json

import pytest

from experiments import tpu_plans


def test_every_recipe_is_fsdp_over_the_slice_without_accumulation_and_validates():
  from jaxformer.plan import search
  from jaxformer.train import config_checks
  for row in tpu_plans.ROWS:
    overrides = tpu_plans.recipe(row)
    assert overrides["mesh.data"] * overrides["mesh.replica"] == row.chips
    assert overrides["mesh.fsdp"] and overrides["optim.grad_accum"] == 1
    for extra in tpu_plans.MEMORY_FALLBACKS:
      config = search.with_overrides(tpu_plans.load(row), {**overrides, **extra})
      settings = config_checks.validate(config)
      assert settings.train.batch_size == row.per_chip_batch * row.chips, row.label


def test_the_committed_report_is_rendered_from_its_json():
  results = json.loads((tpu_plans.RESULTS / "tpu_plans.json").read_text())
  before = json.loads((tpu_plans.RESULTS / "tpu_plans_before.json").read_text())
  assert (tpu_plans.RESULTS / "tpu_plans.md").read_text() == tpu_plans.render(results, before)
  assert set(results) <= {tpu_plans.row_key(r) for r in tpu_plans.ROWS}


def test_maxtext_calibration_report_is_rendered_from_its_json():
  from experiments import maxtext_calibration as cal
  results = json.loads((cal.RESULTS / "maxtext_calibration.json").read_text())
  assert (cal.RESULTS / "maxtext_calibration.md").read_text() == cal.render(results)
  assert set(results) == {run.name for run in cal.RUNS}
  for run in cal.RUNS:          # ours: the committed tpu_plans row, as the calibration read it
    assert results[run.name]["ours_estimated_step_seconds"] == cal.ours(run)


@pytest.mark.slow
def test_maxtext_calibration_is_the_planner_on_the_committed_hlo():
  """The committed figures re-derive from MaxText's committed HLO (~10 s of parsing); the
  measured step is the published tokens/s's."""
  from experiments import maxtext_calibration as cal
  results = json.loads((cal.RESULTS / "maxtext_calibration.json").read_text())
  for run in cal.RUNS:
    again = cal.estimate(run)
    for key, value in again.items():
      assert value == pytest.approx(results[run.name][key], rel=1e-9), key
    assert again["measured_step_seconds"] == pytest.approx(
        run.per_chip_batch * run.seq_len / again["published_tokens_per_s_per_chip"])
    assert again["device_bytes"] <= again["hbm_bytes"]
