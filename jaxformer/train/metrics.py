"""metrics.jsonl: one JSON object per logged step; truncated on resume so a resumed run's
file equals an uninterrupted run's."""

from __future__ import annotations

import json
import os


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
      f.write(json.dumps(record) + "\n")


def read(path: str | os.PathLike) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
