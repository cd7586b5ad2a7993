"""Corpora of any size: every source kind prepared and trained on, preparation killed and
resumed, memory that does not grow with the corpus, changed files, per-process reads."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxformer.data import packing, text, tfds_catalog
from jaxformer.data.corpus import prepare, readers, sources, tokens, units, work
from tests.runs import tiny_run_config
from tests.e2e.test_cloud_storage import BUCKET, gcs  # noqa: F401  (the emulator fixture)
from tests.user_errors import user_error
from tests.repo_root import REPO

ROOT = str(REPO)
LINES = sources.BUNDLED["tinyshakespeare"].read_text(encoding="utf-8").split("\n")[:4000]


def documents(n: int, seed: int = 0) -> list[str]:
  """`n` documents of 2-40 Shakespeare lines (only its 65 characters: vocab <= 65)."""
  rng = np.random.default_rng(seed)
  return ["\n".join(LINES[s:s + k]) for s, k in zip(rng.integers(0, 3900, n),
                                                    rng.integers(2, 40, n))]


def data_config(source, tokenizer="char", seq_len=16, **extra):
  return ConfigDict(dict(source=str(source), tokenizer=tokenizer, seq_len=seq_len, **extra))


def pipeline(cfg, tmp_path, *, run="run", batch=4, **kw):
  """The pipeline of `cfg` with its workdir tmp_path/run and data dir tmp_path/dd."""
  return text.make_text_pipeline(cfg, seed=3, global_batch_size=batch, eval_batch_size=batch,
                                 workdir=str(tmp_path / run), data_dir=str(tmp_path / "dd"),
                                 **kw)


def _write(path, data: bytes):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)


def _jsonl(docs) -> bytes:
  return "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)).encode()


def _parquet(path, docs):
  import pyarrow as pa
  import pyarrow.parquet as pq
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), str(path),
                 row_group_size=64)


def make_source(kind: str, root) -> str:
  """A tiny corpus of `kind` under `root`; the data.source that names it."""
  docs = documents(300)
  if kind in ("txt", "txt.gz"):
    _write(root / f"one.{kind}", "\n".join(docs).encode())
    return str(root / f"one.{kind}")
  if kind == "txt_dir":
    for i, d in enumerate(docs[:120]):
      _write(root / "books" / f"{i:03d}.txt", d.encode())
    return str(root / "books")
  if kind in ("jsonl", "jsonl.gz"):
    _write(root / "a" / f"part0.{kind}", _jsonl(docs[:150]))
    _write(root / "a" / f"part1.{kind}", _jsonl(docs[150:]))
    return str(root / "a" / f"part*.{kind}")
  if kind == "parquet":
    _parquet(root / "docs.parquet", docs)
    return str(root / "docs.parquet")
  if kind == "hf":
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs[:250]}),
                          "validation": datasets.Dataset.from_dict({"text": docs[250:]})}
                         ).save_to_disk(str(root / "hf"))
    return str(root / "hf")
  assert kind == "tfds"
  TinyDocs.DOCS = docs
  builder = TinyDocs(data_dir=str(root / "dd"), file_format="array_record")
  with tfds_catalog.quiet_tfds():
    builder.download_and_prepare()
  return "tfds:tiny_docs"


import tensorflow_datasets as tfds  # noqa: E402


class TinyDocs(tfds.core.GeneratorBasedBuilder):
  """A TFDS catalog dataset of generated documents (tests only)."""
  VERSION = tfds.core.Version("1.0.0")
  DOCS: list[str] = []

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    cut = len(self.DOCS) * 5 // 6                 # the last sixth: validation
    return {"train": self._generate_examples(self.DOCS[:cut]),
            "validation": self._generate_examples(self.DOCS[cut:])}

  def _generate_examples(self, docs):
    for i, doc in enumerate(docs):
      yield i, {"text": doc}


KINDS = ["txt", "txt.gz", "txt_dir", "jsonl", "jsonl.gz", "parquet", "hf", "tfds"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_source_kind_is_prepared_with_each_document_whole(tmp_path, kind):
  source = make_source(kind, tmp_path)
  p = pipeline(data_config(source, seq_len=32), tmp_path)
  one_text = kind in ("txt", "txt.gz")
  assert isinstance(p, text.LMStreamPipeline if one_text else text.LMPackedPipeline)
  assert p.train_batch(0)["inputs"].shape == (4, 32)
  train, val = p.corpus.stream("train"), p.corpus.stream("validation")
  docs = documents(300)[:120] if kind == "txt_dir" else documents(300)
  if one_text:                                   # char tokens: one per character
    assert len(train) + len(val) == len("\n".join(docs))
  else:                                          # documents: each whole in one split
    lengths = [*train.document_lengths(), *val.document_lengths()]
    assert sorted(lengths) == sorted(map(len, docs))



def test_packed_rows_read_back_next_fit_of_the_documents(tmp_path):
  """The row index (.rows, .pieces) read by offset gives next_fit's rows of the split's
  documents in order: rows holding several documents, documents across rows."""
  from tests.unit.data.test_data_text import pack_documents
  _write(tmp_path / "docs.jsonl", _jsonl(documents(80)))
  p = pipeline(data_config(tmp_path / "docs.jsonl", seq_len=400), tmp_path)
  stream = p.corpus.stream("train")
  lengths = np.asarray(list(stream.document_lengths()))
  docs = np.split(stream.read(0, len(stream)), np.cumsum(lengths)[:-1])
  expected, rows = pack_documents(docs, 401), p.corpus.packed("train", 401)
  assert len(rows) == len(expected["tokens"]) and (lengths > 401).any()
  assert (expected["segment_ids"].max(axis=1) > 1).any()
  for i in range(len(rows)):
    for k, field in enumerate(packing.PACKED_FIELDS):
      np.testing.assert_array_equal(rows[i][k], expected[field][i])

# One kind of each way into training: one text (stream windows), documents split by hash,
# named splits (packed rows). How each of the 8 kinds is read and prepared into those is
# test_every_source_kind_is_prepared_with_each_document_whole's, down to the first batch.
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["txt", "jsonl", "hf"])
def test_source_kinds_train(tmp_path, kind):
  """Each way a source reaches training trains a few steps through `loop.train`: one text
  (stream windows), documents split by hash or named splits (packed rows)."""
  from jaxformer.train import loop
  cfg = tiny_run_config(steps=2, log_every=1, eval_every=2, checkpoint_every=2)
  cfg.data.update(source=make_source(kind, tmp_path), data_dir=str(tmp_path / "dd"))
  assert np.isfinite(loop.train(cfg, str(tmp_path / "run"))["eval_loss"])


def test_document_split_is_by_hash_and_one_text_by_characters(tmp_path):
  docs = documents(200)
  _write(tmp_path / "d.jsonl", _jsonl(docs + docs[:20]))         # duplicates: same split
  p = pipeline(data_config(tmp_path / "d.jsonl", train_fraction=0.8), tmp_path)
  for role in work.ROLES:
    want = [d for d in docs + docs[:20] if work.digest_role(
        hashlib.sha256(d.encode()).digest(), 0.8) == role]
    stream = p.corpus.stream(role)
    assert p.tokenizer.decode(stream.read(0, len(stream))) == "".join(want)
  assert 0.6 < len(p.corpus.stream("train")) / (len("".join(docs + docs[:20]))) < 0.95
  (tmp_path / "one.txt").write_text("ab\r\ncd\ref\n" * 50)
  q = pipeline(data_config(tmp_path / "one.txt", train_fraction=0.7), tmp_path, run="q")
  whole = "ab\ncd\nef\n" * 50
  cut = int(len(whole) * 0.7)
  for role, want in (("train", whole[:cut]), ("validation", whole[cut:])):
    stream = q.corpus.stream(role)
    assert q.tokenizer.decode(stream.read(0, len(stream))) == want


def test_units_cut_after_newlines_and_read_back_the_text(tmp_path, monkeypatch):
  monkeypatch.setattr(units, "UNIT_BYTES", 1000)
  monkeypatch.setattr(readers, "BLOCK_BYTES", 300)
  body = "\n".join(documents(60)) + "\nno newline at the end ¿é"
  (tmp_path / "t.txt").write_text(body, encoding="utf-8")
  plan = units.plan(sources.resolve(str(tmp_path / "t.txt")))
  assert len(plan) > 5 and plan[0].start == 0 and plan[-1].stop == len(body.encode())
  pieces = [t for u in plan for t, _ in readers.texts(u, "text")]
  assert "".join(pieces) == body and all(p.endswith("\n") for p in pieces[:-1])


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_encodes_line_by_line_as_the_whole_text(tmp_path, model_type):
  """Why pieces cut after a newline (readers.py) and lines (SentencePieceTokenizer.encode)
  give the ids of the whole text: "\n" is a piece no other piece crosses."""
  from jaxformer.data import tokenizers
  whole = "\n".join(documents(80)) + "\n\n  odd\u2028line\rend\n\n\ntail ¿é"
  tok = tokenizers.make_tokenizer(f"spm:{model_type}:400", lambda: whole.split("\n\n"),
                                  tmp_path)
  expected = np.asarray(tok._sp.encode(whole), np.int32)
  np.testing.assert_array_equal(tok.encode(whole), expected)
  lines = whole.splitlines(keepends=True)
  pieces = ["".join(lines[i:i + 7]) for i in range(0, len(lines), 7)]
  np.testing.assert_array_equal(np.concatenate([tok.encode(p) for p in pieces]), expected)


_KILLED = """
import sys, time
from jaxformer.data.corpus import prepare, units, work
units.UNIT_BYTES = 4000
tokenize = work.tokenize_unit
def stall(task, **kw):
  if task[0].index == 3:
    print("stalled", flush=True)
    time.sleep(600)
  return tokenize(task, **kw)
