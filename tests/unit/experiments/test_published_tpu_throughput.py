"""experiments/published_tpu_throughput.py: the records are well formed, name our configs, and
the numbers that two sources give for the same run agree."""

import dataclasses
import re

import pytest

import configs
from experiments import published_tpu_throughput as pub


def test_records_are_well_formed():
  assert len(pub.RUNS) >= 20
  for r in pub.RUNS:
    assert r.chip in pub.PEAK_BF16_TFLOPS and r.chips > 0
    assert r.metric in pub.METRICS and r.value > 0
    assert r.precision in ("bf16", "int8")
    assert r.seq_len is None or r.seq_len in (2048, 4096, 8192)
    assert r.per_chip_batch is None or r.per_chip_batch > 0
    assert re.fullmatch(r"github:AI-Hypercomputer/[\w-]+@[0-9a-f]{40}:\S+\.md", r.source)
    if r.metric == "mfu":
      assert 0 < r.value < 1
    else:
      assert r.value > 1
  with pytest.raises(dataclasses.FrozenInstanceError):
    pub.RUNS[0].value = 1.0
  # No run is recorded twice with the same metric.
  keys = [(r.model, r.chip, r.chips, r.per_chip_batch, r.metric, r.source) for r in pub.RUNS]
  assert len(keys) == len(set(keys))


def test_every_model_names_one_of_our_configs():
  assert {r.model for r in pub.RUNS} == set(pub.CONFIGS)
  for spec, _ in pub.CONFIGS.values():
    module, name = spec.split(".py:")
    assert configs.get_config(module, name).reference.params > 0


def _one(model, chip, chips, metric, *source_parts):
  found = [r for r in pub.runs(model, chip, metric) if r.chips == chips
           and all(part in r.source for part in source_parts)]
  assert len(found) == 1, (model, chip, chips, metric, found)
  return found[0].value


@pytest.mark.parametrize("model,chips,recipe", [
    ("Llama 2 70B", 256, "Llama2-70B-MaxText/README.md"),
    ("Llama 3.1 70B", 256, "Llama3.1-70B-MaxText/v6e-256/"),
    ("Llama 3.1 8B", 256, "Llama3.1-8B-MaxText/v6e-256/")])
def test_tiering_table_agrees_with_the_recipe_logs(model, chips, recipe):
  """MaxText's tiering MFU / tokens are the recipe's log line over the v6e peak (918)."""
  recipes = "tpu-recipes@c8cfe2f6"             # today's recipes (not the 2024 version)
  tflops = _one(model, "v6e", chips, "tflops_per_chip", recipes, recipe)
  tokens = _one(model, "v6e", chips, "tokens_per_s_per_chip", recipes, recipe)
  mfu = _one(model, "v6e", chips, "mfu", "tiering.md")
  assert tflops / pub.PEAK_BF16_TFLOPS["v6e"] == pytest.approx(mfu, abs=0.001)
  assert _one(model, "v6e", chips, "tokens_per_s_per_chip", "tiering.md") == \
      pytest.approx(tokens, rel=0.01)


def test_mixtral_v5p_mfu_is_its_tflops_over_the_peak():
  source = "Run_Mixtral.md"
  tflops = _one("Mixtral 8X7B", "v5p", 64, "tflops_per_chip", source)
  assert tflops / pub.PEAK_BF16_TFLOPS["v5p"] == pytest.approx(
      _one("Mixtral 8X7B", "v5p", 64, "mfu", source), abs=1e-4)


def test_table_has_a_row_per_record():
  lines = pub.table().splitlines()
  assert len(lines) == 2 + len(pub.RUNS)
  assert "| 43.80% |" in "\n".join(lines) and "llama.py:llama2-70b" in lines[2]
