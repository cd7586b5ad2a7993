"""Text data: tokenizers, text files and catalog sources, packing, LM/MLM pipelines (the
source kinds, preparation and scale: test_data_corpora.py)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxformer.data import packing, text, tfds_catalog, tokenizers
from jaxformer.data.corpus import files, readers, sources
from tests.unit.data.test_data_corpora import TinyDocs
from tests.user_errors import user_error
from tests.repo_root import REPO

ROOT = str(REPO)

SMALL_TEXT = (sources.BUNDLED["tinyshakespeare"].read_text(encoding="utf-8")[:12000]
              + "\n\n\nJULIET:\nAy me!  ¿Qué?\n\n")


def old_text_corpus_batch(ids, step, *, batch_size, seq_len, seed, split_id):
  """A copy of the pre-pipeline `TextCorpus.batch` formula (the README result depends on it)."""
  rng = np.random.default_rng([seed, split_id, step])
  starts = rng.integers(0, len(ids) - seq_len - 1, size=batch_size)
  windows = ids[starts[:, None] + np.arange(seq_len + 1)]
  return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("text") / "small.txt"
  path.write_text(SMALL_TEXT, encoding="utf-8")
  return str(path)


def data_config(source, tokenizer="char", seq_len=16, **extra):
  return ConfigDict(dict(source=source, tokenizer=tokenizer, seq_len=seq_len, **extra))


def pipeline(cfg, task="lm", *, workdir, data_dir, batch=4, seed=3, **kw):
  kw = dict(seed=seed, global_batch_size=batch, eval_batch_size=batch, workdir=str(workdir),
            data_dir=data_dir, **kw)
  return text.make_text_pipeline(cfg, task, **kw)


# ----------------------------------------------------------------------------- tokenizers

def test_char_tokenizer_saves_and_loads_old_workdirs(tmp_path):
  tok = tokenizers.make_tokenizer("char", lambda: ["hello", " world"], tmp_path / "a")
  assert (tok.vocab_size, tok.chars, tok.eos_id, tok.mask_id) == (8, " dehlorw", None, None)
  np.testing.assert_array_equal(tok.encode("low"), [4, 5, 7])
  assert tokenizers.load_tokenizer(tmp_path / "a").decode(tok.encode("hello")) == "hello"
  old = tmp_path / "old"                       # a workdir written before tokenizers.save(dir)
  old.mkdir()
  (old / "tokenizer.json").write_text(json.dumps({"kind": "char", "chars": "ab\n"}))
  for path in (old, old / "tokenizer.json"):
    assert tokenizers.load_tokenizer(path).chars == "\nab"
    assert tokenizers.CharTokenizer.load(path).vocab_size == 3
  reused = tokenizers.make_tokenizer("char", lambda: ["xyz"], old)   # resumed: keeps vocab
  assert reused.chars == "\nab"
  with pytest.raises(ValueError, match="no saved tokenizer"):
    tokenizers.load_tokenizer(tmp_path / "nothing")


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_is_deterministic_lossless_and_reused(tmp_path, model_type):
  spec, lines = f"spm:{model_type}:400", SMALL_TEXT.split("\n\n")
  a = tokenizers.make_tokenizer(spec, lambda: lines, tmp_path / "a")
  b = tokenizers.make_tokenizer(spec, lambda: lines, tmp_path / "b")
  assert a.model_proto == b.model_proto and a.vocab_size == 400
  assert (a.pad_id, a.bos_id, a.eos_id, a.mask_id) == (0, 2, 3, None)
  odd = "ROMEO:\n  two  spaces\tand 日本語 ✓\n\n"     # unseen characters: byte fallback
  ids = a.encode(odd)
  assert ids.dtype == np.int32 and a.decode(ids) == odd
  assert len(a.encode("First Citizen")) < len("First Citizen")    # it learned merges

  def must_not_retrain():
    raise AssertionError("retrained instead of reusing the saved model")
  reused = tokenizers.make_tokenizer(spec, must_not_retrain, tmp_path / "a")
  np.testing.assert_array_equal(reused.encode(odd), ids)
  np.testing.assert_array_equal(tokenizers.load_tokenizer(tmp_path / "a").encode(odd), ids)
  (tmp_path / "a" / tokenizers.SPM_MODEL_FILE).write_bytes(b.model_proto[:-1])
  with pytest.raises(ValueError, match="does not match"):
    tokenizers.load_tokenizer(tmp_path / "a")


def test_huggingface_tokenizer_file_or_directory(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  hf = Tokenizer(models.WordLevel(unk_token="[UNK]"))
  hf.pre_tokenizer = pre_tokenizers.Whitespace()
  hf.train_from_iterator([SMALL_TEXT], trainers.WordLevelTrainer(
      special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
  (tmp_path / "ckpt").mkdir()
  hf.save(str(tmp_path / "ckpt" / "tokenizer.json"))
  for i, src in enumerate([tmp_path / "ckpt", tmp_path / "ckpt" / "tokenizer.json"]):
    tok = tokenizers.make_tokenizer(f"hf:{src}", lambda: [], tmp_path / f"run{i}")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id) == (0, 2, 3, 4)
    phrase = "Before we proceed, Ay me!"
    np.testing.assert_array_equal(tok.encode(phrase), hf.encode(phrase).ids)
    loaded = tokenizers.load_tokenizer(tmp_path / f"run{i}")
    assert loaded.vocab_size == hf.get_vocab_size()
    assert loaded.decode(tok.encode(phrase)) == hf.decode(hf.encode(phrase).ids)


@pytest.mark.parametrize("spec, match", [
    ("bpe", "not a tokenizer spec"), ("spm:bpe", "not a tokenizer spec"),
    ("spm:wordpiece:500", "not a tokenizer spec"), ("hf:/no/such/dir", "does not exist"),
    ("spm:bpe:50", "vocab_size 50 is too small"), (None, "must be a string")])
def test_bad_tokenizer_specs_name_the_field(tmp_path, spec, match):
  with pytest.raises(ValueError, match=f"data.tokenizer.*{match}"):
    tokenizers.make_tokenizer(spec, lambda: ["some text"], tmp_path)


def _saved_spec(kind, blob, **fields):
  """A saved spm/hf tokenizer.json naming its model file, with the sha256 of `blob`."""
  import hashlib
  return json.dumps({
      "kind": kind, "spec": {"spm": "spm:bpe:400", "hf": "hf:x"}[kind],
      "model_file": {"spm": tokenizers.SPM_MODEL_FILE, "hf": tokenizers.HF_MODEL_FILE}[kind],
      "sha256": hashlib.sha256(blob).hexdigest(), **fields})


_HF_CUT = b'{"version": "1.0", "truncation": null, "added_tok'      # a cut-off tokenizer.json


@pytest.mark.parametrize("saved, files, match", [
    ("", {}, "tokenizer.json is not a saved tokenizer (not JSON"),
    ('{"kind": "char", "cha', {}, "tokenizer.json is not a saved tokenizer (not JSON"),
    ("[1, 2]", {}, "(a JSON list, not an object)"),
    ('{"kind": "char"}', {}, "needs a non-empty 'chars' (str), found None"),
    ('{"kind": "char", "chars": 7}', {}, "needs a non-empty 'chars' (str), found 7"),
    ('{"kind": "char", "chars": ""}', {}, "needs a non-empty 'chars' (str), found ''"),
    ('{"kind": "word"}', {}, "unknown tokenizer kind 'word'"),
    (_saved_spec("spm", b""), {}, "tokenizer.spm.model is missing, but"),
    (_saved_spec("spm", b"junk"), {tokenizers.SPM_MODEL_FILE: b"junk"},
     "is not a SentencePiece model"),
    (_saved_spec("spm", b""), {tokenizers.SPM_MODEL_FILE: b""},
     "holds an empty SentencePiece model"),
    (_saved_spec("hf", b"{}"), {tokenizers.HF_MODEL_FILE: _HF_CUT},
     "tokenizer.hf.json does not match its tokenizer.json"),
    (_saved_spec("hf", _HF_CUT), {tokenizers.HF_MODEL_FILE: _HF_CUT},
     "is not a Hugging Face tokenizer.json"),
    (_saved_spec("hf", b""), {}, "tokenizer.hf.json is missing, but"),
    (_saved_spec("hf", b"", model_file="../x.json"), {}, "must be a file name next to it")],
    ids=["empty", "truncated", "not_object", "no_chars", "chars_not_str", "chars_empty",
         "unknown_kind", "spm_missing", "spm_corrupt", "spm_empty", "hf_changed",
         "hf_truncated", "hf_missing", "model_file_path"])
def test_damaged_saved_tokenizer_names_the_file_and_the_fix(tmp_path, saved, files, match):
  """A workdir's tokenizer.json, or the model file it names, damaged as a kill, a copy or a
  hand edit leaves it: one ValueError naming the file, never a traceback or another
  vocabulary. A resumed run (make_tokenizer) stops on it the same way."""
  (tmp_path / "tokenizer.json").write_text(saved)
  for name, blob in files.items():
    (tmp_path / name).write_bytes(blob)
  user_error(lambda: tokenizers.load_tokenizer(tmp_path), tmp_path, match,
             "delete the tokenizer.* files there")
  try:
    spec = json.loads(saved).get("spec", "char")          # the spec it was saved for
  except (ValueError, AttributeError):
    spec = "char"
  user_error(lambda: tokenizers.make_tokenizer(spec, lambda: ["ab"], tmp_path), match)


def test_hf_tokenizer_source_that_is_not_text_names_the_file(tmp_path):
  binary = tmp_path / "binary.json"
  binary.write_bytes(b"\xff\xfe\x00\x01")
  user_error(lambda: tokenizers.make_tokenizer(f"hf:{binary}", lambda: [], tmp_path / "r"),
             binary, "is not a Hugging Face tokenizer.json", f"point data.tokenizer='hf:{binary}'")


# ------------------------------------------------------------------ text files, catalogs

@pytest.fixture(scope="module")
def catalog(data_dir):
  """'tfds:tiny_docs' prepared in `data_dir`: SMALL_TEXT's paragraphs as documents."""
  paragraphs = SMALL_TEXT.split("\n\n")
  TinyDocs.DOCS = paragraphs[:40] + paragraphs[-8:]
  builder = TinyDocs(data_dir=data_dir, file_format="array_record")
  with tfds_catalog.quiet_tfds():
    builder.download_and_prepare()
  return "tfds:tiny_docs"


