"""One path layer for everything jaxformer reads or writes: a local path, or a URL of an object
store that `etils.epath` serves through fsspec (`gs://` with gcsfs, `s3://` with s3fs).

Why one layer: `os.makedirs("gs://bucket/run")` creates a local directory `gs:/bucket/run`,
so a run "saved" to a bucket was lost with the VM. Every file operation on a user path goes
through `path()` (which refuses a scheme it cannot serve, naming the flag, before anything is
written) and the helpers here, which hide the two differences that matter:

- object stores have no rename and no append: an object write is atomic (readers see the old
  or the new object), so `write_*` replaces in place there and writes a temporary file plus
  `os.replace` locally; `append_text` rewrites the object (metrics and samples are small);
- some libraries write local files only (TensorBoard's event writer, the profiler, a process
  log): `local_mirror` gives them a local directory and `upload` copies what they wrote.
Orbax and TensorStore read and write checkpoints at the URL themselves.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
import threading

from etils import epath

# scheme -> the fsspec package that serves it
SCHEMES = {"gs": "gcsfs", "s3": "s3fs"}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
MIRROR_ROOT = os.path.join("~", ".cache", "jaxformer", "mirror")


def cache_dir(*parts: str) -> str:
  """$XDG_CACHE_HOME/jaxformer/<parts> (~/.cache/jaxformer/... by default): where jaxformer
  keeps what it can rebuild (compiled programs, plans)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "jaxformer", *parts)


def scheme(value: str | os.PathLike) -> str | None:
  """'gs' for 'gs://b/x', None for a local path."""
  match = _URL.match(os.fspath(value))
  return match.group(1).lower() if match else None


def is_remote(value: str | os.PathLike) -> bool:
  return scheme(value) is not None


def path(value: str | os.PathLike, field: str = "--workdir") -> epath.Path:
  """`value` as an epath.Path (a local path with ~ expanded). A URL whose scheme jaxformer
  cannot serve, or whose fsspec package is missing, is a ValueError naming `field`."""
  text = os.fspath(value)
  kind = scheme(text)
  if kind is None:
    return epath.Path(os.path.expanduser(text))
  if kind not in SCHEMES:
    raise ValueError(f"{field}={text!r}: {kind}:// is not a storage jaxformer can use; give a "
                     f"local path or a URL of {', '.join(s + '://' for s in SCHEMES)}")
  if importlib.util.find_spec(SCHEMES[kind]) is None:
    raise ValueError(f"{field}={text!r} needs the {SCHEMES[kind]} package to reach {kind}://; "
                     f"install it: pip install {SCHEMES[kind]}")
  return epath.Path(text)


def absolute(value: str | os.PathLike) -> str:
  """An absolute local path (~ expanded), or the URL itself (os.path.abspath would turn
  'gs://b/x' into '<cwd>/gs:/b/x')."""
  text = os.fspath(value)
  return text if is_remote(text) else os.path.abspath(os.path.expanduser(text))


def check_writable_directory(target: str | os.PathLike, field: str, fix: str) -> None:
  """Create the directory `target` if needed and prove a file can be written in it, so a
  read-only or pseudo file system (/proc), a file in the way or missing permissions are a
  ValueError naming `field` before any work; `fix` ends the message."""
  text = os.fspath(target)
  p = path(text, field)
  try:
    if not is_remote(text):
      if p.exists() and not p.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "a file is in the way")
      p.mkdir(parents=True, exist_ok=True)
    _probe(p, text)
  except Exception as e:  # noqa: BLE001  (fsspec backends raise many types)
    raise ValueError(f"{field}={text!r} is not a writable directory ({_reason(e)}); {fix}"
                     ) from e


