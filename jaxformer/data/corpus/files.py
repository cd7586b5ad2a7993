"""Files of the prepared-corpus cache, each written whole under a temporary name and renamed:
a killed writer leaves a `*.tmp-*` file that nothing reads, never a file that looks complete."""

from __future__ import annotations

import json
import os
import uuid
from typing import Iterable

from etils import epath


def temporary(path: epath.Path) -> epath.Path:
  """A unique temporary name next to `path`."""
  return path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def write_json(path: epath.Path, value):
  tmp = temporary(path)
  tmp.write_text(json.dumps(value))
  tmp.rename(path)


def write_array_record(path: epath.Path, rows: Iterable[bytes]):
  """Write records to `path` as `rows` yields them; a temporary file until complete, removed
  if `rows` raises."""
  from array_record.python.array_record_module import ArrayRecordWriter
  tmp = temporary(path)
  writer, complete = ArrayRecordWriter(str(tmp), "group_size:1"), False
  try:
    for row in rows:
      writer.write(row)
    complete = True
  finally:
    writer.close()
    if not complete:
      tmp.unlink()
  tmp.rename(path)