work.tokenize_unit = stall
prepare.prepare(sys.argv[1], "char", options=prepare.Options(workers=1), workdir=sys.argv[2],
                data_dir=sys.argv[3])
"""


def test_killed_preparation_never_looks_complete_and_resumes(tmp_path, monkeypatch, capsys):
  source = tmp_path / "t.txt"
  source.write_text("\n".join(documents(200)))
  dd, run = tmp_path / "dd", tmp_path / "run"
  proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(source), str(run), str(dd)],
                          stdout=subprocess.PIPE, text=True, cwd=ROOT)
  try:
    assert any(line.endswith("stalled\n") for line in proc.stdout)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  (tokens_dir,) = dd.glob(f"{prepare.CACHE_NAME}/*/tokens-*")
  assert not (tokens_dir / "index.json").exists()
  assert sorted(p.name for p in tokens_dir.glob("*.json")) == [
      f"{i:05d}.json" for i in range(3)]
  options = prepare.Options(workers=1)
  capsys.readouterr()
  resumed = prepare.prepare(str(source), "char", options=options, workdir=run, data_dir=str(dd))
  out = capsys.readouterr().out
  assert re.search(r"tokenizing .* once \(\d+ of \d+ parts left\)", out), out
  assert "preparing" not in out                            # the scan was complete: kept
  clean = prepare.prepare(str(source), "char", options=options, workdir=tmp_path / "run2",
                          data_dir=str(tmp_path / "dd2"))
  for role in work.ROLES:
    a, b = resumed.stream(role), clean.stream(role)
    np.testing.assert_array_equal(a.read(0, len(a)), b.read(0, len(b)))
  assert (tokens_dir / "index.json").exists()


def test_unchanged_corpus_is_not_read_and_a_changed_file_is_detected(tmp_path, monkeypatch,
                                                                     capsys):
  src = tmp_path / "books"
  docs = documents(40)
  for i, d in enumerate(docs):
    _write(src / f"{i:02d}.txt", d.encode())
  cfg = data_config(src, seq_len=8)
  first = pipeline(cfg, tmp_path)
  before = first.corpus.directory

  def must_not_read(*a, **k):
    raise AssertionError("read the corpus although it is prepared")
  monkeypatch.setattr(readers, "texts", must_not_read)
  again = pipeline(cfg, tmp_path, run="other")     # a new workdir: the char set comes cached
  assert again.corpus.directory == before
  for key, value in first.train_batch(2).items():
    np.testing.assert_array_equal(again.train_batch(2)[key], value)
  monkeypatch.undo()
  path = src / "07.txt"
  data = bytearray(path.read_bytes())
  data[len(data) // 2] = ord("Z") if data[len(data) // 2] != ord("Z") else ord("Y")
  stat = path.stat()
  path.write_bytes(bytes(data))
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))   # same size, same mtime
  changed = pipeline(cfg, tmp_path, run="third")
  assert changed.corpus.directory != before
  assert changed.corpus.index["sha256"] != first.corpus.index["sha256"]


@pytest.mark.parametrize("packing", ["stream", "packed"])
def test_processes_read_disjoint_rows_that_make_the_global_batch(tmp_path, monkeypatch,
                                                                 packing):
  source = make_source("jsonl", tmp_path)
  reads = []
  read = tokens.TokenStream.read

  def recorded(self, start, length):
    reads.append((start, length))
    return read(self, start, length)
  cfg = data_config(source, seq_len=24, packing=packing)
  whole = pipeline(cfg, tmp_path, batch=8)
  monkeypatch.setattr(tokens.TokenStream, "read", recorded)
  full = whole.train_batch(5)
  everything, reads[:] = list(reads), []
  halves, seen = [], []
  for k in range(2):
    halves.append(pipeline(cfg, tmp_path, batch=8, process_index=k,
                           process_count=2).train_batch(5))
    seen.append(set(reads))
    reads[:] = []
  assert not seen[0] & seen[1] and seen[0] | seen[1] == set(everything)
  assert len(seen[0]) == len(seen[1]) == 4
  for key, value in full.items():
    np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), value)


_PEAK = """
import sys
from jaxformer.data.corpus import prepare
prepare.prepare(sys.argv[1], "char", options=prepare.Options(workers=1), workdir=sys.argv[2],
                data_dir=sys.argv[3])
