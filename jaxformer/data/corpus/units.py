"""A source cut into units of work (about `UNIT_BYTES` or `UNIT_ROWS` each) that worker
processes read independently: byte ranges of text and JSON-lines files (cut after a newline),
row-group ranges of Parquet files, row ranges of Hugging Face and TFDS datasets. A gzip file is
one unit (it cannot be entered in the middle). The units of a source, in order, read back the
source in order, whatever the number of workers.
"""

from __future__ import annotations

import dataclasses

from etils import epath

from jaxformer.data.corpus import sources

UNIT_BYTES = 32 << 20
UNIT_ROWS = 100_000
_PROBE = 1 << 16


@dataclasses.dataclass(frozen=True)
class Unit:
  """`kind`: a file format ('txt', 'jsonl', 'parquet'), 'hf' or 'tfds'; [start, stop): bytes,
  row groups or rows (stop -1: to the end). `document`: a whole .txt file that is one
  document of a many-document source. `role`: the split every text of the unit belongs to,
  when known before reading it ('train' | 'validation'); `split` the dataset split read."""
  index: int
  kind: str
  path: str
  start: int = 0
  stop: int = -1
  size: int = 0
  document: bool = False
  role: str | None = None
  split: str | None = None


def _line_start_after(path: epath.Path, offset: int, size: int) -> int:
  """The first offset >= `offset` that starts a line (or `size`)."""
  with path.open("rb") as f:
    while offset < size:
      f.seek(offset - 1)
      block = f.read(_PROBE + 1)
      newline = block.find(b"\n")
      if newline >= 0:
        return offset + newline
      offset += _PROBE
  return size


def _byte_ranges(path: epath.Path, size: int) -> list[tuple[int, int]]:
  cuts = [0]
  while cuts[-1] + UNIT_BYTES < size:
    cuts.append(_line_start_after(path, cuts[-1] + UNIT_BYTES, size))
  cuts.append(size)
  return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _file_units(path: epath.Path, one_text: bool) -> list[dict]:
  kind, size = sources.file_format(path), path.stat().length
  if kind == "txt" and not one_text:
    return [dict(kind=kind, path=str(path), size=size, document=True)]
  if kind == "parquet":
    return _parquet_units(path, size)
  if sources.is_gzip(path):
    return [dict(kind=kind, path=str(path), size=size)]
  return [dict(kind=kind, path=str(path), start=a, stop=b, size=b - a)
          for a, b in _byte_ranges(path, size)]


def _parquet_units(path: epath.Path, size: int) -> list[dict]:
  from jaxformer.data.corpus import readers
  with readers.open_binary(path) as f:
    meta = readers.parquet_file(f, path).metadata
  groups = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
  units, start, acc = [], 0, 0
  for i, nbytes in enumerate(groups):
    acc += nbytes
    if acc >= UNIT_BYTES or i == len(groups) - 1:
      units.append(dict(kind="parquet", path=str(path), start=start, stop=i + 1,
                        size=size * acc // max(sum(groups), 1)))
      start, acc = i + 1, 0
  return units


def _row_units(kind: str, path: str, split: str | None, role: str | None, rows: int,
               row_bytes: int) -> list[dict]:
  return [dict(kind=kind, path=path, start=a, stop=min(a + UNIT_ROWS, rows), split=split,
               role=role, size=row_bytes * (min(a + UNIT_ROWS, rows) - a))
          for a in range(0, rows, UNIT_ROWS)]


def plan(source: sources.Source,
         splits: list[tuple[str | None, str | None, int, int]] = ()) -> list[Unit]:
  """The units of `source`, in order. `splits` (Hugging Face and TFDS sources): one
  (role, split name, rows, bytes per row) per split read; role None: split by document hash."""
  if source.kind == "files":
    specs = [u for path in source.paths for u in _file_units(path, source.one_text)]
  else:
    path = source.name if source.kind == "tfds" else str(source.paths[0])
    specs = [u for role, name, rows, row_bytes in splits
             for u in _row_units(source.kind, path, name, role, rows, row_bytes)]
  return [Unit(index=i, **spec) for i, spec in enumerate(specs)]
