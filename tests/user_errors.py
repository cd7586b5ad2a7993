"""The check the data and conversion tests share for a bad user file."""

from __future__ import annotations

import pytest

from jaxformer import cli


def user_error(fn, *parts) -> str:
  """fn() raises a ValueError that the CLIs print as one line `error: ...` (raised in
  jaxformer's own code) and whose message holds every one of `parts`."""
  with pytest.raises(ValueError) as info:
    fn()
  message = str(info.value)
  assert cli.is_user_error(info.value), message
  for part in parts:
    assert str(part) in message, (part, message)
  return message
