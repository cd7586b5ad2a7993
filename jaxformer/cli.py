"""One error policy for every command line (`train`, `sample`, `sweep`, the launchers).

A user mistake (a bad config key or value, a bad data path or file, an unwritable workdir, a
missing or unreadable checkpoint) prints one line, `error: <what is wrong and how to fix it>`,
on stderr and exits with code 2 (`EXIT_USER_ERROR`), with no traceback. Anything else is a
bug or an environment failure and keeps its full traceback.

What counts as a user mistake: a `ValueError` or `OSError` raised by jaxformer's own code
(its validation names the field or path and the fix), a flag that does not parse, and an
unknown `--config.*` key (answered with the closest valid key). The test is where the error
was raised, not its type alone, so a `ValueError` from inside JAX or NumPy, which would be a
jaxformer bug, still shows where it came from.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import logging
import os
import sys
import threading
from typing import Any, Callable, NoReturn

EXIT_USER_ERROR = 2
_default_thread_excepthook = threading.excepthook
_default_unraisablehook = sys.unraisablehook
_OWN_CODE = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d)
                  + os.sep for d in ("jaxformer", "configs", "launch"))


def fail(message: str) -> NoReturn:
  """Print `error: message` as one line on stderr and exit with EXIT_USER_ERROR."""
  from jaxformer import console
  console.error("error: " + " ".join(str(message).split()))
  sys.exit(EXIT_USER_ERROR)


def is_user_error(error: BaseException) -> bool:
  """A ValueError/OSError raised in jaxformer's own code (configs and launchers included)."""
  if not isinstance(error, (ValueError, OSError)):
    return False
  code = _innermost_code(error.__traceback__)
  return code is not None and os.path.abspath(code.co_filename).startswith(_OWN_CODE)


def _thread_excepthook(args) -> None:
  """A background writer (TensorBoard's, Orbax's) that finds the disk full dies quietly: the
  run's own thread finds it too at its next write or checkpoint and reports it in one line."""
  from jaxformer import console
  if console.disk_full_path(args.exc_value) is not None:
    logging.debug("thread %s: %s", getattr(args.thread, "name", "?"), args.exc_value)
    return
  _default_thread_excepthook(args)


def _unraisablehook(args) -> None:
  """TensorStore's completion callbacks that reach an asyncio loop Orbax has already closed
  (after a failed asynchronous checkpoint write, e.g. a disk that filled mid-write) are
  dropped: each would print a traceback of `RuntimeError: Event loop is closed`, while the
  failure itself is reported once by the run's own thread."""
  code = _innermost_code(args.exc_traceback)
  if isinstance(args.exc_value, RuntimeError) and code and code.co_name == "_check_closed":
    logging.debug("dropped a callback into a closed event loop: %s", args.exc_value)
    return
  _default_unraisablehook(args)


def _innermost_code(tb):
  """The code object where a traceback was raised (None without a traceback)."""
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return tb.tb_frame.f_code if tb is not None else None


