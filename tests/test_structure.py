"""The package's layering, enforced: every jaxformer module imports only from its own package
and from the layers below it (docs/design/structure.md; README, "Layout"), so the package
graph has no cycles and no exceptions."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "jaxformer"
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
    ("train",),                               # the training loop (samples through inference)
    ("sample", "sweep", "plan", "export"),    # entry points over train and inference; plan:
                                              # compile-only devices, HLO analysis, estimate,
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
