"""python -m jaxformer.plan --config=configs/<name>.py[:arg] --topology=v5e:4x4 [--slices=N]
    [--config.a.b=v] [--json=PATH] [--nearest]
    [--search [--search_dims=mesh,fsdp,...] [--budget_minutes=M]]

Compiles the train step `jaxformer.train` would run for the config on the named TPU topology
(compile-only devices: no TPU needed) and prints per-chip memory against HBM, FLOPs,
collectives and estimated step times. `--nearest`: when the step does not fit, also find and
print the smallest change that does. `--search` ranks shardings and prints the winning
`--config.*` overrides.

Exit codes: 0 the step fits (with --search: a candidate fits); 3 it does not fit in HBM
(no candidate fits), after printing the plan and writing --json; 2 a mistake in the
command line or the config (one `error:` line; --json is checked before compiling).
"""

import json
import sys

from absl import flags
from ml_collections import config_flags

from jaxformer import cli, paths
from jaxformer.plan import EXIT_DOES_NOT_FIT

config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
flags.DEFINE_string("topology", None, "TPU topology, e.g. v5e:4x4, v5p:4x4x4, v4:2x2x2, v6e:8x8.")
flags.DEFINE_integer("slices", 1, "Number of slices (multi-slice: the data axis spans DCN).")
flags.DEFINE_string("json", None, "Also write the report as JSON to this path.")
flags.DEFINE_bool("nearest", False, "When the step does not fit: compile the smallest changes "
                  "(remat policy, FSDP, gradient accumulation, mesh; one field, then pairs) "
                  "until one fits, and print it.")
flags.DEFINE_bool("search", False, "Search the sharding space and rank what fits.")
flags.DEFINE_list("search_dims", ["mesh", "fsdp", "remat", "accum", "attention", "scan"],
                  "Dimensions the search varies (others keep the config's value).")
flags.DEFINE_float("budget_minutes", 30.0, "Time budget of --search.")
flags.DEFINE_integer("workers", 2, "Compile processes of --search.")
flags.DEFINE_integer("max_compiles", None, "At most this many compiles in --search.")
flags.DEFINE_string("cache_dir", None, "Where compiles are cached (default for --search: "
                    "~/.cache/jaxformer/plans; a single plan is cached only when given).")
flags.mark_flags_as_required(["config", "topology"])


def main(argv):
  del argv
  from jaxformer import accelerators
  from jaxformer.plan import estimate, search, topology
  from jaxformer.train import config_checks
  f = flags.FLAGS
  if f.slices < 1:
    raise ValueError(f"--slices={f.slices} must be >= 1")
  unknown = sorted(set(f.search_dims) - set(search.DIMENSIONS))
  if unknown:
    raise ValueError(f"--search_dims={','.join(f.search_dims)}: {unknown} unknown; choose "
                     f"from {','.join(search.DIMENSIONS)}")
  settings = config_checks.validate(f.config)
  if f.json:                                 # a bad --json is refused before the compile
    paths.check_writable_file(f.json, "--json")
  if not f.search:
    report = estimate.plan(f.config, f.topology, f.slices, settings=settings,
                           cache_dir=f.cache_dir)
    print(estimate.table(report))
    if f.json:
      _write_json(f.json, report.to_json())
    if not report.fits and f.nearest:
      print("looking for the nearest change that fits")
      chip = accelerators.CHIPS[topology.generation(f.topology)]
      nearest = search.nearest_fitting_change(
          f.config, topology.devices(f.topology, f.slices), chip, topology=f.topology,
          slices=f.slices, refused=report, cache_dir=f.cache_dir, log=print)
      print("no change of remat policy, FSDP, gradient accumulation or mesh fits: use more "
            "chips or a smaller model or batch" if nearest is None else
            f"nearest change that fits: {nearest.flags()} "
            f"({estimate.gib(nearest.plan['per_chip_bytes']['total'])} per chip)")
    return None if report.fits else EXIT_DOES_NOT_FIT
  result = search.search(f.config, f.topology, f.slices, dimensions=f.search_dims,
                              budget_seconds=60 * f.budget_minutes, workers=f.workers,
                              cache_dir=f.cache_dir, max_compiles=f.max_compiles)
  print(search.table(result))
  best = result.best
  if best is None:
    print("no candidate fits; widen --search_dims, raise --budget_minutes, or use more chips")
  else:
    spec = config_flags.get_config_filename(flags.FLAGS["config"])
    given = " ".join(a for a in sys.argv[1:] if a.startswith("--config.")
                     and a.split("=", 1)[0][len("--config."):] not in best.overrides)
    train = f"python -m jaxformer.train --config={spec} {given} {best.flags()}".replace("  ", " ")
    print(f"best: {best.flags()}")
    print(f"  {train} --workdir=DIR")
    print(f"  python -m launch.tpu run --tpu=NAME --zone=ZONE -- {train} --workdir=gs://BUCKET/DIR")
  if f.json:
    _write_json(f.json, {"best": None if best is None else best.overrides,
                         "candidates": [{"overrides": c.overrides, "status": c.status,
                                         "reason": c.reason, "plan": c.plan}
                                        for c in result.candidates]})
  return EXIT_DOES_NOT_FIT if best is None else None


def _write_json(target: str, value) -> None:
  try:
    paths.write_text(target, json.dumps(value, indent=2))
  except OSError as e:                     # e.g. the disk filled while compiling
    raise ValueError(f"--json={target!r} cannot be written ({e.strerror or e}); the report "
                     "is printed above") from e


if __name__ == "__main__":
  cli.run_absl(main)
