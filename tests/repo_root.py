"""Where the repository is, for tests at any depth under tests/."""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
