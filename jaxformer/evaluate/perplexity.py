"""Perplexity and bits per byte of a decoder LM on a text source, read as training reads it.

The source (`data.source` of the run, or another one in any form training takes) is prepared
by `jaxformer.data.corpus.prepare` with the run's own tokenizer (nothing is written in the
workdir; the token files are cached under data.data_dir like training's). The split is then
scored as training's eval would see it, each token predicted once with rolling windows
(`scoring.rolling_rows`) of the run's data.seq_len:
- one text (data.packing='stream', the default for a single .txt file): the split is one
  token stream; its first token is context only;
- documents ('packed'): each document on its own (packed rows never attend across
  documents), its first token context only, its eos (where the tokenizer has one) scored.

`loss` is the mean nll per scored token in nats (training's eval_loss on the same windows);
`bits_per_byte` = the nll of the text's tokens / ln 2 / the UTF-8 bytes of the text those
tokens decode to. End-of-document tokens decode to no text, so they are left out of that
ratio's numerator as well: a tokenizer is not charged for a token other tokenizers do not
have, and char, BPE and SentencePiece runs compare on the same bytes.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from jaxformer import run_settings, tasks
from jaxformer.data import text as text_data
from jaxformer.data.corpus import prepare, sources
from jaxformer.evaluate.scoring import Scorer, concatenate, rolling_rows

SPLITS = ("train", "validation")
DECODE_CHUNK = 1 << 20            # tokens decoded at a time when counting bytes


def data_config(config, source: str | None):
  """The run's typed data settings (`tasks.saved_run_data`), with `source` in place of its
  data.source (and the packing the new source defaults to)."""
  data = tasks.saved_run_data(config)
  if source is not None:
    data = dataclasses.replace(data, source=source, packing=None)
  return data


def check_args(split: str, max_tokens: int | None):
  if split not in SPLITS:
    raise ValueError(f"--split={split!r} must be one of {SPLITS}")
  if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                 or max_tokens < 1):
    raise ValueError(f"--max_tokens={max_tokens!r} must be an int >= 1 (or unset: the whole "
                     "split)")


def prepared_split(config, tokenizer, workdir: str, *, source: str | None, split: str):
  """(token stream of `split`, whether it is one text) of the source, tokenized with the
  run's tokenizer."""
  data = data_config(config, source)
  options = text_data.corpus_options(data)
  spec = data.tokenizer
  corpus = prepare.prepare(data.source, spec, options=options, workdir=workdir,
                           data_dir=sources.resolve_data_dir(data.data_dir))
  if corpus.tokenizer.fingerprint() != tokenizer.fingerprint():
    raise ValueError(f"data.tokenizer={spec!r} of the run gives a tokenizer other than the "
                     f"run's tokenizer.json in {workdir}; the run's files do not match")
  mode = data.packing or ("stream" if sources.resolve(data.source).one_text else "packed")
  return corpus.stream(split), mode == "stream", data.source


def sequences(stream, one_text: bool, max_tokens: int | None):
  """The token sequences to score, in order, holding at most max_tokens predictions."""
  if one_text:
    yield stream.read(0, len(stream) if max_tokens is None else min(len(stream),
                                                                     max_tokens + 1))
    return
  start, left = 0, max_tokens
  for length in stream.document_lengths():
    if left is not None and left <= 0:
      return
    take = length if left is None else min(length, left + 1)
    if take >= 2:
      yield stream.read(start, take)
      if left is not None:
        left -= take - 1
    start += length


def text_bytes(tokenizer, tokens: np.ndarray) -> int:
  """UTF-8 bytes of the text `tokens` decode to."""
  return sum(len(tokenizer.decode(tokens[i:i + DECODE_CHUNK]).encode("utf-8"))
             for i in range(0, len(tokens), DECODE_CHUNK))


def special_ids(tokenizer) -> list[int]:
  return [i for i in (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)
          if i is not None]


def score_tokens(scorer: Scorer, tokenizer, seqs, *, rows_per_call: int = 4096) -> dict:
  """The metrics of scoring each sequence of `seqs` (its first token as context); the rows
  of many sequences are batched together."""
  specials = special_ids(tokenizer)
  logprobs, greedy, nll_text, counts = [], [], 0.0, dict(text_tokens=0, bytes=0)
  pending: list = []

  def flush():
    nonlocal nll_text
    scores = scorer.score([row for rows, _ in pending for row in rows])
    at = 0
    for rows, targets in pending:
      seq_score = concatenate(scores[at:at + len(rows)])
      at += len(rows)
      is_text = ~np.isin(targets, specials)
      logprobs.append(seq_score.logprobs)
      greedy.append(seq_score.greedy)
      nll_text -= float(seq_score.logprobs[is_text].sum())
      counts["text_tokens"] += int(is_text.sum())
      counts["bytes"] += text_bytes(tokenizer, targets[is_text])
    pending.clear()

  for seq in seqs:
    seq = np.asarray(seq)
    pending.append((rolling_rows(seq, scorer.width), seq[1:]))
    if sum(len(rows) for rows, _ in pending) >= rows_per_call:
      flush()
  flush()
  if not logprobs:
    raise ValueError("nothing to score: the split holds no sequence of 2 or more tokens")
  nll = -np.concatenate(logprobs)
  loss = float(nll.mean())
  n_bytes = counts["bytes"]
  return {"tokens": int(len(nll)), "bytes": int(n_bytes), "loss": loss,
          "perplexity": float(math.exp(min(loss, 80.0))),
          "bits_per_byte": float(nll_text / math.log(2) / max(n_bytes, 1)),
          "bytes_per_token": float(n_bytes / max(counts["text_tokens"], 1)),
          "accuracy": float(np.concatenate(greedy).mean())}


def evaluate(config, params, tokenizer, workdir: str, *, source: str | None = None,
             split: str = "validation", max_tokens: int | None = None, batch_size: int = 16,
             max_length: int | None = None) -> dict:
  """Perplexity, loss and bits per byte of the run on `split` of `source` (default: its
  data.source); see the module docstring."""
  check_args(split, max_tokens)
  scorer = Scorer(config, params, batch_size=batch_size, width=max_length,
                  vocab_limit=tokenizer.vocab_size)
  stream, one_text, used = prepared_split(config, tokenizer, os.fspath(workdir), source=source,
                                          split=split)
  metrics = score_tokens(scorer, tokenizer, sequences(stream, one_text, max_tokens))
  return {"source": used, "split": split, "max_length": scorer.width,
          "layout": "one text" if one_text else "documents", **metrics}
