"""Files of the prepared-corpus cache, each complete or absent: a local file is written under
a temporary name and renamed (a killed writer leaves a `*.tmp-*` file that nothing reads); an
object store has no rename (gcsfs copies) but shows an object only once it is written whole,
so there the final name is written directly (`jaxformer.paths` does the same)."""

from __future__ import annotations

import json
import os
import uuid
from typing import Iterable

from etils import epath

from jaxformer import paths


def temporary(path: epath.Path) -> epath.Path:
  """Where to write `path`: a unique temporary name next to it (`path` itself remotely)."""
  if paths.is_remote(path):
    return path
  return path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def finish(tmp: epath.Path, path: epath.Path):
  """Give the written `tmp` its final name. Another process may have finished the same file
  meanwhile (two runs of a sweep preparing one corpus at once; the content is the same):
  `os.replace` replaces it atomically, where epath's rename would refuse."""
  if tmp != path:
    os.replace(os.fspath(tmp), os.fspath(path))


def write_json(path: epath.Path, value):
  paths.write_text(path, json.dumps(value))


def write_array_record(path: epath.Path, rows: Iterable[bytes]):
  """Write records to `path` as `rows` yields them; a temporary file until complete, removed
  if `rows` raises. ArrayRecord writes local files only: for a remote `path` the file is
  written locally (where `paths.local_copy` will find it) and then uploaded whole."""
  from array_record.python.array_record_module import ArrayRecordWriter
  if paths.is_remote(path):
    local = epath.Path(paths.local_copy_path(path))
    local.parent.mkdir(parents=True, exist_ok=True)
    write_array_record(local, rows)
    paths.write_bytes(path, local.read_bytes())
    return
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
  finish(tmp, path)