def test_text_file_splits_by_characters_and_is_prepared_once(tmp_path, data_dir, small_file,
                                                             capsys):
  cfg = data_config(small_file, train_fraction=0.7)
  p = pipeline(cfg, workdir=tmp_path, data_dir=data_dir)
  n = int(len(SMALL_TEXT) * 0.7)
  for role, expected in (("train", SMALL_TEXT[:n]), ("validation", SMALL_TEXT[n:])):
    stream = p.corpus.stream(role)
    assert p.tokenizer.decode(stream.read(0, len(stream))) == expected
  capsys.readouterr()
  again = pipeline(cfg, workdir=tmp_path, data_dir=data_dir)
  assert again.corpus.directory == p.corpus.directory and capsys.readouterr().out == ""


def test_preparation_says_what_it_does_once(tmp_path, capsys):
  source = tmp_path / "t.txt"
  source.write_text(SMALL_TEXT)
  pipeline(data_config(str(source)), workdir=tmp_path, data_dir=str(tmp_path / "dd2"))
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 2, out
  assert re.fullmatch(r"preparing data.source='.*t.txt' \(0.0 MB\) once, into .*dd2/"
                      r"jaxformer_corpora/\w+ \.\.\. done in \d+\.\d s \(12,\d{3} characters, "
                      r"1 part\)", out[0]), out
  assert re.fullmatch(r"tokenizing data.source='.*t.txt' with data.tokenizer='char' once "
                      r"\(1 part\), into .*tokens-\w+ \.\.\. done in \d+\.\d s \(10,8\d\d "
                      r"train \+ 1,2\d\d validation tokens\)", out[1]), out


