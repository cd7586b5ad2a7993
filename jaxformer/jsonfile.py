"""Reading a JSON file a user may have damaged: the error names the file and the fix."""

from __future__ import annotations

import json


def read_json(path: str, *, fix: str):
  """The JSON data in `path`; a ValueError naming it and saying `fix` if it is not JSON."""
  try:
    with open(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); {fix}") from e
