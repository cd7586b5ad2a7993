"""Each kind of data source's typed settings (`jaxformer.data.settings`): the task names its
kind, `validate` parses the data section with it once and refuses a key the kind does not
name (through the train command too: exit 2, one line, nothing written), the typed object is
what the pipelines read, a saved config.json still loads, and docs/data.md's tables are the
registry's."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import re

import pytest
from ml_collections import ConfigDict

import configs
from jaxformer import cli, run_settings, tasks
from jaxformer.data import settings as source_settings
from tests.repo_root import REPO

ROOT = REPO
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")


def _load(module: str, arg: str | None = None) -> ConfigDict:
  """configs/<module>.py:<arg> (any config file, not only those with published sizes)."""
  return importlib.import_module(f"configs.{module}").get_config(arg)


def _posttrain_config():
  cfg = _load("shakespeare_char")
  cfg.posttrain = ConfigDict({"method": "sft", "init_from": "/no/such/run"})
  cfg.data.source = "/no/such/train.jsonl"
  return cfg


# (config, the task's source kind, a typo'd key, the key it should have been)
KINDS = {
    "text": (lambda: _load("shakespeare_char"), "paking", "packing"),
    "masked_text": (lambda: _load("bert_mlm_shakespeare"), "mask_ratio",
                    "mask_rate"),
    "span_corruption": (lambda: configs.get_config("t5", "tiny"), "noise_densty",
                        "noise_density"),
    "denoising": (lambda: configs.get_config("bart", "tiny"), "mask_rate", "mask_ratio"),
    "images": (lambda: configs.get_config("vit", "tiny"), "augmentation", "augment"),
    "captions": (lambda: _load("captioning"), "grids", "grid"),
    "synthetic": (lambda: _load("seq2seq_synthetic"), "max_length",
                  "max_len"),
    "posttrain_records": (_posttrain_config, "eval_sorce", "eval_source"),
}


def test_every_registered_kind_is_tested_and_named_by_a_task():
  assert set(source_settings.kinds()) - {"shared"} == set(KINDS)
  named = {tasks.get(name).data_kind for name in tasks.names()}
  assert named == set(KINDS), named


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_validate_parses_the_kind_once_and_refuses_a_typo_by_name(kind):
  from jaxformer.train import config_checks
  make, typo, meant = KINDS[kind]
  cfg = make()
  settings = config_checks.validate(cfg)
  task = tasks.task_for_run(cfg, settings)
  assert task.data_kind == kind
  assert type(settings.data) is source_settings.get(kind).settings
  assert task.data_settings(cfg, settings) is settings.data     # what the pipeline reads
  cfg.data[typo] = 0
  with pytest.raises(ValueError) as info:
    config_checks.validate(cfg)
  message = str(info.value)
  assert message.startswith(f"data.{typo} is not a ")
  assert f"did you mean data.{meant}?" in message and f"'{meant}'" in message
  assert "\n" not in message


def test_the_train_command_refuses_a_typo_in_one_line_writing_nothing(tmp_path, capsys):
  """In-process, the path of `python -m jaxformer.train`'s main (as test_cli's range errors)."""
  from jaxformer.train import loop
  cfg = _load("bert_mlm_shakespeare")
  cfg.data.mask_ratio = 0.3                # a typo of mask_rate: silently ignored before
  with pytest.raises(SystemExit) as exit_info:
    cli.user_errors(loop.train)(cfg, str(tmp_path / "run"))
  assert exit_info.value.code == cli.EXIT_USER_ERROR
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      "error: data.mask_ratio is not a masked-text data setting (did you mean "
      "data.mask_rate?); the settings are ["), lines
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind, key, value, message", [
    ("masked_text", "mask_rate", 0, "data.mask_rate=0.0 must be a number in (0, 1]"),
    ("text", "packing", "packd", "data.packing='packd' must be one of 'stream', 'packed'"),
    ("images", "shift_pixels", -1, "data.shift_pixels=-1 must be an int >= 0"),
    ("images", "image_size", (8, 8, 8), "data.image_size=(8, 8, 8) must be an int or (height"),
    ("synthetic", "num_train", 2.5, "data.num_train=2.5 must be an int >= 1"),
    ("denoising", "permute_sentences", 1, "data.permute_sentences=1 must be a bool"),
    ("posttrain_records", "train_fraction", 1, "data.train_fraction=1.0 must be a number in"),
])
def test_a_bad_value_names_the_key_and_the_flag(kind, key, value, message):
  with pytest.raises(ValueError, match=re.escape(message) + ".*; set --config.data." + key):
    source_settings.parse(kind, {"source": "tinyshakespeare", key: value})


def test_checks_across_keys_and_renamed_keys():
  with pytest.raises(ValueError, match=r"data.packing='packed' is for task 'lm'; masked LM"):
    source_settings.parse("masked_text", {"source": "x", "packing": "packed"})
  with pytest.raises(ValueError, match=r"data.text_key is now data.text_field; rename it"):
    source_settings.parse("text", {"source": "x", "text_key": "body"})
  captions = source_settings.parse("captions", {"source": "digits"})
  assert captions.digit_size == 8 and captions.image_size == 30   # resolved from the source
  # a source's own key left None (an unset placeholder) takes its default
  assert source_settings.parse("synthetic", {"source": "synthetic:copy",
                                             "max_len": None}).max_len == 16


def test_a_saved_config_loads_with_keys_this_version_does_not_know():
  """config.json of an older run: a key since dropped (or a typo the run ignored too) is
  ignored when read back; every key this version knows is still checked."""
  saved = configs.get_config("bert", "tiny").to_dict()
  saved["data"]["mask_prob"] = 0.15             # what configs/bert.py held before it was fixed
  saved["data"]["text_key"] = "text"            # renamed to text_field
  data = source_settings.parse("masked_text", saved, strict=False)
  assert data.mask_rate == 0.15 and data.text_field == "text"
  with pytest.raises(ValueError, match="data.mask_prob is not a masked-text data setting"):
    source_settings.parse("masked_text", {k: v for k, v in saved["data"].items()
                                          if k != "text_key"})
  # and the shared settings every command reads stay lenient about a source's own keys
  assert run_settings.parse(saved).data.source == "tinyshakespeare"


def test_every_shipped_config_parses_with_its_tasks_kind():
  """Every config file (sft / dpo / grpo need a trained run: their kind is tested above), every
  named size or variant."""
  files = sorted(p.stem for p in (ROOT / "configs").glob("*.py")
                 if p.stem not in ("__init__", "common", "sft", "dpo", "grpo"))
  assert "shakespeare_char" in files and "transformer" in files
  for module in files:
    loaded = importlib.import_module(f"configs.{module}")
    table = next((getattr(loaded, t) for t in ("SIZES", "TASKS", "MODELS")
                  if isinstance(getattr(loaded, t, None), dict)), {None: None})
    for name in table:
      cfg = loaded.get_config(name)
      settings = run_settings.parse(cfg)
      kind = tasks.task_for_run(cfg, settings).data_kind
      source_settings.parse(kind, cfg)         # strict: no key the kind does not name


def test_a_new_kind_is_one_dataclass_and_one_registration():
  @dataclasses.dataclass(frozen=True)
  class Toy(run_settings.DataSettings):
    """A toy source."""
    width: int = run_settings._int(1, 4, doc="how wide")
  source_settings.register("toy", Toy)
  try:
    assert source_settings.parse("toy", {"source": "x", "width": 2}).width == 2
    with pytest.raises(ValueError, match=r"data.widht is not a toy data setting \(did you mean "
                       r"data.width\?\)"):
      source_settings.parse("toy", {"source": "x", "widht": 2})
    assert "| `width` | `int` | `4` | an int >= 1 | how wide |" in source_settings.table("toy")
    with pytest.raises(ValueError, match="already registered"):
      source_settings.register("toy", Toy)
  finally:
    source_settings.unregister("toy")


def test_the_docs_tables_are_the_registrys():
  used = {}
  for name in tasks.names():
    used.setdefault(tasks.get(name).data_kind, []).append(name)
  text = (ROOT / "docs" / "data.md").read_text()
  begin = text.index("<!-- data settings tables: generated")
  begin = text.index("\n", begin) + 1
  end = text.index("<!-- end of data settings tables -->")
  assert text[begin:end].strip() == source_settings.tables(used).strip(), (
      "docs/data.md's tables differ from the registry: paste jaxformer.data.settings.tables()")
