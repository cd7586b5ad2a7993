"""Post-training data: JSON Lines of prompt/response examples (SFT) or preference pairs (DPO),
tokenized with the source run's tokenizer.

SFT records: {"prompt": str, "response": str}, or {"messages": [{"role": ..., "content":
...}, ...]} rendered with the chat template below (several turns; the loss is on every
assistant turn). Prompt and response are tokenized separately and concatenated (so the
boundary is exact whatever the tokenizer merges), followed by the tokenizer's eos where it has
one (the char tokenizer has none: the model then never learns where a response ends).

An example of n tokens gives n - 1 next-token predictions: `inputs` = ids[:-1], `targets` =
ids[1:], `weights` 1 where the target is a response token (the eos included), 0 on the
prompt. Examples are packed next-fit (data/packing.py) into rows of `data.seq_len`
predictions with `segment_ids` 1..k (0: padding) and `positions` from 0 in each example; the
decoder's attention takes the segment ids, so no token attends across examples, and a row's
per-example logits equal that example's logits alone (tests/unit/posttrain/test_posttrain_sft.py). An
example longer than a row is cut to its first seq_len predictions (counted in
`info['truncated']`), never split across rows. An example left with no response token (an
empty response with a tokenizer that has no eos, or a response cut away) has nothing to learn
or score: it is dropped and counted (`info['dropped_examples']`, one printed line); a split
with none left is refused before training (it would train to loss 0 and perplexity 1).

Chat template (the project's own, plain text so the char tokenizer can write it):
each turn is "{role}: " (never weighted) then "{content}\n" (weighted on assistant turns).

DPO records: {"prompt", "chosen", "rejected"}: each pair gives two unpacked rows, prompt +
chosen and prompt + rejected (+ eos), cut and padded to seq_len predictions, with weights 1 on
the completion's targets: a batch of B pairs is {'chosen_inputs', 'chosen_targets',
'chosen_weights', 'rejected_*'} of [B, seq_len] and 'pairs' [B] (1.0; the eval's padding rows
carry `valid` 0). Padding at the end of a causal row changes nothing before it, so no segment
ids are needed. A pair whose chosen or rejected completion is cut away entirely is dropped
(counted in `info['dropped_pairs']`), and so is a pair whose chosen and rejected rows are equal
(`info['identical_pairs']`: its loss is log 2 whatever the params, its gradient 0, its reward
accuracy 0); both are counted in one printed line. A split with no pair left is refused
before training.

GRPO records: {"prompt", ...} (any other field, e.g. 'answer', is for the reward): each gives
a right-padded prompt row (`GRPOPipeline`); the completions are sampled during training
(jaxformer/tasks/grpo.py).

Splits: `data.source` (train) and `data.eval_source` (optional; else a record goes to eval
when a hash of its line falls in the last 1 - `data.train_fraction` (default 0.9)); the keys
are typed in `jaxformer.data.settings.PosttrainRecordsSettings`, which the pipelines take.
Everything is read and packed in memory when the pipeline is made (fine for the CPU-sized
sets this was built for; a large set needs the prepared-corpus path of data/corpus).
"""

from __future__ import annotations

import json
import zlib

import grain
import numpy as np

from jaxformer import jsonfile, paths
from jaxformer.data import batching, packing
from jaxformer.data import settings as source_settings

SFT_FIELDS = ("prompt", "response")
DPO_FIELDS = ("prompt", "chosen", "rejected")
ROLES = ("system", "user", "assistant")
TURN_HEADER = "{role}: "
TURN_END = "\n"


def read_jsonl(source: str, key: str = "data.source") -> list[tuple[str, dict]]:
  """(where, record) of every non-empty line, `where` being 'file:line'; a ValueError names
  the line, or `key` when the file is missing or empty."""
  return jsonfile.read_jsonl(paths.path(source, f"--config.{key}"), name=source, field=key,
                             holds="records (JSON objects)")


def _text(record, field, where):
  value = record.get(field)
  if not isinstance(value, str):
    got = "missing" if field not in record else f"a {type(value).__name__}"
    raise ValueError(f"{where}: field {field!r} is {got}, expected a string")
  return value


