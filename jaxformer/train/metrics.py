"""metrics.jsonl: one JSON object per logged step; truncated on resume so a resumed run's
file equals an uninterrupted run's.

The file is strict JSON (any JSON reader takes it): a non-finite number (a diverged loss) is
written as the string "NaN", "Infinity" or "-Infinity", and `read` turns it back into a float.
"""

from __future__ import annotations

import json
import logging
import math
import os

from jaxformer import paths

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

  def truncate_after(self, step: int) -> int:
    """Drop records past `step` (written after the checkpoint we resume from), and a torn
    last line (what a kill or a full disk mid-write leaves), atomically; returns the last
    step the file held before (0: none), what the trackers of the run were sent."""
    if not paths.path(self.path).exists():
      return 0
    lines = _lines(self.path)
    records = _parse(lines, self.path)
    keep = [line for line, record in zip(lines, records)
            if record is not None and record["step"] <= step]
    paths.write_text(self.path, "".join(line if line.endswith("\n") else line + "\n"
                                        for line in keep))
    return max((r["step"] for r in records if r is not None), default=0)

  def write(self, record: dict) -> None:
    paths.append_text(self.path, json.dumps({k: _strict(v) for k, v in record.items()},
                                            allow_nan=False) + "\n")


def _parse(lines: list[str], path) -> list[dict | None]:
  """The record of each line (None for blank lines). A torn last line (no newline, or not
  JSON) is dropped with a warning; a bad line anywhere else is a ValueError naming it."""
  records = []
  for i, line in enumerate(lines):
    if not line.strip():
      records.append(None)
      continue
    try:
      record = json.loads(line)
      if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        raise ValueError("not a metrics record")
    except ValueError as e:
      if i == len(lines) - 1:
        logging.warning("%s: dropping its torn last line %d (%s), written by an interrupted "
                        "run", path, i + 1, line[:60].strip())
        records.append(None)
        continue
      raise ValueError(f"{path}: line {i + 1} is not a metrics record ({e}); the file is "
                       "damaged: fix or delete that line, or rerun with --fresh") from None
    records.append({k: _numbers(v) for k, v in record.items()})
  return records


def _lines(path) -> list[str]:
  return paths.path(path).read_text().splitlines(keepends=True)


def read(path: str | os.PathLike) -> list[dict]:
  """The records of a metrics.jsonl (a torn last line dropped, see `_parse`)."""
  return [r for r in _parse(_lines(path), path) if r is not None]
