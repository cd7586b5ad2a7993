"""The texts of one unit, streamed: `texts(unit, field, data_dir)` yields (text, ends_document)
pairs with memory bounded by `BLOCK_BYTES` and `MAX_PIECE_CHARS`, never by the file size.

A .txt unit yields pieces cut after a newline (a tokenizer that never merges across a newline,
like the char and SentencePiece ones here, encodes the pieces exactly as the whole text), with
universal newlines (\\r\\n and \\r become \\n); it checks the text is UTF-8 without NUL bytes,
naming the byte offset. Records (.jsonl lines, Parquet rows, dataset rows) are documents: the
string in `field` (rows where it is null are skipped).
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import json
import zlib
from typing import Iterator

from etils import epath

from jaxformer.data.corpus import sources
from jaxformer.data.corpus.units import Unit

BLOCK_BYTES = 1 << 20
MAX_PIECE_CHARS = 1 << 22          # a text with no newline for this long is cut anyway
_ROWS_PER_READ = 1024


@contextlib.contextmanager
def open_binary(path: epath.Path):
  """`path` opened for binary reading, decompressed if it ends in .gz. A .gz file that is not
  gzip, or whose stream is truncated or damaged, is a ValueError naming it (gzip finds out
  only while it is read, so the reads in the `with` block are covered too)."""
  with epath.Path(path).open("rb") as raw:
    if not sources.is_gzip(epath.Path(path)):
      yield raw
      return
    try:
      with gzip.GzipFile(fileobj=raw) as f:
        yield f
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
      raise ValueError(_bad_gzip(path, e)) from None


def _bad_gzip(path, error: Exception) -> str:
  if isinstance(error, gzip.BadGzipFile) and str(error).startswith("Not a gzipped file"):
    return (f"data.source: {path} is not gzip-compressed ({error}) though its name ends in "
            ".gz; compress it (gzip FILE) or drop the .gz from its name")
  what, copy = ("truncated", "complete") if isinstance(error, EOFError) else ("damaged", "good")
  return (f"data.source: {path} is a {what} gzip file ({error}); replace it with a {copy} "
          "copy (`gzip -t FILE` checks one) or remove it from the source")


def parquet_file(f, path):
  from jaxformer.extras import require
  pq = require("pyarrow.parquet", extra="corpora", needed_for=f"reading {path}")
  return pq.ParquetFile(f)


def _blocks(unit: Unit) -> Iterator[bytes]:
  """The bytes [unit.start, unit.stop) of the unit's file, decompressed, in blocks."""
  with open_binary(unit.path) as f:
    if unit.start:
      f.seek(unit.start)
    left = unit.stop - unit.start if unit.stop >= 0 else None
    while left is None or left > 0:
      block = f.read(BLOCK_BYTES if left is None else min(BLOCK_BYTES, left))
      if not block:
        return
      if left is not None:
        left -= len(block)
      yield block


def _decode(block: bytes, decoder, offset: int, path: str, final: bool = False) -> str:
  """The text of `block` (after what earlier blocks left pending); ValueError with the byte
  offset on a NUL byte or bytes that are not UTF-8."""
  nul = block.find(b"\0")
  if nul >= 0:
    raise ValueError(f"data.source: {path} is a binary file (a NUL byte at byte offset "
                     f"{offset + nul}), not text; give UTF-8 text files")
  try:
    return decoder.decode(block, final=final)
  except UnicodeDecodeError as e:
    at = offset + e.start - len(decoder.getstate()[0])   # e.start counts pending bytes too
    raise ValueError(f"data.source: {path} is not UTF-8 text (byte offset {at}: {e.reason}); "
                     "convert it, e.g. iconv -f latin1 -t utf-8") from None


def _universal(text: str) -> str:
  return text.replace("\r\n", "\n").replace("\r", "\n")


def _txt_texts(unit: Unit) -> Iterator[tuple[str, bool]]:
  decoder = codecs.getincrementaldecoder("utf-8")()
  offset, pending = unit.start, ""
  for block in _blocks(unit):
    text = pending + _decode(block, decoder, offset, unit.path)
    offset += len(block)
    cut = text.rfind("\n") + 1
    if not cut and len(text) > MAX_PIECE_CHARS:
      cut = len(text) - 1                 # keep a last \r that a \n may follow
    if cut:
      yield _universal(text[:cut]), False
    pending = text[cut:]
  pending += _decode(b"", decoder, offset, unit.path, final=True)
  if pending or unit.document:
    yield _universal(pending), unit.document


