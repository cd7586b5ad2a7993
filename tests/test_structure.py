"""Import rules that keep the package layered: the library below training never imports it,
and inference imports only the train state's shared layer (state, optimizer, checkpoints)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "jaxformer"
# Used by training, never using it: ops -> layers -> models, and inference (restore, decode),
# which may use the part of `train` that defines a run's state and nothing else.
BELOW_TRAIN = ("ops", "layers", "models", "inference")
SHARED = {"inference": ("jaxformer.train.state", "jaxformer.train.optim",
                        "jaxformer.train.checkpoint")}


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


def _modules(package: str):
  for path in sorted((ROOT / package).rglob("*.py")):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    if parts[-1] == "__init__":
      module += ".__init__"          # relative imports resolve from the package itself
    yield path, module


@pytest.mark.parametrize("package", BELOW_TRAIN)
def test_no_module_below_training_imports_it(package):
  offenders = []
  for path, module in _modules(package):
    tree = ast.parse(path.read_text(), filename=str(path))
    allowed = SHARED.get(package, ())
    bad = sorted(n for n in imported_modules(tree, module)
                 if (n == "jaxformer.train" or n.startswith("jaxformer.train."))
                 and not n.startswith(allowed or ("-",)))
    if bad:
      offenders.append(f"{path.relative_to(ROOT.parent)}: {', '.join(bad)}")
  assert list(_modules(package)), f"jaxformer/{package} holds no modules"
  assert not offenders, "imports of jaxformer.train below it:\n" + "\n".join(offenders)


def test_the_rule_catches_every_spelling():
  spellings = ["import jaxformer.train", "from jaxformer.train import loop",
               "from jaxformer import train", "def f():\n  from jaxformer.train.loop import x",
               "from jaxformer.train.checkpoint import Checkpoints as C",
               "importlib.import_module('jaxformer.train.loop')"]
  for source in spellings:
    names = imported_modules(ast.parse(source), "jaxformer.inference.restore")
    assert any(n == "jaxformer.train" or n.startswith("jaxformer.train.") for n in names), source
  mixed = imported_modules(ast.parse("from jaxformer.train import state, loop"), "x")
  assert [n for n in mixed if not n.startswith(SHARED["inference"])] == ["jaxformer.train.loop"]
  relative = imported_modules(ast.parse("from ..train import loop"), "jaxformer.inference.x")
  assert "jaxformer.train.loop" in relative


def test_the_shared_state_layer_imports_nothing_else_from_training():
  for name in SHARED["inference"]:
    path = ROOT.parent.joinpath(*name.split(".")).with_suffix(".py")
    names = imported_modules(ast.parse(path.read_text()), name)
    bad = sorted(n for n in names if n.startswith("jaxformer.train.")
                 and not n.startswith(SHARED["inference"]))
    assert not bad, f"{name} imports {bad}"


def test_importing_inference_loads_no_training_loop():
  code = ("import sys, jaxformer.inference; "
          "print(sorted(m for m in sys.modules if m.startswith('jaxformer.train')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=ROOT.parent).stdout
  loaded = set(eval(out))
  assert loaded <= {"jaxformer.train", *SHARED["inference"]}, loaded
