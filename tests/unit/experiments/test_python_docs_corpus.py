"""The scaling corpus recipe (experiments/python_docs_corpus.py) on a small deterministic
`_sources` tree: file order, joins, the printed checksum and its check."""

import hashlib

from experiments import python_docs_corpus as recipe

EXPECTED = (b"About\n=====\n\nSee also.\n\n.. c-api\n\nPy_Initialize\n\n"
            b"lib: \xc3\xa9t\xc3\xa9\n   indented\n")


def _sources(root):
  files = {"about.rst.txt": "About\n=====\n\nSee also.\n\n\n",
           "library/x.rst.txt": "lib: \u00e9t\u00e9\n   indented",      # no final newline
           "c-api/init.rst.txt": "\n.. c-api\n\nPy_Initialize\n",     # a leading blank line
           "library/notes.txt": "not a source"}                       # other files: left out
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text, encoding="utf-8")
  return root


def test_the_recipe_joins_the_sources_in_path_order_and_checks_the_checksum(tmp_path, capsys):
  sources = _sources(tmp_path / "_sources")
  assert recipe.corpus(sources) == EXPECTED
  digest = hashlib.sha256(EXPECTED).hexdigest()
  assert digest == "9ace21b0d4f6359bb1ad4c603b13cc52ed429fb27a64a9b2c333eef436de6f70"
  out = tmp_path / "corpus.txt"
  assert recipe.main([f"--sources={sources}", f"--out={out}", f"--sha256={digest}"]) == 0
  assert out.read_bytes() == EXPECTED
  assert f"sha256 {digest}: neither the studies' corpus" in capsys.readouterr().out
  other = tmp_path / "other.txt"
  assert recipe.main([f"--sources={sources}", f"--out={other}", "--sha256=" + "0" * 64]) == 2
  assert not other.exists()                       # nothing written when the check fails
  assert f"has sha256 {digest}, not --sha256=000" in capsys.readouterr().err
  assert recipe.main([f"--sources={tmp_path / 'none'}", f"--out={other}"]) == 2
  assert "is not a directory" in capsys.readouterr().err
