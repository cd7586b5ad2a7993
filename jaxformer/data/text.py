"""Text pipelines for language modelling (LM), BERT masked LM (MLM) and BERT's MLM with
next-sentence prediction (sentence pairs, `NSPPipeline`), one constructor each.

`make_text_pipeline(config.data, task, seed=..., global_batch_size=..., eval_batch_size=...,
workdir=..., data_dir=...)` gives a `batching.Pipeline`: `train_batch(step)` is this process's
rows of the global batch of `step`, a pure function of (seed, step), so a resumed run reads
what an uninterrupted one would and the global batch does not depend on the process count.

Sources (`data.source`, see corpus/sources.py): files, directories or globs of .txt, .jsonl
and .parquet (optionally .gz), a saved Hugging Face dataset, a TFDS catalog dataset
`tfds:<name>`, or `tinyshakespeare`. Each is tokenized once into sharded token files under
`data.data_dir` (corpus/prepare.py) that every run then reads by offset; the tokenizer
(`data.tokenizer`, see tokenizers.py) is made once and saved in the workdir. The source's
own keys (`text_field`, `train_fraction`, `train_split` / `eval_split`, `workers`, `packing`,
and MLM's `mask_rate`) are typed in `jaxformer.data.settings` (`TextSettings`,
`MaskedTextSettings`), which the pipelines take.

Splits: a single .txt file is one text whose first `train_fraction` of the characters train
(nanoGPT); otherwise every document (a .txt file, a JSON line, a row) goes to train or
validation by a hash of its text (corpus/work.py); datasets with named splits keep them.

Modes (`data.packing`):
- "stream" (default for a single text file): a split is one token stream; step s draws random
  windows with `np.random.default_rng([seed, split_id, s])` (nanoGPT's sampling, bit-identical
  to the earlier `TextCorpus.batch`). Eval batch i uses step index i on the eval split, drawn
  with EVAL_SEED rather than the run's seed (MLM eval masks too): the eval set belongs to the
  data, so runs of different seeds are scored on the same tokens and a seed study measures
  training noise, not the eval sample's. With `data.eval_batches=None` eval instead covers the
  split once in consecutive windows.
- "packed" (default for documents): documents (+eos, where the tokenizer has one) are packed
  next-fit into rows (packing.py), indexed once per sequence length from the document lengths
  and batched with `batching.train_batches` / `batching.eval_batches`. On a single text file
  (one document) this gives consecutive non-overlapping rows: an epoch sees every token once.
"""

from __future__ import annotations

import os
from typing import Iterable

import grain
import numpy as np

from jaxformer.data import batching, tokenizers
from jaxformer.data import settings as source_settings
from jaxformer.data.corpus import prepare, sources
from jaxformer.data.corpus.tokens import TokenStream
from jaxformer.data.corpus.work import ROLES

SPLIT_IDS = dict(zip(ROLES, (0, 1)))         # the split_id of the window RNG
EVAL_SEED = 0                                 # eval windows and masks: the same for every run seed
PACKING_MODES = source_settings.PACKING_MODES
TASKS = ("lm", "mlm", "mlm_nsp")
MLM_MASK_FRACTION, MLM_RANDOM_FRACTION = 0.8, 0.1    # of the selected positions (BERT)


def corpus_options(data: source_settings.TextSettings) -> prepare.Options:
  """The source's own reading keys, as the corpus preparation takes them."""
  return prepare.Options(text_field=data.text_field, train_fraction=float(data.train_fraction),
                         split_names=(data.train_split, data.eval_split),
                         workers=data.workers)


def stream_windows(stream: TokenStream, *, seed: int, split_id: int, step: int,
                   batch_size: int, length: int, rows: slice = slice(None)) -> np.ndarray:
  """Rows `rows` of the [batch_size, length] random windows of `stream`, a pure function of
  (seed, split, step); only those rows are read."""
  rng = np.random.default_rng([seed, split_id, step])
  starts = rng.integers(0, len(stream) - length, size=batch_size)[rows]
  return np.stack([stream.read(int(s), length) for s in starts]).reshape(len(starts), length)


