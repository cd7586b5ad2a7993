"""Multiple-choice scoring of local JSONL: each choice's log-likelihood after the context,
the most likely choice is the answer (lm-evaluation-harness's `multiple_choice`).

Formats (one JSON object a line; the format of each line is read from its keys):
- HellaSwag: `ctx` (or `ctx_a` + `ctx_b`), `endings` [str], `label` (index, int or digits);
  the continuations are " " + ending;
- ARC: `question`, `choices` {`text`: [str], `label`: [str]}, `answerKey` (one of the
  labels); context "Question: <question>\\nAnswer:", continuations " " + text;
- PIQA: `goal`, `sol1`, `sol2`, `label` (0 or 1); context "Question: <goal>\\nAnswer:";
- generic: `context`, `choices` [str], `answer` (index, or the text of a choice); the
  choices are scored as written (put any leading space in them).

`acc`: the choice of largest log-likelihood; `acc_norm`: of largest log-likelihood per
character of the continuation (lm-eval's acc_norm). Each with a 95% Wilson score interval.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from jaxformer import jsonfile, paths
from jaxformer.evaluate.scoring import Scorer, continuation_row

FORMATS = {
    "hellaswag": "ctx (or ctx_a and ctx_b), endings, label",
    "arc": "question, choices {text, label}, answerKey",
    "piqa": "goal, sol1, sol2, label",
    "generic": "context, choices, answer",
}
Z95 = 1.959963984540054


@dataclasses.dataclass(frozen=True)
class Item:
  context: str
  choices: tuple[str, ...]
  label: int
  where: str                         # file:line


def _expected() -> str:
  return "; ".join(f"{name}: {keys}" for name, keys in FORMATS.items())


def _index(value, n: int, what: str) -> int:
  if isinstance(value, str) and value.strip().isdigit():
    value = int(value)
  if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
    raise ValueError(f"{what}={value!r} must be a choice index in [0, {n})")
  return value


def _strings(values, what: str) -> tuple[str, ...]:
  if not isinstance(values, list) or len(values) < 2 or not all(
      isinstance(v, str) and v for v in values):
    raise ValueError(f"{what} must be a list of 2 or more non-empty strings")
  return tuple(values)


def parse_record(record: dict, where: str) -> Item:
  """One JSON object in any of FORMATS as an Item; a ValueError naming `where` otherwise."""
  try:
    if not isinstance(record, dict):
      raise ValueError("the line is not a JSON object")
    if "endings" in record:                                          # HellaSwag
      ctx = record.get("ctx")
      if ctx is None and "ctx_a" in record:
        ctx = f"{record['ctx_a']} {record.get('ctx_b', '')}".rstrip()
      endings = _strings(record["endings"], "endings")
      return Item(str(ctx), tuple(" " + e for e in endings),
                  _index(record["label"], len(endings), "label"), where)
    if "question" in record and isinstance(record.get("choices"), dict):   # ARC
      texts = _strings(record["choices"]["text"], "choices.text")
      labels = [str(x) for x in record["choices"]["label"]]
      key = str(record["answerKey"])
      if key not in labels:
        raise ValueError(f"answerKey={key!r} is not one of choices.label {labels}")
      return Item(f"Question: {record['question']}\nAnswer:", tuple(" " + t for t in texts),
                  labels.index(key), where)
    if "goal" in record:                                             # PIQA
      sols = _strings([record["sol1"], record["sol2"]], "sol1/sol2")
      return Item(f"Question: {record['goal']}\nAnswer:", tuple(" " + s for s in sols),
                  _index(record["label"], 2, "label"), where)
    if "context" in record and "choices" in record:                  # generic
      choices = _strings(record["choices"], "choices")
      answer = record["answer"]
      if isinstance(answer, str) and answer in choices:
        answer = choices.index(answer)
      return Item(str(record["context"]), choices, _index(answer, len(choices), "answer"),
                  where)
  except KeyError as e:
    raise ValueError(f"{where}: missing key {e}; expected the keys of one format: "
                     f"{_expected()}") from None
  except (ValueError, TypeError) as e:
    raise ValueError(f"{where}: {e}") from None
  keys = sorted(record) if isinstance(record, dict) else type(record).__name__
  raise ValueError(f"{where}: keys {keys} match no multiple-choice format; expected the "
                   f"keys of one: {_expected()}")


def read_items(path: str, limit: int | None = None) -> list[Item]:
  """The items of a JSONL file (blank lines skipped), checked line by line."""
  name = os.fspath(path)
  records = jsonfile.read_jsonl(paths.path(name, "--data"), name=name, field="--data",
                                holds=f"multiple-choice items, with the keys of one format: "
                                      f"{_expected()}", objects=False, limit=limit)
  return [parse_record(record, where) for where, record in records]


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
  """The Wilson score interval of a proportion."""
  if n == 0:
    return 0.0, 1.0
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def encode_items(items: list[Item], tokenizer, start: int | None):
  """(context ids, [choice ids]) per item; an item the tokenizer cannot encode is named."""
  encoded = []
  for item in items:
    try:
      ctx = tokenizer.encode(item.context).tolist()
      choices = [tokenizer.encode(c).tolist() for c in item.choices]
    except ValueError as e:
      raise ValueError(f"{item.where}: {e}") from None
    if not ctx:
      if start is None:
        raise ValueError(f"{item.where}: the context is empty and the tokenizer has no "
                         "token to start from (no eos, bos or newline)")
      ctx = [start]
    if not all(choices):
      raise ValueError(f"{item.where}: a choice encodes to no tokens")
    encoded.append((ctx, choices))
  return encoded


def evaluate(scorer: Scorer, tokenizer, items: list[Item], start: int | None) -> dict:
  """acc and acc_norm (with Wilson intervals) of the model on `items`."""
  encoded = encode_items(items, tokenizer, start)
  rows = []
  for item, (ctx, choices) in zip(items, encoded):
    for c in choices:
      try:
        rows.append(continuation_row(ctx, c, scorer.width))
      except ValueError as e:
        raise ValueError(f"{item.where}: {e}") from None
  scores = iter(scorer.score(rows))
  correct = correct_norm = 0
  for item in items:
    ll = np.array([next(scores).total for _ in item.choices])
    chars = np.array([len(c) for c in item.choices], np.float64)
    correct += int(np.argmax(ll) == item.label)
    correct_norm += int(np.argmax(ll / chars) == item.label)
  n = len(items)
  return {"items": n, "acc": correct / n, "acc_interval": list(wilson(correct, n)),
          "acc_norm": correct_norm / n, "acc_norm_interval": list(wilson(correct_norm, n)),
          "chance": float(np.mean([1 / len(item.choices) for item in items]))}
