"""jaxformer/jsonfile.py read_jsonl: the one JSON Lines reader behind choices.read_items,
probe.read_labelled and posttrain.data.read_jsonl, its file:line errors one line each."""

import pytest

from jaxformer import jsonfile
from jaxformer.evaluate import choices, probe
from jaxformer.posttrain import data as pdata


def _read(path, **kw):
  return jsonfile.read_jsonl(path, name=str(path), field="--data", holds="things", **kw)


def test_records_with_their_file_and_line_blank_lines_skipped(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_text('{"a": 1}\n\n  \n{"b": 2}\n{"c": 3}\n')
  assert _read(path) == [(f"{path}:1", {"a": 1}), (f"{path}:4", {"b": 2}),
                         (f"{path}:5", {"c": 3})]
  assert _read(path, limit=2) == _read(path)[:2]


@pytest.mark.parametrize("text,objects,message", [
    ('{"a": 1}\n{"a": \n', True, r"a\.jsonl:2: not JSON \(.*\); each line is one JSON object of "
                                 "things"),
    ('{"a": 1}\n[1]\n', True, r"a\.jsonl:2: expected a JSON object \(things\), got list"),
    ("\n \n", True, r"--data='.*a\.jsonl' holds no records; give a JSONL file of things"),
    (b"\xff\xfe{}\n", True, r"--data='.*a\.jsonl' is not UTF-8 text"),
])
def test_mistakes_are_one_line_errors_naming_the_line_or_the_field(tmp_path, text, objects,
                                                                   message):
  path = tmp_path / "a.jsonl"
  (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
  with pytest.raises(ValueError, match=message) as e:
    _read(path, objects=objects)
  assert "\n" not in str(e.value)


def test_a_missing_file_names_the_field(tmp_path):
  with pytest.raises(ValueError, match=r"--data='.*nope\.jsonl' is not a file; give a JSONL "
                                       "file of things"):
    _read(tmp_path / "nope.jsonl")


def test_the_three_readers_share_it(tmp_path):
  """The same line that is not JSON is named the same way by all three readers."""
  path = tmp_path / "x.jsonl"
  path.write_text('{"text": "a", "label": 1, "context": "c", "choices": ["a", "b"], '
                  '"answer": 0, "prompt": "p", "response": "r"}\nnot json\n')
  for read in (choices.read_items, probe.read_labelled, pdata.read_jsonl):
    with pytest.raises(ValueError, match=rf"{path}:2: not JSON"):
      read(str(path))