def test_bad_sources_name_data_source(tmp_path, data_dir):
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  for source, match in ((str(tmp_path / "missing.txt"), "no such file"),
                        (str(empty), "is empty"), ("tfds:Bad Name!", "expected 'tfds:")):
    with pytest.raises(ValueError, match=f"data.source=.*{match}"):
      pipeline(data_config(source), workdir=tmp_path, data_dir=data_dir)
  with pytest.raises(ValueError, match="data.train_fraction=1.5"):
    pipeline(data_config("tinyshakespeare", train_fraction=1.5), workdir=tmp_path,
             data_dir=data_dir)


@pytest.mark.parametrize("blob, fraction, match", [
    (b"  \n\n\t \n", 0.9, "holds only whitespace (7 bytes)"),
    ("\u00a0\u3000\n".encode(), 0.9, "holds only whitespace"),
    (b"\xef\xbb\xbf\n", 0.9, "holds only whitespace"),               # a byte-order mark
    (b"a", 0.9, "holds 1 character, too few to split at data.train_fraction=0.9"),
    (b"abc", 0.2, "holds 3 characters, too few to split at data.train_fraction=0.2")],
    ids=["spaces", "unicode_spaces", "bom", "one_char", "empty_train_split"])
def test_degenerate_text_file_is_refused_before_any_tokenizer(tmp_path, blob, fraction, match):
  """Text that decodes but holds nothing to train on, or too little for both splits."""
  (tmp_path / "t.txt").write_bytes(blob)
  source = str(tmp_path / "t.txt")
  user_error(lambda: pipeline(data_config(source, train_fraction=fraction), workdir=tmp_path,
                              data_dir=str(tmp_path / "dd")),
             f"data.source={source!r}", match)
  assert not (tmp_path / "tokenizer.json").exists()


