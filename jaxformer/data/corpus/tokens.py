"""Reading a prepared split: `TokenStream` (its unit token files as one stream, read by
offset: a host reads only the windows and rows of its own batch rows) and the packed-row index
(`packed_rows`), an ArrayRecord file of row layouts that grain reads directly.
"""

from __future__ import annotations

import collections
import threading
from typing import Iterator

import grain
import numpy as np
from etils import epath

from jaxformer import paths
from jaxformer.data import packing
from jaxformer.data.corpus import files
from jaxformer.data.corpus.work import unit_name

MAX_OPEN_FILES = 64


class TokenStream:
  """One split of a prepared corpus: `parts` is [(unit index, tokens, docs)] in order."""

  def __init__(self, directory: epath.Path, role: str, parts: list, dtype: str):
    parts = [(i, n) for i, n, _ in parts if n]
    self.paths = [directory / f"{unit_name(i)}.{role}.tok" for i, _ in parts]
    self.ends = np.cumsum([n for _, n in parts], dtype=np.int64)
    self.dtype = np.dtype(dtype)
    self._files, self._lock = collections.OrderedDict(), threading.Lock()

  def __len__(self) -> int:
    return int(self.ends[-1]) if len(self.ends) else 0

  def _read_part(self, k: int, offset: int, count: int) -> bytes:
    with self._lock:
      f = self._files.pop(k, None) or self.paths[k].open("rb")
      self._files[k] = f                        # most recently used last
      if len(self._files) > MAX_OPEN_FILES:
        self._files.popitem(last=False)[1].close()
      f.seek(offset * self.dtype.itemsize)
      return f.read(count * self.dtype.itemsize)

  def read(self, start: int, length: int) -> np.ndarray:
    """int32 tokens [start, start + length) of the stream."""
    if start < 0 or start + length > len(self):
      raise IndexError(f"tokens [{start}, {start + length}) outside [0, {len(self)})")
    chunks, k = [], int(np.searchsorted(self.ends, start, side="right"))
    while length > 0:
      first = int(self.ends[k - 1]) if k else 0
      count = min(length, int(self.ends[k]) - start)
      chunks.append(self._read_part(k, start - first, count))
      start, length, k = start + count, length - count, k + 1
    return np.frombuffer(b"".join(chunks), self.dtype).astype(np.int32)

  def document_lengths(self) -> Iterator[int]:
    """The token count of each document, in order (a document may span unit files; the end
    of the split ends the last one)."""
    carry, previous_end = 0, 0
    for k, path in enumerate(self.paths):
      start = 0
      ends = np.frombuffer(path.with_suffix(".ends").read_bytes(), "<i8")
      for end in ends.tolist():
        yield carry + end - start
        carry, start = 0, end
      carry += int(self.ends[k]) - previous_end - start
      previous_end = int(self.ends[k])
    if carry:
      yield carry


def _write_row_index(path: epath.Path, stream: TokenStream, row_len: int):
  def layouts():
    start = 0
    for pieces in packing.next_fit(stream.document_lengths(), row_len):
      yield np.asarray([start, *pieces], "<i8").tobytes()
      start += sum(pieces)
  files.write_array_record(path, layouts())


def packed_rows(stream: TokenStream, path: epath.Path, row_len: int) -> grain.MapDataset:
  """Rows of `row_len` tokens packed next-fit from the stream's documents: int32 arrays
  [len(PACKED_FIELDS), row_len]. The row index (start, piece lengths) is written to `path`
  once, from the document lengths alone."""
  if not path.exists():
    _write_row_index(path, stream, row_len)

  def row(record: bytes) -> np.ndarray:
    start, *pieces = np.frombuffer(record, "<i8").tolist()
    return packing.layout_row(stream.read(start, sum(pieces)), pieces, row_len)
  return grain.MapDataset.source(
      grain.sources.ArrayRecordDataSource(paths.local_copy(path))).map(row)   # local files only
