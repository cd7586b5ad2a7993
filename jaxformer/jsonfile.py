"""Reading JSON files a user may have damaged or written by hand: the error names the file
(and the line of a JSON Lines file) and the fix."""

from __future__ import annotations

import json
from typing import Any

from etils import epath


def read_json(path: str, *, fix: str):
  """The JSON data in `path` (a local path or a URL); a ValueError naming it and saying `fix`
  if it is not JSON."""
  try:
    return json.loads(epath.Path(path).read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); {fix}") from e


def read_jsonl(file, *, name: str, field: str, holds: str, objects: bool = True,
               limit: int | None = None) -> list[tuple[str, Any]]:
  """(where, record) of every non-blank line of the JSON Lines file `file` (an epath.Path, or
  a local path), `where` being '<name>:<line>' for the caller's own errors about a record.

  `name` is the path as the user gave it in `field` (a flag or config key); `holds` says what
  the file should hold. A ValueError names `field` when the file is missing, not UTF-8 or
  holds no records, and '<name>:<line>' when a line is not JSON (or, with `objects`, not a
  JSON object). `limit`: stop after that many records."""
  path = epath.Path(file)
  if not path.is_file():
    raise ValueError(f"{field}={name!r} is not a file; give a JSONL file of {holds}")
  try:
    text = path.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{field}={name!r} is not UTF-8 text ({e.reason} at byte {e.start}); give "
                     f"a JSONL file of {holds}") from None
  out = []
  for lineno, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    where = f"{name}:{lineno}"
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{where}: not JSON ({e.msg}); each line is one JSON object of "
                       f"{holds}") from None
    if objects and not isinstance(record, dict):
      raise ValueError(f"{where}: expected a JSON object ({holds}), got "
                       f"{type(record).__name__}")
    out.append((where, record))
    if limit is not None and len(out) >= limit:
      break
  if not out:
    raise ValueError(f"{field}={name!r} holds no records; give a JSONL file of {holds}")
  return out