def bert_mask(tokens: np.ndarray, rng: np.random.Generator, *, rate: float, mask_id: int,
              vocab_size: int, maskable: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """BERT masking of one row: select each position with prob `rate` (at least one; only
  where `maskable`, if given: not [CLS]/[SEP]); selected -> 80% `mask_id`, 10% a random id in
  [0, vocab_size), 10% unchanged."""
  selected = rng.random(tokens.shape) < rate
  if maskable is not None:
    selected &= maskable
  if not selected.any():
    candidates = np.arange(len(tokens)) if maskable is None else np.flatnonzero(maskable)
    selected[candidates[rng.integers(len(candidates))]] = True
  action = rng.random(tokens.shape)
  random_ids = rng.integers(0, vocab_size, size=tokens.shape, dtype=np.int32)
  inputs = np.where(selected & (action < MLM_MASK_FRACTION), mask_id, tokens)
  swap = selected & (action >= MLM_MASK_FRACTION)
  swap &= action < MLM_MASK_FRACTION + MLM_RANDOM_FRACTION
  inputs = np.where(swap, random_ids, inputs).astype(np.int32)
  return {"inputs": inputs, "targets": tokens.astype(np.int32),
          "weights": selected.astype(np.float32)}


def _check_data(data: source_settings.TextSettings):
  """What a text source needs besides its typed keys."""
  if data.seq_len is None:
    raise ValueError("data.seq_len is not set; a text source needs it: set "
                     "--config.data.seq_len=<tokens per example>")
  if data.tokenizer is None:
    raise ValueError("data.tokenizer is not set; use 'char', 'spm:bpe:<vocab_size>', "
                     "'spm:unigram:<vocab_size>' or 'hf:<path>'")


class _TextPipeline:
  """Shared construction: config checks, source, tokenizer, batch sizes, process slice.
  `data`: the typed settings of the pipeline's source kind (`data_kind`), or a data section
  to parse with it."""
  task = "lm"
  data_kind = "text"

  def __init__(self, data, *, seed: int, global_batch_size: int, eval_batch_size: int,
               process_index: int = 0, process_count: int = 1, workdir: str | os.PathLike,
               data_dir: str | os.PathLike | None = None):
    data = source_settings.coerce(self.data_kind, data)
    _check_data(data)
    self.local_batch_size = batching.local_batch_size(global_batch_size, process_count)
    if not isinstance(eval_batch_size, int) or eval_batch_size < 1 or (
        eval_batch_size % process_count):
      raise ValueError(f"eval_batch_size={eval_batch_size!r} must be a positive multiple of "
                       f"the {process_count} processes")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index={process_index} must be in [0, {process_count})")
    self.data, self.seed = data, int(seed)
    self.seq_len = data.seq_len
    self.global_batch_size, self.eval_batch_size = global_batch_size, eval_batch_size
    self.process_index, self.process_count = process_index, process_count
    self.corpus = prepare.prepare(data.source, data.tokenizer,
                                  options=corpus_options(data), workdir=workdir,
                                  data_dir=sources.resolve_data_dir(data_dir))
    self.tokenizer = self.corpus.tokenizer
    self.info = {"vocab_size": self.tokenizer.vocab_size}

  def _rows(self, batch_size: int) -> slice:
    """This process's rows [p*L, (p+1)*L) of a global batch."""
    local = batch_size // self.process_count
    return slice(self.process_index * local, (self.process_index + 1) * local)


class _StreamMixin:
  """Token streams per split and the random-window batches drawn from them."""

  def _load_streams(self, window: int):
    self.window = window
    self.streams = {role: self.corpus.stream(role) for role in SPLIT_IDS}
    for role, ids in self.streams.items():
      if len(ids) <= window:
        raise ValueError(f"data.seq_len={self.seq_len} is longer than the {role} split of "
                         f"data.source={self.data.source!r} ({len(ids)} tokens); lower "
                         "data.seq_len")

  def _windows(self, role: str, step: int, batch_size: int) -> np.ndarray:
    """This process's rows of the global batch of random windows of `step`."""
    seed = self.seed if role == "train" else EVAL_SEED
    return stream_windows(self.streams[role], seed=seed, split_id=SPLIT_IDS[role],
                          step=step, batch_size=batch_size, length=self.window,
                          rows=self._rows(batch_size))

  def _consecutive_windows(self) -> grain.MapDataset:
    """The eval split once, in non-overlapping windows (for data.eval_batches=None)."""
    ids = self.streams["validation"]
    stride = self.seq_len
    count = (len(ids) - self.window) // stride + 1
    return grain.MapDataset.range(count).map(
        lambda i: self._example(ids.read(int(i) * stride, self.window), int(i)))

  def eval_batches(self) -> Iterable[dict[str, np.ndarray]]:
    num = self.data.eval_batches
    if num is None:
      return batching.eval_batches(self._consecutive_windows(),
                                   global_batch_size=self.eval_batch_size,
                                   process_index=self.process_index,
                                   process_count=self.process_count)
    return (self._eval_batch(i) for i in range(num))


class _KeyedWindowsMixin(_StreamMixin):
  """Pipelines whose example is a random function of one stream window (masking, span
  corruption, denoising): the generator of a row is keyed by (seed, split, step, global row),
  the eval seed for evaluation, so a row does not depend on the process count or on
  resuming. Subclasses define `_transform(window, rng) -> dict of arrays`."""

  def _keyed(self, window: np.ndarray, key: list[int]) -> dict[str, np.ndarray]:
    seed = self.seed if key[0] == SPLIT_IDS["train"] else EVAL_SEED
    return self._transform(window, np.random.default_rng([seed, *key]))

  def _keyed_batch(self, role: str, step: int, batch_size: int) -> dict[str, np.ndarray]:
    windows = self._windows(role, step, batch_size)
    first = self._rows(batch_size).start
    rows = [self._keyed(w, [SPLIT_IDS[role], step, first + r]) for r, w in enumerate(windows)]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

  def _example(self, window: np.ndarray, index: int) -> dict[str, np.ndarray]:
    return self._keyed(window, [SPLIT_IDS["validation"], index])

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    return self._keyed_batch("train", step, self.global_batch_size)

  def _eval_batch(self, i: int) -> dict[str, np.ndarray]:
    batch = self._keyed_batch("validation", i, self.eval_batch_size)
    rows = len(next(iter(batch.values())))
    return {**batch, batching.VALID: np.ones(rows, np.float32)}


class LMStreamPipeline(_StreamMixin, _TextPipeline):
  """Next-token prediction on random windows of the token stream: {'inputs', 'targets'}."""

  def __init__(self, data, **kw):
    super().__init__(data, **kw)
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


class MLMPipeline(_KeyedWindowsMixin, _TextPipeline):
  """BERT masked LM on stream windows of seq_len tokens: {'inputs' (masked), 'targets',
  'weights' (1 at selected positions)}. Masking is a pure function of (seed, split, step,
  global row), so it does not depend on the process count either."""
  task = "mlm"
  data_kind = "masked_text"

  def __init__(self, data, **kw):
    super().__init__(data, **kw)
    self.mask_rate = float(self.data.mask_rate)
    ids, size = tokenizers.special_ids(self.tokenizer, tokenizers.TASK_SPECIAL_IDS["mlm"])
    self.mask_id = ids["mask_id"]                # else a [MASK] id after the vocabulary
    self.info = {"vocab_size": size}
    self._load_streams(self.seq_len)

  def _transform(self, tokens: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return bert_mask(tokens, rng, rate=self.mask_rate, mask_id=self.mask_id,
                     vocab_size=self.tokenizer.vocab_size)


class NSPPipeline(MLMPipeline):
  """BERT pre-training: masked LM plus next-sentence prediction on sentence pairs
  `[CLS] A [SEP] B [SEP]` of exactly seq_len tokens: {'inputs' (masked), 'targets', 'weights'
  (1 at masked positions, never at [CLS]/[SEP]), 'token_type_ids' (0 for [CLS] A [SEP], 1 for
  B [SEP]), 'nsp_labels' (0: B follows A, 1: B is random, as transformers' BertForPreTraining
  labels them)}.

  As in the BERT paper, a "sentence" is a span of contiguous text, not a linguistic sentence:
  A starts at a random position of the split's token stream and has a uniform random length
  in [1, seq_len - 4] (B gets the rest); with probability 1/2 B is the text right after A,
  else a span from a random position at least seq_len tokens away from A. Every row is a pure
  function of (seed, split, step, global row), so resumed runs and any process count read
  the same pairs. [CLS]/[SEP] are the tokenizer's bos/eos ids where it has them, else new ids
  after the vocabulary (after [MASK]): the char tokenizer's 65 symbols give a vocab of 68.
  Evaluation needs `data.eval_batches` (random pairs drawn with the eval seed)."""
  task = "mlm_nsp"

  def __init__(self, data, **kw):
    super().__init__(data, **kw)
    if self.data.eval_batches is None:
      raise ValueError("data.eval_batches is not set: next-sentence prediction evaluates on "
                       "random sentence pairs; set --config.data.eval_batches=<batches>")
    if self.seq_len < 5:
      raise ValueError(f"data.seq_len={self.seq_len} is too short for [CLS] A [SEP] B [SEP] "
                       "with non-empty A and B; use data.seq_len >= 5")
    ids, size = tokenizers.special_ids(self.tokenizer, tokenizers.TASK_SPECIAL_IDS["mlm_nsp"])
    self.cls_id, self.sep_id = ids["bos_id"], ids["eos_id"]
    self.info = {"vocab_size": size}

  def _pair(self, role: str, step: int, row: int) -> dict[str, np.ndarray]:
    stream = self.streams[role]
    seed = self.seed if role == "train" else EVAL_SEED
    rng = np.random.default_rng([seed, SPLIT_IDS[role], step, row])
    budget = self.seq_len - 3                     # tokens of A and B together
    first = int(rng.integers(1, budget))          # A's length
    start = int(rng.integers(0, len(stream) - budget))
    is_random = bool(rng.random() < 0.5)
    b_start = start + first
    if is_random:         # B starts anywhere but within seq_len tokens of the pair's text
      ends = len(stream) - (budget - first)       # B's possible starts: [0, ends)
      lo, hi = max(start - self.seq_len, 0), min(start + budget + self.seq_len, ends)
      allowed = ends - max(hi - lo, 0)
      if allowed > 0:
        b_start = int(rng.integers(0, allowed))
        b_start += (hi - lo) if b_start >= lo else 0
      else:                                       # a split too small to stay away
        b_start = int(rng.integers(0, ends))
    a = stream.read(start, first)
    b = stream.read(b_start, budget - first)
    cls, sep = np.array([self.cls_id]), np.array([self.sep_id])
    tokens = np.concatenate([cls, a, sep, b, sep]).astype(np.int32)
    types = np.zeros(self.seq_len, np.int32)
    types[first + 2:] = 1
    maskable = np.ones(self.seq_len, bool)
    maskable[[0, first + 1, self.seq_len - 1]] = False
    masked = bert_mask(tokens, rng, rate=self.mask_rate, mask_id=self.mask_id,
                       vocab_size=self.tokenizer.vocab_size, maskable=maskable)
    return {**masked, "token_type_ids": types, "nsp_labels": np.int32(is_random)}

  def _keyed_batch(self, role: str, step: int, batch_size: int) -> dict[str, np.ndarray]:
    rows = self._rows(batch_size)
    pairs = [self._pair(role, step, r) for r in range(rows.start, rows.stop)]
    return {k: np.stack([p[k] for p in pairs]) for k in pairs[0]}


def _packed_example(row: np.ndarray) -> dict[str, np.ndarray]:
  """A packed row [3, seq_len + 1] -> next-token example with segment-aware weights."""
  tokens, segments, positions = row
  weights = (segments[1:] == segments[:-1]) & (segments[1:] != 0)
  return {"inputs": tokens[:-1], "targets": tokens[1:], "segment_ids": segments[:-1],
          "positions": positions[:-1], "weights": weights.astype(np.float32)}


class LMPackedPipeline(_TextPipeline):
  """Next-token prediction on packed documents: {'inputs', 'targets', 'segment_ids',
  'positions', 'weights'} with weight 0 on padding and where the target starts the next
  document. Rows are read with grain through the prepared corpus's row index."""

  def __init__(self, data, **kw):
    super().__init__(data, **kw)
    self.records = {role: self.corpus.packed(role, self.seq_len + 1).map(_packed_example)
                    for role in SPLIT_IDS}
    self._train = batching.train_batches(
        self.records["train"], global_batch_size=self.global_batch_size, seed=self.seed,
        process_index=self.process_index, process_count=self.process_count)

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    return self._train[step]

  def eval_batches(self) -> Iterable[dict[str, np.ndarray]]:
    return batching.eval_batches(self.records["validation"],
                                 global_batch_size=self.eval_batch_size,
                                 process_index=self.process_index,
                                 process_count=self.process_count,
                                 max_batches=self.data.eval_batches)


def make_text_pipeline(data, task: str = "lm", **kw) -> _TextPipeline:
  """The pipeline for `task` ('lm' | 'mlm' | 'mlm_nsp') and `data.packing` (default: 'stream'
  for a single text file, 'packed' for documents); `data` is the typed settings
  (`source_settings.TextSettings`, `MaskedTextSettings` for mlm) or a data section to parse;
  `kw` are the constructor's keyword arguments."""
  if task not in TASKS:
    raise ValueError(f"task={task!r} must be one of {TASKS}")
  if task in ("mlm", "mlm_nsp"):
    return (MLMPipeline if task == "mlm" else NSPPipeline)(data, **kw)
  data = source_settings.coerce("text", data)
  mode = data.packing or ("stream" if sources.resolve(data.source).one_text else "packed")
  return (LMPackedPipeline if mode == "packed" else LMStreamPipeline)(data, **kw)
