"""Install a `git archive` tarball of jaxformer into a directory, on a TPU worker.

    python3 tpu_install.py TARBALL TARGET

`python -m launch.tpu setup` adds this file to the archive it ships (so the installer is the
launcher's, whatever `--ref` is archived) and runs it on every worker. It never deletes or
overwrites a file it did not write: TARGET may hold other things (a relative `--workdir` of a
run started from TARGET lives there), and they are left as they are.

- TARGET/.jaxformer-install.json (the marker) lists every file the last install wrote, with
  its SHA-256.
- A file of the new archive is written only where TARGET has nothing, or a file the marker
  lists with its recorded content, or already the new content (a rerun after an interrupted
  install). A file of the old install that the new archive lacks is removed (then its empty
  parent directories). Identical files are not rewritten.
- Anything else in the way (a file it did not write, one changed since it wrote it, or a
  directory where the archive has a file) refuses the whole install before anything is
  changed, naming the paths; the fix is to move them, or to install into another
  `--remote_dir`. A TARGET from before the marker existed is refused the same way, unless
  its files are already the archive's.

Standard library only (it runs with the worker's python3 before anything is installed); the
tarball is removed afterwards either way (setup copied it there).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile

MARKER = ".jaxformer-install.json"
SELF = "tpu_install.py"          # this file, at the archive's top (launch.tpu adds it)
_SHOWN = 5


class Refused(Exception):
  """The install would delete or overwrite something it did not write."""


def _digest(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _on_disk(path: str) -> str | None:
  """The digest of what is at `path` (a symlink by its target; None: nothing, 'dir': a
  directory)."""
  if os.path.islink(path):
    return "symlink:" + os.readlink(path)
  if os.path.isdir(path):
    return "dir"
  if not os.path.exists(path):
    return None
  with open(path, "rb") as f:
    return _digest(f.read())


def read_archive(tarball: str) -> tuple[dict, str | None]:
  """({relative path: (digest, bytes or symlink target, mode)}, the archive's commit): the
  files under the archive's one top directory, without this installer."""
  entries, commit = {}, None
  with tarfile.open(tarball, "r:gz") as tar:
    commit = tar.pax_headers.get("comment")        # git archive records the commit there
    for member in tar.getmembers():
      top, _, rel = member.name.partition("/")
      if not rel or member.isdir() or rel == SELF:
        continue
      if member.issym():
        entries[rel] = ("symlink:" + member.linkname, member.linkname, None)
      elif member.isfile():
        data = tar.extractfile(member).read()
        entries[rel] = (_digest(data), data, member.mode & 0o777)
  return entries, commit


def _listed(names) -> str:
  names = sorted(names)
  more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
  return ", ".join(names[:_SHOWN]) + more


def plan(entries: dict, target: str) -> tuple[dict, list[str], list[str]]:
  """(the old marker's files, the paths to write, the paths to remove); Refused if anything
  in the way is not this installer's."""
  if os.path.lexists(target) and not os.path.isdir(target):
    raise Refused(f"{target} is a file, not a directory")
  old = {}
  marker = os.path.join(target, MARKER)
  if os.path.exists(marker):
    with open(marker) as f:
      old = json.load(f).get("files", {})
  ours = lambda rel, found: found is None or found == old.get(rel) or (
      rel in entries and found == entries[rel][0])
  blocked, changed, write, remove = [], [], [], []
  for rel, (digest, _, _) in entries.items():
    found = _on_disk(os.path.join(target, rel))
    parent = os.path.dirname(rel)
    while parent:                        # a file where the archive needs a directory
      if os.path.lexists(os.path.join(target, parent)) and not os.path.isdir(
          os.path.join(target, parent)) and parent not in old:
        blocked.append(parent)
      parent = os.path.dirname(parent)
    if not ours(rel, found):
      (changed if rel in old else blocked).append(rel)
    elif found != digest:
      write.append(rel)
  for rel in old:
    if rel not in entries:
      found = _on_disk(os.path.join(target, rel))
      if not ours(rel, found):
        changed.append(rel)
      elif found is not None:
        remove.append(rel)
  if blocked or changed:
    why = []
    if changed:
      why.append(f"{len(changed)} file(s) it installed were changed since ({_listed(changed)})")
    if blocked:
      why.append(f"{len(set(blocked))} path(s) it did not install are in the way "
                 f"({_listed(set(blocked))})")
    raise Refused(f"{target}: {'; '.join(why)}; nothing was changed: move them out of "
                  f"{target} (or install into another --remote_dir) and rerun setup")
  return old, sorted(write), sorted(remove)


def _write(path: str, data, mode, symlink: bool):
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.jaxformer-tmp")
  if os.path.lexists(tmp):
    os.unlink(tmp)
  if symlink:
    os.symlink(data, tmp)
  else:
    with open(tmp, "wb") as f:
      f.write(data)
    os.chmod(tmp, mode)
  os.replace(tmp, path)


def install(tarball: str, target: str) -> str:
  """Install `tarball` into `target` (see the module docstring); a summary line."""
  entries, commit = read_archive(tarball)
  _, write, remove = plan(entries, target)
  os.makedirs(target, exist_ok=True)
  for rel in remove:
    path = os.path.join(target, rel)
    os.unlink(path)
    parent = os.path.dirname(path)
    while os.path.abspath(parent) != os.path.abspath(target) and not os.listdir(parent):
      os.rmdir(parent)
      parent = os.path.dirname(parent)
  for rel in write:
    digest, data, mode = entries[rel]
    _write(os.path.join(target, rel), data, mode, digest.startswith("symlink:"))
  record = {"commit": commit, "files": {rel: e[0] for rel, e in sorted(entries.items())}}
  _write(os.path.join(target, MARKER), json.dumps(record, indent=1).encode(), 0o644, False)
  return (f"installed {commit or 'the archive'} into {target}: {len(write)} file(s) written, "
          f"{len(remove)} removed, {len(entries) - len(write)} unchanged")


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print("usage: tpu_install.py TARBALL TARGET", file=sys.stderr)
    return 2
  tarball, target = argv
  try:
    print(install(tarball, target), flush=True)
    return 0
  except Refused as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    return 3
  finally:
    if os.path.exists(tarball):
      os.unlink(tarball)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