def user_errors(main: Callable) -> Callable:
  """Wrap a CLI main: user mistakes become one line and exit code 2 (see module docstring)."""
  @functools.wraps(main)
  def wrapped(*args, **kwargs):
    try:
      return main(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (re-raised unless it is a user mistake)
      if is_user_error(e):
        fail(e)
      raise
  return wrapped


def format_value(value: Any) -> str:
  """A Python value as a `--config.*` flag's text that `config_flags` parses back (strings
  bare, bools lower-case): how sweeps and the plan search write their overrides."""
  if isinstance(value, str):
    return value
  if isinstance(value, bool):
    return str(value).lower()
  return repr(tuple(value) if isinstance(value, list) else value)


def config_keys(config: Any, prefix: str = "") -> list[str]:
  """Every dotted key of a (nested) ConfigDict, leaves and sections."""
  keys = []
  for key, value in config.items():
    keys.append(prefix + key)
    if hasattr(value, "items"):
      keys += config_keys(value, prefix + key + ".")
  return keys


def unknown_key_message(config: Any, dotted: str, flag: str = "config") -> str | None:
  """'unknown config key ...: did you mean ...' when `dotted` is not in `config`, else None.
  The suggestion is the closest key of the same section, else a key of that name in another
  section, else the section's keys."""
  node, parts = config, dotted.split(".")
  for i, part in enumerate(parts):
    if not hasattr(node, "keys") or part not in node.keys():
      section = ".".join(parts[:i])
      names = sorted(node.keys()) if hasattr(node, "keys") else []
      close = [f"{section}.{k}" if section else k
               for k in difflib.get_close_matches(part, names, n=1, cutoff=0.6)]
      if not close:
        close = [k for k in config_keys(config)
                 if difflib.get_close_matches(part, [k.split(".")[-1]], cutoff=0.85)][:1]
      hint = (f"did you mean --{flag}.{close[0]}?" if close else
              f"the keys of {section or flag} are {names}")
      return f"unknown config key {dotted!r} (--{flag}.{dotted}): {hint}"
    node = node[part]
  return None


def absl_flags_parser(argv: list[str]) -> list[str]:
  """`app.run(..., flags_parser=absl_flags_parser)`: absl flag errors and unknown
  `--config.*` keys as one line and exit code 2 instead of a traceback."""
  from absl import flags
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    fail(f"{_last_error_line(str(e))} (see --helpshort)")
  except (AttributeError, KeyError) as e:           # an unknown --config.* override
    config = _config_file(argv)
    for arg in argv[1:] if config is not None else ():
      if arg.startswith("--config."):
        message = unknown_key_message(config, arg[len("--config."):].split("=")[0])
        if message:
          fail(message)
    fail(f"a --config.* override names no config key ({e})")
  if "config" in flags.FLAGS:              # config_flags loads lazily: surface a bad file now
    try:
      hasattr(getattr(flags.FLAGS, "config"), "keys")     # a failed load raises on access
    except Exception as e:  # noqa: BLE001
      given = next((a for a in argv if a.startswith("--config=")), "--config")
      fail(f"{given}: the config file does not load ({_last_error_line(str(e))})")
  return rest


def _last_error_line(text: str) -> str:
  """The message of the innermost exception in `text` (config_flags embeds the traceback of
  a config file that raised), else the text itself."""
  lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
  if len(lines) > 1:
    head = lines[0].split("Traceback")[0].strip()
    return f"{head} {lines[-1]}".strip()
  return text


def _config_file(argv: list[str]):
  """The config that `--config=path.py[:arg]` in argv names, loaded as config_flags loads it
  (None if there is none or it does not load: the original error is reported then)."""
  import importlib.util
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if spec is None:
    return None
  path, _, arg = spec.partition(".py:")
  path = path if path.endswith(".py") else path + ".py"
  try:
    module_spec = importlib.util.spec_from_file_location("_jaxformer_cli_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception:  # noqa: BLE001
    return None


def run_absl(main: Callable) -> None:
  """`absl.app.run(main)` under the one error policy and the one logging policy
  (`jaxformer.console`: third-party records off unless --verbosity is given)."""
  from absl import app, flags

  from jaxformer import console

  def logged_main(argv):
    console.configure_logging(verbosity_given=flags.FLAGS["verbosity"].present)
    threading.excepthook = _thread_excepthook
    sys.unraisablehook = _unraisablehook
    return main(argv)
  app.run(user_errors(logged_main), flags_parser=absl_flags_parser)


class ArgumentParser(argparse.ArgumentParser):
  """argparse whose usage errors are one line and exit code 2, like every jaxformer CLI."""

  def error(self, message: str) -> NoReturn:
    fail(f"{message} (see {self.prog} --help)")


def define_compilation_cache_flag() -> None:
  """`--compilation_cache=DIR` for a command that compiles (see `jaxformer.compilation`);
  the command calls `compilation.enable_cache(FLAGS.compilation_cache)` first thing."""
  from absl import flags

  from jaxformer import compilation
  flags.DEFINE_string(
      "compilation_cache", compilation.default_cache_dir(),
      "Persistent XLA compilation cache: a rerun of the same job loads its compiled steps "
      "instead of compiling them. Empty: off.")