def _record_text(record, field: str, where: str) -> str | None:
  if not isinstance(record, dict) or field not in record:
    fields = sorted(record) if isinstance(record, dict) else f"a JSON {type(record).__name__}"
    raise ValueError(f"data.text_field={field!r}: {where} has no such field (it has "
                     f"{fields}); set data.text_field to the field that holds the text")
  value = record[field]
  if value is not None and not isinstance(value, str):
    raise ValueError(f"data.text_field={field!r}: {where} holds a {type(value).__name__}, "
                     "not text; set data.text_field to a string field")
  return value


def _jsonl_texts(unit: Unit, field: str) -> Iterator[tuple[str, bool]]:
  with open_binary(unit.path) as f:
    if unit.start:
      f.seek(unit.start)
    offset = unit.start
    while unit.stop < 0 or offset < unit.stop:
      line = f.readline()
      if not line:
        return
      where = f"{unit.path} (the line at byte offset {offset})"
      offset += len(line)
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise ValueError(f"data.source: {where} is not JSON ({e}); give one JSON object per "
                         "line") from None
      text = _record_text(record, field, where)
      if text is not None:
        yield text, True


def _column_texts(values, field: str, where: str) -> Iterator[tuple[str, bool]]:
  for value in values:
    if value is not None:
      yield _record_text({field: value}, field, where), True


def _parquet_texts(unit: Unit, field: str) -> Iterator[tuple[str, bool]]:
  with open_binary(unit.path) as f:
    table = parquet_file(f, unit.path)
    if field not in table.schema_arrow.names:
      raise ValueError(f"data.text_field={field!r}: {unit.path} has no such column (it has "
                       f"{table.schema_arrow.names}); set data.text_field to the text column")
    for batch in table.iter_batches(batch_size=_ROWS_PER_READ, columns=[field],
                                    row_groups=range(unit.start, unit.stop)):
      yield from _column_texts(batch.column(0).to_pylist(), field, unit.path)


def hf_dataset(path: str, split: str | None):
  """The saved Hugging Face dataset at `path` (its `split` if it is a DatasetDict)."""
  try:
    import datasets
  except ImportError:
    raise ValueError(f"data.source={path!r} is a Hugging Face dataset; reading it needs "
                     "`datasets`: pip install 'jaxformer[corpora]'") from None
  dataset = datasets.load_from_disk(path)
  return dataset[split] if split is not None else dataset


def _hf_texts(unit: Unit, field: str) -> Iterator[tuple[str, bool]]:
  dataset = hf_dataset(unit.path, unit.split)
  if field not in dataset.column_names:
    raise ValueError(f"data.text_field={field!r}: {unit.path} has no such column (it has "
                     f"{dataset.column_names}); set data.text_field to the text column")
  for a in range(unit.start, unit.stop, _ROWS_PER_READ):
    rows = dataset[a:min(a + _ROWS_PER_READ, unit.stop)][field]
    yield from _column_texts(rows, field, unit.path)


def _tfds_texts(unit: Unit, field: str, data_dir) -> Iterator[tuple[str, bool]]:
  from jaxformer.data import tfds_catalog
  builder = tfds_catalog.catalog_builder(sources.TFDS_PREFIX + unit.path, data_dir)
  records = builder.as_data_source(split=unit.split)
  for a in range(unit.start, unit.stop, _ROWS_PER_READ):
    for record in records.__getitems__(list(range(a, min(a + _ROWS_PER_READ, unit.stop)))):
      value = record[field]
      yield value.decode("utf-8") if isinstance(value, bytes) else str(value), True


def texts(unit: Unit, field: str, data_dir=None) -> Iterator[tuple[str, bool]]:
  """(text, ends_document) pairs of `unit`, in order."""
  if unit.kind == "txt":
    return _txt_texts(unit)
  if unit.kind == "jsonl":
    return _jsonl_texts(unit, field)
  if unit.kind == "parquet":
    return _parquet_texts(unit, field)
  if unit.kind == "hf":
    return _hf_texts(unit, field)
  return _tfds_texts(unit, field, data_dir)
