"""Packing variable-length documents into fixed-length rows (no attention across documents).

Next-fit greedy: documents are placed in order, each into the current row if it fits, else
into a new row. It streams (`next_fit` holds one open row and yields each row as soon as it
is full, so a corpus of any size packs in constant memory), keeps a document's pieces in
consecutive rows and rows in corpus order, and is deterministic. First-fit would fill rows a
little better but reorders documents and needs a search over open rows; with rows much longer
than a typical document (e.g. lm1b sentences of ~30 tokens in rows of 512) next-fit wastes
under one document per row. A document longer than a row is cut into row-sized pieces, each
packed as its own segment with positions from 0 (a model never sees a position >= row_len).
Where the rows fall depends on the document lengths alone, and a row's tokens are consecutive
in the token stream, so a prepared corpus indexes its rows from its document lengths without
reading a token (corpus/tokens.py) and `layout_row` lays out a row from its tokens.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

PACKED_FIELDS = ("tokens", "segment_ids", "positions")


def _next_fit(lengths: Iterable[int], row_len: int) -> Iterator[list[int]]:
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


def next_fit(lengths: Iterable[int], row_len: int) -> Iterator[list[int]]:
  """The layout of each row from the document lengths (any iterable, read once): the lengths
  of the pieces it holds, which are consecutive in the token stream. Empty documents are
  skipped. `row_len` is checked at the call."""
  if not isinstance(row_len, (int, np.integer)) or isinstance(row_len, bool) or row_len < 1:
    raise ValueError(f"row_len={row_len!r} must be an int >= 1")
  return _next_fit(lengths, int(row_len))


def layout_row(tokens: np.ndarray, pieces: list[int], row_len: int) -> np.ndarray:
  """[len(PACKED_FIELDS), row_len] int32: `tokens` (the pieces, concatenated) as `tokens`,
  `segment_ids` 1..k (0 = padding) and `positions` from 0 in each piece, then padding
  (0, 0, 0)."""
  row = np.zeros((len(PACKED_FIELDS), row_len), np.int32)
  fill = sum(pieces)
  row[0, :fill] = tokens
  row[1, :fill] = np.repeat(np.arange(1, len(pieces) + 1, dtype=np.int32), pieces)
  row[2, :fill] = np.concatenate([np.arange(n, dtype=np.int32) for n in pieces])
  return row
