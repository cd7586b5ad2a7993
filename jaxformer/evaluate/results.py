"""Where `python -m jaxformer.evaluate` keeps its results: `<workdir>/eval/<name>.json`, one
file per evaluation name, never a file training writes; and the short table it prints."""

from __future__ import annotations

import json
import os
import re

from jaxformer import paths, workdir_layout

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def stem(text: str) -> str:
  """A file-name stem for results named after a data path or source: 'data/arc.jsonl' ->
  'arc'."""
  base = os.path.basename(text.rstrip("/")) or text
  base = re.sub(r"\.(jsonl|json|txt|parquet)(\.gz)?$", "", base)
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("_.") or "data"


def check_name(name: str) -> str:
  if not isinstance(name, str) or not _NAME.match(name) or name.endswith(".json"):
    raise ValueError(f"--name={name!r} must be a file name stem of letters, digits, '_', '-' "
                     "and '.', e.g. 'wikitext_val' (written as <workdir>/eval/<name>.json)")
  return name


def path(workdir: str, name: str) -> str:
  return os.path.join(os.fspath(workdir), workdir_layout.EVAL, f"{check_name(name)}.json")


def write(workdir: str, name: str, record: dict) -> str:
  """`record` as <workdir>/eval/<name>.json (replacing an earlier result of that name)."""
  target = path(workdir, name)
  paths.path(os.path.dirname(target)).mkdir(parents=True, exist_ok=True)
  paths.write_text(target, json.dumps(record, indent=2, sort_keys=False) + "\n")
  return target


def _cell(value) -> str:
  if isinstance(value, float):
    return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
  if isinstance(value, (list, tuple)) and len(value) == 2 and all(
      isinstance(v, float) for v in value):
    return f"[{value[0]:.3f}, {value[1]:.3f}]"
  return str(value)


def table(metrics: dict) -> str:
  """Two aligned columns: metric, value (nested dicts flattened with '/')."""
  rows = []

  def add(prefix, value):
    if isinstance(value, dict):
      for k, v in value.items():
        add(f"{prefix}/{k}" if prefix else k, v)
    else:
      rows.append((prefix, _cell(value)))
  add("", metrics)
  width = max(len(k) for k, _ in rows) if rows else 0
  return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