def sft_pieces(record: dict, where: str) -> list[tuple[str, bool]]:
  """The (text, weighted) pieces of one SFT record, in order."""
  if "messages" in record:
    turns = record["messages"]
    if not isinstance(turns, list) or not turns:
      raise ValueError(f"{where}: 'messages' must be a non-empty list of "
                       "{'role', 'content'} objects")
    pieces = []
    for i, turn in enumerate(turns):
      if not isinstance(turn, dict) or turn.get("role") not in ROLES:
        raise ValueError(f"{where}: messages[{i}] must have 'role' one of {ROLES}")
      content = _text(turn, "content", f"{where}: messages[{i}]")
      pieces += [(TURN_HEADER.format(role=turn["role"]), False),
                 (content + TURN_END, turn["role"] == "assistant")]
    if not any(w for _, w in pieces):
      raise ValueError(f"{where}: 'messages' has no assistant turn to train on")
    return pieces
  if not all(f in record for f in SFT_FIELDS):
    missing = [f for f in SFT_FIELDS if f not in record]
    raise ValueError(f"{where}: missing field {missing[0]!r}; SFT records need 'prompt' and "
                     f"'response' (or 'messages'); the record has {sorted(record)}")
  return [(_text(record, "prompt", where), False), (_text(record, "response", where), True)]


def encode_pieces(tokenizer, pieces, where: str) -> tuple[np.ndarray, np.ndarray]:
  """(ids [n], weighted [n] bool) of the concatenated pieces, + eos (weighted) if any."""
  ids, weighted = [], []
  for text, w in pieces:
    try:
      piece = np.asarray(tokenizer.encode(text), np.int32)
    except ValueError as e:
      raise ValueError(f"{where}: {e}") from None
    ids.append(piece)
    weighted.append(np.full(len(piece), w))
  if tokenizer.eos_id is not None:
    ids.append(np.array([tokenizer.eos_id], np.int32))
    weighted.append(np.array([True]))
  return np.concatenate(ids), np.concatenate(weighted)


def sft_example(ids: np.ndarray, weighted: np.ndarray, max_len: int) -> dict[str, np.ndarray]:
  """The next-token example of one tokenized record, cut to `max_len` predictions."""
  n = min(len(ids) - 1, max_len)
  return {"inputs": ids[:n], "targets": ids[1:n + 1],
          "weights": weighted[1:n + 1].astype(np.float32)}


def pack_examples(examples: list[dict], row_len: int) -> list[dict[str, np.ndarray]]:
  """Next-fit rows of `row_len` predictions: inputs, targets, weights, segment_ids 1..k
  (0 = padding), positions from 0 per example. Examples are never split (cut them first)."""
  rows, start = [], 0
  lengths = [len(e["inputs"]) for e in examples]
  if max(lengths, default=0) > row_len:
    raise ValueError(f"an example of {max(lengths)} predictions does not fit a row of "
                     f"{row_len}; cut it first (sft_example)")
  for pieces in packing.next_fit(lengths, row_len):
    row = {"inputs": np.zeros(row_len, np.int32), "targets": np.zeros(row_len, np.int32),
           "weights": np.zeros(row_len, np.float32),
           "segment_ids": np.zeros(row_len, np.int32), "positions": np.zeros(row_len, np.int32)}
    at = 0
    for k, n in enumerate(pieces, 1):
      e = examples[start]
      start += 1
      for key in ("inputs", "targets", "weights"):
        row[key][at:at + n] = e[key]
      row["segment_ids"][at:at + n] = k
      row["positions"][at:at + n] = np.arange(n)
      at += n
    rows.append(row)
  return rows


def _in_eval(line: str, train_fraction: float) -> bool:
  return (zlib.crc32(line.encode()) % 10_000) >= train_fraction * 10_000


def _records_settings(data) -> source_settings.PosttrainRecordsSettings:
  return source_settings.coerce("posttrain_records", data)


