"""`prepare(...)`: a text source tokenized once into sharded token files, then opened.

Cache layout, under `<data_dir>/jaxformer_corpora/<corpus key>/`: `scan.json` (the units and,
per unit, its character set, counts and SHA-256), and per tokenizer `tokens-<fingerprint>/`
with each unit's token files (work.py) and `index.json`, written last: a directory without
it is unfinished, and the next run resumes it at the first unit without its counts.

The corpus key is a cheap fingerprint, computed at every start without reading the corpus:
every file's name, size, mtime and a SHA-256 of 3 x 64 KiB samples (head, middle, tail), plus
the reading options. A changed, added or removed file gives a new key (and a new
preparation); the full SHA-256 of the text is computed only while preparing (`index.json`
records it). Both passes (scan, tokenize) run over the units in `workers` spawned processes
(spawned, not forked: the caller may run JAX's threads); each worker streams its unit, so
memory does not grow with the corpus. Spawned workers import the caller's main module, so a
script (not `python -m jaxformer.train`) that prepares a corpus with several workers needs
the usual `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import multiprocessing
import os
from typing import Callable, Iterator

import grain
from etils import epath

from jaxformer import console, paths
from jaxformer.data.corpus import files, sources, tokens, units, work
from jaxformer.data.tokenizers import Tokenizer, make_tokenizer, parse_spec

CORPUS_FORMAT = 1             # bump when the cache layout changes
CACHE_NAME = "jaxformer_corpora"
SAMPLE_CHARS = 10_000_000     # trained tokenizers learn from at most this many characters
SENTENCE_CHARS = 1 << 16      # ... given to them in pieces of at most this many
_SAMPLE_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class Options:
  """How a source is read: `text_field` of records, `train_fraction` (one text: of its
  characters; documents: of the hash range), the named splits of datasets that have them,
  and the worker processes (None: one per CPU core)."""
  text_field: str = "text"
  train_fraction: float = 0.9
  split_names: tuple[str, str] = ("train", "validation")
  workers: int | None = None


@dataclasses.dataclass
class Prepared:
  """A prepared corpus: its tokenizer and its splits' token streams."""
  tokenizer: Tokenizer
  directory: epath.Path
  index: dict

  def stream(self, role: str) -> tokens.TokenStream:
    return tokens.TokenStream(self.directory, role, self.index["roles"][role],
                              self.index["dtype"])

  def packed(self, role: str, row_len: int) -> grain.MapDataset:
    return tokens.packed_rows(self.stream(role), self.directory /
                              f"packed-{row_len}.{role}", row_len)