def test_catalog_source_errors_say_how_to_fix(tmp_path, data_dir, catalog):
  with pytest.raises(ValueError, match=r"not prepared.*tfds build lm1b "
                                       r"--file_format=array_record --data_dir="):
    tfds_catalog.catalog_builder("tfds:lm1b", data_dir)
  with pytest.raises(ValueError, match=r"data.eval_split='test'.*\['train', 'validation'\]"):
    pipeline(data_config(catalog, eval_split="test"), workdir=tmp_path, data_dir=data_dir)
  with pytest.raises(ValueError, match=r"data.text_field='sentence'.*\['text'\]"):
    pipeline(data_config(catalog, text_field="sentence"), workdir=tmp_path, data_dir=data_dir)
  with pytest.raises(ValueError, match=r"data.text_key is now data.text_field"):
    pipeline(data_config(catalog, text_key="text"), workdir=tmp_path, data_dir=data_dir)


# ----------------------------------------------------------------------------- packing

def reference_next_fit(docs, row_len):
  """Plain-Python next-fit over row-sized pieces: lists of (token, segment, position)."""
  rows, row = [], None
  for doc in docs:
    for start in range(0, len(doc), row_len):
      piece = list(doc[start:start + row_len])
      if row is None or len(row) + len(piece) > row_len:
        row = []
        rows.append(row)
      segment = 1 + (max(s for _, s, _ in row) if row else 0)
      row.extend((t, segment, p) for p, t in enumerate(piece))
  return [row + [(0, 0, 0)] * (row_len - len(row)) for row in rows]


def pack_documents(docs, row_len):
  """{field: [rows, row_len]}: next_fit over the lengths, each row laid out from its tokens."""
  tokens, rows, start = np.concatenate([*docs, np.zeros(0, np.int32)]), [], 0
  for pieces in packing.next_fit(map(len, docs), row_len):
    rows.append(packing.layout_row(tokens[start:start + sum(pieces)], pieces, row_len))
    start += sum(pieces)
  stacked = np.stack(rows) if rows else np.zeros((0, len(packing.PACKED_FIELDS), row_len))
  return {k: stacked[:, i] for i, k in enumerate(packing.PACKED_FIELDS)}



