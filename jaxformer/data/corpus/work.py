"""What a worker process does with one unit: scan it (character set, counts, content hash) or
tokenize it into its token files. Runs in spawned processes, so it imports no JAX and no TFDS.

Splits (`role` of each text): a unit's fixed role (named dataset splits, or a .txt document
whose role the scan decided); one text (a single .txt source) is cut at its `train_chars`-th
character (nanoGPT: the first train_fraction of the characters train); any other document goes
to 'validation' when the first 8 bytes of the SHA-256 of its UTF-8 text, as a fraction of 2^64,
are >= train_fraction (deterministic, independent of file order and worker count, and
duplicated documents share a split).

Output per unit and role: `<index>.<role>.tok` (the token ids, little-endian uint16 or uint32)
and `<index>.<role>.ends` (int64 token offsets where a document ends), then `<index>.json`
(the counts), each complete or absent (files.py): a unit whose json exists is complete, so a
killed preparation resumes at the units without one.
"""

from __future__ import annotations

import hashlib
from typing import Iterator

import numpy as np
from etils import epath

from jaxformer.data.corpus import files, readers
from jaxformer.data.corpus.units import Unit

ROLES = ("train", "validation")
FLUSH_TOKENS = 1 << 20


def digest_role(digest: bytes, train_fraction: float) -> str:
  """The split of a document whose SHA-256 digest is `digest` (see the module docstring)."""
  return "train" if int.from_bytes(digest[:8], "big") < train_fraction * 2.0**64 else "validation"


def scan_unit(unit: Unit, *, field: str, data_dir=None) -> dict:
  """{'chars': its distinct characters, 'count': characters, 'blank': only whitespace,
  'sha256': of its UTF-8 text}."""
  seen, count = np.zeros(0x110000, bool), 0
  blank, digest = True, hashlib.sha256()
  for text, _ in readers.texts(unit, field, data_dir):
    seen[np.frombuffer(text.encode("utf-32-le"), np.uint32)] = True
    digest.update(text.encode("utf-8"))
    count += len(text)
    blank = blank and not text.replace("\ufeff", "").strip()
  return {"chars": "".join(map(chr, np.flatnonzero(seen))), "count": count, "blank": blank,
          "sha256": digest.hexdigest()}


def role_texts(unit: Unit, *, field: str, data_dir=None, train_chars: int | None,
               train_fraction: float) -> Iterator[tuple[str, str, bool]]:
  """(role, text, ends_document) of `unit` in order; `train_chars`: one text's unit, whose
  first train_chars characters are train."""
  for text, ends in readers.texts(unit, field, data_dir):
    if unit.role is not None:
      yield unit.role, text, ends
    elif train_chars is None:
      yield digest_role(hashlib.sha256(text.encode("utf-8")).digest(), train_fraction), text, ends
    else:
      cut = min(max(train_chars, 0), len(text))
      if cut:
        yield "train", text[:cut], False
      if cut < len(text):
        yield "validation", text[cut:], False
      train_chars -= len(text)


class _RoleFiles:
  """One role's token and document-end files of a unit, written under temporary names, a
  block at a time (memory does not grow with the unit)."""

  def __init__(self, directory: epath.Path, name: str, dtype: str):
    self.path, self.dtype = directory / f"{name}.tok", np.dtype(dtype)
    self.ends_path = self.path.with_suffix(".ends")
    self.tmp, self.ends_tmp = files.temporary(self.path), files.temporary(self.ends_path)
    self.files, self.pending, self.pending_ends = None, [], []
    self.buffered, self.tokens, self.docs = 0, 0, 0

  def add(self, ids: np.ndarray, ends: bool):
    self.pending.append(ids.astype(self.dtype))
    self.buffered += len(ids)
    self.tokens += len(ids)
    if ends:
      self.pending_ends.append(self.tokens)
      self.docs += 1
    if self.buffered >= FLUSH_TOKENS or len(self.pending_ends) >= FLUSH_TOKENS:
      self.flush()

  def flush(self):
    if self.files is None:
      self.files = (self.tmp.open("wb"), self.ends_tmp.open("wb"))
    self.files[0].write(b"".join(p.tobytes() for p in self.pending))
    self.files[1].write(np.asarray(self.pending_ends, "<i8").tobytes())
    self.pending, self.pending_ends, self.buffered = [], [], 0

  def close(self, complete: bool) -> dict:
    """Rename the files into place (complete) or remove them; the role's counts."""
    if complete and self.tokens:
      self.flush()
    for f in self.files or ():
      f.close()
    if not complete or not self.tokens:
      for tmp in (self.tmp, self.ends_tmp):
        if tmp.exists():
          tmp.unlink()
      if not complete:
        return {}
    else:
      files.finish(self.ends_tmp, self.ends_path)
      files.finish(self.tmp, self.path)
    return {"tokens": self.tokens, "docs": self.docs}


def unit_name(index: int) -> str:
  return f"{index:05d}"


def tokenize_unit(task: tuple[Unit, int | None], *, field: str, data_dir, tokenizer,
                  dtype: str, train_fraction: float, directory: str) -> dict:
  """Tokenize one unit into `directory` (documents get the tokenizer's eos, if it has one);
  returns and writes its counts {role: {'tokens', 'docs'}}."""
  unit, train_chars = task
  directory = epath.Path(directory)
  outputs = {role: _RoleFiles(directory, f"{unit_name(unit.index)}.{role}", dtype)
           for role in ROLES}
  eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
  complete = False
  try:
    for role, text, ends in role_texts(unit, field=field, data_dir=data_dir,
                                       train_chars=train_chars, train_fraction=train_fraction):
      ids = tokenizer.encode(text)
      outputs[role].add(np.concatenate([ids, np.asarray(eos, ids.dtype)]) if ends else ids, ends)
    complete = True
  finally:
    counts = {role: f.close(complete) for role, f in outputs.items()}
  files.write_json(directory / f"{unit_name(unit.index)}.json", counts)
  return counts