def split_records(data) -> dict[str, list[tuple[str, dict]]]:
  """{'train': [(where, record)], 'validation': [...]} from data.source / data.eval_source
  (`data`: the typed settings, or a data section to parse)."""
  data = _records_settings(data)
  source, eval_source, fraction = data.source, data.eval_source, data.train_fraction
  train = read_jsonl(source, "data.source")
  if eval_source:
    return {"train": train, "validation": read_jsonl(eval_source, "data.eval_source")}
  split = {"train": [], "validation": []}
  for where, r in train:
    split["validation" if _in_eval(json.dumps(r, sort_keys=True), fraction)
          else "train"].append((where, r))
  return split


def _split_source(data, role: str) -> str:
  """The config field (and file) a split's records come from."""
  if role == "validation" and data.eval_source:
    return f"data.eval_source={data.eval_source!r}"
  return f"data.source={data.source!r}"


def dropped_summary(pipeline, what: str, why: str) -> str | None:
  """One line counting the records each split dropped (None: none dropped)."""
  parts = [f"{d} of {n} {role}" for role, (d, n) in pipeline.dropped.items() if d]
  if not parts:
    return None
  return f"{pipeline.task} data: dropped {' and '.join(parts)} {what} ({why})"


def _check_split(data, role: str, items: list, total: int):
  """After every record of a split was read (so a bad field is reported first)."""
  if not items:
    raise ValueError(f"data.source={data.source!r}: the {role} split is empty "
                     f"({total} records, data.train_fraction="
                     f"{data.train_fraction}); add records or set "
                     "data.eval_source")


class SFTPipeline(batching.SplitPipeline):
  """Packed SFT rows (see the module docstring), batched like every pipeline: step-indexed
  and independent of the process count (`batching.train_batches`)."""
  task = "sft"

  def _start(self, data, tokenizer):
    data = _records_settings(data)
    if data.seq_len is None:
      raise ValueError("data.seq_len is not set: set --config.data.seq_len=<tokens per row>")
    self.data, self.tokenizer = data, tokenizer
    self.seq_len = int(data.seq_len)
    return data

  def __init__(self, data, tokenizer, *, seed: int, global_batch_size: int,
               eval_batch_size: int, process_index: int = 0, process_count: int = 1):
    data = self._start(data, tokenizer)
    truncated, weighted, self.records, self.dropped = 0, 0, {}, {}
    splits = split_records(data)
    encoded = {role: [(where, encode_pieces(tokenizer, sft_pieces(r, where), where))
                      for where, r in records] for role, records in splits.items()}
    total = sum(len(r) for r in splits.values())
    for role, records in encoded.items():
      _check_split(data, role, records, total)
      examples = []
      for where, (ids, w) in records:
        truncated += len(ids) - 1 > self.seq_len
        e = sft_example(ids, w, self.seq_len)
        if e["weights"].any():           # else nothing to learn or score: dropped, counted
          weighted += int(e["weights"].sum())
          examples.append(e)
      self.dropped[role] = (len(records) - len(examples), len(records))
      if not examples:
        raise ValueError(
            f"{_split_source(data, role)}: no {role} example has a response token to "
            f"train on ({len(records)} records, each response empty or cut away by "
            f"data.seq_len={self.seq_len}"
            + ("" if tokenizer.eos_id is not None else "; the tokenizer has no eos to learn")
            + "): it would train to loss 0; give the records non-empty responses or raise "
            "data.seq_len")
      self.records[role] = grain.MapDataset.source(pack_examples(examples, self.seq_len))
    self.info = {"vocab_size": tokenizer.vocab_size, "truncated": truncated,
                 "response_tokens": weighted,
                 "dropped_examples": sum(d for d, _ in self.dropped.values())}
    self._batch_splits(self.records["train"], self.records["validation"], seed=seed,
                       global_batch_size=global_batch_size, eval_batch_size=eval_batch_size,
                       process_index=process_index, process_count=process_count,
                       max_eval_batches=data.eval_batches)


