"""Packing variable-length documents into fixed-length rows (no attention across documents).

Next-fit greedy: documents are placed in order, each into the current row if it fits, else
into a new row. It is streaming (one open row, O(total tokens)), keeps a document's pieces in
consecutive rows and rows in corpus order, and is deterministic. First-fit would fill rows a
little better but reorders documents and needs a search over open rows; with rows much longer
than a typical document (e.g. lm1b sentences of ~30 tokens in rows of 512) next-fit wastes
under one document per row. A document longer than a row is cut into row-sized pieces, each
packed as its own segment with positions from 0 (a model never sees a position >= row_len).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

PACKED_FIELDS = ("tokens", "segment_ids", "positions")


def _pieces(docs: Sequence[np.ndarray], row_len: int) -> list[np.ndarray]:
  return [np.asarray(d, np.int32)[i:i + row_len]
          for d in docs for i in range(0, len(d), row_len)]


def _next_fit(lengths: Sequence[int], row_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(row, offset within the row, segment id) of each piece under next-fit."""
  rows, offsets, segments = [], [], []
  row, fill, segment = -1, row_len, 0
  for n in lengths:
    if fill + n > row_len:
      row, fill, segment = row + 1, 0, 0
    rows.append(row)
    offsets.append(fill)
    segments.append(segment + 1)
    fill, segment = fill + n, segment + 1
  return (np.asarray(rows, np.int64), np.asarray(offsets, np.int64),
          np.asarray(segments, np.int32))


def pack_documents(docs: Sequence[np.ndarray], row_len: int) -> dict[str, np.ndarray]:
  """Next-fit pack of 1-D token arrays into rows of `row_len`.

  Returns int32 arrays [num_rows, row_len]: `tokens` (0 where padding), `segment_ids`
  (1..k in each row, 0 = padding) and `positions` (0.. within each segment, 0 on padding).
  Empty documents are skipped.
  """
  if not isinstance(row_len, (int, np.integer)) or row_len < 1:
    raise ValueError(f"row_len={row_len!r} must be an int >= 1")
  pieces = [p for p in _pieces(docs, int(row_len)) if len(p)]
  lengths = np.asarray([len(p) for p in pieces], np.int64)
  rows, offsets, segments = _next_fit(lengths.tolist(), row_len)
  num_rows = int(rows[-1]) + 1 if len(pieces) else 0
  out = {k: np.zeros((num_rows, row_len), np.int32) for k in PACKED_FIELDS}
  if not pieces:
    return out
  starts = np.repeat(rows * row_len + offsets, lengths)
  within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
  flat = starts + within
  out["tokens"].reshape(-1)[flat] = np.concatenate(pieces)
  out["segment_ids"].reshape(-1)[flat] = np.repeat(segments, lengths)
  out["positions"].reshape(-1)[flat] = within
  return out
