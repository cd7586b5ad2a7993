"""Every config in the README's table trains through the train command line with its defaults
(only shortened: `train.steps`, one eval batch, a short sample; on one device), evaluates
(attention maps included) and samples where its task samples. The configs are read from the
README itself, so a new row is tested by adding it."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from jaxformer import models
from tests.test_data_images import _fake_mnist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2
SAMPLE_TOKENS = 20        # the default samples' length (80-500) only repeats the decode step
# Rows that cannot train here, and why (their models are counted and sharded in other tests).
NOT_HERE = {"configs/gpt2.py:small": "needs the prepared tfds:lm1b corpus and a GPU"}


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
def test_readme_config_trains_with_its_defaults(spec, tmp_path):
  """`python -m jaxformer.train --config=<spec> --config.train.steps=2` (+ one eval batch, a
  20-token sample) on one CPU device, as on the laptop the table is for (the suite's 8
  simulated devices need not divide the default batch sizes, e.g. nanoGPT's 12)."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                            env.get("XLA_FLAGS", ""))
  if spec.startswith("configs/vit_tiny.py") and not spec.endswith("digits"):
    _fake_mnist(tmp_path / "mnist", n_train=16, n_test=8, size=(28, 28))
    env["MNIST_DIR"] = str(tmp_path / "mnist")
  run = tmp_path / "run"
  result = subprocess.run([sys.executable, "-m", "jaxformer.train", f"--config={spec}",
                           f"--workdir={run}", *_shortening(spec)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  from jaxformer.train.metrics import read
  evals = [r for r in read(run / "metrics.jsonl") if "eval_loss" in r]
  assert evals and evals[-1]["step"] == STEPS
  assert (run / "checkpoints" / str(STEPS)).is_dir()
  config = json.loads((run / "config.json").read_text())
  if models.get(config["model"]["family"]).task == "lm" and config["train"]["sample_tokens"]:
    assert f"--- sample after {STEPS} steps ---" in result.stdout, result.stdout[-2000:]
  if config["train"]["attention_maps"]:
    assert os.listdir(run / "attention"), "no attention map written"