def _sample_hash(path: epath.Path, size: int) -> str:
  digest = hashlib.sha256()
  with path.open("rb") as f:
    for offset in sorted({0, max(size // 2 - _SAMPLE_BYTES // 2, 0),
                          max(size - _SAMPLE_BYTES, 0)}):
      f.seek(offset)
      digest.update(f.read(_SAMPLE_BYTES))
  return digest.hexdigest()


def _file_fingerprints(paths) -> list:
  paths = sorted(paths, key=str)
  root = os.path.commonpath([os.fspath(p) for p in paths]) if len(paths) > 1 else ""
  stats = [(p, p.stat()) for p in paths]
  return [[os.path.relpath(os.fspath(p), root) if root else p.name, s.length, s.mtime,
           _sample_hash(p, s.length)] for p, s in stats]


def _dataset_splits(source: sources.Source, options: Options, data_dir: str) -> tuple[list, list]:
  """(splits as units.plan takes them, fingerprint) of a Hugging Face or TFDS source."""
  roles = dict(zip(work.ROLES, options.split_names))
  fields = dict(zip(work.ROLES, ("data.train_split", "data.eval_split")))
  if source.kind == "tfds":
    from jaxformer.data import tfds_catalog
    builder = tfds_catalog.catalog_builder(source.spec, data_dir)
    tfds_catalog.check_text_field(builder, options.text_field, source.spec)
    splits = []
    for role, name in roles.items():
      tfds_catalog.check_split(builder, name, source.spec, fields[role])
      info = builder.info.splits[name]
      splits.append((role, name, info.num_examples, info.num_bytes // max(info.num_examples, 1)))
    return splits, [builder.info.full_name, data_dir]
  from jaxformer.data.corpus import readers
  dataset = readers.hf_dataset(str(source.paths[0]), None)
  if isinstance(dataset.column_names, dict):              # a DatasetDict: named splits
    for role, name in roles.items():
      if name not in dataset:
        raise ValueError(f"{fields[role]}={name!r}: data.source={source.spec!r} has no such "
                         f"split; its splits are {sorted(dataset)}")
    parts = [(role, name, dataset[name]) for role, name in roles.items()]
  else:
    parts = [(None, None, dataset)]
  splits = [(role, name, len(d), d.data.nbytes // max(len(d), 1)) for role, name, d in parts]
  return splits, _file_fingerprints(sources.walk_files(source.paths[0]))


def _parts(n: int) -> str:
  return f"{n} part{'s' * (n != 1)}"


def _run(fn: Callable, tasks: list, workers: int) -> list:
  """[fn(t) for t in tasks], over `workers` spawned processes when there is more than one
  task."""
  if workers <= 1 or len(tasks) <= 1:
    return [fn(t) for t in tasks]
  with multiprocessing.get_context("spawn").Pool(min(workers, len(tasks))) as pool:
    try:
      return pool.map(fn, tasks, chunksize=1)
    except ValueError as e:                    # a data mistake in a worker: still one line
      raise ValueError(str(e)) from None


def _scan(source: sources.Source, splits: list, directory: epath.Path, options: Options,
          data_dir: str, workers: int) -> dict:
  path = directory / "scan.json"
  if path.exists():
    return json.loads(path.read_text())
  sources.require_writable_data_dir(data_dir)
  plan = units.plan(source, splits)
  size = sum(u.size for u in plan)
  with console.announce(f"preparing data.source={source.spec!r} ({size / 1e6:,.1f} MB) once, "
                        f"into {console.short_path(directory)}") as note:
    scans = _run(functools.partial(work.scan_unit, field=options.text_field,
                                   data_dir=data_dir), plan, workers)
    note.details = f"{sum(s['count'] for s in scans):,} characters, {_parts(len(plan))}"
  scan = {"units": [dataclasses.asdict(u) for u in plan], "scans": scans}
  directory.mkdir(parents=True, exist_ok=True)
  files.write_json(path, scan)
  return scan


def _one_text_split(source: sources.Source, scans: list, fraction: float) -> list[int]:
  """Each unit's count of train characters: the first `fraction` of the text is train."""
  path, total = source.paths[0], sum(s["count"] for s in scans)
  if all(s["blank"] for s in scans):
    raise ValueError(f"data.source={source.spec!r}: {path} holds only whitespace "
                     f"({path.stat().length} bytes), no text to train on; give a UTF-8 text "
                     "file with text")
  split = int(total * fraction)
  if not 1 <= split < total:
    raise ValueError(f"data.source={source.spec!r}: {path} holds {total} character"
                     f"{'s' * (total != 1)}, too few to split at data.train_fraction="
                     f"{fraction} (each split needs one); give a longer text file")
  starts = [sum(s["count"] for s in scans[:i]) for i in range(len(scans))]
  return [split - start for start in starts]


def _sentences(text: str) -> Iterator[str]:
  """`text` in pieces of at most SENTENCE_CHARS, cut after a newline where there is one."""
  while text:
    cut = len(text) if len(text) <= SENTENCE_CHARS else (
        text.rfind("\n", 0, SENTENCE_CHARS) + 1 or SENTENCE_CHARS)
    yield text[:cut]
    text = text[cut:]


def _sample(tasks: list, read: Callable) -> Iterator[str]:
  """Train texts for a tokenizer: the first SAMPLE_CHARS / len(tasks) of each unit."""
  budget = SAMPLE_CHARS // max(len(tasks), 1)
  for task in tasks:
    left = budget
    for role, text, _ in read(task):
      if role != "train":
        continue
      for sentence in _sentences(text[:left]):
        yield sentence
      left -= min(len(text), left)
      if not left:
        break


def _tokenize(tasks: list, directory: epath.Path, spec: str, tokenizer_spec: str,
              tokenize: Callable, workers: int):
  directory.mkdir(parents=True, exist_ok=True)
  todo = [t for t in tasks
          if not (directory / f"{work.unit_name(t[0].index)}.json").exists()]
  if todo:
    left = f"{len(todo)} of {_parts(len(tasks))} left" if len(todo) < len(tasks) else (
        _parts(len(tasks)))
    with console.announce(f"tokenizing data.source={spec!r} with data.tokenizer="
                          f"{tokenizer_spec!r} once ({left}), into "
                          f"{console.short_path(directory)}") as note:
      counts = _run(tokenize, todo, workers)
      note.details = " + ".join(f"{sum(c[r]['tokens'] for c in counts):,} {r}"
                                for r in work.ROLES) + " tokens"


def _index(tasks: list, directory: epath.Path, source: sources.Source, scan: dict,
           options: Options, tokenizer: Tokenizer, dtype: str) -> dict:
  counts = [json.loads((directory / f"{work.unit_name(u.index)}.json").read_text())
            for u, _ in tasks]
  roles = {role: [[u.index, c[role]["tokens"], c[role]["docs"]] for (u, _), c in
                  zip(tasks, counts)] for role in work.ROLES}
  for role, field in zip(work.ROLES, ("data.train_split", "data.eval_split")):
    if not sum(n for _, n, _ in roles[role]):
      how = (f"set {field} to a non-empty split" if source.kind != "files" or
             source.one_text else f"split by document hash at data.train_fraction="
             f"{options.train_fraction}: add documents or change data.train_fraction")
      raise ValueError(f"data.source={source.spec!r}: the {role} split is empty ({how})")
  digest = hashlib.sha256("".join(s["sha256"] for s in scan["scans"]).encode()).hexdigest()
  return {"format": CORPUS_FORMAT, "source": source.spec, "sha256": digest, "dtype": dtype,
          "vocab_size": tokenizer.vocab_size, "tokenizer": tokenizer.fingerprint(),
          "roles": roles}


def _tasks(source: sources.Source, scan: dict, options: Options) -> list[tuple]:
  """(unit, its train characters if it is part of one text) per unit; a .txt document's
  role comes from its scanned hash."""
  plan = [units.Unit(**u) for u in scan["units"]]
  if source.one_text:
    return list(zip(plan, _one_text_split(source, scan["scans"], options.train_fraction)))
  return [(dataclasses.replace(u, role=work.digest_role(bytes.fromhex(s["sha256"]),
                                                        options.train_fraction))
           if u.document else u, None) for u, s in zip(plan, scan["scans"])]


def prepare(spec: str, tokenizer_spec: str, *, options: Options, workdir,
            data_dir: str) -> Prepared:
  """The corpus `spec` (data.source) tokenized with `tokenizer_spec`, prepared under
  `data_dir` if it is not yet; the tokenizer is made (or reused) in `workdir`."""
  parse_spec(tokenizer_spec)                   # a bad spec fails before any reading
  source = sources.resolve(spec)
  splits, fingerprint = ([], _file_fingerprints(source.paths)) if source.kind == "files" else (
      _dataset_splits(source, options, data_dir))
  key = json.dumps([CORPUS_FORMAT, source.kind, fingerprint, options.text_field,
                    options.train_fraction, options.split_names, splits])
  directory = paths.path(data_dir, "data.data_dir") / CACHE_NAME / hashlib.sha256(
      key.encode()).hexdigest()[:24]
  workers = options.workers or os.cpu_count() or 1
  scan = _scan(source, splits, directory, options, data_dir, workers)
  tasks = _tasks(source, scan, options)

  def read(task):
    return work.role_texts(task[0], field=options.text_field, data_dir=data_dir,
                           train_chars=task[1], train_fraction=options.train_fraction)
  chars = "".join(sorted(set("".join(s["chars"] for s in scan["scans"]))))
  tokenizer = make_tokenizer(tokenizer_spec, lambda: [chars] if tokenizer_spec == "char"
                             else _sample(tasks, read), workdir)
  out = directory / f"tokens-{tokenizer.fingerprint()[:16]}"
  index_path = out / "index.json"
  if not index_path.exists():
    sources.require_writable_data_dir(data_dir)
    dtype = "<u2" if tokenizer.vocab_size <= 1 << 16 else "<u4"
    _tokenize(tasks, out, spec, tokenizer_spec, functools.partial(
        work.tokenize_unit, field=options.text_field, data_dir=data_dir, tokenizer=tokenizer,
        dtype=dtype, train_fraction=options.train_fraction, directory=os.fspath(out)), workers)
    files.write_json(index_path, _index(tasks, out, source, scan, options, tokenizer, dtype))
  return Prepared(tokenizer, out, json.loads(index_path.read_text()))
