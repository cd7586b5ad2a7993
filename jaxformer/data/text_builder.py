"""Text sources as TFDS datasets in ArrayRecord format (random access, no TensorFlow needed).

A local text file (or the bundled tiny Shakespeare) becomes the `local_text` TFDS dataset:
split `train` is the first `train_fraction` of its *characters*, `validation` the rest
(nanoGPT's split), and the records of a split are consecutive pieces of its text of up to
`MAX_RECORD_CHARS` (64 Ki) characters, cut after a blank line where possible, with an
`index`, so joining a split's records by index gives back its text exactly. A text file is
one continuous text, not a set of documents: big records keep reading fast (tiny Shakespeare
is 18 records) and pipelines re-join them. The builder config name is the file's content
hash plus the fraction (and record size): a changed file builds a new dataset, an unchanged
one is built once per data dir. TFDS writes into a temporary directory and renames it when
complete, so a killed build never looks finished.

A user-prepared catalog dataset is read with `"tfds:<name>[/<config>][:<version>]"`.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import fcntl
import hashlib
import os
import pathlib
import re
import shutil

import numpy as np
import tensorflow_datasets as tfds

from jaxformer import console

BUNDLED = {"tinyshakespeare": pathlib.Path(__file__).parent / "assets" / "tinyshakespeare.txt"}
DEFAULT_DATA_DIR = os.path.join("~", ".cache", "jaxformer", "tfds")
SPLITS = ("train", "validation")
MAX_RECORD_CHARS = 1 << 16
TFDS_PREFIX = "tfds:"
_TFDS_NAME = re.compile(r"^(?P<name>[a-z0-9_]+)(/(?P<config>[\w.\-]+))?(:(?P<version>[\d.]+))?$")


def resolve_data_dir(data_dir: str | os.PathLike | None) -> str:
  return os.path.expanduser(os.fspath(data_dir) if data_dir else DEFAULT_DATA_DIR)


def text_file(source: str) -> pathlib.Path:
  """The file of a bundled source name or a path; ValueError naming data.source if absent."""
  path = pathlib.Path(BUNDLED.get(source, source)).expanduser()
  if not path.is_file():
    raise ValueError(f"data.source={source!r}: no such file; give a path to a .txt file, "
                     f"a bundled name {sorted(BUNDLED)} or 'tfds:<name>'")
  if path.stat().st_size == 0:
    raise ValueError(f"data.source={source!r}: {path} is empty; give a UTF-8 text file")
  return path


def file_digest(path: str | os.PathLike, *, source: str | None = None,
                train_fraction: float | None = None) -> str:
  """sha256 of the file; with `source` (the data.source naming it) the file must also be
  UTF-8 text: a binary file (a NUL byte), another encoding or only whitespace is refused
  here, naming the file (and the byte offset), before any dataset is built from it. With
  `train_fraction`, both splits must get a character (TFDS fails on an empty split)."""
  digest = hashlib.sha256()
  decoder = codecs.getincrementaldecoder("utf-8")()
  offset = chars = 0
  has_text, last = False, ""
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
      if source is not None:
        text = _check_text_block(block, decoder, offset, path, source)
        # characters as the builder reads them (read_text turns \r\n into \n)
        chars += len(text) - text.count("\r\n") - (last == "\r" and text[:1] == "\n")
        has_text = has_text or bool(text.replace("\ufeff", "").strip())
        last = text[-1:] or last
      offset += len(block)
  if source is not None:
    chars += len(_check_text_block(b"", decoder, offset, path, source, final=True))
    if not has_text:
      raise ValueError(f"data.source={source!r}: {path} holds only whitespace ({offset} "
                       "bytes), no text to train on; give a UTF-8 text file with text")
    if train_fraction is not None and not 1 <= int(chars * train_fraction) < chars:
      raise ValueError(f"data.source={source!r}: {path} holds {chars} character"
                       f"{'s' * (chars != 1)}, too few to split at data.train_fraction="
                       f"{train_fraction} (each split needs one); give a longer text file")
  return digest.hexdigest()


def _check_text_block(block: bytes, decoder, offset: int, path, source: str, final=False) -> str:
  """The text decoded from `block` (after what earlier blocks left pending)."""
  nul = block.find(b"\0")
  if nul >= 0:
    raise ValueError(f"data.source={source!r}: {path} is a binary file (a NUL byte at byte "
                     f"offset {offset + nul}), not text; give a UTF-8 text file")
  try:
    return decoder.decode(block, final=final)
  except UnicodeDecodeError as e:
    at = offset + e.start - len(decoder.getstate()[0])   # e.start counts pending bytes too
    raise ValueError(f"data.source={source!r}: {path} is not UTF-8 text (byte offset {at}: "
                     f"{e.reason}); convert it, e.g. iconv -f latin1 -t utf-8") from None


def check_train_fraction(train_fraction: float):
  if not isinstance(train_fraction, (int, float)) or not 0.0 < train_fraction < 1.0:
    raise ValueError(f"data.train_fraction={train_fraction!r} must be in (0, 1), e.g. 0.9")


def split_text(text: str, train_fraction: float) -> dict[str, str]:
  """{'train': first train_fraction of the characters, 'validation': the rest}."""
  n = int(len(text) * train_fraction)
  return {"train": text[:n], "validation": text[n:]}


def text_records(text: str, max_chars: int = MAX_RECORD_CHARS) -> list[str]:
  """`text` in consecutive pieces of at most `max_chars`, cut after a blank line where one
  falls inside the limit; ''.join(pieces) == text."""
  records, parts, size = [], [], 0
  for paragraph in re.split(r"(?<=\n\n)(?=[^\n])", text):
    for i in range(0, len(paragraph), max_chars):
      piece = paragraph[i:i + max_chars]
      if parts and size + len(piece) > max_chars:
        records.append("".join(parts))
        parts, size = [], 0
      parts.append(piece)
      size += len(piece)
  return records + ["".join(parts)] if parts else records


@dataclasses.dataclass
class LocalTextConfig(tfds.core.BuilderConfig):
  """Which file (`path`) and which split point (`train_fraction`) this dataset holds."""
  path: str = ""
  train_fraction: float = 0.9
  record_chars: int = MAX_RECORD_CHARS


class LocalText(tfds.core.GeneratorBasedBuilder):
  """A local text file as train/validation records {'index', 'text'} in file order."""
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Paragraph records with an index; character-fraction split."}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description="Paragraphs of a local text file, in order.",
        features=tfds.features.FeaturesDict({"index": tfds.features.Scalar(np.int64),
                                             "text": tfds.features.Text()}),
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    text = pathlib.Path(self.builder_config.path).read_text(encoding="utf-8")
    splits = split_text(text, self.builder_config.train_fraction)
    return {name: self._generate_examples(splits[name]) for name in SPLITS}

  def _generate_examples(self, text: str):
    for i, piece in enumerate(text_records(text, self.builder_config.record_chars)):
      yield i, {"index": i, "text": piece}


def local_text_config(source: str, train_fraction: float,
                      record_chars: int = MAX_RECORD_CHARS) -> LocalTextConfig:
  """The builder config of `source`: named by content hash, fraction and record size."""
  check_train_fraction(train_fraction)
  path = text_file(source)
  fraction = f"{train_fraction:.6g}".replace(".", "p")
  return LocalTextConfig(
      name=(f"sha256_{file_digest(path, source=source, train_fraction=train_fraction)[:24]}"
            f"_train{fraction}_rec{record_chars}"),
      path=str(path), train_fraction=float(train_fraction), record_chars=int(record_chars),
      description=f"{path} (train fraction {train_fraction})")


def build_local_text(source: str, *, train_fraction: float = 0.9,
                     data_dir: str | os.PathLike | None = None,
                     record_chars: int = MAX_RECORD_CHARS) -> LocalText:
  """The prepared `local_text` builder of `source` (built into `data_dir` if not yet, with
  one line saying so). Concurrent builders (sweep points, processes) take a file lock: one
  builds, the others wait and find it built; a killed build leaves only an `incomplete.*`
  directory, removed by the next build."""
  config = local_text_config(source, train_fraction, record_chars)
  data_dir = resolve_data_dir(data_dir)
  make = lambda: LocalText(config=config, data_dir=data_dir, file_format="array_record")
  with quiet_tfds():
    builder = make()
  if not builder.is_prepared():
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, f".{config.name}.lock"), "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      with quiet_tfds():
        builder = make()
      if not builder.is_prepared():
        _prepare(builder, source, pathlib.Path(config.path))
  for name in SPLITS:
    if builder.info.splits[name].num_examples == 0:
      raise ValueError(f"data.train_fraction={train_fraction} leaves the {name} split of "
                       f"data.source={source!r} empty; the file is too short for it")
  return builder


def _prepare(builder: LocalText, source: str, path: pathlib.Path):
  """Build the dataset (the caller holds its lock), removing what killed builds left."""
  for stale in pathlib.Path(builder.data_dir).parent.glob("incomplete.*"):
    shutil.rmtree(stale, ignore_errors=True)
  size = path.stat().st_size
  where = pathlib.Path(builder.data_dir).parents[2]     # <data_dir>/local_text/<config>/<v>
  with console.announce(f"preparing data.source={source!r} ({size / 1e6:,.1f} MB) once, "
                        f"into {console.short_path(where)}") as note:
    with quiet_tfds():
      builder.download_and_prepare()
    splits = builder.info.splits
    note.details = " + ".join(f"{splits[name].num_examples} {name}" for name in SPLITS) + " records"


@contextlib.contextmanager
def quiet_tfds():
  """TFDS's own output (its custom-config and variant-folder warnings, the preparation prints
  and progress bars) off unless the user asked for INFO logs (`jaxformer.console`)."""
  from tensorflow_datasets.core.utils import tqdm_utils
  if console.verbose():
    yield
    return
  shown = getattr(tqdm_utils, "_active", True)
  tfds.display_progress_bar(False)
  try:
    with console.third_party_output():
      yield
  finally:
    tfds.display_progress_bar(shown)


def parse_tfds_source(source: str) -> str:
  """'tfds:lm1b/subwords8k:1.1.0' -> 'lm1b/subwords8k:1.1.0' (checked)."""
  name = source[len(TFDS_PREFIX):]
  if not _TFDS_NAME.match(name):
    raise ValueError(f"data.source={source!r}: expected 'tfds:<name>[/<config>][:<version>]'")
  return name


def catalog_builder(source: str, data_dir: str | os.PathLike | None = None):
  """The prepared ArrayRecord builder of a 'tfds:...' source, or a ValueError saying how to
  prepare it."""
  name, data_dir = parse_tfds_source(source), resolve_data_dir(data_dir)
  prepare = (f"prepare it with `tfds build {name.split(':')[0]} --file_format=array_record "
             f"--data_dir={data_dir}` (or set data.data_dir to where it is prepared)")
  try:
    with quiet_tfds():
      builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(f"data.source={source!r}: TFDS has no dataset {name!r} in its catalog "
                     f"or in {data_dir} ({str(e).splitlines()[0]})") from e
  if not builder.is_prepared():
    raise ValueError(f"data.source={source!r} is not prepared in {data_dir}; {prepare}")
  if builder.info.file_format != tfds.core.FileFormat.ARRAY_RECORD:
    raise ValueError(f"data.source={source!r} is prepared as {builder.info.file_format.value}, "
                     f"not array_record (needed for random access); {prepare}")
  return builder


def check_split(builder, split: str, source: str, field: str):
  """ValueError naming `field` and listing the splits that exist if `split` does not."""
  if split not in builder.info.splits:
    raise ValueError(f"{field}={split!r}: data.source={source!r} has no such split; its "
                     f"splits are {sorted(builder.info.splits)}")


def check_text_key(builder, text_key: str, source: str):
  features = builder.info.features
  if text_key not in features:
    raise ValueError(f"data.text_key={text_key!r}: data.source={source!r} has no such "
                     f"feature; its features are {sorted(features)}")
