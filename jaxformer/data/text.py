"""Text pipelines for language modelling (LM) and BERT masked LM (MLM), one constructor each.

`make_text_pipeline(config.data, task, seed=..., global_batch_size=..., eval_batch_size=...,
workdir=..., data_dir=...)` gives a `batching.Pipeline`: `train_batch(step)` is this process's
rows of the global batch of `step`, a pure function of (seed, step), so a resumed run reads
what an uninterrupted one would and the global batch does not depend on the process count.

Sources (`data.source`): a local .txt file or "tinyshakespeare" (built once into a TFDS
ArrayRecord dataset, see text_builder.py) or a prepared TFDS catalog dataset "tfds:<name>".
The tokenizer (`data.tokenizer`, see tokenizers.py) is made once and saved in the workdir.

Modes (`data.packing`):
- "stream" (default for text files): a split is one token stream; step s draws random windows
  with `np.random.default_rng([seed, split_id, s])` (nanoGPT's sampling, bit-identical to the
  earlier `TextCorpus.batch`). Eval batch i uses step index i on the eval split; with
  `data.eval_batches=None` eval instead covers the split once in consecutive windows.
- "packed" (default for TFDS catalog sources): each record is a document (+eos), documents
  are packed into rows (packing.py), cached as ArrayRecord in the data dir and batched with
  `batching.train_batches` / `batching.eval_batches`. On a text file (records are 64 Ki
  character pieces of one text, no eos) this gives consecutive non-overlapping rows, and an
  epoch sees every token once.

Records are read lazily (`TextSource.records(role)`, in chunks of `_READ_CHUNK`): a packed
split is tokenized, packed and written to its cache as the records stream by, and a run that
finds the cache reads no source record at all (with a tokenizer saved in the workdir, start-up
is independent of the corpus size, e.g. lm1b's 30M sentences). Stream mode holds its token
streams in memory, so it is meant for text files and small corpora.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
from typing import Iterable, Iterator

import grain
import numpy as np

from jaxformer import run_settings
from jaxformer.data import batching, packing, text_builder
from jaxformer.data.tokenizers import SPM_MAX_TRAINING_TEXTS, Tokenizer, make_tokenizer

SPLIT_IDS = {"train": 0, "validation": 1}    # the split_id of the window RNG
PACKING_MODES = ("stream", "packed")
TASKS = ("lm", "mlm")
MLM_MASK_FRACTION, MLM_RANDOM_FRACTION = 0.8, 0.1    # of the selected positions (BERT)
PACKED_FORMAT = 1                            # bump when the cached row layout changes
_READ_CHUNK = 4096


def _as_str(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _read_records(data_source, key: str) -> Iterator[str]:
  """The `key` texts of a TFDS data source, in stored order, read in chunks."""
  for start in range(0, len(data_source), _READ_CHUNK):
    chunk = range(start, min(start + _READ_CHUNK, len(data_source)))
    for record in data_source.__getitems__(list(chunk)):
      yield _as_str(record[key])


class TextSource:
  """The train and eval splits of `data.source`, whose record texts are read on demand.

  `documents` is True for catalog sources (a record is a document) and False for text files
  (records are consecutive pieces of one text). `identity` names the data (keys caches);
  building the source reads dataset metadata only, never records.
  """

  def __init__(self, data_config, data_dir: str | None):
    source = data_config.source
    if not isinstance(source, str) or not source:
      raise ValueError(f"data.source={source!r} must be a file path, a bundled name "
                       f"{sorted(text_builder.BUNDLED)} or 'tfds:<name>'")
    self.documents = source.startswith(text_builder.TFDS_PREFIX)
    if self.documents:
      builder = text_builder.catalog_builder(source, data_dir)
      key = data_config.get("text_key") or "text"
      text_builder.check_text_key(builder, key, source)
    else:
      builder = text_builder.build_local_text(
          source, train_fraction=data_config.get("train_fraction", 0.9), data_dir=data_dir)
      key = "text"
    self.split_names = {"train": data_config.get("train_split", "train"),
                        "validation": data_config.get("eval_split", "validation")}
    for role, field in (("train", "data.train_split"), ("validation", "data.eval_split")):
      text_builder.check_split(builder, self.split_names[role], source, field)
    self.identity = json.dumps([builder.info.full_name, key, self.split_names])
    self._builder, self._key = builder, key

  def records(self, role: str) -> Iterator[str]:
    """The record texts of split `role` ('train' | 'validation'), in order, read lazily."""
    return _read_records(self._builder.as_data_source(split=self.split_names[role]), self._key)

  def texts(self, *roles: str) -> Iterator[str]:
    """The record texts of `roles`, one split after the other, read lazily."""
    return itertools.chain.from_iterable(self.records(r) for r in roles)


def pipeline_tokenizer(data_config, source: TextSource, workdir) -> Tokenizer:
  """The run's tokenizer: char sets cover every split (all text must be encodable), trained
  tokenizers learn from the first SPM_MAX_TRAINING_TEXTS texts of the training split (the
  rest of a large corpus is never read for them)."""
  spec = data_config.tokenizer
  if spec == "char":
    return make_tokenizer(spec, lambda: source.texts("train", "validation"), workdir)
  return make_tokenizer(
      spec, lambda: itertools.islice(source.texts("train"), SPM_MAX_TRAINING_TEXTS), workdir)


def encode_stream(tokenizer: Tokenizer, source: TextSource, role: str) -> np.ndarray:
  """One token stream per split: a text file is encoded whole; documents each get an eos."""
  if not source.documents:
    return tokenizer.encode("".join(source.records(role)))
  eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
  parts = [np.concatenate([tokenizer.encode(t), np.asarray(eos, np.int32)])
           for t in source.records(role)]
  return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)


def stream_windows(ids: np.ndarray, *, seed: int, split_id: int, step: int,
                   batch_size: int, length: int) -> np.ndarray:
  """[batch_size, length] random windows of `ids`, a pure function of (seed, split, step)."""
  rng = np.random.default_rng([seed, split_id, step])
  starts = rng.integers(0, len(ids) - length, size=batch_size)
  return ids[starts[:, None] + np.arange(length)]


def bert_mask(tokens: np.ndarray, rng: np.random.Generator, *, rate: float, mask_id: int,
              vocab_size: int) -> dict[str, np.ndarray]:
  """BERT masking of one row: select each position with prob `rate` (at least one); selected
  -> 80% `mask_id`, 10% a random id in [0, vocab_size), 10% unchanged."""
  selected = rng.random(tokens.shape) < rate
  if not selected.any():
    selected[rng.integers(len(tokens))] = True
  action = rng.random(tokens.shape)
  random_ids = rng.integers(0, vocab_size, size=tokens.shape, dtype=np.int32)
  inputs = np.where(selected & (action < MLM_MASK_FRACTION), mask_id, tokens)
  swap = selected & (action >= MLM_MASK_FRACTION)
  swap &= action < MLM_MASK_FRACTION + MLM_RANDOM_FRACTION
  inputs = np.where(swap, random_ids, inputs).astype(np.int32)
  return {"inputs": inputs, "targets": tokens.astype(np.int32),
          "weights": selected.astype(np.float32)}


def _check_data_config(data_config):
  """The shared keys through their typed settings, then what a text source needs besides."""
  if run_settings.parse_section("data", data_config).seq_len is None:
    raise ValueError("data.seq_len is not set; a text source needs it: set "
                     "--config.data.seq_len=<tokens per example>")
  packing_mode = data_config.get("packing")
  if packing_mode is not None and packing_mode not in PACKING_MODES:
    raise ValueError(f"data.packing={packing_mode!r} must be one of {PACKING_MODES}")
  if data_config.get("tokenizer") is None:
    raise ValueError("data.tokenizer is not set; use 'char', 'spm:bpe:<vocab_size>', "
                     "'spm:unigram:<vocab_size>' or 'hf:<path>'")


class _TextPipeline:
  """Shared construction: config checks, source, tokenizer, batch sizes, process slice."""
  task = "lm"

  def __init__(self, data_config, *, seed: int, global_batch_size: int, eval_batch_size: int,
               process_index: int = 0, process_count: int = 1, workdir: str | os.PathLike,
               data_dir: str | os.PathLike | None = None):
    _check_data_config(data_config)
    self.local_batch_size = batching.local_batch_size(global_batch_size, process_count)
    if not isinstance(eval_batch_size, int) or eval_batch_size < 1 or (
        eval_batch_size % process_count):
      raise ValueError(f"eval_batch_size={eval_batch_size!r} must be a positive multiple of "
                       f"the {process_count} processes")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index={process_index} must be in [0, {process_count})")
    self.config, self.seed = data_config, int(seed)
    self.seq_len = data_config.seq_len
    self.global_batch_size, self.eval_batch_size = global_batch_size, eval_batch_size
    self.process_index, self.process_count = process_index, process_count
    self.source = TextSource(data_config, data_dir)
    self.data_dir = text_builder.resolve_data_dir(data_dir)
    self.tokenizer = pipeline_tokenizer(data_config, self.source, workdir)
    self.info = {"vocab_size": self.tokenizer.vocab_size}

  def _rows(self, batch_size: int) -> slice:
    """This process's rows [p*L, (p+1)*L) of a global batch."""
    local = batch_size // self.process_count
    return slice(self.process_index * local, (self.process_index + 1) * local)


