"""The committed partition-spec dumps (tests/partition_specs/, see tests/spec_dumps.py) are
what the code lays out now: a change of the sharding rules, of a layer's logical axis names or
of the optimizer state shows here as a diff, and is committed with the regenerated dumps."""

import difflib

import pytest

from jaxformer import models
from tests import spec_dumps


def test_every_family_has_a_dump_and_every_dump_a_variant():
  assert set(models.names()) <= {v.family for v in spec_dumps.VARIANTS}
  committed = {p.name for p in spec_dumps.DIR.glob("*.txt")}
  wanted = {spec_dumps.path(v).name for v in spec_dumps.VARIANTS}
  assert committed == wanted, (f"missing: {sorted(wanted - committed)}, stale: "
                               f"{sorted(committed - wanted)}; regenerate: {spec_dumps.COMMAND}")


@pytest.mark.parametrize("variant", spec_dumps.VARIANTS, ids=lambda v: v.name)
def test_partition_specs_match_the_committed_dump(variant):
  path = spec_dumps.path(variant)
  want = path.read_text() if path.is_file() else ""
  got = spec_dumps.render(variant)
  if got != want:
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                        f"{path.name} (committed)", f"{path.name} (now)"))
    pytest.fail(f"the partition specs of {variant.name} changed; if that is intended, "
                f"regenerate with `{spec_dumps.COMMAND}` and commit the diff:\n{diff}",
                pytrace=False)