@pytest.mark.parametrize("row_len", [1, 5, 12])
def test_next_fit_blocks_gives_next_fits_rows_in_bounded_blocks(row_len):
  """Lengths in blocks of any size, rows out in blocks of at most `rows_per_block` pieces:
  the same rows as next_fit (empty documents, documents of exactly k rows, one document of
  many rows, which is cut into blocks too)."""
  rng = np.random.default_rng(row_len)
  lengths = rng.integers(0, 3 * row_len + 2, size=400)
  lengths[rng.integers(0, 400, size=20)] = row_len * rng.integers(1, 4, size=20)
  lengths[7] = 50 * row_len + 1
  expected = list(packing.next_fit(lengths.tolist(), row_len))
  for per_block in (1, 3, 64):
    blocks = np.array_split(lengths, [3, 4, 150])
    out = list(packing.next_fit_blocks(blocks, row_len, rows_per_block=per_block))
    assert all(len(p) == c.sum() and len(p) <= 2 * per_block + row_len for c, p in out)
    pieces = iter(np.concatenate([p for _, p in out]).tolist())
    assert [[next(pieces) for _ in range(c)]
            for c in np.concatenate([c for c, _ in out]).tolist()] == expected
  assert list(packing.next_fit_blocks([], row_len)) == []
  with pytest.raises(ValueError, match="row_len=0"):
    packing.next_fit_blocks([np.asarray([3])], 0)

@pytest.mark.parametrize("row_len", [1, 7, 13])
def test_packing_matches_reference_and_invariants(row_len):
  rng = np.random.default_rng(row_len)
  docs = [rng.integers(1, 50, size=n).astype(np.int32)
          for n in rng.integers(0, 3 * row_len, size=23)]
  packed = pack_documents(docs, row_len)
  expected = np.asarray(reference_next_fit(docs, row_len), np.int32)
  for i, key in enumerate(packing.PACKED_FIELDS):
    assert packed[key].dtype == np.int32 and packed[key].shape == expected.shape[:2]
    np.testing.assert_array_equal(packed[key], expected[..., i])
  seg = packed["segment_ids"]
  # every token exactly once, in document order (pieces are consecutive segments)
  np.testing.assert_array_equal(packed["tokens"][seg > 0], np.concatenate(docs))
  for row_seg, row_pos in zip(seg, packed["positions"]):
    used = row_seg[row_seg > 0]
    assert np.all(row_seg[len(used):] == 0)                  # padding only at the end
    assert np.all(np.diff(used) >= 0) and np.all(np.diff(np.unique(used)) == 1)
    for s in np.unique(used):                                # contiguous, positions 0..n-1
      np.testing.assert_array_equal(row_pos[row_seg == s], np.arange(np.sum(row_seg == s)))
  assert pack_documents([], 4)["tokens"].shape == (0, 4)
  with pytest.raises(ValueError, match="row_len=0"):
    packing.next_fit([3], 0)                                 # checked at the call


def test_next_fit_yields_rows_as_lengths_arrive():
  row_len, rng = 11, np.random.default_rng(0)
  lengths = rng.integers(0, 4 * row_len, size=300).tolist()   # many longer than a row
  pulled = []

  def stream():
    for n in lengths:
      pulled.append(n)
      yield n
  rows = packing.next_fit(stream(), row_len)
  first = next(rows)
  assert len(pulled) < 5                                     # not the whole corpus first
  layouts = [first, *rows]
  assert len(pulled) == len(lengths) and sum(map(sum, layouts)) == sum(lengths)
  docs = [np.arange(n, dtype=np.int32) for n in lengths]
  expected = reference_next_fit(docs, row_len)
  assert [[sum(1 for _, s, _ in row if s == k) for k in range(1, 1 + max(s for _, s, _ in row))]
          for row in expected] == layouts


# --------------------------------------------------------------------------- pipelines

def test_stream_lm_batches_match_the_old_text_corpus_exactly(tmp_path, data_dir):
  cfg = data_config("tinyshakespeare", seq_len=64, eval_batches=3)
  p = pipeline(cfg, workdir=tmp_path, data_dir=data_dir, batch=12)
  assert p.task == "lm" and p.info == {"vocab_size": 65}
  full = sources.BUNDLED["tinyshakespeare"].read_text(encoding="utf-8")
  ids = p.tokenizer.encode(full)
  train, val = ids[:1003854], ids[1003854:]
  for step in (0, 7, 1999):
    old = old_text_corpus_batch(train, step, batch_size=12, seq_len=64, seed=3, split_id=0)
    new = p.train_batch(step)
    assert new.keys() == old.keys() and new["inputs"].dtype == np.int32
    for key in old:
      np.testing.assert_array_equal(new[key], old[key])
  evals = list(p.eval_batches())
  assert len(evals) == 3
  for i, batch in enumerate(evals):
    old = old_text_corpus_batch(val, i, batch_size=12, seq_len=64, seed=text.EVAL_SEED,
                                split_id=1)                 # eval: the data's seed, not the run's
    np.testing.assert_array_equal(batch["inputs"], old["inputs"])
    np.testing.assert_array_equal(batch["valid"], np.ones(12))
  assert tokenizers.load_tokenizer(tmp_path).chars == p.tokenizer.chars   # saved in workdir
  halves = [pipeline(cfg, workdir=tmp_path, data_dir=data_dir, batch=12, process_index=k,
                     process_count=2).train_batch(5)["targets"] for k in (0, 1)]
  np.testing.assert_array_equal(np.concatenate(halves), p.train_batch(5)["targets"])


