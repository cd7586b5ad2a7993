"""The typed `data` settings of each kind of source, and their registry.

A run's `data` section holds the keys every source shares (`run_settings.DataSettings`:
source, tokenizer, seq_len, data_dir, eval_batches) and its source's own keys (`packing`,
`mask_rate`, `augment`, ...). Each kind of source states its own keys here, in one frozen
dataclass that extends `DataSettings` (or another kind: masked text is text plus
`mask_rate`), each field with its default, its range and a line saying what it does, and is
registered under its name like a model family:

    kind        settings                 tasks (`Task.data_kind`)
    shared      DataSettings             a task that reads the shared keys only
    text        TextSettings             lm
    masked_text MaskedTextSettings       mlm, mlm_nsp, rtd
    span_corruption SpanCorruptionSettings  span_corruption
    denoising   DenoisingSettings        bart_denoising
    images      ImageSettings            classification
    captions    CaptionSettings          captioning
    synthetic   SyntheticSettings        seq2seq
    posttrain_records PosttrainRecordsSettings  sft, dpo

Each task names its kind (`Task.data_kind`); `train.config_checks.validate` parses the run's
`data` section with it once (`parse`, strict: a key the kind does not name is refused with the
list of the ones it does, before any compilation) and the typed object travels on as
`RunSettings.data`: the pipelines, batch layouts, data record and export read it, never the
raw section. A source's own key left None (an unset placeholder) takes its default. A
config.json saved by a run is read back with `strict=False`: a key this version does not
know (one it dropped, or a typo the run that wrote it ignored too) is ignored, and every key
it does know is checked.

Adding a kind of source: its dataclass and one `register` call (docs/design/data.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxformer import run_settings
from jaxformer.run_settings import (DataSettings, _choice, _field, _int, _is_int, _number,
                                    _typed)

PACKING_MODES = ("stream", "packed")            # data.packing of text (data/text.py)
AUGMENTATIONS = ("none", "shift")               # data.augment of images (images/augment.py)
SHARED_KEYS = tuple(f.name for f in dataclasses.fields(DataSettings))


def _name(v) -> bool:
  return isinstance(v, str) and bool(v)


def _image_size(v) -> bool:
  return (_is_int(v) and v >= 1) or (isinstance(v, (tuple, list)) and len(v) == 2
                                     and all(_is_int(s) and s >= 1 for s in v))


# --- the kinds ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TextSettings(DataSettings):
  """A text corpus (data/text.py, data/corpus): files, globs, datasets, `tfds:<name>`."""
  packing: str | None = _choice(PACKING_MODES, None, optional=True,
                                doc="batches of random stream windows or packed documents "
                                    "(None: 'stream' for a single text file, else 'packed')")
  text_field: str = _field("text", check=_name, want="the name of the text field, e.g. 'text'",
                           doc="the field holding the text of a JSON / Parquet / dataset "
                               "record")
  train_fraction: float = _number(lambda v: 0 < v < 1, "a number in (0, 1), e.g. 0.9", 0.9,
                                  doc="the share of a single text file (or of the documents, "
                                      "by hash) that trains")
  train_split: str = _field("train", check=_name, want="a split name, e.g. 'train'",
                            doc="the training split of a dataset with named splits")
  eval_split: str = _field("validation", check=_name, want="a split name, e.g. 'validation'",
                           doc="the evaluation split of a dataset with named splits")
  workers: int | None = _int(1, None, optional=True,
                             doc="processes that prepare the corpus (None: one per core)")

  _renamed = {"text_key": "text_field"}        # old key -> its new name (refused, named)
  _stream_only = ""                             # the task that reads stream windows only

  def checked(self):
    if self._stream_only and self.packing == "packed":
      raise ValueError(f"data.packing='packed' is for task 'lm'; {self._stream_only} reads "
                       "stream windows (set data.packing='stream' or leave it unset)")
    return self


@dataclasses.dataclass(frozen=True)
class MaskedTextSettings(TextSettings):
  """Text, BERT-masked (data/text.py MLMPipeline, NSPPipeline): stream windows only."""
  mask_rate: float = _number(lambda v: 0 < v <= 1, "a number in (0, 1], e.g. 0.15", 0.15,
                             doc="the share of positions selected for prediction (80% [MASK], "
                                 "10% random, 10% kept)")
  _stream_only = "masked LM"


@dataclasses.dataclass(frozen=True)
class SpanCorruptionSettings(TextSettings):
  """Text, T5's span corruption (data/span_corruption.py): stream windows only."""
  noise_density: float = _number(lambda v: 0 < v < 1, "a number in (0, 1), e.g. 0.15 (T5)",
                                 0.15, doc="the share of a window's tokens that are noise")
  mean_noise_span_length: float = _number(lambda v: v >= 1, "a number >= 1, e.g. 3 (T5)", 3.0,
                                          doc="the mean length of a noise span")
  num_sentinels: int = _int(1, 100, note=" (T5: 100)",
                            doc="sentinel ids appended after the tokenizer's vocabulary")
  _stream_only = "span corruption"