print(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's VmHWM")
def test_preparation_memory_does_not_grow_with_the_corpus(tmp_path):
  """Peak RSS (VmHWM: ru_maxrss would count the forking pytest worker) preparing 8 MB vs
  32 MB of text (one file: the old code read it whole, ~12 bytes per character): the larger
  corpus may add a few MB, not 24 MB x 12."""
  block = "\n".join(documents(400)).encode()
  peaks = {}
  for mb in (8, 32):
    path = tmp_path / f"c{mb}.txt"
    with path.open("wb") as f:
      for _ in range(mb * (1 << 20) // len(block)):
        f.write(block + b"\n")
    out = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(tmp_path / f"run{mb}"),
                          str(tmp_path / "dd")], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    peaks[mb] = int(out.split()[-1]) / 1024                  # MiB
  assert peaks[32] - peaks[8] < 16, peaks



_PIPELINE_PEAK = """
import sys
from ml_collections import ConfigDict
from jaxformer.data import text
cfg = ConfigDict(dict(source=sys.argv[1], tokenizer="char", seq_len=16, workers=1))
p = text.make_text_pipeline(cfg, seed=0, global_batch_size=8, eval_batch_size=8,
                            workdir=sys.argv[2], data_dir=sys.argv[3])
for step in range(0, 1 << 20, 1 << 14):             # batches from all over the split
  p.train_batch(step)
next(iter(p.eval_batches()))
print(len(p.records["train"]),
      next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])
"""


def _jsonl_gz_corpus(directory, total_bytes: int, file_bytes: int = 1 << 19):
  """.jsonl.gz files of about `file_bytes` each (compressed), about `total_bytes` in all."""
  block = _jsonl(documents(400))
  directory.mkdir(parents=True)
  written = 0
  while written < total_bytes:
    path = directory / f"part-{written // file_bytes:03d}.jsonl.gz"
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1,
                                                mtime=0) as f:
      while raw.tell() < min(file_bytes, total_bytes - written):
        f.write(block)
    written += path.stat().st_size


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's VmHWM")
def test_packed_pipeline_memory_does_not_grow_with_the_corpus(tmp_path):
  """Peak RSS (VmHWM) of a process that prepares 0.5 MB vs 4 MB of .jsonl.gz files (1 vs 8
  files, ~1.3 vs 10 M characters; in-process, workers=1), packs them into rows of 17 tokens
  and reads batches from all over the split and an eval batch. What may scale with the
  corpus is only per file (a unit: a json entry, a few array elements; kilobytes);
  everything else (tokenizing, the document ends, the row index) moves in blocks of a fixed
  size, which both sizes fill (1 M tokens, 128 Ki ends, 64 Ki rows). So the 8x corpus
  (~0.5 M more rows) may cost allocator noise, a few MB: 12 MB. The ArrayRecord row index
  used before held ~120 bytes a row in memory at its peak (+134 MB measured at 1 vs 8 MB).
  """
  peaks, rows = {}, {}
  for mb in (1, 8):
    _jsonl_gz_corpus(tmp_path / f"c{mb}", mb << 19)
    out = subprocess.run([sys.executable, "-c", _PIPELINE_PEAK, str(tmp_path / f"c{mb}/*.gz"),
                          str(tmp_path / f"run{mb}"), str(tmp_path / "dd")],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    rows[mb], peak = map(int, out.split()[-2:])
    peaks[mb] = peak / 1024                                  # MiB
  assert rows[8] > 6 * rows[1], rows
  assert peaks[8] - peaks[1] < 12, (peaks, rows)

def _made(path, data: bytes = b"x"):
  _write(path, data)
  return path


@pytest.mark.parametrize("make, match", [
    (lambda p: _made(p / "x.csv"),
     "data.source=.*x.csv is not a kind of source jaxformer reads; give a .txt, .jsonl"),
    (lambda p: p / "missing", "no such file or directory; give"),
    (lambda p: (p / "e").mkdir() or p / "e", "holds no .txt, .jsonl or .parquet file"),
    (lambda p: str(p / "*.nothing"), "holds no .txt, .jsonl or .parquet file"),
    (lambda p: _made(p / "d.jsonl", b'{"body": "x"}\n'),
     r"data.text_field='text': .*d.jsonl \(the line at byte offset 0\) has no such field "
     r"\(it has \['body'\]\)"),
    (lambda p: _made(p / "d.jsonl", b'{"text": 3}\n'), "holds a int"),
    (lambda p: _made(p / "d.jsonl", b'{"text": "a"}\nnot json\n'),
     r"the line at byte offset 14\) is not JSON"),
    (lambda p: _parquet(p / "d.parquet", ["a"]) or p / "d.parquet",
     r"data.text_field='body': .*has no such column"),
    (lambda p: _made(p / "b.txt", b"ab\x00c"), "NUL byte at byte offset 2"),
    (lambda p: _made(p / "l.txt", b"ab\xe9c"), r"is not UTF-8 text \(byte offset 2"),
    (lambda p: "tfds:Bad Name!", "expected 'tfds:<name>"),
], ids=["suffix", "missing", "empty_dir", "glob", "jsonl_field", "jsonl_type", "jsonl_json",
        "parquet_field", "nul", "latin1", "tfds_name"])
def test_source_mistakes_are_one_line_errors_naming_the_field(tmp_path, make, match):
  source = make(tmp_path)
  extra = {"text_field": "body"} if "parquet" in str(source) else {}
  message = user_error(lambda: pipeline(data_config(source, **extra), tmp_path))
  assert re.search(match, message) and "\n" not in message, message


def test_a_dataset_source_without_datasets_installed_says_how_to_install(tmp_path,
                                                                         monkeypatch):
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "dataset_dict.json").write_text('{"splits": ["train"]}')
  monkeypatch.setitem(sys.modules, "datasets", None)
  user_error(lambda: pipeline(data_config(tmp_path / "hf"), tmp_path),
             "is a Hugging Face dataset; reading it needs `datasets`: pip install "
             "'jaxformer[corpora]'")