def test_stream_eval_covers_the_whole_split_when_eval_batches_is_none(tmp_path, data_dir,
                                                                      small_file):
  cfg = data_config(small_file, seq_len=16, train_fraction=0.7, eval_batches=None)
  p = pipeline(cfg, workdir=tmp_path, data_dir=data_dir, batch=6)
  val = p.tokenizer.encode(SMALL_TEXT[int(len(SMALL_TEXT) * 0.7):])
  batches = list(p.eval_batches())
  valid = np.concatenate([b["valid"] for b in batches]).astype(bool)
  inputs = np.concatenate([b["inputs"] for b in batches])[valid]
  targets = np.concatenate([b["targets"] for b in batches])[valid]
  count = (len(val) - 17) // 16 + 1
  assert len(inputs) == count and not valid[count:].any()
  np.testing.assert_array_equal(inputs.reshape(-1), val[:count * 16])
  np.testing.assert_array_equal(targets.reshape(-1), val[1:count * 16 + 1])


def test_packed_lm_pipeline_batches_cache_and_processes(tmp_path, data_dir, small_file,
                                                        monkeypatch):
  cfg = data_config(small_file, tokenizer="spm:bpe:400", seq_len=24, packing="packed",
                    train_fraction=0.7, eval_batches=None)
  p = pipeline(cfg, workdir=tmp_path, data_dir=data_dir)
  tok, row_len = p.tokenizer, 25
  train_text = SMALL_TEXT[:int(len(SMALL_TEXT) * 0.7)]
  expected = pack_documents([tok.encode(train_text)], row_len)           # one document
  records = p.records["train"]
  assert len(records) == len(expected["tokens"])
  for i in range(len(records)):                        # the cached rows, in order
    seg = expected["segment_ids"][i]
    want = {"inputs": expected["tokens"][i, :-1], "targets": expected["tokens"][i, 1:],
            "segment_ids": seg[:-1], "positions": expected["positions"][i, :-1],
            "weights": (seg[1:] == seg[:-1]) & (seg[1:] > 0)}
    assert records[i].keys() == want.keys()
    for key, value in want.items():
      np.testing.assert_array_equal(records[i][key], value)
  steps = len(records) // 4                            # one epoch: every row once, shuffled
  batches = [p.train_batch(s) for s in range(steps)]
  assert {k: v.shape for k, v in batches[0].items()} == {k: (4, 24) for k in want}
  assert batches[0]["weights"].dtype == np.float32 and batches[0]["inputs"].dtype == np.int32
  seen = np.concatenate([b["inputs"] for b in batches])
  rows = np.stack([records[i]["inputs"] for i in range(len(records))])
  assert not np.array_equal(seen, rows[:len(seen)])
  assert len(np.unique(np.concatenate([seen, rows]), axis=0)) == len(np.unique(rows, axis=0))
  evals = list(p.eval_batches())
  assert sum(b["valid"].sum() for b in evals) == len(p.records["validation"])

  monkeypatch.setattr(packing, "next_fit_blocks", lambda *a: pytest.fail("re-packed"))
  halves = [pipeline(cfg, workdir=tmp_path, data_dir=data_dir, process_index=k,
                     process_count=2).train_batch(9) for k in (0, 1)]
  for key, value in p.train_batch(9).items():
    np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), value)


