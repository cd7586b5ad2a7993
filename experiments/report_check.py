"""The plumbing every committed scaling report shares: a study script's report is a pure
function of its JSON, so a report can be regenerated without retraining and a test can tell
when a committed report no longer matches the code.

A study script `experiments/<name>.py` that commits experiments/results/<name>.{md,json,png}
provides
  render(results: dict) -> str      the markdown, from the JSON alone
  refit(results: dict) -> dict      {fit key: {param: value} or None}: the fits' point
                                    estimates recomputed from the JSON's raw points (samples=0)
  plot(results: dict, path: str)    optional: the figure, from the JSON alone
and a `--report_only` flag that calls `report_only(OUT, render, plot)`.

The stored estimates `refit` is compared with are the module's `stored(results)` when it has
one (same shape as refit's), else `stored_estimates(results)`: every
results["fits"][key]["fit"]["params"] (None for a fit that failed), or results["fit"]["params"]
as key "fit". tests/unit/experiments/test_reports.py runs `check(name)` for every committed report.
"""

from __future__ import annotations

import importlib
import json
import math
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "experiments" / "results"
# How close a refit must come to the stored estimate. A fit is determined only to its
# optimizer's stopping point, and a CPU whose float64 rounding differs (BLAS kernels, FMA, SIMD
# math) stops elsewhere: scipy's least_squares (jaxformer/scaling/laws.py) stops once the cost
# falls by less than ftol = 1e-8 of itself, and a cost quadratic near its minimum pins a
# well-scaled parameter (x_scale="jac") to about sqrt(ftol) = 1e-4 of its scale. Measured:
# refits at 1e-15 move the reports' estimates by <= 1.6e-6 (scaling_vit's floor c), other CPUs
# by 1.4e-6 (a Zen 5 with AVX-512; OpenBLAS's Sandy Bridge kernels). A change that moves an
# estimate by more than 1e-4 of itself (about the last digit the reports print) still fails.
RTOL = 1e-4


def paths(prefix) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
  """(OUT.md, OUT.json, OUT.png) of an output prefix."""
  prefix = pathlib.Path(prefix)
  return tuple(prefix.with_name(prefix.name + ext) for ext in (".md", ".json", ".png"))


def load(prefix) -> dict:
  """OUT.json, or a ValueError naming the path and how to make it."""
  _, json_path, _ = paths(prefix)
  if not json_path.is_file():
    raise ValueError(f"--out={prefix}: no {json_path.name} there; run the study without "
                     "--report_only first (it writes OUT.json)")
  return json.loads(json_path.read_text())


def write(prefix, results: dict, render, plot=None, *, write_json: bool = True) -> str:
  """Write OUT.json (unless `write_json` is False), OUT.md = render(results) and, with `plot`,
  OUT.png; returns the markdown. The JSON goes through `json.dumps` first and the report is
  rendered from what it reads back, so a report never shows what its JSON does not hold."""
  md_path, json_path, png_path = paths(prefix)
  md_path.parent.mkdir(parents=True, exist_ok=True)
  if write_json:
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    results = json.loads(json_path.read_text())
  text = render(results)
  md_path.write_text(text)
  if plot is not None:
    plot(results, str(png_path))
  return text


def report_only(prefix, render, plot=None) -> int:
  """What a study's `--report_only` does: OUT.md and OUT.png rewritten from OUT.json (no
  training, no refitting). A missing JSON is a one-line error (exit 2)."""
  from jaxformer import cli
  try:
    results = load(prefix)
  except ValueError as e:
    cli.fail(str(e))
  write(prefix, results, render, plot, write_json=False)
  md_path, _, png_path = paths(prefix)
  print(f"wrote {md_path}" + (f", {png_path}" if plot is not None else "") +
        f" from {prefix}.json")
  return 0


def stored_estimates(results: dict) -> dict:
  """{fit key: params or None} as the JSON stores them (module docstring)."""
  if "fits" in results:
    return {key: (entry.get("fit") or {}).get("params") for key, entry in
            results["fits"].items()}
  if "fit" in results:
    return {"fit": (results["fit"] or {}).get("params")}
  raise ValueError("results hold neither 'fits' nor 'fit': not a scaling report's JSON")


def compare_estimates(refitted: dict, stored: dict, rtol: float = RTOL) -> list[str]:
  """The differences between two {fit key: params or None} (empty: they agree to `rtol`)."""
  out = []
  for key in sorted(set(refitted) | set(stored)):
    a, b = refitted.get(key), stored.get(key)
    if (a is None) != (b is None):
      out.append(f"{key}: refitted {a}, stored {b}")
      continue
    if a is None:
      continue
    if sorted(a) != sorted(b):
      out.append(f"{key}: refitted parameters {sorted(a)}, stored {sorted(b)}")
      continue
    for name in a:
      x, y = a[name], b[name]
      if x is None or y is None:
        if (x is None) != (y is None) and not (x is not None and not math.isfinite(x)):
          out.append(f"{key}.{name}: refitted {x}, stored {y}")
      elif not math.isclose(x, y, rel_tol=rtol, abs_tol=0.0):
        out.append(f"{key}.{name}: refitted {x!r}, stored {y!r} (rtol {rtol:g})")
  return out


def script(name: str):
  """The study module experiments/<name>.py."""
  return importlib.import_module(f"experiments.{name}")


def check(name: str, results_dir=RESULTS) -> list[str]:
  """What differs between the committed report experiments/results/<name>.* and what
  experiments/<name>.py computes from its committed JSON: the markdown, then the fits' point
  estimates. Empty when they agree."""
  module = script(name)
  prefix = pathlib.Path(results_dir) / name
  md_path, _, _ = paths(prefix)
  results = load(prefix)
  problems = []
  if module.render(results) != md_path.read_text():
    problems.append(f"{md_path.name} differs from render({name}.json): regenerate it with "
                    f"`python -m experiments.{name} --report_only`")
  stored = getattr(module, "stored", stored_estimates)(results)
  problems += [f"{name}.json {p}" for p in compare_estimates(module.refit(results), stored)]
  return problems