def test_named_splits_and_tfds_names(tmp_path):
  source = make_source("hf", tmp_path)
  user_error(lambda: pipeline(data_config(source, eval_split="test"), tmp_path),
             "data.eval_split='test': data.source=", "its splits are ['train', 'validation']")
  for name in ("huggingface:ag_news", "huggingface:wikitext/wikitext-2-raw-v1:1.0.0",
               "lm1b/subwords8k:1.1.0"):
    assert tfds_catalog.parse_tfds_source("tfds:" + name) == name
  assert sources.resolve("tfds:huggingface:ag_news").kind == "tfds"


def test_trained_tokenizers_learn_from_a_bounded_sample_of_the_train_split(tmp_path,
                                                                           monkeypatch):
  docs = documents(300)
  _write(tmp_path / "d.jsonl", _jsonl(docs))
  monkeypatch.setattr(prepare, "SAMPLE_CHARS", 5000)
  monkeypatch.setattr(units, "UNIT_BYTES", 20000)
  given = []
  make = prepare.make_tokenizer

  def spy(spec, texts, directory):
    given.extend(texts())
    return make(spec, texts, directory)
  monkeypatch.setattr(prepare, "make_tokenizer", spy)
  p = pipeline(data_config(tmp_path / "d.jsonl", tokenizer="spm:bpe:400", workers=1), tmp_path)
  plan_units = len(p.corpus.index["roles"]["train"])
  assert plan_units > 3 and sum(map(len, given)) <= 5000
  train_docs = {d for d in docs if work.digest_role(
      hashlib.sha256(d.encode()).digest(), 0.9) == "train"}
  assert all(any(g in d for d in train_docs) for g in given)


