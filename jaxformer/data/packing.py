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
reading a token (corpus/tokens.py, through `next_fit_blocks`: the same rows, computed per
block of document lengths and yielded per block of rows, so a corpus of billions of rows packs
in memory bounded by the block size) and `layout_row` lays out a row from its tokens.
"""

from __future__ import annotations

import itertools
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
  _check_row_len(row_len)
  return _next_fit(lengths, int(row_len))


def _check_row_len(row_len):
  if not isinstance(row_len, (int, np.integer)) or isinstance(row_len, bool) or row_len < 1:
    raise ValueError(f"row_len={row_len!r} must be an int >= 1")


def next_fit_blocks(length_blocks: Iterable[np.ndarray], row_len: int,
                    rows_per_block: int = 1 << 16) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """`next_fit` for corpora of any size: the document lengths arrive as blocks (integer
  arrays), the rows leave as blocks (pieces per row [rows], the piece lengths [sum of it])
  of at most 2 x `rows_per_block` pieces (a document of many row lengths is cut into blocks
  too), so memory is bounded by the block sizes, not by the corpus. Concatenated, the blocks
  give exactly `next_fit`'s rows."""
  _check_row_len(row_len)
  return _next_fit_blocks(length_blocks, int(row_len), rows_per_block)


def _next_fit_blocks(length_blocks, row_len: int, rows_per_block: int):
  # A piece of row_len (a longer document's) never shares a row: next_fit closes the open row
  # before it and no later piece fits beside it. The rest is next-fit over shorter pieces.
  counts, pieces, open_n, fill = [], [], 0, 0     # closed rows' counts; the open row's pieces last

  def closed():
    nonlocal pieces
    cut = len(pieces) - open_n
    block = (np.asarray(counts, np.int64), np.asarray(pieces[:cut], np.int64))
    counts.clear()
    pieces = pieces[cut:]
    return block

  for lengths in length_blocks:
    for length in np.asarray(lengths, np.int64).tolist():
      if length <= 0:
        continue
      if length >= row_len:
        if open_n:
          counts.append(open_n)
          open_n, fill = 0, 0
        full, rest = divmod(length, row_len)
        while full:                                 # one row each, a block at a time
          k = min(full, rows_per_block)
          counts.extend(itertools.repeat(1, k))
          pieces.extend(itertools.repeat(row_len, k))
          full -= k
          if len(pieces) >= rows_per_block:
            yield closed()
        if rest:
          pieces.append(rest)
          open_n, fill = 1, rest
        continue
      if open_n and fill + length > row_len:
        counts.append(open_n)
        open_n, fill = 0, 0
      pieces.append(length)
      open_n, fill = open_n + 1, fill + length
      if len(pieces) - open_n >= rows_per_block:      # closed rows hold >= 1 piece each
        yield closed()
  if open_n:
    counts.append(open_n)
    open_n = 0
  if counts:
    yield closed()


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