def check_writable_file(target: str | os.PathLike, field: str) -> None:
  """Prove the file `target` can be written (its directory exists and takes a new file;
  `target` is not a directory) before the work that produces it: a ValueError naming
  `field`. Nothing is created."""
  text = os.fspath(target)
  p = path(text, field)
  fix = f"pass {field}=<a file path you can write to>"
  if not is_remote(text) and p.is_dir():
    raise ValueError(f"{field}={text!r} is a directory; {fix}")
  if not is_remote(text) and not p.parent.is_dir():
    raise ValueError(f"{field}={text!r}: its directory {os.fspath(p.parent)!r} does not "
                     f"exist; create it or {fix}")
  try:
    _probe(p.parent, text)
  except Exception as e:  # noqa: BLE001
    raise ValueError(f"{field}={text!r} cannot be written ({_reason(e)}); {fix}") from e


def _probe(directory: epath.Path, text: str) -> None:
  """Write and remove a file in `directory` (an object, on an object store)."""
  if is_remote(text):
    probe = directory / f".jaxformer-probe-{os.getpid()}-{threading.get_ident()}"
    probe.write_text("")
    probe.unlink()
    return
  with tempfile.TemporaryFile(dir=directory):
    pass


def _reason(error: Exception) -> str:
  return getattr(error, "strerror", None) or (
      str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def write_bytes(target: str | os.PathLike, data: bytes) -> None:
  """Write `data` so that a reader (or a crash) never sees half of it."""
  p = path(target)
  if is_remote(target):
    p.write_bytes(data)
    return
  # unique per writer thread; `--fresh` removes a leftover *.tmp
  tmp = f"{os.fspath(p)}.{os.getpid()}.{threading.get_ident()}.tmp"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, p)


def write_text(target: str | os.PathLike, text: str) -> None:
  write_bytes(target, text.encode("utf-8"))


def append_text(target: str | os.PathLike, text: str) -> None:
  """Append `text`: in place locally; an object store rewrites the object (it cannot append)."""
  p = path(target)
  if is_remote(target):
    p.write_text((p.read_text() if p.exists() else "") + text)
    return
  with open(p, "a", encoding="utf-8") as f:
    f.write(text)


def local_mirror(target: str | os.PathLike, what: str) -> str:
  """The local directory standing in for `target` (a remote directory) where a library
  writes only local files; `target` itself when it is local."""
  if not is_remote(target):
    return os.fspath(target)
  digest = hashlib.sha256(os.fspath(target).encode()).hexdigest()[:16]
  return os.path.join(os.path.expanduser(MIRROR_ROOT), digest, what)


def local_copy_path(target: str | os.PathLike) -> str:
  """Where `local_copy` keeps the local copy of `target` (`target` itself when local)."""
  if not is_remote(target):
    return os.fspath(target)
  return os.path.join(local_mirror(os.fspath(target), "copies"), path(target).name)


def local_copy(target: str | os.PathLike) -> str:
  """A local file with the bytes of `target` (`target` itself when it is local): for readers
  that open local files only (or read by offset). Downloaded into the mirror once, streamed;
  the object is immutable once written (its name is content-keyed by the caller)."""
  local = local_copy_path(target)
  if is_remote(target) and not os.path.exists(local):
    os.makedirs(os.path.dirname(local), exist_ok=True)
    tmp = f"{local}.{os.getpid()}.{threading.get_ident()}.tmp"
    with path(target).open("rb") as src, open(tmp, "wb") as f:
      shutil.copyfileobj(src, f, 1 << 20)
    os.replace(tmp, local)
  return local


def upload(local_dir: str, target: str | os.PathLike) -> None:
  """Copy the files under `local_dir` that are new or changed to `target` (a no-op when
  `target` is `local_dir` itself)."""
  if not is_remote(target) or not os.path.isdir(local_dir):
    return
  for root, _, files in os.walk(local_dir):
    for name in files:
      local = os.path.join(root, name)
      remote = path(target) / os.path.relpath(local, local_dir)
      if remote.exists() and remote.stat().length == os.path.getsize(local):
        continue
      remote.parent.mkdir(parents=True, exist_ok=True)
      with open(local, "rb") as f:
        remote.write_bytes(f.read())
