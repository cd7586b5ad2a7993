"""data.json: the fingerprint of the data a run trains on, recorded at its start and compared
at every resume, so a source that changed between a stop and a resume is refused instead of
silently training the remaining steps on other data.

The fingerprint is the cheapest one that follows the content:
- a text corpus (every text task: `data.corpus`): the SHA-256 of its text that the preparation
  already computes (`index.json`'s "sha256"), so a re-download or a `touch` that leaves the
  text as it was is no change, and a re-preparation costs nothing extra;
- other local files named by `data.source` (and `data.eval_source`): the post-training JSON
  Lines, "mnist:<dir>", "images:<root>": every file's name (relative to the source), size and
  a SHA-256 of 3 x 64 KiB samples (head, middle, tail), read at every start;
- none for generated or versioned data ("synthetic:*", "digits", non-text "tfds:*"): nothing is
  recorded and nothing checked.

A change is accepted on purpose with `--data_changed_ok` (`loop.train(data_changed_ok=True)`):
the new fingerprint is recorded, the old one kept under "earlier" with the step it ended at.
A workdir from before data.json (none there) resumes and records the data it finds.
Process 0 decides and writes; the other processes follow its decision (`parallel.
process_zero_first`), so hosts that see different copies of the data never diverge.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os

from jaxformer import paths, run_settings, workdir_layout

_SAMPLE_BYTES = 1 << 16
# data.source kinds whose argument is a local directory of files
_DIRECTORY_KINDS = ("mnist", "images")
# data.source values with nothing to fingerprint: generated, bundled with a library, versioned
_NOT_FILES = ("synthetic:", "tfds:", "digits")


def _sample_hash(open_file, size: int) -> str:
  digest = hashlib.sha256()
  with open_file() as f:
    for offset in sorted({0, max(size // 2 - _SAMPLE_BYTES // 2, 0),
                          max(size - _SAMPLE_BYTES, 0)}):
      f.seek(offset)
      digest.update(f.read(_SAMPLE_BYTES))
  return digest.hexdigest()


def _local_files(root: str) -> list[tuple[str, str]]:
  """(name relative to `root`, path) of every file under the directory `root`, hidden ones
  skipped, sorted (os, not epath: ~10x faster on a folder of many small images)."""
  out = []
  for directory, dirs, names in os.walk(root):
    dirs[:] = [d for d in dirs if not d.startswith(".")]
    out += [(os.path.relpath(os.path.join(directory, n), root), os.path.join(directory, n))
            for n in names if not n.startswith(".")]
  return sorted(out)


def _entries(spec: str, path_str: str) -> list[list]:
  """[spec, name, size, sample hash] of each file `path_str` names (none if it names none)."""
  if not paths.is_remote(path_str):
    root = os.path.expanduser(path_str)
    named = (_local_files(root) if os.path.isdir(root) else
             [(os.path.basename(root), root)] if os.path.isfile(root) else [])
    return [[spec, name, size, _sample_hash(lambda p=p: open(p, "rb"), size)]
            for name, p in named for size in [os.path.getsize(p)]]
  root = paths.path(path_str, "data.source")
  if root.is_dir():
    named = []
    for directory, dirs, names in root.walk():
      dirs[:] = [d for d in dirs if not d.startswith(".")]
      named += [(str((directory / n).relative_to(root)), directory / n) for n in names
                if not n.startswith(".")]
  else:
    named = [(root.name, root)] if root.is_file() else []
  return [[spec, name, size, _sample_hash(lambda p=p: p.open("rb"), size)]
          for name, p in sorted(named) for size in [p.stat().length]]


def _source_path(spec) -> str | None:
  if not isinstance(spec, str) or not spec or spec.startswith(_NOT_FILES):
    return None
  kind, sep, arg = spec.partition(":")
  if sep and kind in _DIRECTORY_KINDS:
    return arg or None
  return spec


def _files_fingerprint(specs: list[str]) -> dict | None:
  """Names, sizes and sample hashes of the files the `specs` name (None if none exists)."""
  entries = []
  for spec in specs:
    path_str = _source_path(spec)
    if path_str is not None:   # one that is no path (a bundled name, a glob): nothing to add
      entries += _entries(spec, path_str)
  if not entries:
    return None
  digest = hashlib.sha256(json.dumps(entries).encode()).hexdigest()
  return {"kind": "files", "sha256": digest, "files": len(entries),
          "bytes": sum(e[2] for e in entries)}


def fingerprint(config, pipeline, settings: run_settings.RunSettings | None = None
                ) -> dict | None:
  """The fingerprint of the data `pipeline` reads for `config` (None: not known; see the
  module docstring). Compared by its "sha256". `settings`: the run's typed settings
  (`config_checks.validate`'s), parsed here unless given."""
  index = getattr(getattr(pipeline, "corpus", None), "index", None)
  if isinstance(index, dict) and index.get("sha256"):
    return {"kind": "text", "sha256": index["sha256"]}
  from jaxformer import tasks
  settings = settings or run_settings.parse(config)
  data = tasks.task_for_run(config, settings).data_settings(config, settings)
  # eval_source: the post-training records' own key
  return _files_fingerprint([data.source, getattr(data, "eval_source", None)])


def read(workdir: str) -> dict | None:
  path = paths.path(workdir) / workdir_layout.DATA
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text())
    if not isinstance(record, dict) or not isinstance(record.get("fingerprint"), dict):
      raise ValueError("not a data record")
  except ValueError as e:
    raise ValueError(f"{path} is damaged ({e}); it is written by training: delete it to "
                     "record the data the next start finds, or rerun with --fresh") from None
  return record


def _describe(f: dict) -> str:
  if f.get("kind") == "files":
    return (f"{f['files']} file{'s' if f['files'] != 1 else ''}, {f['bytes']:,} bytes, "
            f"sha256 {f['sha256'][:12]}")
  return f"text sha256 {f['sha256'][:12]}"


def check(workdir: str, settings: run_settings.RunSettings, current: dict | None, *, taken: int,
          data_changed_ok: bool) -> dict | None:
  """The record to write to `workdir` (None: nothing to write), or a ValueError when the
  data changed since the run recorded it and `data_changed_ok` is not set. `taken`: the steps
  the run has taken (its latest checkpoint)."""
  if current is None:
    return None
  saved = read(workdir)
  source = settings.data.source
  record = {"source": source, "fingerprint": current, "since_step": taken,
            "recorded": datetime.datetime.now().isoformat(timespec="seconds")}
  if saved is None:
    return record
  if saved["fingerprint"].get("sha256") == current["sha256"]:
    return None
  if data_changed_ok:
    earlier = saved.pop("earlier", [])
    return {**record, "earlier": [*earlier, {**saved, "until_step": taken}]}
  branch = (paths.path(workdir) / workdir_layout.BRANCH).exists()
  ways = ("restore that data, or pass --data_changed_ok to train the branch on the new data "
          "on purpose" if branch else
          "restore that data, or use a new --workdir, or --fresh to discard the run, or pass "
          "--data_changed_ok to train its remaining steps on the new data on purpose")
  raise ValueError(f"data.source={source!r} changed since {workdir} recorded it "
                   f"({_describe(saved['fingerprint'])}, now {_describe(current)}): resuming "
                   f"after step {taken} would train on other data; {ways}")


def write(workdir: str, record: dict) -> None:
  paths.write_text(os.path.join(workdir, workdir_layout.DATA), json.dumps(record, indent=1) + "\n")