@dataclasses.dataclass(frozen=True)
class DenoisingSettings(TextSettings):
  """Text, BART's denoising (data/denoising.py): stream windows only."""
  mask_ratio: float = _number(lambda v: 0 <= v <= 0.5,
                              "in [0, 0.5] (BART: 0.3); above 0.5 the spans no longer fit "
                              "between unmasked tokens", 0.3,
                              doc="the share of tokens text infilling masks")
  poisson_lambda: float = _number(lambda v: v > 0, "> 0 (BART: 3.0, the mean span length)",
                                  3.0, doc="the mean of the Poisson span lengths")
  permute_sentences: bool = _typed(bool, True, doc="shuffle the sentences before infilling")
  sentence_delimiters: str = _field(".!?", check=lambda v: isinstance(v, str),
                                    want="a string of the characters that end a sentence, "
                                         "e.g. '.!?'",
                                    doc="the characters that end a sentence (single tokens)")
  _stream_only = "BART's denoising"


@dataclasses.dataclass(frozen=True)
class ImageSettings(DataSettings):
  """Labelled images (data/images/pipeline.py): 'digits', 'mnist:<dir>', 'images:<root>',
  'tfds:<name>'."""
  image_size: Any = _field(None, check=_image_size, optional=True,
                           want="an int or (height, width)",
                           doc="the images' size, checked against the source's (None: any)")
  augment: str = _choice(AUGMENTATIONS, "none", doc="training augmentation ('shift': random "
                                                   "translations)")
  shift_pixels: int = _int(0, 2, doc="the largest shift of augment='shift', in pixels")
  train_split: str = _field("train", check=_name, want="a split name, e.g. 'train'",
                            doc="the split that trains")
  eval_split: str = _field("test", check=_name, want="a split name, e.g. 'test'",
                           doc="the split that evaluates")
  image_key: str = _field("image", check=_name, want="a feature name, e.g. 'image'",
                          doc="the image feature of a tfds: source")
  label_key: str = _field("label", check=_name, want="a feature name, e.g. 'label'",
                          doc="the label feature of a tfds: source")


_NATIVE_DIGIT_SIZE = {"mnist": 14, "digits": 8}      # captions' default digit_size per source
CAPTION_SOURCES = "'mnist:<dir>' or 'digits'"


def caption_source_kind(source, *, need_dir: bool = True) -> str:
  """'mnist' or 'digits'; `need_dir=False` accepts a bare 'mnist:' (a config built before the
  user named the directory still has sizes; opening it fails)."""
  kind, _, arg = str(source).partition(":")
  if source == "digits" or (kind == "mnist" and (arg or not need_dir)):
    return kind
  raise ValueError(f"data.source={source!r}: captioning composes digits from {CAPTION_SOURCES}")


@dataclasses.dataclass(frozen=True)
class CaptionSettings(DataSettings):
  """Captioned digit composites (data/images/captions.py): 'mnist:<dir>' or 'digits'."""
  grid: int = _int(1, 3, doc="cells per side of the composite")
  digit_size: int | None = _int(1, None, optional=True,
                                doc="a digit's side in pixels (None: 14 for mnist, 8 for digits)")
  jitter: int = _int(0, 2, doc="the largest random offset of a digit in its cell, in pixels")
  min_digits: int = _int(1, 2, doc="the fewest digits of a composite")
  max_digits: int = _int(1, 6, doc="the most digits of a composite (<= grid**2)")
  num_train: int = _int(1, 1_000_000, doc="train composites")
  num_eval: int = _int(1, 1_000, doc="eval composites")

  def checked(self):
    kind = caption_source_kind(self.source, need_dir=False)
    lo, hi, cells = self.min_digits, self.max_digits, self.grid ** 2
    if lo > hi:
      raise ValueError(f"data.min_digits={lo} > data.max_digits={hi}; lower data.min_digits")
    if hi > cells:
      raise ValueError(f"data.max_digits={hi} > data.grid**2={cells} cells; lower "
                       f"data.max_digits to <= {cells} or raise data.grid")
    if self.digit_size is None:
      return dataclasses.replace(self, digit_size=_NATIVE_DIGIT_SIZE[kind])
    return self

  @property
  def cell_size(self) -> int:
    return self.digit_size + self.jitter

  @property
  def image_size(self) -> int:
    """Side of the square composite: grid * (digit_size + jitter)."""
    return self.grid * self.cell_size

  @property
  def caption_length(self) -> int:
    """Tokens of tgt_in / tgt_out: the longest caption (3 * max_digits - 2 words) + EOS."""
    return 3 * self.max_digits - 1