def dpo_pair(tokenizer, record: dict, where: str, seq_len: int) -> dict[str, np.ndarray] | None:
  """The padded rows of one preference pair (None: a completion was cut away)."""
  missing = [f for f in DPO_FIELDS if f not in record]
  if missing:
    raise ValueError(f"{where}: missing field {missing[0]!r}; DPO records need 'prompt', "
                     f"'chosen' and 'rejected'; the record has {sorted(record)}")
  prompt = _text(record, "prompt", where)
  out = {"pairs": np.float32(1.0)}
  for side in ("chosen", "rejected"):
    ids, w = encode_pieces(tokenizer, [(prompt, False), (_text(record, side, where), True)],
                           where)
    e = sft_example(ids, w, seq_len)
    if not e["weights"].any():
      return None
    n = len(e["inputs"])
    for key, value in e.items():
      padded = np.zeros(seq_len, value.dtype)
      padded[:n] = value
      out[f"{side}_{key}"] = padded
  return out


def same_rows(pair: dict[str, np.ndarray]) -> bool:
  """Whether a pair's chosen and rejected rows are equal (as tokenized and cut): its DPO
  loss is log 2 whatever the params, with a zero gradient, and its reward accuracy 0."""
  return all(np.array_equal(pair[f"chosen_{k}"], pair[f"rejected_{k}"])
             for k in ("inputs", "targets", "weights"))


class DPOPipeline(SFTPipeline):
  """Preference pairs (see the module docstring), batched like every pipeline."""
  task = "dpo"

  def __init__(self, data, tokenizer, *, seed: int, global_batch_size: int,
               eval_batch_size: int, process_index: int = 0, process_count: int = 1):
    data = self._start(data, tokenizer)
    dropped, identical, self.records, self.dropped = 0, 0, {}, {}
    splits = split_records(data)
    encoded = {role: [dpo_pair(tokenizer, r, where, self.seq_len) for where, r in records]
               for role, records in splits.items()}
    total = sum(len(r) for r in splits.values())
    for role, pairs in encoded.items():
      _check_split(data, role, pairs, total)
      where = _split_source(data, role)
      cut = [p for p in pairs if p is not None]
      if not cut:
        raise ValueError(f"{where}: no {role} pair has a completion within "
                         f"data.seq_len={self.seq_len}; raise data.seq_len")
      kept = [p for p in cut if not same_rows(p)]
      if not kept:
        raise ValueError(f"{where}: every {role} pair's chosen equals its rejected "
                         f"({len(cut)} pairs, as tokenized and cut to data.seq_len="
                         f"{self.seq_len}): there is no preference to learn; give each "
                         "pair two different completions")
      dropped += len(pairs) - len(cut)
      identical += len(cut) - len(kept)
      self.dropped[role] = (len(pairs) - len(kept), len(pairs))
      self.records[role] = grain.MapDataset.source(kept)
    self.info = {"vocab_size": tokenizer.vocab_size, "dropped_pairs": dropped,
                 "identical_pairs": identical}
    self._batch_splits(self.records["train"], self.records["validation"], seed=seed,
                       global_batch_size=global_batch_size, eval_batch_size=eval_batch_size,
                       process_index=process_index, process_count=process_count,
                       max_eval_batches=data.eval_batches)


def grpo_prompt(tokenizer, record: dict, where: str, width: int) -> dict | None:
  """The right-padded prompt row of one GRPO record (None: longer than `width` tokens)."""
  ids = encode_prompt(tokenizer, record, where)
  if len(ids) > width:
    return None
  row = np.zeros(width, np.int32)
  row[:len(ids)] = ids
  return {"prompt": row, "prompt_len": np.int32(len(ids))}


def encode_prompt(tokenizer, record: dict, where: str) -> np.ndarray:
  prompt = _text(record, "prompt", where)
  if not prompt:
    raise ValueError(f"{where}: field 'prompt' is empty; a completion needs a prompt to follow")
  try:
    return np.asarray(tokenizer.encode(prompt), np.int32)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None


