"""Build `python_docs.txt`, the scaling studies' corpus, from the Python documentation's
reStructuredText sources, and print and check its sha256.

    apt-get install python3.11-doc          # Debian / Ubuntu: the docs, with their sources
    python -m experiments.python_docs_corpus --out=python_docs.txt

The sources are the `_sources/**/*.rst.txt` files of a Sphinx HTML build of the docs (Debian's
`python3.X-doc` installs them under /usr/share/doc/python3.X/html/_sources, the default
`--sources` when one is there); nothing is downloaded. The corpus is every such file in sorted
path order, each without its leading and trailing blank lines, joined by one blank line, with
a final newline: the studies' file (experiments/results/scaling_*.md, mup_transfer.md) is
this recipe applied to a Debian python3.11-doc of Python 3.11.2.

Checksums (`KNOWN`): the studies' file, and what Debian bookworm's python3.11-doc
3.11.2-6+deb12u8 gives (the docs of security updates change between package revisions: it
differs from the studies' file in 7 places of the ssl, asyncio-eventloop, asyncio-stream and
urllib.request pages, 1,956 characters fewer). The build prints which one it made, or that it made neither (then the
studies' numbers are not expected to repeat exactly); `--sha256=HEX` makes a different
checksum an error (exit 2).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import pathlib
import re
import sys

SUFFIX = ".rst.txt"
KNOWN = {
    "d7d917b10d010d467576bc0c48e5a3c900265f42a28ee229fcce3f89cbb0b596":
        "the scaling studies' python_docs.txt (11,048,662 bytes)",
    "a43bd1452887bb662b218899f54eda0e0d322684207a9fed2a30a3af26bb9fb1":
        "Debian bookworm python3.11-doc 3.11.2-6+deb12u8 (11,046,706 bytes; not the "
        "studies' file: 7 passages of the ssl, asyncio and urllib.request pages differ)",
}
DEFAULT_SOURCES = "/usr/share/doc/python3*/html/_sources"


def corpus(sources: str | os.PathLike) -> bytes:
  """The corpus of the `*.rst.txt` files under `sources` (see the module docstring)."""
  root = pathlib.Path(sources)
  if not root.is_dir():
    raise ValueError(f"--sources={str(sources)!r} is not a directory; give the `_sources` "
                     "directory of the Python docs' HTML build (Debian/Ubuntu: apt-get "
                     "install python3.11-doc, then /usr/share/doc/python3.11/html/_sources)")
  files = sorted(root.rglob("*" + SUFFIX), key=lambda p: p.relative_to(root).as_posix())
  if not files:
    raise ValueError(f"--sources={str(sources)!r} holds no *{SUFFIX} files; give the "
                     "`_sources` directory of the Python docs' HTML build")
  texts = [p.read_text(encoding="utf-8").strip("\n") for p in files]
  return ("\n\n".join(texts) + "\n").encode("utf-8")


def default_sources() -> str | None:
  """The newest installed Debian/Ubuntu python3.X-doc's `_sources`, if any."""
  def version(path):                       # .../python3.11/html/_sources -> (3, 11)
    digits = re.findall(r"\d+", pathlib.Path(path).parents[1].name)
    return tuple(int(d) for d in digits)
  found = sorted(glob.glob(DEFAULT_SOURCES), key=version)
  return found[-1] if found else None


def build(sources: str, out: str, expect: str | None = None) -> str:
  """Write the corpus to `out`; returns its sha256. ValueError when `expect` is given and
  differs (nothing is written then)."""
  data = corpus(sources)
  digest = hashlib.sha256(data).hexdigest()
  if expect is not None and digest != expect.lower():
    raise ValueError(f"the corpus built from {sources} has sha256 {digest}, not --sha256="
                     f"{expect} ({KNOWN.get(expect.lower(), 'an unknown corpus')}); another "
                     "docs package revision gives other text: see experiments/python_docs_corpus.py")
  pathlib.Path(out).write_bytes(data)
  return digest


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sources", help="the docs' `_sources` directory (default: an "
                      f"installed Debian python3.X-doc's, {DEFAULT_SOURCES})")
  parser.add_argument("--out", default="python_docs.txt", help="the corpus file to write")
  parser.add_argument("--sha256", help="the checksum the corpus must have (else exit 2)")
  args = parser.parse_args(argv)
  sources = args.sources or default_sources()
  try:
    if sources is None:
      raise ValueError("no --sources and no Python docs installed: apt-get install "
                       "python3.11-doc (Debian/Ubuntu), or give --sources=<the _sources "
                       "directory of the docs' HTML build>")
    digest = build(sources, args.out, args.sha256)
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  size = os.path.getsize(args.out)
  print(f"{args.out}: {size:,} bytes from {sources}\nsha256 {digest}: "
        + KNOWN.get(digest, "neither the studies' corpus nor a known build: the studies' "
                    "numbers are not expected to repeat exactly"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