class _StreamMixin:
  """Token streams per split and the random-window batches drawn from them."""

  def _load_streams(self, window: int):
    self.window = window
    self.streams = {}
    for role in SPLIT_IDS:
      ids = encode_stream(self.tokenizer, self.source, role)
      if len(ids) <= window:
        raise ValueError(f"data.seq_len={self.seq_len} is longer than the {role} split of "
                         f"data.source={self.config.source!r} ({len(ids)} tokens); lower "
                         "data.seq_len")
      self.streams[role] = ids

  def _windows(self, role: str, step: int, batch_size: int) -> np.ndarray:
    """This process's rows of the global batch of random windows of `step`."""
    windows = stream_windows(self.streams[role], seed=self.seed, split_id=SPLIT_IDS[role],
                             step=step, batch_size=batch_size, length=self.window)
    return windows[self._rows(batch_size)]

  def _consecutive_windows(self) -> grain.MapDataset:
    """The eval split once, in non-overlapping windows (for data.eval_batches=None)."""
    ids = self.streams["validation"]
    stride = self.seq_len
    count = (len(ids) - self.window) // stride + 1
    return grain.MapDataset.range(count).map(
        lambda i: self._example(ids[i * stride:i * stride + self.window], int(i)))

  def eval_batches(self) -> Iterable[dict[str, np.ndarray]]:
    num = self.config.get("eval_batches")
    if num is None:
      return batching.eval_batches(self._consecutive_windows(),
                                   global_batch_size=self.eval_batch_size,
                                   process_index=self.process_index,
                                   process_count=self.process_count)
    return (self._eval_batch(i) for i in range(num))