class GRPOPipeline(SFTPipeline):
  """Prompts for GRPO (task "grpo"): {"prompt": str, ...} records; a row is {'prompt' [W]
  int32 right-padded, 'prompt_len', 'index' (the record's place in its split, so the reward
  finds the whole record: `records_of`)}, W = data.seq_len + 1 - posttrain.max_new_tokens
  (prompt and completion fill one row of seq_len predictions). A prompt longer than W tokens
  is dropped and counted (`info['dropped_prompts']`, one printed line); a split with none
  left is refused. Batches hold `global_batch_size` prompts (the task samples
  posttrain.num_generations completions of each: train.batch_size / k prompts per step)."""
  task = "grpo"

  def __init__(self, data, tokenizer, *, max_new_tokens: int, seed: int,
               global_batch_size: int, eval_batch_size: int, process_index: int = 0,
               process_count: int = 1):
    data = self._start(data, tokenizer)
    self.seed = seed                     # the rollout's sampling seeds derive from it
    self.width = self.seq_len + 1 - max_new_tokens
    self.records, self.dropped, self.raw = {}, {}, {}
    splits = split_records(data)
    total = sum(len(r) for r in splits.values())
    for role, records in splits.items():
      _check_split(data, role, records, total)
      rows, kept = [], []
      for where, record in records:
        row = grpo_prompt(tokenizer, record, where, self.width)
        if row is not None:
          rows.append({**row, "index": np.int32(len(kept))})
          kept.append(record)
      self.dropped[role] = (len(records) - len(kept), len(records))
      if not kept:
        raise ValueError(f"{_split_source(data, role)}: no {role} prompt fits "
                         f"{self.width} tokens (data.seq_len={self.seq_len} + 1 - "
                         f"posttrain.max_new_tokens={max_new_tokens}); raise data.seq_len")
      self.raw[role] = kept
      self.records[role] = grain.MapDataset.source(rows)
    self.info = {"vocab_size": tokenizer.vocab_size,
                 "dropped_prompts": sum(d for d, _ in self.dropped.values())}
    self._batch_splits(self.records["train"], self.records["validation"], seed=seed,
                       global_batch_size=global_batch_size, eval_batch_size=eval_batch_size,
                       process_index=process_index, process_count=process_count,
                       max_eval_batches=data.eval_batches)

  def records_of(self, train: bool) -> list[dict]:
    """The records of the train (or validation) split, as the rows' 'index' numbers them."""
    return self.raw["train" if train else "validation"]


def make_pipeline(config, task: str, *, workdir: str, seed: int, global_batch_size: int,
                  eval_batch_size: int, process_index: int = 0, process_count: int = 1,
                  data_dir=None, data=None, posttrain=None):
  """The SFT, DPO or GRPO pipeline of `config` (`posttrain`: its PosttrainSettings), with the
  tokenizer of `posttrain.init_from`,
  saved into `workdir` too (so sampling the post-trained run finds it, and a resume reads that
  copy, not the source: `start.run_tokenizer`). `data`: the typed data settings
  (`PosttrainRecordsSettings`; None: `config`'s data section parsed)."""
  from jaxformer.posttrain import start
  if task not in ("sft", "dpo", "grpo"):
    raise ValueError(f"task={task!r} has no post-training pipeline (sft, dpo, grpo)")
  tokenizer = start.run_tokenizer(config, workdir)
  kw = dict(seed=seed, global_batch_size=global_batch_size, eval_batch_size=eval_batch_size,
            process_index=process_index, process_count=process_count)
  data = source_settings.coerce("posttrain_records", config if data is None else data)
  if task == "grpo":                      # batches of prompts: k completions each
    k, max_new = posttrain.num_generations, posttrain.max_new_tokens
    kw.update(global_batch_size=global_batch_size // k, eval_batch_size=eval_batch_size // k)
    pipeline = GRPOPipeline(data, tokenizer, max_new_tokens=max_new, **kw)
  else:
    pipeline = (SFTPipeline if task == "sft" else DPOPipeline)(data, tokenizer, **kw)
  if process_index == 0:                  # after the data passed its checks
    tokenizer.save(workdir)
    line = (dropped_summary(pipeline, "examples with no response token to learn",
                            "an empty response, or one cut away by data.seq_len")
            if task == "sft" else
            dropped_summary(pipeline, "pairs with no preference to learn",
                            "chosen equal to rejected, or a completion cut away by "
                            "data.seq_len") if task == "dpo" else
            dropped_summary(pipeline, "prompts too long to leave room for a completion",
                            "longer than data.seq_len + 1 - posttrain.max_new_tokens tokens"))
    if line:
      print(line, flush=True)
  return pipeline
