"""metrics.jsonl: one JSON object per logged step; truncated on resume so a resumed run's
file equals an uninterrupted run's.

The file is strict JSON (any JSON reader takes it): a non-finite number (a diverged loss) is
written as the string "NaN", "Infinity" or "-Infinity", and `read` turns it back into a float.
"""

from __future__ import annotations

import json
import math
import os

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _strict(value):
  if isinstance(value, float) and not math.isfinite(value):
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
  if isinstance(value, list):
    return [_strict(v) for v in value]
  return value


def _numbers(value):
  if isinstance(value, str) and value in _NON_FINITE:
    return _NON_FINITE[value]
  if isinstance(value, list):
    return [_numbers(v) for v in value]
  return value


class MetricsWriter:
  def __init__(self, path: str | os.PathLike):
    self.path = path

  def truncate_after(self, step: int) -> None:
    """Drop records past `step` (written after the checkpoint we resume from)."""
    if not os.path.exists(self.path):
      return
    with open(self.path) as f:
      keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    tmp = f"{self.path}.tmp"
    with open(tmp, "w") as f:
      f.writelines(keep)
    os.replace(tmp, self.path)

  def write(self, record: dict) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps({k: _strict(v) for k, v in record.items()}, allow_nan=False) + "\n")


def read(path: str | os.PathLike) -> list[dict]:
  with open(path) as f:
    return [{k: _numbers(v) for k, v in json.loads(line).items()} for line in f if line.strip()]
