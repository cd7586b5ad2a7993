"""Packing variable-length documents into fixed-length rows (no attention across documents).

Next-fit greedy: documents are placed in order, each into the current row if it fits, else
into a new row. It streams (`pack_rows` holds one open row and yields each row as soon as it
is full, so a corpus of any size packs in constant memory), keeps a document's pieces in
consecutive rows and rows in corpus order, and is deterministic. First-fit would fill rows a
little better but reorders documents and needs a search over open rows; with rows much longer
than a typical document (e.g. lm1b sentences of ~30 tokens in rows of 512) next-fit wastes
under one document per row. A document longer than a row is cut into row-sized pieces, each
packed as its own segment with positions from 0 (a model never sees a position >= row_len).
Where the rows fall depends on the document lengths alone (`next_fit`), so a prepared corpus
indexes its rows from its document lengths without reading a token (corpus/tokens.py).
"""

from __future__ import annotations

import collections
from typing import Iterable, Iterator

import numpy as np

PACKED_FIELDS = ("tokens", "segment_ids", "positions")


def _check_row_len(row_len: int):
  if not isinstance(row_len, (int, np.integer)) or isinstance(row_len, bool) or row_len < 1:
    raise ValueError(f"row_len={row_len!r} must be an int >= 1")


def _as_document(doc) -> np.ndarray:
  doc = np.asarray(doc)
  if doc.ndim != 1:
    raise ValueError(f"docs: a document must be a 1-D token array, got shape {doc.shape}")
  return doc.astype(np.int32, copy=False)


def next_fit(lengths: Iterable[int], row_len: int) -> Iterator[list[int]]:
  """The layout of each row from document lengths alone: the lengths of the pieces it holds
  (consecutive in the token stream). A document longer than a row is cut into row-sized
  pieces; empty documents are skipped."""
  pieces, fill = [], 0
  for length in lengths:
    while length > 0:
      n = min(length, row_len)
      if pieces and fill + n > row_len:
        yield pieces
        pieces, fill = [], 0
      pieces.append(n)
      fill, length = fill + n, length - n
  if pieces:
    yield pieces


def layout_row(tokens: np.ndarray, pieces: list[int], row_len: int) -> np.ndarray:
  """[len(PACKED_FIELDS), row_len] int32: `tokens` (the pieces, concatenated) as segments
  1..k with positions from 0 in each, then padding (0, 0, 0)."""
  row = np.zeros((len(PACKED_FIELDS), row_len), np.int32)
  fill = sum(pieces)
  row[0, :fill] = tokens
  row[1, :fill] = np.repeat(np.arange(1, len(pieces) + 1, dtype=np.int32), pieces)
  row[2, :fill] = np.concatenate([np.arange(n, dtype=np.int32) for n in pieces])
  return row


def _take(pending: collections.deque, count: int) -> np.ndarray:
  """The first `count` tokens of the documents in `pending`, removed from it."""
  parts = []
  while count:
    doc = pending.popleft()
    if len(doc) > count:
      pending.appendleft(doc[count:])
      doc = doc[:count]
    parts.append(doc)
    count -= len(doc)
  return np.concatenate(parts)


def _next_fit_rows(docs: Iterable[np.ndarray], row_len: int) -> Iterator[np.ndarray]:
  pending = collections.deque()

  def lengths():
    for doc in docs:
      pending.append(_as_document(doc))
      yield len(pending[-1])
  for pieces in next_fit(lengths(), row_len):
    yield layout_row(_take(pending, sum(pieces)), pieces, row_len)


def pack_rows(docs: Iterable[np.ndarray], row_len: int) -> Iterator[np.ndarray]:
  """Next-fit pack of 1-D token arrays (any iterable, read once) into rows of `row_len`.

  Yields int32 arrays [len(PACKED_FIELDS), row_len], one per row as soon as it is closed:
  `tokens` (0 where padding), `segment_ids` (1..k in the row, 0 = padding) and `positions`
  (0.. within each segment, 0 on padding). Empty documents are skipped.
  """
  _check_row_len(row_len)
  return _next_fit_rows(docs, int(row_len))


def pack_documents(docs: Iterable[np.ndarray], row_len: int) -> dict[str, np.ndarray]:
  """`pack_rows` collected: {field: int32 array [num_rows, row_len]} for PACKED_FIELDS."""
  rows = list(pack_rows(docs, row_len))
  stacked = np.stack(rows) if rows else np.zeros((0, len(PACKED_FIELDS), row_len), np.int32)
  return {k: np.ascontiguousarray(stacked[:, i]) for i, k in enumerate(PACKED_FIELDS)}