def test_gs_sources_and_caches_go_through_the_path_layer(gcs, tmp_path):
  """A glob of .jsonl files in a bucket (prepared into a local cache) and a .txt file in a
  bucket prepared into a cache in the bucket: the same tokens as the local copies."""
  from etils import epath
  bucket = epath.Path(f"gs://{BUCKET}/corpus")
  docs = documents(120)
  for name, data in (("a.jsonl", _jsonl(docs[:60])), ("b.jsonl", _jsonl(docs[60:])),
                     ("one.txt", "\n".join(docs).encode())):
    (bucket / name).write_bytes(data)
    _write(tmp_path / "local" / name, data)
  for pattern, data_dir in (("*.jsonl", str(tmp_path / "dd")), ("one.txt", f"gs://{BUCKET}/dd")):
    remote, local = (text.make_text_pipeline(
        data_config(f"{root}/{pattern}", packing="stream", workers=1), seed=0,
        global_batch_size=4, eval_batch_size=4, workdir=str(tmp_path / run / pattern[-4:]),
        data_dir=dd) for root, run, dd in ((bucket, "remote", data_dir),
                                           (tmp_path / "local", "local", str(tmp_path / "dd2"))))
    for role in work.ROLES:
      a, b = remote.corpus.stream(role), local.corpus.stream(role)
      np.testing.assert_array_equal(a.read(0, len(a)), b.read(0, len(b)))
  # packed rows: their row index is written locally and uploaded, and read by offset from a
  # local copy
  remote, local = (text.make_text_pipeline(
      data_config(f"{root}/*.jsonl", packing="packed", workers=1), seed=0, global_batch_size=4,
      eval_batch_size=4, workdir=str(tmp_path / run / "packed"), data_dir=dd)
      for root, run, dd in ((bucket, "remote", f"gs://{BUCKET}/dd"),
                            (tmp_path / "local", "local", str(tmp_path / "dd3"))))
  for key, value in local.train_batch(3).items():
    np.testing.assert_array_equal(remote.train_batch(3)[key], value)
  user_error(lambda: pipeline(data_config("ftp://host/x.txt"), tmp_path),
             "data.source='ftp://host/x.txt': ftp:// is not a storage jaxformer can use")


def test_a_cache_file_another_process_finished_meanwhile_is_replaced(tmp_path):
  """Two runs of a sweep preparing one corpus at once both finish the same file: the second
  rename must not fail (a sweep's run died with FileExistsError here)."""
  from etils import epath
  from jaxformer.data.corpus import files
  path = epath.Path(tmp_path / "00000.train.ends")
  for content in (b"first", b"second"):
    tmp = files.temporary(path)
    tmp.write_bytes(content)
    files.finish(tmp, path)
  assert path.read_bytes() == b"second" and sorted(p.name for p in tmp_path.iterdir()) == [
      "00000.train.ends"]
