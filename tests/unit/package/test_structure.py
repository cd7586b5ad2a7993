"""The package's layering, enforced: every jaxformer module imports only from its own package
and from the layers below it (docs/design/structure.md; README, "Layout"), so the package
graph has no cycles and no exceptions."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
from tests.repo_root import REPO

ROOT = REPO / "jaxformer"
# Lowest first. A unit is a sub-package or a top-level module of jaxformer; it may import units
# of lower layers only (units of one layer do not import each other).
LAYERS = (
    ("workdir_layout", "run_settings", "paths", "jsonfile", "extras",    # no jaxformer imports
     "tpu_flags", "accelerators"),            # accelerators: chip and GPU peak figures
    ("console",),                             # what reaches the terminal
    ("compilation",),                         # the compilation cache and compiler options
    ("cli",),                                 # the one error policy of the command lines
    ("ops",),                                 # pure functions
    ("parallel",),                            # meshes, logical axis rules, sharding plans
    ("layers",),                              # linen modules
    ("models",),                              # families, the registry, parameter counting
    ("data",),                                # sources, tokenizers, pipelines
    ("state",),                               # train-state layout, optimizer, checkpoints
    ("inference", "scaling", "convert"),      # restore + decode; studies; Hugging Face
    ("posttrain",),                           # SFT / DPO data, DPO's loss, initialization
    ("tasks",),                               # one module per task + the task registry
    ("evaluate",),                            # checkpoint evaluation (train.evaluators runs it)
    ("train",),                               # the training loop (samples through inference)
    ("sample", "sweep", "plan", "export",     # entry points over train and inference; plan:
     "predict", "serve"),                     # compile-only devices, HLO analysis, estimate,
                                              # search
)
LEVEL = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def imported_modules(tree: ast.AST, module: str) -> set[str]:
  """Every module an `import`, `from ... import` or `importlib.import_module("...")` names,
  anywhere in the file (lazy imports inside functions included); relative imports resolved
  against `module`."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parent = module.split(".")[:-node.level]
        base = ".".join(parent + ([base] if base else []))
      # each name as base.name: `from jaxformer import train` -> jaxformer.train; a name that
      # is not a module (a function) still lies under its module's prefix
      names.update(f"{base}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
      func = node.func                  # importlib.import_module("..."), __import__("...")
      name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
      if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
        names.add(node.args[0].value)
  return names


def unit_of(name: str) -> str | None:
  """The layering unit of a dotted jaxformer name (None outside jaxformer or for the package
  itself)."""
  parts = name.split(".")
  return parts[1] if parts[0] == "jaxformer" and len(parts) > 1 else None


def _modules():
  for path in sorted(ROOT.rglob("*.py")):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    if parts[-1] == "__init__":
      module += ".__init__"          # relative imports resolve from the package itself
    yield path, module


def layering_violations(source: str, module: str) -> list[str]:
  """The imports of `source` (the text of `module`) that reach a unit not below its own."""
  own = unit_of(module)
  bad = []
  for name in sorted(imported_modules(ast.parse(source), module)):
    unit = unit_of(name)
    if unit is None or unit == own or unit == "__init__":
      continue
    if unit not in LEVEL or LEVEL[unit] >= LEVEL[own]:
      bad.append(name)
  return bad


def test_every_unit_has_a_layer():
  units = {unit_of(module) for _, module in _modules()} - {"__init__"}
  assert units == set(LEVEL), f"units without a layer: {sorted(units - set(LEVEL))}; " \
      f"layers naming nothing: {sorted(set(LEVEL) - units)}"


def test_every_module_imports_only_from_below():
  offenders = []
  for path, module in _modules():
    if unit_of(module) == "__init__":
      continue
    bad = layering_violations(path.read_text(), module)
    if bad:
      offenders.append(f"{path.relative_to(ROOT.parent)}: {', '.join(bad)}")
  assert not offenders, "imports of a unit not below the importer:\n" + "\n".join(offenders)


def test_the_package_root_imports_no_unit():
  """`import jaxformer` stays cheap: the root package imports none of its units."""
  names = imported_modules(ast.parse((ROOT / "__init__.py").read_text()), "jaxformer.__init__")
  assert not [n for n in names if unit_of(n) not in (None, "__init__")], names


@pytest.mark.parametrize("source", [
    "import jaxformer.train", "from jaxformer.train import loop", "from jaxformer import train",
    "def f():\n  from jaxformer.train.loop import x",
    "from jaxformer.train.run_builder import Run as R", "importlib.import_module('jaxformer.train')",
    "from ..train import loop", "from jaxformer import sweep", "from jaxformer import scaling",
])
def test_the_rule_catches_every_spelling(source):
  assert layering_violations(source, "jaxformer.inference.restore"), source


def test_the_rule_allows_own_package_and_lower_layers():
  ok = ("from jaxformer.inference import decode\nfrom . import text\n"
        "from jaxformer.state import checkpoint\nfrom jaxformer import models, workdir_layout\n"
        "import jaxformer")
  assert layering_violations(ok, "jaxformer.inference.restore") == []
  # a unit that no layer names is refused, so a new package gets a place in LAYERS
  assert layering_violations("from jaxformer import newthing", "jaxformer.train.loop")


def test_importing_inference_loads_no_training_module():
  code = ("import sys, jaxformer.inference; "
          "print(sorted(m for m in sys.modules if m.startswith('jaxformer.train')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=ROOT.parent).stdout
  assert eval(out) == [], out


# --- one typed configuration -----------------------------------------------------------------
# The `train`, `optim`, `mesh`, `posttrain` and `model` sections and every `data` key (the
# shared ones and each source's own) are read through the typed settings (`run_settings.parse`,
# the source kind's `jaxformer.data.settings`, which `train.config_checks.validate` returns,
# and the family's `jaxformer.models.settings`: `settings.model`, or `models.settings_of(config)`
# where only a config is at hand); a raw read of them from a config is allowed only in the
# settings layer itself. The `data` section handed whole (to the parser) is not a read of a
# key; the `model` section is not even handed whole (`models.build(settings.model)`).
TYPED_SECTIONS = ("train", "optim", "mesh", "posttrain", "model")
SETTINGS_LAYER = ("jaxformer/run_settings.py", "jaxformer/data/settings.py",
                  "jaxformer/models/settings.py")     # the model section's parser
# what names a config: `config`, `cfg`, `self.config`, `point.config`, `src_config`, ...
_CONFIG_NAMES = ("config", "cfg", "conf")
# what names a data section itself: `data_config`, `data_cfg` (any key read from it is raw)
_DATA_SECTION_NAMES = ("data_config", "data_cfg")


def _names_a_config(node: ast.AST) -> bool:
  name = node.id if isinstance(node, ast.Name) else (
      node.attr if isinstance(node, ast.Attribute) else None)
  return name is not None and (name in _CONFIG_NAMES or name.endswith(("_config", "_cfg")))


def _names_a_data_section(node: ast.AST) -> bool:
  name = node.id if isinstance(node, ast.Name) else (
      node.attr if isinstance(node, ast.Attribute) else None)
  return name in _DATA_SECTION_NAMES


def _section_read(node: ast.AST) -> str | None:
  """The section `node` reads from a config (`config.train`, `config.get("train")`,
  `config["train"]`, `getattr(config, "train")`), or None."""
  if _names_a_data_section(node):
    return "data"                  # `data_config` is the section: `data_config.packing` a key
  if isinstance(node, ast.Attribute) and _names_a_config(node.value):
    return node.attr
  if isinstance(node, ast.Subscript) and _names_a_config(node.value) and isinstance(
      node.slice, ast.Constant) and isinstance(node.slice.value, str):
    return node.slice.value
  if isinstance(node, ast.Call) and node.args and isinstance(node.args[0 if isinstance(
      node.func, ast.Attribute) else -1], ast.Constant):
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "get" and _names_a_config(func.value):
      key = node.args[0].value
      return key if isinstance(key, str) else None
    if (isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2
        and _names_a_config(node.args[0]) and isinstance(node.args[1], ast.Constant)):
      return node.args[1].value if isinstance(node.args[1].value, str) else None
  return None


def _key_read(node: ast.AST, section_node: ast.AST) -> str | None:
  """The key `node` reads from the section `section_node` (`.key`, `.get("key")`, `["key"]`)."""
  if isinstance(node, ast.Attribute) and node.value is section_node:
    return node.attr
  if (isinstance(node, ast.Subscript) and node.value is section_node
      and isinstance(node.slice, ast.Constant)):
    return node.slice.value
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
      and node.func.value is section_node and node.func.attr == "get" and node.args
      and isinstance(node.args[0], ast.Constant)):
    return node.args[0].value
  return None


def raw_setting_reads(source: str) -> list[tuple[int, str]]:
  """(line, what) of each raw read of a typed section (or of any data key) from a config in
  `source`. Assignments (`cfg.train.steps = 3`: a config built or overridden) are not reads."""
  tree = ast.parse(source)
  parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
  found = []
  for node in ast.walk(tree):
    section = _section_read(node)
    if section in TYPED_SECTIONS:
      parent = parents.get(node)
      if isinstance(getattr(parent, "ctx", None), ast.Store) or isinstance(
          getattr(node, "ctx", None), ast.Store):
        continue
      found.append((node.lineno, f"{section} section"))
    elif section == "data":
      parent = parents.get(node)
      if isinstance(parent, ast.Attribute) and parent.attr == "get":
        parent = parents.get(parent)           # config.data.get("seq_len"): the Call
      key = _key_read(parent, node) if parent is not None else None
      if isinstance(key, str) and not isinstance(getattr(parent, "ctx", None), ast.Store):
        found.append((node.lineno, f"data.{key}"))
  return sorted(found)


def test_typed_sections_are_read_only_through_the_settings():
  offenders = []
  for path, _ in _modules():
    rel = str(path.relative_to(ROOT.parent))
    if rel in SETTINGS_LAYER:
      continue
    offenders += [f"{rel}:{line}: {what}" for line, what in raw_setting_reads(path.read_text())]
  assert not offenders, ("raw reads of a typed config section (read it from the settings "
                         "`run_settings.parse` / `config_checks.validate` returns):\n"
                         + "\n".join(offenders))


@pytest.mark.parametrize("source", [
    "x = config.train.steps", "x = cfg.optim.lr", "plan(config.mesh)", "self.config.train.seed",
    "x = point.config.data.seq_len", "config.data.get('source')", "config.get('posttrain')",
    "config['optim']['lr']", "getattr(config, 'mesh')", "src_config.train.batch_size",
    "x = config.data['tokenizer']",
    # a source's own keys too, from a config or from the data section itself
    "mode = config.data.get('packing')", "cfg.data.mask_rate", "config.data['augment']",
    "data_config.get('eval_source')", "data_config.noise_density", "data_config['image_key']",
    "self.data_config.get('num_train')",
    # the model section, whole or a key of it
    "models.build(config.model)", "config.model.get('family')", "x = cfg.model.vocab_size",
    "generate(self.config.model, params, tokens)", "models.with_defaults(run.config.model)",
    "config['model']['d_model']",
])
def test_the_settings_rule_catches_every_spelling(source):
  assert raw_setting_reads(source), source


def test_the_settings_rule_allows_the_section_handed_whole_and_writes():
  ok = ("parse('text', config.data)\nsource_settings.parse(kind, config)\n"
        "cfg.train.steps = 3\nsettings.train.steps\nsettings.model.d_model\n"
        "cfg.model = with_width(settings.model, 64)\ncfg.model.d_model = 64\n"
        "models.settings_of(config).family\nmesh.model\n"
        "cfg.data.seq_len = 8\nsettings.data.packing\ndata.mask_rate\n"
        "coerce('images', data_config)\n")
  assert raw_setting_reads(ok) == []
