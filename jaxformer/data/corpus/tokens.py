"""Reading a prepared split: `TokenStream` (its unit token files as one stream, read by
offset: a host reads only the windows and rows of its own batch rows) and the packed-row index
(`packed_rows`): two flat files read by offset, so neither building nor reading it holds
anything per row in memory.

Row index of a split for one row length: `<name>.rows`, little-endian int64 pairs (the row's
first token in the stream, its first piece in `.pieces`), one per row and a last pair (the
stream's packed tokens, the piece count) that closes the last row; `<name>.pieces`, int32
piece lengths (packing.py's layouts, rows in order). Row r is tokens [start[r], start[r+1])
cut into pieces [piece[r], piece[r+1]). `.pieces` is complete before `.rows` gets its name,
so a `.rows` file means a complete index. (An ArrayRecord file of one record per row, used
before, kept a per-record index in memory to write and to read: ~40 bytes a row, +0.7 GB of
a training process for the 17 M rows of 554 M tokens at seq_len 32, and 72 bytes a row on
disk where these files take 20.)
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from typing import Iterator

import grain
import numpy as np
from etils import epath

from jaxformer import paths
from jaxformer.data import packing
from jaxformer.data.corpus import files
from jaxformer.data.corpus.work import unit_name

MAX_OPEN_FILES = 64
ENDS_BLOCK = 1 << 17                  # document ends read at a time (1 MiB)


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

  def document_length_blocks(self, block: int = ENDS_BLOCK) -> Iterator[np.ndarray]:
    """The token count of each document, in order, as int64 arrays of at most `block` (a
    document may span unit files; the end of the split ends the last one)."""
    carry, previous_end = 0, 0
    for k, path in enumerate(self.paths):
      start = 0
      with path.with_suffix(".ends").open("rb") as f:
        while chunk := f.read(block * 8):
          ends = np.frombuffer(chunk, "<i8")
          lengths = np.diff(ends, prepend=start)
          lengths[0] += carry
          carry, start = 0, int(ends[-1])
          yield lengths
      carry += int(self.ends[k]) - previous_end - start
      previous_end = int(self.ends[k])
    if carry:
      yield np.asarray([carry], np.int64)

  def document_lengths(self) -> Iterator[int]:
    """The token count of each document, in order (`document_length_blocks`, one by one)."""
    for lengths in self.document_length_blocks():
      yield from lengths.tolist()


def _write_row_index(path: epath.Path, stream: TokenStream, row_len: int):
  """`path`.rows and `path`.pieces (module docstring), a block of rows at a time."""
  tokens = pieces = 0
  with files.writing(_index_path(path, ".rows")) as rows, files.writing(
      _index_path(path, ".pieces")) as lengths_file:      # .pieces is complete first
    for counts, lengths in packing.next_fit_blocks(stream.document_length_blocks(), row_len):
      first = np.concatenate([[0], np.cumsum(counts)[:-1]])
      row_tokens = np.add.reduceat(lengths, first)
      starts = tokens + np.concatenate([[0], np.cumsum(row_tokens)[:-1]])
      rows.write(np.stack([starts, pieces + first], axis=1).astype("<i8").tobytes())
      lengths_file.write(lengths.astype("<i4").tobytes())
      tokens, pieces = tokens + int(row_tokens.sum()), pieces + len(lengths)
    rows.write(np.asarray([tokens, pieces], "<i8").tobytes())


def _index_path(path: epath.Path, suffix: str) -> epath.Path:
  return path.with_name(path.name + suffix)


class PackedRows:
  """The packed rows of a stream as a grain data source: row r is read by offset (two small
  reads of the index, one of the tokens): int32 [len(PACKED_FIELDS), row_len]."""

  def __init__(self, stream: TokenStream, path: epath.Path, row_len: int):
    self.stream, self.row_len = stream, row_len
    self._paths = [paths.local_copy(_index_path(path, s)) for s in (".rows", ".pieces")]
    self._rows = os.path.getsize(self._paths[0]) // 16 - 1
    self._fds, self._pid, self._closer = None, None, None

  def __len__(self) -> int:
    return self._rows

  def _read(self, k: int, count: int, offset: int) -> bytes:
    if self._pid != os.getpid():                   # opened once per process
      self._fds, self._pid = [os.open(p, os.O_RDONLY) for p in self._paths], os.getpid()
      self._closer = weakref.finalize(self, _close_all, self._fds)
    data = os.pread(self._fds[k], count, offset)
    if len(data) != count:
      raise OSError(f"{self._paths[k]} is shorter than its index says (truncated?); delete "
                    "it to rebuild it")
    return data

  def __getitem__(self, r: int) -> np.ndarray:
    r = int(r)
    if not 0 <= r < self._rows:
      raise IndexError(f"row {r} outside [0, {self._rows})")
    start, first, end, last = np.frombuffer(self._read(0, 32, 16 * r), "<i8").tolist()
    pieces = np.frombuffer(self._read(1, 4 * (last - first), 4 * first), "<i4").tolist()
    return packing.layout_row(self.stream.read(start, end - start), pieces, self.row_len)

  def __getstate__(self):
    return {**self.__dict__, "_fds": None, "_pid": None, "_closer": None}


def _close_all(fds: list[int]):
  for fd in fds:
    os.close(fd)


def packed_rows(stream: TokenStream, path: epath.Path, row_len: int) -> grain.MapDataset:
  """Rows of `row_len` tokens packed next-fit from the stream's documents: int32 arrays
  [len(PACKED_FIELDS), row_len]. The row index (`path`.rows and .pieces) is written once,
  from the document lengths alone."""
  if not _index_path(path, ".rows").exists():
    _write_row_index(path, stream, row_len)
  return grain.MapDataset.source(PackedRows(stream, path, row_len))