@dataclasses.dataclass(frozen=True)
class SyntheticSettings(DataSettings):
  """Generated seq2seq tasks (data/synthetic.py): 'synthetic:copy|reverse|recall'."""
  vocab_size: int = _int(1, 16, doc="symbols (3 special ids are added)")
  min_len: int = _int(1, 1, doc="the shortest source")
  max_len: int = _int(1, 16, doc="the longest source (the padded length)")
  num_train: int = _int(1, 100_000, doc="train examples")
  num_eval: int = _int(1, 1_000, doc="eval examples")


@dataclasses.dataclass(frozen=True)
class PosttrainRecordsSettings(DataSettings):
  """JSON Lines of SFT examples, DPO pairs or GRPO prompts (posttrain/data.py)."""
  eval_source: str | None = _typed(str, None, optional=True,
                                   doc="a .jsonl of eval records (None: a hash split of "
                                       "data.source)")
  train_fraction: float = _number(lambda v: 0 < v < 1, "a number in (0, 1), e.g. 0.9", 0.9,
                                  doc="the share of data.source that trains when there is no "
                                      "eval_source")


# --- the registry ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SourceKind:
  """A registry entry: the settings dataclass of a kind of source and its name in messages."""
  name: str
  settings: type
  label: str                      # "a <label> data setting"


_KINDS: dict[str, SourceKind] = {}


def register(name: str, settings: type, *, label: str | None = None,
             replace: bool = False) -> SourceKind:
  """Add the kind of source `name` with its settings dataclass (a `DataSettings` subclass made
  with run_settings' `_field` helpers); a test or plugin can add its own."""
  if not (isinstance(settings, type) and issubclass(settings, DataSettings)
          and dataclasses.is_dataclass(settings)):
    raise TypeError(f"register() takes a DataSettings dataclass; got {settings!r}")
  if name in _KINDS and not replace:
    raise ValueError(f"data source kind {name!r} is already registered (replace=True to "
                     "override it)")
  _KINDS[name] = SourceKind(name, settings, label or name.replace("_", " "))
  return _KINDS[name]


def unregister(name: str):
  _KINDS.pop(name, None)


def get(name: str) -> SourceKind:
  if name not in _KINDS:
    raise ValueError(f"data source kind {name!r} is not one of {sorted(_KINDS)}")
  return _KINDS[name]


def kinds() -> tuple[str, ...]:
  return tuple(_KINDS)


for _entry in (("shared", DataSettings, "shared"), ("text", TextSettings, "text"),
               ("masked_text", MaskedTextSettings, "masked-text"),
               ("span_corruption", SpanCorruptionSettings, "span-corruption"),
               ("denoising", DenoisingSettings, "denoising"),
               ("images", ImageSettings, "image"), ("captions", CaptionSettings, "captioning"),
               ("synthetic", SyntheticSettings, "synthetic"),
               ("posttrain_records", PosttrainRecordsSettings, "post-training records")):
  register(_entry[0], _entry[1], label=_entry[2])


# --- parsing -----------------------------------------------------------------------------------


def _section(config) -> dict:
  """The `data` section of a config (or the section itself) as a plain dict."""
  if config is None:
    return {}
  if hasattr(config, "keys") and "data" in config.keys() and (
      hasattr(config["data"], "keys") or config["data"] is None):
    config = config["data"]                      # a whole config: its data section
  if config is None:
    return {}
  if hasattr(config, "to_dict"):
    config = config.to_dict()
  if not isinstance(config, Mapping):
    raise ValueError(f"the data section must be a dict or ConfigDict; got "
                     f"{type(config).__name__}")
  return dict(config)


