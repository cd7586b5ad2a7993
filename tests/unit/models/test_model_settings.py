"""The typed `model` section (jaxformer/models/settings.py): one frozen object per run with the
family's every field at its resolved default, made from the registry, parsed once by
`run_settings.parse`; the one-line errors of a bad key or value."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import pickle

import pytest
from ml_collections import ConfigDict

from jaxformer import models, run_settings
from jaxformer.scaling import mup
from tests.e2e.test_readme_configs import readme_configs
from tests.repo_root import REPO


def _every_config() -> list[str]:
  """The README table's configs, and every other config of configs/ at its default size (the
  post-training ones need a workdir to start from)."""
  specs = readme_configs()
  seen = {s.partition(":")[0] for s in specs}
  for path in sorted((REPO / "configs").glob("*.py")):
    spec = f"configs/{path.name}"
    if spec not in seen and path.stem not in ("__init__", "common", "sft", "dpo", "grpo"):
      specs.append(spec)
  return specs


def _load(spec: str) -> ConfigDict:
  path, _, arg = spec.partition(":")
  return importlib.import_module(path[:-3].replace("/", ".")).get_config(arg or None)


def _json(value):
  return json.loads(json.dumps(value))


CONFIGS = _every_config()


def test_every_config_parses_to_its_model_with_the_family_defaults():
  families = set()
  for spec in CONFIGS:
    config = _load(spec)
    model = run_settings.parse(config).model
    assert isinstance(model, models.ModelSettings), spec
    assert type(model) is models.settings_class(config.model.family), spec
    full = models.with_defaults(config.model)
    got = model.to_dict()
    if "name" not in full:
      assert got.pop("name") is None, spec
    assert _json(got) == _json(full), spec         # every field, at the resolved default
    assert models.parse_settings(_json(model.to_dict())) == model, spec   # a config.json
    assert models.settings_of(config) == model, spec
    families.add(model.family)
  assert families == set(models.names())          # every registered family has a config


def test_the_fields_are_the_registrys():
  for family in models.names():
    names = [f.name for f in dataclasses.fields(models.settings_class(family))]
    assert names == ["family", "name", *models.config_fields(family)], family


def test_the_settings_are_frozen_hashable_and_a_read_only_mapping():
  config = _load("configs/shakespeare_char.py:tiny")
  model = run_settings.parse(config).model
  with pytest.raises(dataclasses.FrozenInstanceError):
    model.d_model = 8
  with pytest.raises(TypeError):
    model["d_model"] = 8                                        # noqa: the mapping is read-only
  assert hash(model) == hash(models.settings_of(_load("configs/shakespeare_char.py:tiny")))
  assert model["d_model"] == model.d_model == config.model.d_model
  assert model.get("num_classes", "none") == "none" and "vocab_size" in model
  assert dict(model) == model.to_dict() and models.config_as_dict(model) == model.to_dict()
  assert pickle.loads(pickle.dumps(model)) == model == copy.deepcopy(model)
  # what a model config went to takes it: build, the counts, μP's width copy
  assert models.build(model) == models.build(config.model)
  wide = mup.with_width(model, 2 * model.d_model)
  assert isinstance(wide, type(model)) and wide.d_model == 2 * model.d_model
  assert wide.mlp_dim == mup.with_width(config.model, 2 * model.d_model).mlp_dim


def test_values_are_json_data_and_tuples():
  values = _load("configs/shakespeare_char.py:tiny").model.to_dict()
  model = models.parse_settings({**values, "attention_block_sizes": [16, 16],  # config.json's
                                 "norm_eps": 1})       # an int where a float is wanted
  assert model.attention_block_sizes == (16, 16) and model.norm_eps == 1.0
  assert isinstance(model.norm_eps, float) and isinstance(model.dtype, str)


@pytest.mark.parametrize("key, value, message", [
    ("d_modle", 64, "model.d_modle is not a field of the 'decoder' model (did you mean "
                    "model.d_model?)"),
    ("tie_embeddings", "yes", "model.tie_embeddings='yes' must be True or False; set "
                              "--config.model.tie_embeddings=<value>"),
    ("rope_theta", "1e4", "model.rope_theta='1e4' must be a finite number; set "
                          "--config.model.rope_theta=<value>"),
    ("num_heads", 0, "model.num_heads"),                  # the registry's own checks
    ("family", "gpt", "model.family='gpt' is not one of"),
])
def test_a_bad_model_key_or_value_is_one_line_naming_it(key, value, message):
  config = _load("configs/shakespeare_char.py:tiny")
  config.model = ConfigDict({**config.model.to_dict(), key: value})
  with pytest.raises(ValueError) as e:
    run_settings.parse(config)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_a_new_family_gets_its_settings_without_code():
  family = dataclasses.replace(models.get("decoder"), name="decoder_copy")
  models.register(family)
  try:
    values = dict(_load("configs/shakespeare_char.py:tiny").model.to_dict(),
                  family="decoder_copy")
    model = models.parse_settings(values)
    assert type(model).__name__ == "DecoderCopyModelSettings"
    assert model.family == "decoder_copy" and model.d_model == values["d_model"]
  finally:
    models.unregister("decoder_copy")


def test_parse_only_types_the_model_when_asked():
  config = _load("configs/shakespeare_char.py:tiny")
  assert run_settings.parse(config, only=("train",)).model is None
  assert run_settings.parse(config, only=("model",)).model == models.settings_of(config)
  del config.model                                   # a config without a model section
  assert run_settings.parse(config).model is None