def test_catalog_source_packs_documents_by_default(tmp_path, data_dir, catalog):
  p = pipeline(data_config(catalog, tokenizer="spm:unigram:400", seq_len=32),
               workdir=tmp_path, data_dir=data_dir)
  assert isinstance(p, text.LMPackedPipeline) and p.info == {"vocab_size": 400}
  batch = p.train_batch(0)
  assert batch["weights"].sum() > 0 and (batch["segment_ids"] > 0).any()
  docs = [p.tokenizer.encode(d) for d in SMALL_TEXT.split("\n\n")[:40]]
  train = p.corpus.stream("train")                   # documents in order, each + eos
  np.testing.assert_array_equal(train.read(0, len(train)), np.concatenate(
      [np.append(d, p.tokenizer.eos_id) for d in docs]))


def test_packed_rows_are_indexed_once_and_reused_without_reading(tmp_path, data_dir, catalog,
                                                                monkeypatch):
  cfg = data_config(catalog, seq_len=24)
  p = pipeline(cfg, workdir=tmp_path, data_dir=data_dir)

  def must_not_read(*args, **kwargs):
    raise AssertionError("read the source or re-packed although the corpus is prepared")
  monkeypatch.setattr(readers, "texts", must_not_read)
  monkeypatch.setattr(packing, "next_fit_blocks", must_not_read)
  for workdir in (tmp_path, tmp_path / "other_run"):     # a new run: the char set is cached
    again = pipeline(cfg, workdir=workdir, data_dir=data_dir)
    for key, value in p.train_batch(3).items():
      np.testing.assert_array_equal(again.train_batch(3)[key], value)
  with pytest.raises(AssertionError, match="prepared"):    # the patch does bite
    pipeline(data_config(catalog, seq_len=20), workdir=tmp_path, data_dir=data_dir)


def test_interrupted_cache_write_leaves_no_file(tmp_path):
  from etils import epath
  path = epath.Path(tmp_path) / "train.rows"
  with pytest.raises(KeyboardInterrupt):
    with files.writing(path) as f:
      f.write(b"row")
      raise KeyboardInterrupt("killed while packing")
  assert list(tmp_path.iterdir()) == []
  with files.writing(path) as f:
    f.write(b"ab")
  assert [p.name for p in tmp_path.iterdir()] == ["train.rows"] and path.read_bytes() == b"ab"


def test_mlm_masking_statistics_determinism_and_processes(tmp_path, data_dir, small_file):
  cfg = data_config("tinyshakespeare", seq_len=128, mask_rate=0.15, eval_batches=2)
  p = pipeline(cfg, "mlm", workdir=tmp_path, data_dir=data_dir, batch=64)
  assert p.task == "mlm" and p.info == {"vocab_size": 66} and p.mask_id == 65
  batch = p.train_batch(4)
  selected = batch["weights"] == 1
  assert 0.13 < selected.mean() < 0.17
  masked = selected & (batch["inputs"] == 65)
  kept = selected & (batch["inputs"] == batch["targets"])
  assert 0.76 < masked.sum() / selected.sum() < 0.84
  assert 0.07 < kept.sum() / selected.sum() < 0.13
  np.testing.assert_array_equal(batch["inputs"][~selected], batch["targets"][~selected])
  assert batch["inputs"].max() <= 65 and batch["weights"].dtype == np.float32
  windows = text.stream_windows(p.streams["train"], seed=3, split_id=0, step=4,
                                batch_size=64, length=128)
  np.testing.assert_array_equal(batch["targets"], windows)
  halves = [pipeline(cfg, "mlm", workdir=tmp_path, data_dir=data_dir, batch=64,
                     process_index=k, process_count=2).train_batch(4) for k in range(2)]
  for key in batch:
    np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), batch[key])
  first, again = list(p.eval_batches()), list(p.eval_batches())
  assert len(first) == 2 and not np.array_equal(first[0]["inputs"], first[1]["inputs"])
  np.testing.assert_array_equal(first[1]["inputs"], again[1]["inputs"])
  rare = pipeline(data_config(small_file, seq_len=8, mask_rate=1e-9), "mlm",
                  workdir=tmp_path / "rare", data_dir=data_dir, batch=16).train_batch(0)
  np.testing.assert_array_equal(rare["weights"].sum(1), np.ones(16))     # at least one


