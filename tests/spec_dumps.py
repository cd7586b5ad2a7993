"""Committed partition-spec dumps: every model family's train state on a representative mesh,
one line per array, so a change of the sharding rules (parallel/rules.py), of a layer's logical
axis names or of the optimizer state's layout shows as a diff of tests/partition_specs/.

Each dump is one family's tiny test config (tests/test_registry.SMALL, vocabularies padded so
the mesh divides them) through what training runs: `train_state.train_state_fns` traced by
`jax.eval_shape` (nothing is initialised or compiled) and `ShardingPlan.from_config(...)
.state_shardings`, on data=2 x model=2 with FSDP (and expert=2 for the MoE variant). A line:

  path  shape  dtype  logical-axes  PartitionSpec

(logical axes `-` for an unboxed leaf such as a step counter), sorted by path.
tests/unit/parallel/test_partition_specs.py compares them with the committed files. Regenerate with

  PYTHONPATH=. python -m tests.spec_dumps
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys

if __name__ == "__main__":        # before JAX is imported: 8 CPU devices, as tests/conftest.py
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

import flax.linen as nn
import jax

from jaxformer import models
from jaxformer.parallel.sharding import ShardingPlan, _path_str
from jaxformer.state import train_state
from tests.unit.models.test_registry import SMALL, run_config

DIR = pathlib.Path(__file__).resolve().parent / "partition_specs"
COMMAND = "PYTHONPATH=. python -m tests.spec_dumps"
MESH = dict(data=2, model=2, expert=1, fsdp=True)


@dataclasses.dataclass(frozen=True)
class Variant:
  """One dump: `family`'s model config and the mesh it is laid on."""
  name: str
  family: str
  model: dict
  mesh: dict


def _divisible(model: dict) -> dict:
  """SMALL's config with what mesh.model=2 must divide made even (its vocabulary of 37,
  ELECTRA's one-head generator)."""
  out = dict(model)
  if "vocab_size" in out:
    out["vocab_size"] = 40
  if out.get("generator_num_heads") == 1:
    out["generator_num_heads"] = 2
  return out


# Mixtral-like: grouped-query attention, rope, RMSNorm, 4 experts, scanned layers.
_MOE = dict(SMALL["decoder"], num_layers=2, num_heads=4, num_kv_heads=2, positions="rope",
            norm="rmsnorm", num_experts=4, experts_per_token=2, scan_layers=True)

VARIANTS = tuple(Variant(f, f, _divisible(SMALL[f]), MESH) for f in sorted(SMALL)) + (
    Variant("decoder_moe", "decoder", _divisible(_MOE), dict(MESH, expert=2)),)


def _spec(spec) -> str:
  def entry(e):
    if e is None:
      return "None"
    return repr(e) if isinstance(e, str) else "(" + ",".join(map(repr, e)) + ")"
  return "P(" + ",".join(entry(e) for e in spec) + ")"


def render(variant: Variant) -> str:
  """The dump of `variant`: a header naming the config and the mesh, then one line per array
  of the train state (params, optimizer state, counters), sorted by path."""
  config = run_config(variant.family, variant.model)
  _, _, init_boxed = train_state.train_state_fns(config)
  boxed = jax.eval_shape(init_boxed)
  size = variant.mesh["data"] * variant.mesh["model"] * variant.mesh["expert"]
  plan = ShardingPlan.from_config(variant.mesh, jax.devices()[:size])
  shardings = plan.state_shardings(boxed)

  def is_box(x):
    return isinstance(x, nn.Partitioned)
  names = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(boxed, is_leaf=is_box)[0]:
    if is_box(leaf):
      names[_path_str(path)] = "(" + ",".join(str(n) for n in leaf.names) + ")"
  lines = []
  arrays = jax.tree_util.tree_flatten_with_path(nn.unbox(boxed))[0]
  for (path, x), sharding in zip(arrays, jax.tree.leaves(shardings), strict=True):
    key = _path_str(path)
    shape = "[" + ",".join(map(str, x.shape)) + "]"
    lines.append(f"{key}  {shape}  {x.dtype}  {names.get(key, '-')}  {_spec(sharding.spec)}")
  mesh = " ".join(f"{k}={v}" for k, v in variant.mesh.items())
  model = json.dumps(dict(variant.model, family=variant.family), sort_keys=True)
  header = f"# {variant.name}: model {model}\n# mesh {mesh}; regenerate: {COMMAND}\n"
  return header + "\n".join(sorted(lines)) + "\n"


def path(variant: Variant) -> pathlib.Path:
  return DIR / f"{variant.name}.txt"


def main() -> None:
  DIR.mkdir(exist_ok=True)
  wanted = {path(v) for v in VARIANTS}
  for stale in sorted(set(DIR.glob("*.txt")) - wanted):
    stale.unlink()
    print(f"removed {stale} (no such variant)")
  for variant in VARIANTS:
    text = render(variant)
    if not path(variant).is_file() or path(variant).read_text() != text:
      path(variant).write_text(text)
      print(f"wrote {path(variant)}")
  assert set(models.names()) <= {v.family for v in VARIANTS}


if __name__ == "__main__":
  sys.exit(main())
