"""Every config in the README's table trains through the train command line with its defaults
(only shortened: `train.steps`, one eval batch, a short sample; on one device), evaluates
(attention maps included) and samples where its task samples. The configs are read from the
README itself, so a new row is tested by adding it."""

from __future__ import annotations

import importlib
import json
import os
import re

import numpy as np
import pytest

from jaxformer import models
from tests.unit.data.test_data_images import _fake_mnist
from tests.repo_root import REPO

ROOT = str(REPO)
STEPS = 2
SAMPLE_TOKENS = 20        # the default samples' length (80-500) only repeats the decode step
# Rows that cannot train here, and why (their models are counted and sharded in other tests).
NOT_HERE = {"configs/gpt2.py:small": "needs the prepared tfds:lm1b corpus and a GPU",
            # the README's first command, which .ci/run runs with its defaults for 50 steps
            # (its end-of-training sample checked) on every change
            "configs/shakespeare_char.py": "trained by .ci/run"}


def readme_configs() -> list[str]:
  """`configs/x.py[:a]` and `configs/x.py:{a,b}` of the README table's first column."""
  with open(os.path.join(ROOT, "README.md")) as f:
    cells = [line.split("|")[1] for line in f if line.startswith("| `configs/")]
  specs = []
  for cell in cells:
    match = re.fullmatch(r"\s*`(configs/[\w/]+\.py)(\[:(\w+)\]|:\{([\w,]+)\}|:(\w+))?`.*", cell)
    assert match, f"README table cell {cell!r} is not a config spec"
    path, optional, choices, single = match.group(1, 3, 4, 5)
    if optional:
      specs += [path, f"{path}:{optional}"]
    elif choices:
      specs += [f"{path}:{c}" for c in choices.split(",")]
    else:
      specs.append(f"{path}:{single}" if single else path)
  return specs


def _shortening(spec: str) -> list[str]:
  """The overrides that shorten `spec`'s run: its steps, its eval (where it names a number of
  batches) and its sample (where it samples)."""
  path, _, arg = spec.partition(":")
  defaults = importlib.import_module(path[:-3].replace("/", ".")).get_config(arg or None)
  flags = [f"--config.train.steps={STEPS}"]
  if "eval_batches" in defaults.data:
    flags.append("--config.data.eval_batches=1")
  if defaults.train.get("sample_tokens", 0) > SAMPLE_TOKENS:
    flags.append(f"--config.train.sample_tokens={SAMPLE_TOKENS}")
  return flags


def test_the_readme_table_is_read():
  specs = readme_configs()
  assert {"configs/shakespeare_char.py", "configs/bert_mlm_shakespeare.py:tiny",
          "configs/vit_tiny.py:mnist", "configs/seq2seq_synthetic.py:recall",
          "configs/moe_gpt.py:switch"} <= set(specs) and len(specs) >= 14


@pytest.mark.slow
@pytest.mark.parametrize("spec", [s for s in readme_configs() if s not in NOT_HERE])
def test_readme_config_trains_with_its_defaults(spec, tmp_path, monkeypatch, capsys):
  """`python -m jaxformer.train --config=<spec> --config.train.steps=2` (+ one eval batch, a
  20-token sample) on one CPU device, as on the laptop the table is for (the suite's 8
  simulated devices need not divide the default batch sizes, e.g. nanoGPT's 12). In this
  process: the train command's own config flag (`config_flags`, locked, on a fresh
  FlagValues) reads the spec and the overrides, then the loop it calls trains; a subprocess
  per row cost a JAX import each (the command line itself: tests/unit/package/test_cli.py)."""
  from absl import flags
  from ml_collections import config_flags
  from jaxformer.train import loop
  from jaxformer.train.metrics import read
  from tests.runs import on_one_device
  if spec.startswith("configs/vit_tiny.py") and not spec.endswith("digits"):
    _fake_mnist(tmp_path / "mnist", n_train=16, n_test=8, size=(28, 28))
    monkeypatch.setenv("MNIST_DIR", str(tmp_path / "mnist"))
  argv = ["train", f"--config={os.path.join(ROOT, spec)}", *_shortening(spec)]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values(argv)
  on_one_device(monkeypatch)
  run = tmp_path / "run"
  loop.train(values.config, str(run))
  stdout = capsys.readouterr().out
  records = read(run / "metrics.jsonl")
  evals = [r for r in records if "eval_loss" in r]
  assert evals and evals[-1]["step"] == STEPS
  assert (run / "checkpoints" / str(STEPS)).is_dir()
  config = json.loads((run / "config.json").read_text())
  if models.get(config["model"]["family"]).task == "lm" and config["train"]["sample_tokens"]:
    assert f"--- sample after {STEPS} steps ---" in stdout, stdout[-2000:]
  if config["train"]["attention_maps"]:
    assert os.listdir(run / "attention"), "no attention map written"
  if config["model"].get("num_experts"):       # the MoE rows log their router's metrics
    record = [r for r in records if "loss" in r][-1]
    assert len(record["moe_expert_load"]) == config["model"]["num_experts"]
    np.testing.assert_allclose(sum(record["moe_expert_load"]), 1.0, rtol=1e-5)
    assert 0.0 <= record["moe_dropped_fraction"] < 1.0 and record["moe_load_balance_loss"] > 0.5