@pytest.mark.parametrize("field, value, match", [
    ("seq_len", 4096, "data.seq_len=4096 is longer than the validation split"),
    ("seq_len", 0, "data.seq_len=0 must be"),
    ("packing", "ragged", "data.packing='ragged'"),
    ("eval_batches", 0, "data.eval_batches=0"),
    ("mask_rate", 0.0, "data.mask_rate=0.0"),
    ("tokenizer", None, "data.tokenizer is not set")])
def test_bad_data_configs_name_the_field(tmp_path, data_dir, small_file, field, value, match):
  cfg = data_config(small_file, train_fraction=0.7)
  cfg[field] = value
  with pytest.raises(ValueError, match=match):
    pipeline(cfg, "mlm" if field == "mask_rate" else "lm", workdir=tmp_path, data_dir=data_dir)


def test_batch_size_arguments_are_checked(tmp_path, data_dir, small_file):
  cfg = data_config(small_file, train_fraction=0.7)
  with pytest.raises(ValueError, match="eval_batch_size=3"):
    text.make_text_pipeline(cfg, seed=0, global_batch_size=4, eval_batch_size=3,
                            process_count=2, workdir=str(tmp_path), data_dir=data_dir)
  with pytest.raises(ValueError, match="task='seq2seq'"):
    text.make_text_pipeline(cfg, "seq2seq", seed=0, global_batch_size=4, eval_batch_size=4,
                            workdir=str(tmp_path), data_dir=data_dir)


def _hf_tokenizer(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  hf = Tokenizer(models.WordLevel(unk_token="[UNK]"))
  hf.pre_tokenizer = pre_tokenizers.Whitespace()
  hf.train_from_iterator([SMALL_TEXT], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
  hf.save(str(tmp_path / "tokenizer.json"))
  return tokenizers.make_tokenizer(f"hf:{tmp_path / 'tokenizer.json'}", lambda: [],
                                   tmp_path / "run")


@pytest.mark.parametrize("kind", ["char", "spm", "hf"])
def test_padded_vocabulary_samples_decode_and_bad_ids_are_refused(tmp_path, kind):
  """Every tokenizer kind: decode refuses ids past its vocabulary (and negative ones) with a
  clear error, and sampling from a model whose vocabulary is padded far past the tokenizer's
  never produces such an id."""
  import jax
  from flax import linen as nn
  from jaxformer import models
  from jaxformer.inference import sample_text
  lines = SMALL_TEXT.split("\n\n")
  tok = {"char": lambda: tokenizers.make_tokenizer("char", lambda: lines, tmp_path / "c"),
         "spm": lambda: tokenizers.make_tokenizer("spm:bpe:400", lambda: lines, tmp_path / "s"),
         "hf": lambda: _hf_tokenizer(tmp_path)}[kind]()
  for bad in (tok.vocab_size, -1):
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the tokenizer's "
                                         rf"vocabulary \[0, {tok.vocab_size}\)"):
      tok.decode([0, bad])
  vocab = 4 * tok.vocab_size                 # 3/4 of the model's ids have no token
  cfg = ConfigDict(dict(family="decoder", vocab_size=vocab, d_model=16, num_layers=1,
                        num_heads=2, mlp_dim=32, max_len=48))
  params = nn.unbox(models.build(cfg).init(jax.random.key(0), np.zeros((1, 4), np.int32)))
  for seed in range(3):
    text = sample_text(ConfigDict(dict(model=cfg)), params["params"], tok, prompt="ROMEO:", max_new_tokens=40,
                       temperature=1.0, seed=seed)
    assert isinstance(text, str) and len(text) > 0


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_eval_batches_are_the_same_for_every_run_seed(small_file, data_dir, tmp_path, task):
  """The eval set belongs to the data: runs of seeds 3 and 4 train on different windows but
  are scored on the same eval windows (and MLM eval masks), so a seed study measures training
  noise, not the eval sample's."""
  cfg = data_config(small_file, eval_batches=3)
  a = pipeline(cfg, task, workdir=tmp_path / "a", data_dir=data_dir, seed=3)
  b = pipeline(cfg, task, workdir=tmp_path / "b", data_dir=data_dir, seed=4)
  for x, y in zip(a.eval_batches(), b.eval_batches()):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])
  assert not np.array_equal(a.train_batch(5)["inputs"], b.train_batch(5)["inputs"])
