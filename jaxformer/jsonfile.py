"""Reading a JSON file a user may have damaged: the error names the file and the fix."""

from __future__ import annotations

import json

from etils import epath


def read_json(path: str, *, fix: str):
  """The JSON data in `path` (a local path or a URL); a ValueError naming it and saying `fix`
  if it is not JSON."""
  try:
    return json.loads(epath.Path(path).read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); {fix}") from e
