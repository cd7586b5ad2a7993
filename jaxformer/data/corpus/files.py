"""Files of the prepared-corpus cache, each complete or absent: a local file is written under
a temporary name and renamed (a killed writer leaves a `*.tmp-*` file that nothing reads); an
object store has no rename (gcsfs copies) but shows an object only once it is written whole,
so there the final name is written directly (`jaxformer.paths` does the same)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from typing import BinaryIO, Iterator

from etils import epath

from jaxformer import paths

COPY_BYTES = 1 << 20


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


@contextlib.contextmanager
def writing(path: epath.Path) -> Iterator[BinaryIO]:
  """A binary file to write `path` through, streamed: `path` once the block ends, nothing if
  it raises. A remote `path` is written locally (where `paths.local_copy` finds it: readers
  by offset read local files) and then uploaded."""
  remote = paths.is_remote(path)
  local = epath.Path(paths.local_copy_path(path)) if remote else path
  if remote:
    local.parent.mkdir(parents=True, exist_ok=True)
  tmp, complete = temporary(local), False
  try:
    with tmp.open("wb") as f:
      yield f
    complete = True
  finally:
    if not complete and tmp.exists():
      tmp.unlink()
  finish(tmp, local)
  if remote:
    with local.open("rb") as src, path.open("wb") as dst:
      shutil.copyfileobj(src, dst, COPY_BYTES)