def parse(kind: str, config, *, strict: bool = True) -> DataSettings:
  """The `data` section of `config` (a whole config, or the section: ConfigDict or dict) as the
  typed settings of source `kind`: missing keys at their defaults, every value checked, then
  the kind's checks across keys (`checked`). `strict` (a config about to train) refuses a key
  the kind does not name, listing the ones it does; `strict=False` (a saved config.json)
  ignores it. A ValueError names `data.<key>` and the fix, in one line."""
  entry = get(kind)
  cls = entry.settings
  values = _section(config)
  for old, new in getattr(cls, "_renamed", {}).items():
    if old in values:
      if strict:
        raise ValueError(f"data.{old} is now data.{new}; rename it")
      values.setdefault(new, values.pop(old))
  own = {f.name: f for f in dataclasses.fields(cls) if f.name not in SHARED_KEYS}
  for name, f in own.items():        # a source's own key left None: its default
    if name in values and values[name] is None and not f.metadata["optional"]:
      del values[name]
  if not strict:
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in values.items() if k in names}
  settings = run_settings.parse_fields(cls, values, section="data", strict=True,
                                       what=entry.label + " data")
  checked = getattr(settings, "checked", None)
  return checked() if checked is not None else settings


def coerce(kind: str, data, *, strict: bool = True) -> DataSettings:
  """`data` as the settings of `kind`: an instance of the kind's dataclass as it is, a data
  section (or whole config) parsed (`parse`). What a pipeline constructor takes, so a test or
  script may still hand it a dict."""
  if type(data) is get(kind).settings:
    return data
  return parse(kind, data, strict=strict)


def for_run(kind: str, config, settings: run_settings.RunSettings | None = None
            ) -> DataSettings:
  """The typed data settings of `kind` for a run: `settings.data` where
  `train.config_checks.validate` already parsed it with that kind, else `config`'s data
  section parsed now (a caller with `run_settings.parse`'s shared settings only)."""
  data = getattr(settings, "data", None)
  if data is not None and type(data) is get(kind).settings:
    return data
  return parse(kind, config)


def defaults(kind: str) -> dict:
  """The default of every own key of `kind` (the shared keys excluded)."""
  return {f.name: f.default for f in dataclasses.fields(get(kind).settings)
          if f.name not in SHARED_KEYS}


# --- the documentation table -------------------------------------------------------------------


def _type_name(f) -> str:
  return str(f.type).replace("Any", "int | tuple[int, int] | None").replace("|", "\\|")


def table(kind: str, tasks: tuple[str, ...] = ()) -> str:
  """The Markdown table of `kind`'s own keys: key, type, default, range and what it does;
  `tasks` name the tasks that read it (docs/data.md holds every kind's table;
  tests/unit/data/test_data_settings.py keeps them equal)."""
  entry = get(kind)
  inherited = [k for k, e in _KINDS.items() if e.settings is not entry.settings
               and e.settings is not DataSettings and issubclass(entry.settings, e.settings)]
  base = {f.name for k in inherited for f in dataclasses.fields(get(k).settings)}
  rows = ["| key | type | default | must be | what |", "|---|---|---|---|---|"]
  for f in dataclasses.fields(entry.settings):
    if f.name in SHARED_KEYS or f.name in base:
      continue
    want = f.metadata["want"] + (" or None" if f.metadata["optional"] else "")
    want = want.replace("|", "\\|")
    rows.append(f"| `{f.name}` | `{_type_name(f)}` | `{f.default!r}` | {want} | "
                f"{f.metadata['doc']} |")
  about = " ".join(entry.settings.__doc__.split())
  head = f"**`{kind}`**" + (f" (tasks {', '.join(tasks)})" if tasks else "") + f": {about}"
  if inherited:
    head += " Also every key of " + ", ".join(f"`{k}`" for k in inherited) + "."
  return head + "\n\n" + "\n".join(rows)


def tables(tasks: Mapping[str, tuple[str, ...]] | None = None) -> str:
  """Every kind's table but the shared one's, in registry order (what docs/data.md holds);
  `tasks`: {kind: the tasks that read it}."""
  tasks = tasks or {}
  return "\n\n".join(table(k, tuple(tasks.get(k, ()))) for k in _KINDS if k != "shared")
