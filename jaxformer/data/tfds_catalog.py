"""TFDS catalog datasets (`tfds:<name>[/<config>][:<version>]`, also the `huggingface:`
namespace): prepared by the user as ArrayRecord and read by random access, plus TFDS's output
kept quiet. Text and image sources share it.
"""

from __future__ import annotations

import contextlib
import os
import re

import tensorflow_datasets as tfds

from jaxformer import console
from jaxformer.data.corpus.sources import TFDS_PREFIX, resolve_data_dir
_TFDS_NAME = re.compile(r"^((?P<namespace>[a-z0-9_]+):)?(?P<name>[\w.\-]+)"
                        r"(/(?P<config>[\w.\-]+))?(:(?P<version>[\d.]+))?$")


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
    raise ValueError(f"data.source={source!r}: expected 'tfds:<name>[/<config>][:<version>]' "
                     "or 'tfds:huggingface:<name>[/<config>]'")
  return name


def catalog_builder(source: str, data_dir: str | os.PathLike | None = None):
  """The prepared ArrayRecord builder of a 'tfds:...' source, or a ValueError saying how to
  prepare it."""
  name, data_dir = parse_tfds_source(source), resolve_data_dir(data_dir)
  parts = _TFDS_NAME.match(name)
  unversioned = name.removesuffix(f":{parts['version']}") if parts["version"] else name
  prepare = (f"prepare it with `tfds build {unversioned} --file_format=array_record "
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


def check_text_field(builder, text_field: str, source: str):
  features = builder.info.features
  if text_field not in features:
    raise ValueError(f"data.text_field={text_field!r}: data.source={source!r} has no such "
                     f"feature; its features are {sorted(features)}")