class LMStreamPipeline(_StreamMixin, _TextPipeline):
  """Next-token prediction on random windows of the token stream: {'inputs', 'targets'}."""

  def __init__(self, data_config, **kw):
    super().__init__(data_config, **kw)
    self._load_streams(self.seq_len + 1)

  def _example(self, window: np.ndarray, index: int) -> dict[str, np.ndarray]:
    return {"inputs": window[:-1], "targets": window[1:]}

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    windows = self._windows("train", step, self.global_batch_size)
    return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}

  def _eval_batch(self, i: int) -> dict[str, np.ndarray]:
    windows = self._windows("validation", i, self.eval_batch_size)
    return {"inputs": windows[:, :-1], "targets": windows[:, 1:],
            batching.VALID: np.ones(len(windows), np.float32)}


class MLMPipeline(_StreamMixin, _TextPipeline):
  """BERT masked LM on stream windows of seq_len tokens: {'inputs' (masked), 'targets',
  'weights' (1 at selected positions)}. Masking is a pure function of (seed, split, step,
  global row), so it does not depend on the process count either."""
  task = "mlm"

  def __init__(self, data_config, **kw):
    super().__init__(data_config, **kw)
    if data_config.get("packing") == "packed":
      raise ValueError("data.packing='packed' is for task 'lm'; MLM reads stream windows "
                       "(set data.packing='stream')")
    rate = data_config.get("mask_rate", 0.15)
    if not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
      raise ValueError(f"data.mask_rate={rate!r} must be in (0, 1], e.g. 0.15")
    self.mask_rate = float(rate)
    self.mask_id = self.tokenizer.mask_id
    if self.mask_id is None:                     # append a [MASK] id after the vocabulary
      self.mask_id = self.tokenizer.vocab_size
      self.info = {"vocab_size": self.tokenizer.vocab_size + 1}
    self._load_streams(self.seq_len)

  def _mask(self, tokens: np.ndarray, key: list[int]) -> dict[str, np.ndarray]:
    return bert_mask(tokens, np.random.default_rng([self.seed, *key]), rate=self.mask_rate,
                     mask_id=self.mask_id, vocab_size=self.tokenizer.vocab_size)

  def _masked_batch(self, role: str, step: int, batch_size: int) -> dict[str, np.ndarray]:
    windows = self._windows(role, step, batch_size)
    first = self._rows(batch_size).start
    rows = [self._mask(w, [SPLIT_IDS[role], step, first + r]) for r, w in enumerate(windows)]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

  def _example(self, window: np.ndarray, index: int) -> dict[str, np.ndarray]:
    return self._mask(window, [SPLIT_IDS["validation"], index])

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    return self._masked_batch("train", step, self.global_batch_size)

  def _eval_batch(self, i: int) -> dict[str, np.ndarray]:
    batch = self._masked_batch("validation", i, self.eval_batch_size)
    return {**batch, batching.VALID: np.ones(len(batch["inputs"]), np.float32)}


