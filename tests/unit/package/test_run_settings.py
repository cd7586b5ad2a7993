"""The typed run settings: one place for every train/optim/data/mesh key, its default and its
range; the configs are written from them and no module repeats a default."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest
from ml_collections import ConfigDict

from configs import common, shakespeare_char
from jaxformer import run_settings
from tests.repo_root import REPO

ROOT = REPO


def test_the_configs_hold_every_key_at_the_settings_default():
  cfg = shakespeare_char.get_config("tiny")
  for section, kind in run_settings.SECTIONS.items():
    assert set(f.name for f in dataclasses.fields(kind)) <= set(cfg[section].keys()), section
  settings = run_settings.parse(cfg)
  assert settings.train.keep_best == run_settings.TrainSettings.keep_best == 1
  assert settings.optim.eps == 1e-8 and settings.optim.decay_steps is None
  assert settings.data.eval_batches == cfg.data.eval_batches
  assert settings.mesh == run_settings.MeshSettings()


def test_a_saved_config_without_newer_keys_reads_at_their_defaults():
  """config.json of a run saved before a key existed: the key takes its default."""
  saved = shakespeare_char.get_config("tiny").to_dict()
  del saved["train"]["sample_every"], saved["optim"]["eps"], saved["mesh"]
  settings = run_settings.parse(saved)
  assert settings.train.sample_every == 0 and settings.optim.eps == 1e-8
  assert settings.mesh.data == -1


@pytest.mark.parametrize("section, key, value, message", [
    ("train", "steps", 0, "train.steps=0 must be an int >= 1; set --config.train.steps"),
    ("train", "steps", True, "train.steps=True must be an int >= 1"),
    ("train", "keep_best", -1, "train.keep_best=-1 must be an int >= 0 (0: off)"),
    ("train", "keep_checkpoint_every", -1,
     "train.keep_checkpoint_every=-1 must be an int >= 0 (0: off)"),
    ("train", "best_metric", "loss", "train.best_metric='loss' must be one of 'eval_loss', "
     "'eval_accuracy'"),
    ("train", "label_smoothing", 1.0, "train.label_smoothing=1.0 must be a number in [0, 1)"),
    ("train", "attention_maps", "yes", "train.attention_maps='yes' must be a bool"),
    ("optim", "lr", float("nan"), "optim.lr=nan must be a finite number > 0"),
    ("optim", "schedule", "step", "optim.schedule='step' must be one of 'cosine'"),
    ("optim", "name", "sgd", "optim.name='sgd' must be one of 'adamw'"),
    ("optim", "decay_steps", 0, "optim.decay_steps=0 must be an int >= 1"),
    ("data", "source", "", "data.source='' must be a dataset name"),
    ("data", "seq_len", 0, "data.seq_len=0 must be an int >= 1"),
    ("mesh", "model", 0, "mesh.model=0 must be an int >= 1, or -1 for the remaining devices"),
    ("mesh", "fsdp", 1, "mesh.fsdp=1 must be a bool"),
])
def test_a_bad_value_names_the_field_and_the_flag(section, key, value, message):
  cfg = shakespeare_char.get_config("tiny").to_dict()
  cfg[section][key] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    run_settings.parse(cfg)


def test_unknown_keys_are_refused_except_a_data_sources_own():
  cfg = shakespeare_char.get_config("tiny").to_dict()
  cfg["data"]["packing"] = "packed"                       # the text pipeline's own key
  assert run_settings.parse(cfg).data.source == "tinyshakespeare"
  cfg["train"]["stepz"] = 3
  with pytest.raises(ValueError, match=r"train.stepz is not a train setting"):
    run_settings.parse(cfg)
  with pytest.raises(ValueError, match=r"optim.lr is required"):
    run_settings.parse_section("optim", {})
  with pytest.raises(ValueError, match=r"train.stepz is not a train setting"):
    common.train(10, 2, stepz=3)


def test_numbers_stay_floats_and_unset_optionals_stay_settable():
  """optim(lr=1) is 1.0 (so --config.optim.lr=0.5 parses); an unset optional key is a typed
  placeholder (so --config.train.eval_batch_size=8 parses)."""
  optim, train = common.optim(1, weight_decay=0), common.train(10, 2)
  assert isinstance(optim.lr, float) and isinstance(optim.weight_decay, float)
  assert run_settings.parse_section("optim", {"lr": 1}).lr == 1.0
  train.eval_batch_size = 8                     # a placeholder(int) takes an int
  with pytest.raises(TypeError):
    train.eval_batch_size = "eight"
  assert isinstance(common.data("tinyshakespeare", "char", 8), ConfigDict)


# `.get("<key>", <default>)` for a settings key outside run_settings.py would be a second default.
_FALLBACK = re.compile(r"""\.get\(\s*["']([a-z_]+)["']\s*,""")


def test_no_module_repeats_a_settings_default():
  keys = {f.name for kind in (run_settings.TrainSettings, run_settings.OptimSettings,
                              run_settings.MeshSettings) for f in dataclasses.fields(kind)}
  keys |= {"data_dir", "eval_batches", "seq_len", "tokenizer"}
  keys -= {"data", "model"}          # mesh axes named like config sections (`saved.get("model")`)
  offenders = []
  for path in sorted((ROOT / "jaxformer").rglob("*.py")):
    if path.name == "run_settings.py" or "convert" in path.parts:   # HF configs are not ours
      continue
    for number, line in enumerate(path.read_text().splitlines(), 1):
      offenders += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                    for key in _FALLBACK.findall(line) if key in keys]
  assert not offenders, "defaults repeated outside run_settings.py:\n" + "\n".join(offenders)


def test_log_every_left_unset_follows_train_steps_and_a_given_value_wins():
  """20 to 50 train lines a run, at a round cadence, whatever train.steps is overridden to."""
  every = run_settings.default_log_every
  assert [every(s) for s in (1, 39, 40, 60, 100, 200, 2000, 3000, 600_000)] == [
      1, 1, 2, 2, 5, 10, 100, 100, 20_000]
  for steps in range(1, 3000, 7):
    lines = -(-steps // every(steps))          # multiples of it, and the last step
    assert min(steps, 20) <= lines <= 50, steps
    assert str(every(steps)).rstrip("0") in ("1", "2", "5")
  cfg = shakespeare_char.get_config("tiny")
  assert cfg.train.log_every is None
  cfg.train.steps = 200
  assert run_settings.parse(cfg).train.log_every == 10      # was 3: 67 lines
  cfg.train.log_every = 7
  assert run_settings.parse(cfg).train.log_every == 7
  assert run_settings.parse(shakespeare_char.get_config()).train.log_every == 100   # README's
