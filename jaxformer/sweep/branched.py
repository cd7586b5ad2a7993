"""Sweeps of warmup-stable-decay trunks and their cooldown branches
(`jaxformer.scaling.wsd_sweeps` plans them): the trunks train first, then each branch starts
from its trunk's checkpoint (`jaxformer.train.workdir.branch`) and trains its decay only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jaxformer.sweep import runner, spec


def run_branched(specs: Mapping[str, Any], workdir: str, *, parallel: int = 1
                 ) -> tuple[list[dict], list[dict]]:
  """(trunk rows, branch rows): `sweep.run` of specs["trunks"] in `workdir/trunks`, then of
  specs["branches"] in `workdir/branches`, each branch first copied from its trunk's kept
  checkpoint (`links`: (branch index, trunk index, step)). Resumable like any sweep: a rerun
  skips finished runs and branches again only what is missing. A branch whose trunk never
  reached its step trains from scratch instead, to the same result at a higher cost."""
  from jaxformer import paths, workdir_layout          # not at import: `jaxformer.sweep` loads the
  from jaxformer.train import workdir as workdir_lib   # standard library only
  trunk_dir, branch_dir = os.path.join(workdir, "trunks"), os.path.join(workdir, "branches")
  trunk_rows = runner.run(specs["trunks"], trunk_dir, parallel=parallel)
  if not specs.get("branches"):
    return trunk_rows, []
  trunks = spec.expand(specs["trunks"], validate=False)
  branches = spec.expand(specs["branches"], validate=False)
  for b, t, step in specs["links"]:
    source = os.path.join(trunk_dir, trunks[t].name)
    if paths.path(os.path.join(source, workdir_layout.CHECKPOINTS, str(step))).is_dir():
      workdir_lib.branch(source, step, os.path.join(branch_dir, branches[b].name))
  return trunk_rows, runner.run(specs["branches"], branch_dir, parallel=parallel)