def _packed_example(row: np.ndarray) -> dict[str, np.ndarray]:
  """A packed row [3, seq_len + 1] -> next-token example with segment-aware weights."""
  tokens, segments, positions = row
  weights = (segments[1:] == segments[:-1]) & (segments[1:] != 0)
  return {"inputs": tokens[:-1], "targets": tokens[1:], "segment_ids": segments[:-1],
          "positions": positions[:-1], "weights": weights.astype(np.float32)}


def write_array_record(path: str | os.PathLike, rows: Iterable[bytes]):
  """Write records to `path` as `rows` yields them, atomically: into a temporary file that
  is renamed when complete, or removed if `rows` raises."""
  from array_record.python.array_record_module import ArrayRecordWriter
  tmp = f"{path}.tmp-{os.getpid()}"
  writer, complete = ArrayRecordWriter(tmp, "group_size:1"), False
  try:
    for row in rows:
      writer.write(row)
    complete = True
  finally:
    writer.close()
    if not complete:
      os.remove(tmp)
  os.replace(tmp, path)


class LMPackedPipeline(_TextPipeline):
  """Next-token prediction on packed documents: {'inputs', 'targets', 'segment_ids',
  'positions', 'weights'} with weight 0 on padding and where the target starts the next
  document. Rows are read with grain from an ArrayRecord cache in the data dir."""

  def __init__(self, data_config, **kw):
    super().__init__(data_config, **kw)
    self.cache_dir = pathlib.Path(self.data_dir) / "jaxformer_packed" / self._cache_key()
    self.records = {role: self._packed_split(role) for role in SPLIT_IDS}
    self._train = batching.train_batches(
        self.records["train"], global_batch_size=self.global_batch_size, seed=self.seed,
        process_index=self.process_index, process_count=self.process_count)

  def _cache_key(self) -> str:
    key = json.dumps([PACKED_FORMAT, self.source.identity, self.tokenizer.fingerprint(),
                      self.seq_len])
    return hashlib.sha256(key.encode()).hexdigest()[:24]

  def _documents(self, role: str) -> Iterator[np.ndarray]:
    """Catalog records are documents (+eos); a text file is one document per record."""
    eos_id = self.tokenizer.eos_id
    eos = np.asarray([eos_id] if self.source.documents and eos_id is not None else [], np.int32)
    return (np.concatenate([self.tokenizer.encode(t), eos]) for t in self.source.records(role))

  def _write_packed(self, role: str, path: pathlib.Path):
    """Tokenize, pack and write the split as its records stream by (one open row in memory)."""
    rows = packing.pack_rows(self._documents(role), self.seq_len + 1)
    first = next(rows, None)
    if first is None:
      raise ValueError(f"the {role} split of data.source={self.config.source!r} is empty")
    self.cache_dir.mkdir(parents=True, exist_ok=True)
    write_array_record(path, (r.astype("<i4").tobytes() for r in itertools.chain([first], rows)))

  def _packed_split(self, role: str) -> grain.MapDataset:
    path = self.cache_dir / f"{role}.array_record"
    if not path.exists():
      self._write_packed(role, path)
    shape = (len(packing.PACKED_FIELDS), self.seq_len + 1)
    source = grain.sources.ArrayRecordDataSource(str(path))
    return grain.MapDataset.source(source).map(
        lambda b: _packed_example(np.frombuffer(b, "<i4").reshape(shape).astype(np.int32)))

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    return self._train[step]

  def eval_batches(self) -> Iterable[dict[str, np.ndarray]]:
    return batching.eval_batches(self.records["validation"],
                                 global_batch_size=self.eval_batch_size,
                                 process_index=self.process_index,
                                 process_count=self.process_count,
                                 max_batches=self.config.get("eval_batches"))


def make_text_pipeline(data_config, task: str = "lm", **kw) -> _TextPipeline:
  """The pipeline for `task` ('lm' | 'mlm') and `data.packing` (default: 'packed' for
  'tfds:' sources, 'stream' for text files); `kw` are the constructor's keyword arguments."""
  if task not in TASKS:
    raise ValueError(f"task={task!r} must be one of {TASKS}")
  if task == "mlm":
    return MLMPipeline(data_config, **kw)
  default = "packed" if str(data_config.get("source")).startswith("tfds:") else "stream"
  mode = data_config.get("packing") or default
  if mode not in PACKING_MODES:
    raise ValueError(f"data.packing={mode!r} must be one of {PACKING_MODES}")
  return (LMPackedPipeline if mode == "packed" else LMStreamPipeline)(data_config, **kw)
