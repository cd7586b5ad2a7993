"""What `data.source` names, resolved into a `Source` that lists its parts (nothing is read).

Accepted: a `.txt`, `.jsonl` or `.parquet` file, each optionally gzip-compressed (`.gz`), a
directory holding such files (recursively, hidden files skipped) or a glob of them; a Hugging
Face `datasets` dataset saved with `save_to_disk` (a directory with `state.json` or
`dataset_dict.json`); a TFDS catalog builder `tfds:<name>[/<config>][:<version>]` (also
`tfds:huggingface:<name>`); or the bundled `tinyshakespeare`. Every path goes through
`jaxformer.paths` (etils.epath), so `gs://` sources work where a local path does.
"""

from __future__ import annotations

import dataclasses
import os

from etils import epath

from jaxformer import paths

BUNDLED = {"tinyshakespeare": epath.Path(__file__).parent.parent / "assets" / "tinyshakespeare.txt"}
DEFAULT_DATA_DIR = os.path.join("~", ".cache", "jaxformer", "tfds")
FORMATS = ("txt", "jsonl", "parquet")
TFDS_PREFIX = "tfds:"
HF_MARKERS = ("state.json", "dataset_dict.json")     # what save_to_disk writes
ACCEPTED = ("a .txt, .jsonl or .parquet file (each optionally .gz), a directory or glob of "
            "them, a Hugging Face dataset directory (save_to_disk), 'tfds:<name>' or "
            f"{' / '.join(repr(b) for b in BUNDLED)}")
_GLOB_CHARS = "*?["


@dataclasses.dataclass(frozen=True)
class Source:
  """`kind`: 'files' (`paths` in order), 'hf' (`paths` = the dataset directory) or 'tfds'
  (`name` is the builder name)."""
  spec: str
  kind: str
  paths: tuple[epath.Path, ...] = ()
  name: str = ""

  @property
  def one_text(self) -> bool:
    """One .txt file: one continuous text, split by characters (nanoGPT)."""
    return self.kind == "files" and len(self.paths) == 1 and file_format(self.paths[0]) == "txt"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> str:
  """`data.data_dir` (prepared corpora and TFDS datasets), or the default, expanded."""
  return os.fspath(paths.path(data_dir or DEFAULT_DATA_DIR, "data.data_dir"))


def require_writable_data_dir(data_dir: str | os.PathLike) -> None:
  """Before preparing data under `data_dir` (data.data_dir, resolved): a ValueError naming
  it when it cannot be written (a read-only or pseudo file system such as /proc, a file in
  the way, missing permissions), before the source is read. A finished preparation is only
  read, so a read-only data_dir that holds one is fine."""
  paths.check_writable_directory(
      data_dir, "data.data_dir", "prepared data is kept there: set --config.data.data_dir to "
      "a directory you can write to")


def file_format(path: epath.Path) -> str | None:
  """'txt' | 'jsonl' | 'parquet' from the name (a trailing .gz ignored), or None."""
  name = path.name.removesuffix(".gz")
  suffix = name.rpartition(".")[2] if "." in name else ""
  return suffix if suffix in FORMATS else None


def is_gzip(path: epath.Path) -> bool:
  return path.name.endswith(".gz")


def walk_files(directory: epath.Path):
  """Every file under `directory`, recursively, hidden directories skipped."""
  for root, dirs, names in directory.walk():
    dirs[:] = [d for d in dirs if not d.startswith(".")]
    yield from (root / name for name in names)


def _refuse(spec: str, what: str):
  raise ValueError(f"data.source={spec!r}: {what}; give {ACCEPTED}")


def _accepted_files(paths, spec: str) -> tuple[epath.Path, ...]:
  files = tuple(sorted((p for p in paths if not p.name.startswith(".") and file_format(p)
                        and p.is_file()), key=str))
  if not files:
    _refuse(spec, "holds no .txt, .jsonl or .parquet file")
  return files


def _glob(spec: str) -> tuple[epath.Path, ...]:
  parts = spec.split("/")
  first = next(i for i, part in enumerate(parts) if any(c in part for c in _GLOB_CHARS))
  root = paths.path("/".join(parts[:first]) or ".", "data.source")
  return _accepted_files(root.glob("/".join(parts[first:])), spec)


def resolve(spec) -> Source:
  """The `Source` that `data.source` names; a one-line ValueError naming data.source and the
  accepted kinds otherwise."""
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"data.source={spec!r} must be a string: {ACCEPTED}")
  if spec.startswith(TFDS_PREFIX):
    from jaxformer.data import tfds_catalog      # imports TFDS: only for its sources
    return Source(spec, "tfds", name=tfds_catalog.parse_tfds_source(spec))
  if spec in BUNDLED:
    return Source(spec, "files", (BUNDLED[spec],))
  if any(c in spec for c in _GLOB_CHARS):
    return Source(spec, "files", _glob(spec))
  path = paths.path(spec, "data.source")
  if path.is_dir():
    if any((path / marker).exists() for marker in HF_MARKERS):
      return Source(spec, "hf", (path,))
    return Source(spec, "files", _accepted_files(walk_files(path), spec))
  if not path.exists():
    _refuse(spec, "no such file or directory")
  if file_format(path) is None:
    _refuse(spec, f"{path.name} is not a kind of source jaxformer reads")
  if path.stat().length == 0:
    raise ValueError(f"data.source={spec!r}: {path} is empty; give a UTF-8 text file")
  return Source(spec, "files", (path,))
