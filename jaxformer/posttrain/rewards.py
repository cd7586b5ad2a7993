"""Verifiable rewards: programs that score a completion, the registry `posttrain.reward` names.

A reward is `fn(completion: str, record: dict) -> float` (None: unscorable, the completion then
gets advantage 0 and counts in no group statistic, as in trl). `completion` is the sampled text
up to and including its stop (the tokenizer's eos or `posttrain.stop`); `record` is the
prompt's JSON Lines record (`prompt`, `answer` and any other field). Rewards run on the host,
in Python, between sampling and the train step (`tasks/grpo.py`).

    rewards.register("my_reward", fn)      # a plugin or a test adds its own
    rewards.get("first_line_exact")

Built in:
- `first_line_exact`: 1.0 if the completion's text before its first newline, stripped, is
  exactly `record['answer']` (case included), else 0.0: the checker of
  experiments/posttrain.py's "LAST WORD" task.
- `contains_answer`: 1.0 if `record['answer']` occurs in the completion, else 0.0.
"""

from __future__ import annotations

from collections.abc import Callable

Reward = Callable[[str, dict], "float | None"]
_REWARDS: dict[str, Reward] = {}


def register(name: str, fn: Reward, *, replace: bool = False) -> Reward:
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f"reward name {name!r} must be an identifier")
  if name in _REWARDS and not replace:
    raise ValueError(f"reward {name!r} is already registered (replace=True to override it)")
  _REWARDS[name] = fn
  return fn


def unregister(name: str) -> None:
  _REWARDS.pop(name, None)


def names() -> tuple[str, ...]:
  return tuple(sorted(_REWARDS))


def get(name) -> Reward:
  if name not in _REWARDS:
    raise ValueError(f"posttrain.reward={name!r} is not a registered reward; one of "
                     f"{list(names())} (jaxformer.posttrain.rewards.register adds one)")
  return _REWARDS[name]


def first_line(text: str) -> str:
  """The answer a line-based checker reads: the text before its first newline, stripped."""
  return text.split("\n", 1)[0].strip()


def _answer(record: dict) -> str:
  answer = record.get("answer")
  if not isinstance(answer, str):
    raise ValueError("the reward needs a string field 'answer' in every record; got "
                     f"{type(answer).__name__ if 'answer' in record else 'none'}")
  return answer


def first_line_exact(completion: str, record: dict) -> float:
  return float(first_line(completion) == _answer(record))


def contains_answer(completion: str, record: dict) -> float:
  return float(_answer(record) in completion)


register("first_line_exact", first_line_exact)
register("contains_answer", contains_answer)
