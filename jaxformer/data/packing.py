"""Packing variable-length documents into fixed-length rows (no attention across documents).

Next-fit greedy: documents are placed in order, each into the current row if it fits, else
into a new row. It streams (`pack_rows` holds one open row and yields each row as soon as it
is full, so a corpus of any size packs in constant memory), keeps a document's pieces in
consecutive rows and rows in corpus order, and is deterministic. First-fit would fill rows a
little better but reorders documents and needs a search over open rows; with rows much longer
than a typical document (e.g. lm1b sentences of ~30 tokens in rows of 512) next-fit wastes
under one document per row. A document longer than a row is cut into row-sized pieces, each
packed as its own segment with positions from 0 (a model never sees a position >= row_len).
"""

from __future__ import annotations

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


def _pieces(docs: Iterable[np.ndarray], row_len: int) -> Iterator[np.ndarray]:
  """The non-empty row-sized pieces of each document, in order."""
  for doc in docs:
    doc = _as_document(doc)
    for start in range(0, len(doc), row_len):
      yield doc[start:start + row_len]


def _next_fit_rows(docs: Iterable[np.ndarray], row_len: int) -> Iterator[np.ndarray]:
  positions = np.arange(row_len, dtype=np.int32)
  row, fill, segment = None, 0, 0
  for piece in _pieces(docs, row_len):
    n = len(piece)
    if row is None or fill + n > row_len:
      if row is not None:
        yield row
      row, fill, segment = np.zeros((len(PACKED_FIELDS), row_len), np.int32), 0, 0
    segment += 1
    row[0, fill:fill + n] = piece
    row[1, fill:fill + n] = segment
    row[2, fill:fill + n] = positions[:n]
    fill += n
  if row is not None:
    yield row


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
