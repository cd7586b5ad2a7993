"""One error policy for every command line (`train`, `sample`, `sweep`, the launchers).

A user mistake (a bad config key or value, a bad data path or file, an unwritable workdir, a
missing or unreadable checkpoint) prints one line, `error: <what is wrong and how to fix it>`,
on stderr and exits with code 2 (`EXIT_USER_ERROR`), with no traceback. Anything else is a
bug or an environment failure and keeps its full traceback.

What counts as a user mistake: a `ValueError` or `OSError` raised by jaxformer's own code
(its validation names the field or path and the fix), a flag that does not parse, an
unknown `--config.*` key (answered with the closest valid key) or one under a leaf
(`--config.data.source.path=x` when data.source is a string), and a `--config` file that
does not load or raises: that one line names the file and line it raised at and the
exception (a config file is short; its own traceback would add config_flags' frames, not
information). The test is where the error was raised, not its type alone, so a `ValueError`
from inside JAX or NumPy, which would be a jaxformer bug, still shows where it came from.
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
    if i and not hasattr(node, "keys"):            # a key under a leaf: data.source.path
      leaf = ".".join(parts[:i])
      return (f"--{flag}.{dotted}: config key {leaf!r} is a {type(node).__name__} "
              f"({node!r}), not a section with keys; set it whole: --{flag}.{leaf}=<value>")
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


_HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def absl_flags_parser(argv: list[str], flag_values=None) -> list[str]:
  """`app.run(..., flags_parser=absl_flags_parser)`: a command line or `--config` file
  mistake as one line and exit code 2 instead of a traceback (see the module docstring);
  anything else parsing raises keeps its traceback. `flag_values`: absl's FLAGS unless given
  (tests pass their own)."""
  from absl import flags
  flag_values = flags.FLAGS if flag_values is None else flag_values
  try:
    rest = flag_values(argv)
  except SystemExit as e:   # absl exits 1 after printing --help: asked-for help is success
    if e.code == 1 and any(a.split("=")[0] in _HELP_FLAGS for a in argv[1:]):
      raise SystemExit(0) from None
    raise
  except Exception as e:  # noqa: BLE001  (re-raised unless it is the user's mistake)
    message = _command_line_mistake(argv, e, flag_values)
    if message is None:
      raise
    fail(message)
  if "config" in flag_values:              # config_flags loads lazily: surface a bad file now
    try:
      hasattr(getattr(flag_values, "config"), "keys")     # a failed load raises on access
    except Exception as e:  # noqa: BLE001
      spec = _config_spec(argv)
      fail((_load_config(spec)[1] if spec is not None else None) or
           f"--config={spec}: the config file does not load ({_last_error_line(str(e))})")
  return rest


def _command_line_mistake(argv: list[str], error: Exception, flag_values) -> str | None:
  """The one line for what parsing `argv` raised, or None (a bug: keep the traceback). The
  `--config` file is loaded again here, so its own failure (missing, raising, wrong
  get_config) is named as such whatever override config_flags was applying when it failed."""
  from absl import flags
  spec = _config_spec(argv) if _has_config_file_flag(flag_values) else None
  config = None
  if spec is not None:
    config, message = _load_config(spec)
    if message:
      return message
  if isinstance(error, flags.Error):
    return f"{_last_error_line(str(error))} (see --helpshort)"
  if isinstance(error, (AttributeError, KeyError, TypeError)) and config is not None:
    for arg in argv[1:]:                  # an override naming no key, or a key under a leaf
      if arg.startswith("--config."):
        message = unknown_key_message(config, arg[len("--config."):].split("=")[0])
        if message:
          return message
  if isinstance(error, (AttributeError, KeyError)):
    return f"a --config.* override names no config key ({error})"
  return None


def _has_config_file_flag(flag_values) -> bool:
  """--config is a config_flags config file (train, plan), not a plain string (sweep)."""
  from ml_collections.config_flags import config_flags
  return "config" in flag_values and isinstance(flag_values["config"].parser,
                                                config_flags.ConfigFileFlagParser)


def _last_error_line(text: str) -> str:
  """The message of the innermost exception in `text` (config_flags embeds the traceback of
  a config file that raised), else the text itself."""
  lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
  if len(lines) > 1:
    head = lines[0].split("Traceback")[0].strip()
    return f"{head} {lines[-1]}".strip()
  return text


def _config_spec(argv: list[str]) -> str | None:
  """The value of `--config=path.py[:arg]` (or `--config path.py`) in argv, else None."""
  for i, arg in enumerate(argv[1:], 1):
    if arg.startswith(("--config=", "-config=")):
      return arg.split("=", 1)[1]
    if arg in ("--config", "-config") and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _load_config(spec: str) -> tuple[Any, str | None]:
  """(the config `spec` names, None), loaded as config_flags loads it (`path[:arg]`, split
  at the first colon), or (None, the one line saying why it does not load: no such file,
  no get_config, or what the file raised and where)."""
  import importlib.machinery
  import importlib.util
  path, _, arg = spec.partition(":")
  given = f"--config={spec}"
  if not os.path.isfile(path):
    return None, f"{given}: the config file does not load: {_no_such_file(path)}"
  try:
    loader = importlib.machinery.SourceFileLoader("_jaxformer_cli_config", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name,
                                                                             loader))
    loader.exec_module(module)
  except Exception as e:  # noqa: BLE001  (whatever the user's file raises is reported)
    return None, _config_raised(given, path, e)
  get_config = getattr(module, "get_config", None)
  if not callable(get_config):
    return None, (f"{given}: {path} defines no get_config(); a config file defines "
                  "get_config(arg=None) returning the ConfigDict")
  try:
    return (get_config(arg) if ":" in spec else get_config()), None
  except TypeError as e:
    if _innermost_code(e.__traceback__) is _load_config.__code__:   # the call itself
      return None, f"{given}: get_config of {path} cannot be called that way ({e})"
    return None, _config_raised(given, path, e)
  except Exception as e:  # noqa: BLE001
    return None, _config_raised(given, path, e)


def _no_such_file(path: str) -> str:
  """'No such file or directory ...' for a config path, with the closest file beside it."""
  where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
  folder, name = os.path.split(path)
  try:
    names = [n for n in os.listdir(folder or ".") if n.endswith(".py")]
  except OSError:
    names = []
  stems = {n[:-len(".py")]: n for n in names}
  close = difflib.get_close_matches(name.removesuffix(".py"), stems, n=1, cutoff=0.6)
  hint = (f"did you mean --config={os.path.join(folder, stems[close[0]])}?" if close else
          "give the path of a config file, e.g. configs/shakespeare_char.py")
  kind = "is a directory" if os.path.isdir(path) else "No such file or directory"
  return f"{kind}: {path!r}{where}; {hint}"


def _config_raised(given: str, path: str, error: Exception) -> str:
  """What a config file raised: a jaxformer validation error (configs/common.py naming valid
  names) as its own message; anything else as the exception and the file:line of the config
  file where it arose (the innermost frame in that file; a SyntaxError's own line)."""
  if is_user_error(error):
    return f"{given}: {error}"
  target = os.path.abspath(path)
  where, text = "", _exception_text(error)
  if isinstance(error, SyntaxError) and error.filename and (
      os.path.abspath(error.filename) == target):
    where, text = f" at {path}:{error.lineno}", error.msg
  else:
    import traceback
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if os.path.abspath(f.filename) == target]
    if frames:
      where = f" at {path}:{frames[-1].lineno} (in {frames[-1].name})"
  return (f"{given}: the config file raised {type(error).__name__}{where}: {text}; fix the "
          "config file")


def _exception_text(error: Exception) -> str:
  """str(error), with the quoting KeyError (and ml_collections' AttributeError) add undone."""
  import ast
  text = str(error)
  for _ in range(2):
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
      try:
        value = ast.literal_eval(text)
      except (ValueError, SyntaxError):
        break
      if not isinstance(value, str):
        break
      text = value
  return " ".join(text.split())


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
