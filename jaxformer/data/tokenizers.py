"""Tokenizers behind one interface, saved with the run so sampling decodes with its vocabulary.

Every tokenizer has `kind`, `vocab_size`, `encode(str) -> int32 array`, `decode(ids) -> str`,
the special ids `bos_id`/`eos_id`/`pad_id`/`mask_id` (None where it has none) and
`save(directory)`, which writes `directory/tokenizer.json` (the kind and what it needs) plus
any model file next to it. `make_tokenizer(spec, texts, directory)` builds one from a
`data.tokenizer` spec ("char", "spm:bpe:<V>", "spm:unigram:<V>", "hf:<path>") and reuses an
identical one already saved in `directory`, so a resumed run keeps its vocabulary;
`load_tokenizer(directory)` reads any saved kind back.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
from typing import Callable, Iterable, Protocol

import numpy as np

from jaxformer import console, paths
from jaxformer.extras import require

TOKENIZER_FILE = "tokenizer.json"
SPM_MODEL_FILE = "tokenizer.spm.model"
HF_MODEL_FILE = "tokenizer.hf.json"
SPM_MODEL_TYPES = ("bpe", "unigram")
SPM_SPECIAL_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}
SPM_BYTE_PIECES = 256                  # byte fallback: every UTF-8 byte has its own piece
SPM_USER_SYMBOLS = ("\n",)             # pieces of their own that no other piece crosses
SPM_MAX_TRAINING_TEXTS = 2_000_000     # the first this many texts train the model
_SPEC_HELP = ('use "char", "spm:bpe:<vocab_size>", "spm:unigram:<vocab_size>" or '
              '"hf:<tokenizer.json or a directory holding one>"')


class Tokenizer(Protocol):
  """What pipelines, the training loop and sampling need from a tokenizer."""
  kind: str
  vocab_size: int
  bos_id: int | None
  eos_id: int | None
  pad_id: int | None
  mask_id: int | None

  def encode(self, text: str) -> np.ndarray: ...

  def decode(self, ids) -> str: ...

  def save(self, directory: str | os.PathLike): ...

  def fingerprint(self) -> str:
    """A hash of everything that defines the id mapping (keys caches of tokenized data)."""


def _write_atomically(directory, name: str, data: bytes):
  """`directory/name` replaced whole: a kill mid-write leaves the old file or none."""
  paths.path(directory).mkdir(parents=True, exist_ok=True)
  paths.write_bytes(os.path.join(os.fspath(directory), name), data)


def _write_spec(directory, spec: dict):
  """tokenizer.json last: it names a model file that is already complete."""
  _write_atomically(directory, TOKENIZER_FILE, json.dumps(spec).encode())


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def checked_ids(ids, vocab_size: int) -> list[int]:
  """ids as a flat list of ints, each in [0, vocab_size); a clear error otherwise (a padded
  model vocabulary has ids no tokenizer entry maps to)."""
  flat = [int(i) for i in np.asarray(ids).reshape(-1)]
  bad = [i for i in flat if not 0 <= i < vocab_size]
  if bad:
    raise ValueError(f"token id {bad[0]} is outside the tokenizer's vocabulary [0, "
                     f"{vocab_size}) ({len(bad)} such ids); a model vocabulary padded past "
                     "the tokenizer's must not emit them (generate(..., vocab_limit=...))")
  return flat


# The special tokens each task's batches use, by the tokenizer attribute that may hold them,
# in the order new ids are appended for those the tokenizer lacks (see `special_ids`):
# MLM's [MASK]; NSP's [MASK], [CLS] (bos_id) and [SEP] (eos_id); BART's <mask>, decoder start
# (bos_id) and <pad>; T5's <pad> and </s> (its sentinels follow, at the top of the vocabulary).
TASK_SPECIAL_IDS = {"mlm": ("mask_id",), "mlm_nsp": ("mask_id", "bos_id", "eos_id"),
                    "bart_denoising": ("mask_id", "bos_id", "pad_id"),
                    "span_corruption": ("pad_id", "eos_id")}
# The text names of those tokens where a task appends them after the vocabulary (by role): what
# `jaxformer.export` names them in the exported tokenizer and what `jaxformer.predict` reads
# in an input text. T5's sentinels are <extra_id_k> (k-th id from the top of the vocabulary).
TASK_SPECIAL_NAMES = {
    "mlm": {"mask_id": "[MASK]"},
    "mlm_nsp": {"mask_id": "[MASK]", "bos_id": "[CLS]", "eos_id": "[SEP]"},
    "bart_denoising": {"mask_id": "<mask>", "bos_id": "<s>", "pad_id": "<pad>"},
    "span_corruption": {"pad_id": "<pad>", "eos_id": "</s>"},
}


def special_ids(tokenizer, roles) -> tuple[dict[str, int], int]:
  """({role: id}, vocabulary size) for the special tokens `roles` (tokenizer attributes:
  'mask_id', 'bos_id', 'eos_id', 'pad_id') a task uses: the tokenizer's own id where it has
  one, else a new id after its vocabulary, appended in the order of `roles` (the char
  tokenizer has none: MLM's [MASK] is id 65 after its 65 symbols). The size counts the
  appended ids. The data pipelines and `jaxformer.export` (which names the appended tokens
  in the exported tokenizer) both take the ids from here."""
  ids, size = {}, tokenizer.vocab_size
  for role in roles:
    own = getattr(tokenizer, role)
    if own is None:
      own, size = size, size + 1
    ids[role] = int(own)
  return ids, size


def _code_points(text: str) -> np.ndarray:
  return np.frombuffer(text.encode("utf-32-le"), np.uint32)


class CharTokenizer:
  """One id per distinct character of the training text, in sorted order (nanoGPT's scheme)."""
  kind = "char"
  bos_id = eos_id = pad_id = mask_id = None

  def __init__(self, chars: str):
    if not chars:
      raise ValueError("CharTokenizer needs a non-empty character set")
    self.chars = "".join(sorted(set(chars)))
    self._codes = _code_points(self.chars)       # sorted: id = rank of the code point

  @property
  def vocab_size(self) -> int:
    return len(self.chars)

  def encode(self, text: str) -> np.ndarray:
    codes = _code_points(text)
    ids = np.minimum(np.searchsorted(self._codes, codes), len(self._codes) - 1)
    unknown = self._codes[ids] != codes
    if unknown.any():
      chars = sorted(set(text[i] for i in np.flatnonzero(unknown)[:1000]))
      raise ValueError(f"characters {chars[:10]!r} are not in the tokenizer's vocabulary")
    return ids.astype(np.int32)

  def decode(self, ids) -> str:
    return "".join(self.chars[i] for i in checked_ids(ids, self.vocab_size))

  def fingerprint(self) -> str:
    return _sha256(f"char:{self.chars}".encode())

  def save(self, directory: str | os.PathLike):
    _write_spec(directory, {"kind": self.kind, "spec": "char", "chars": self.chars})

  @classmethod
  def from_saved(cls, directory, saved: dict) -> CharTokenizer:
    return cls(saved["chars"])

  @classmethod
  def load(cls, path: str | os.PathLike) -> CharTokenizer:
    """A saved char tokenizer from its directory or its tokenizer.json."""
    tokenizer = load_tokenizer(path)
    if not isinstance(tokenizer, cls):
      raise ValueError(f"{path} holds a {tokenizer.kind!r} tokenizer, not {cls.kind!r}")
    return tokenizer


class SentencePieceTokenizer:
  """A SentencePiece model (BPE or unigram) with byte fallback: no text is ever unknown.

  Trained with identity normalisation and no dummy prefix, so decode(encode(s)) == s.
  """
  kind = "spm"
  mask_id = None

  def __init__(self, model_proto: bytes, spec: str):
    spm = require("sentencepiece", extra="text", needed_for="data.tokenizer='spm:...'")
    self.model_proto, self.spec = model_proto, spec
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.bos_id, self.eos_id, self.pad_id = (
        self._optional_id(i) for i in (self._sp.bos_id(), self._sp.eos_id(), self._sp.pad_id()))

  def __reduce__(self):                  # for worker processes: the processor is not picklable
    return type(self), (self.model_proto, self.spec)

  @staticmethod
  def _optional_id(i: int) -> int | None:
    return None if i < 0 else int(i)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> np.ndarray:
    """Line by line: "\n" is a piece of its own that no other piece crosses, so the ids are
    those of the whole text, and the time is linear in its length (one long string is not)."""
    lines = text.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    ids = self._sp.encode(lines, num_threads=1)
    return np.fromiter(itertools.chain.from_iterable(ids), np.int32)

  def decode(self, ids) -> str:
    return self._sp.decode(checked_ids(ids, self.vocab_size))

  def fingerprint(self) -> str:
    return _sha256(self.model_proto)

  def save(self, directory: str | os.PathLike):
    _write_atomically(directory, SPM_MODEL_FILE, self.model_proto)
    _write_spec(directory, {"kind": self.kind, "spec": self.spec, "model_file": SPM_MODEL_FILE,
                            "sha256": self.fingerprint()})

  @classmethod
  def from_saved(cls, directory, saved: dict) -> SentencePieceTokenizer:
    file, proto = _read_model_file(directory, saved)
    try:
      tokenizer = cls(proto, saved["spec"])
    except RuntimeError as e:             # sentencepiece's parse errors
      raise ValueError(f"{file} is not a SentencePiece model ({str(e).strip()}); "
                       f"{_RETRAIN}") from e
    if tokenizer.vocab_size == 0:
      raise ValueError(f"{file} holds an empty SentencePiece model; {_RETRAIN}")
    return tokenizer

  @classmethod
  def train(cls, model_type: str, vocab_size: int, texts: Iterable[str], spec: str
            ) -> SentencePieceTokenizer:
    """Deterministic training: one thread, fixed seed, no sentence sampling."""
    spm = require("sentencepiece", extra="text", needed_for="data.tokenizer='spm:...'")
    spm.set_random_generator_seed(0)
    model = io.BytesIO()
    sentences = (t for t in itertools.islice(texts, SPM_MAX_TRAINING_TEXTS) if t)
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=sentences, model_writer=model, model_type=model_type,
          vocab_size=vocab_size, character_coverage=1.0, byte_fallback=True, num_threads=1,
          input_sentence_size=0, shuffle_input_sentence=False, max_sentence_length=1 << 20,
          normalization_rule_name="identity", remove_extra_whitespaces=False,
          add_dummy_prefix=False, allow_whitespace_only_pieces=True,
          user_defined_symbols=list(SPM_USER_SYMBOLS), minloglevel=2, **SPM_SPECIAL_IDS)
    except RuntimeError as e:
      raise ValueError(f"data.tokenizer={spec!r}: SentencePiece training failed ({e}); a "
                       "vocab_size that fits the text usually fixes it") from e
    return cls(model.getvalue(), spec)


# Special tokens of common Hugging Face vocabularies, looked up by name (first match wins).
HF_SPECIAL_TOKENS = {
    "bos_id": ("<s>", "<|begin_of_text|>", "<bos>", "[CLS]"),
    "eos_id": ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[SEP]"),
    "pad_id": ("<pad>", "[PAD]", "<|pad|>"),
    "mask_id": ("<mask>", "[MASK]"),
}


class HuggingFaceTokenizer:
  """A Hugging Face `tokenizer.json` run by the `tokenizers` library (no special tokens
  are added by encode; bos/eos/pad/mask are found by their usual names)."""
  kind = "hf"

  def __init__(self, json_text: str, spec: str):
    hf = require("tokenizers", extra="text", needed_for="data.tokenizer='hf:...'")
    self.json_text, self.spec = json_text, spec
    self._tok = hf.Tokenizer.from_str(json_text)
    for attr, names in HF_SPECIAL_TOKENS.items():
      ids = (self._tok.token_to_id(n) for n in names)
      setattr(self, attr, next((int(i) for i in ids if i is not None), None))

  def __reduce__(self):
    return type(self), (self.json_text, self.spec)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

  def decode(self, ids) -> str:
    return self._tok.decode(checked_ids(ids, self.vocab_size), skip_special_tokens=False)

  def fingerprint(self) -> str:
    return _sha256(self.json_text.encode())

  def save(self, directory: str | os.PathLike):
    _write_atomically(directory, HF_MODEL_FILE, self.json_text.encode("utf-8"))
    _write_spec(directory, {"kind": self.kind, "spec": self.spec, "model_file": HF_MODEL_FILE,
                            "sha256": self.fingerprint()})

  @classmethod
  def from_saved(cls, directory, saved: dict) -> HuggingFaceTokenizer:
    file, data = _read_model_file(directory, saved)
    return cls._parse(data, saved["spec"], file, _RETRAIN)

  @classmethod
  def from_path(cls, path: str, spec: str) -> HuggingFaceTokenizer:
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise ValueError(f"data.tokenizer={spec!r}: {file} does not exist; point it at a "
                       "Hugging Face tokenizer.json or a checkpoint directory holding one")
    with open(file, "rb") as f:
      data = f.read()
    return cls._parse(data, spec, file, f"point data.tokenizer={spec!r} at a Hugging Face "
                      "tokenizer.json (the file `tokenizer.save(path)` writes)")

  @classmethod
  def _parse(cls, data: bytes, spec: str, file: str, fix: str) -> HuggingFaceTokenizer:
    """The tokenizer in `data`, read from `file`; a ValueError naming the file otherwise."""
    try:
      return cls(data.decode("utf-8"), spec)
    except ImportError:
      raise
    except Exception as e:  # noqa: BLE001  (tokenizers raises its own exception types)
      raise ValueError(f"{file} is not a Hugging Face tokenizer.json "
                       f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                       f"{fix}") from e


KINDS = {cls.kind: cls for cls in (CharTokenizer, SentencePieceTokenizer, HuggingFaceTokenizer)}


def _spec_file(path: str | os.PathLike) -> str:
  """`path` itself if it is a tokenizer.json file, else `path`/tokenizer.json."""
  path = os.fspath(path)
  if path.endswith(".json") and paths.path(path).is_file():
    return path
  return os.path.join(path, TOKENIZER_FILE)


# What each saved kind's tokenizer.json must hold (key -> type), checked when it is read.
_SAVED_KEYS = {"char": {"chars": str}, "spm": {"spec": str, "model_file": str, "sha256": str},
               "hf": {"spec": str, "model_file": str}}
_RETRAIN = ("delete the tokenizer.* files there and run train on the workdir again (the same "
            "data.source and data.tokenizer rebuild the same tokenizer)")


def _read_saved(path) -> dict | None:
  """The checked contents of a saved tokenizer.json, or None if there is none: a damaged file
  is a ValueError naming it (a resumed run must not silently get another vocabulary)."""
  file = _spec_file(path)
  if not paths.path(file).is_file():
    return None
  data = paths.path(file).read_bytes()
  try:
    saved = json.loads(data)
  except ValueError as e:       # JSONDecodeError and UnicodeDecodeError (truncated or binary)
    raise ValueError(f"{file} is not a saved tokenizer (not JSON: {e}); {_RETRAIN}") from None
  if not isinstance(saved, dict):
    raise ValueError(f"{file} is not a saved tokenizer (a JSON {type(saved).__name__}, not an "
                     f"object); {_RETRAIN}")
  kind = saved.get("kind")
  if kind not in KINDS:
    raise ValueError(f"{file}: unknown tokenizer kind {kind!r}; known kinds: {sorted(KINDS)}; "
                     f"{_RETRAIN}")
  for key, want in _SAVED_KEYS[kind].items():
    if not isinstance(saved.get(key), want) or not saved[key]:
      raise ValueError(f"{file}: a saved {kind!r} tokenizer needs a non-empty {key!r} "
                       f"({want.__name__}), found {saved.get(key)!r}; {_RETRAIN}")
  model_file = saved.get("model_file")
  if model_file is not None and os.path.basename(model_file) != model_file:
    raise ValueError(f"{file}: model_file={model_file!r} must be a file name next to it, not "
                     f"a path; {_RETRAIN}")
  return saved


def _read_model_file(directory, saved: dict) -> tuple[str, bytes]:
  """(path, bytes) of the model file a saved tokenizer.json names, checked against its
  sha256 where the spec records one (every save does)."""
  file = os.path.join(os.fspath(directory), saved["model_file"])
  if not paths.path(file).is_file():
    raise ValueError(f"{file} is missing, but {os.path.join(directory, TOKENIZER_FILE)} names "
                     f"it; {_RETRAIN}")
  data = paths.path(file).read_bytes()
  if "sha256" in saved and _sha256(data) != saved["sha256"]:
    raise ValueError(f"{file} does not match its {TOKENIZER_FILE} (changed or truncated after "
                     f"it was saved); {_RETRAIN}")
  return file, data


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """The tokenizer saved in directory `path` (or in the tokenizer.json file `path`)."""
  saved = _read_saved(path)
  if saved is None:
    raise ValueError(f"{path} holds no saved tokenizer ({TOKENIZER_FILE} is missing); "
                     "train a run there first or pass the run's workdir")
  return KINDS[saved["kind"]].from_saved(os.path.dirname(_spec_file(path)), saved)


def parse_spec(spec: str) -> tuple[str, str | tuple[str, int]]:
  """'char' -> ('char', ''); 'spm:bpe:8000' -> ('spm', ('bpe', 8000)); 'hf:p' -> ('hf', 'p')."""
  if not isinstance(spec, str):
    raise ValueError(f"data.tokenizer={spec!r} must be a string; {_SPEC_HELP}")
  kind, _, rest = spec.partition(":")
  if kind == "char" and not rest:
    return kind, ""
  if kind == "hf" and rest:
    return kind, rest
  if kind == "spm":
    model_type, _, size = rest.partition(":")
    if model_type in SPM_MODEL_TYPES and size.isdigit():
      return kind, (model_type, int(size))
  raise ValueError(f"data.tokenizer={spec!r} is not a tokenizer spec; {_SPEC_HELP}")


def _min_spm_vocab(texts: Iterable[str]) -> int:
  chars = set()
  for i, t in enumerate(texts):
    if i >= SPM_MAX_TRAINING_TEXTS:
      break
    chars.update(t)
  return len(SPM_SPECIAL_IDS) + SPM_BYTE_PIECES + len(chars | {"\n"})


def _build(spec: str, texts: Callable[[], Iterable[str]]) -> Tokenizer:
  kind, arg = parse_spec(spec)
  if kind == "char":
    chars = set()
    for t in texts():
      chars.update(t)
    if not chars:
      raise ValueError(f"data.tokenizer={spec!r}: the text is empty, no characters to index")
    return CharTokenizer("".join(chars))
  if kind == "hf":
    return HuggingFaceTokenizer.from_path(arg, spec)
  model_type, vocab_size = arg
  needed = _min_spm_vocab(texts())
  if vocab_size < needed:
    raise ValueError(f"data.tokenizer={spec!r}: vocab_size {vocab_size} is too small; this "
                     f"text needs at least {needed} (4 special + 256 byte + one per character)")
  with console.announce(f"training the tokenizer data.tokenizer={spec!r}, once"):
    return SentencePieceTokenizer.train(model_type, vocab_size, texts(), spec)


def make_tokenizer(spec: str, texts: Callable[[], Iterable[str]],
                   directory: str | os.PathLike) -> Tokenizer:
  """The `spec` tokenizer, saved in `directory`; reused if `directory` already holds one
  made from the same spec. `texts()` yields the training texts (called only when needed)."""
  parse_spec(spec)
  saved = _read_saved(directory)
  if saved is not None and saved.get("spec", saved.get("kind")) == spec:
    return load_tokenizer(directory)
  tokenizer = _build(spec, texts)
  tokenizer.save(directory)
  return tokenizer

