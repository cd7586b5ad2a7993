"""TPU compiler flags that overlap collectives with compute, passed to libtpu in
`LIBTPU_INIT_ARGS` (read once, when libtpu initialises: set them before the first use of a TPU
backend or of compile-only TPU devices).

Each flag below names where it is documented; the groups are what MaxText's benchmark recipes
turn on for dense and MoE training on v5e/v5p/v6e. None changes what a step computes, only how
the compiler schedules and lays out its collectives (and how much memory that takes: the
data-parallel pipelining can raise it, its documentation says so).

Who applies them: `python -m jaxformer.train` (before JAX initialises a backend), the TPU
compile-only devices of `python -m jaxformer.plan` (`jaxformer.plan.topology`, so a plan is
compiled as the run will be; the plan records the flags it compiled with), and
`python -m launch.tpu` (exported on every worker). Rules:

- A user's own `LIBTPU_INIT_ARGS` wins, flag by flag: its flags are kept as given, ours only
  fill the flags it does not name (so `--xla_tpu_enable_async_collective_fusion=false` turns
  one off); anything in it that is not a `--flag` (e.g. `TPU_MEGACORE=...`) is kept.
- `JAXFORMER_TPU_FLAGS` picks the groups: unset means `DEFAULT_GROUPS`; a comma-separated list
  of group names (e.g. `async_collectives,collective_matmul`); `none` applies nothing.
"""

from __future__ import annotations

import dataclasses
import os
import shlex

ENV = "LIBTPU_INIT_ARGS"
GROUPS_ENV = "JAXFORMER_TPU_FLAGS"

# Where each flag is documented (public material; names and meanings, no code taken).
JAX_DOCS = ("JAX documentation, 'List of XLA compiler flags', TPU XLA flags "
            "(https://docs.jax.dev/en/latest/xla_flags.html)")
MAXTEXT = ("MaxText benchmarks/xla_flags_library.py (github.com/AI-Hypercomputer/maxtext), "
           "the flags its benchmark recipes set")


@dataclasses.dataclass(frozen=True)
class Flag:
  name: str          # without the leading --
  value: str
  source: str
  effect: str

  @property
  def arg(self) -> str:
    return f"--{self.name}={self.value}"


GROUPS: dict[str, tuple[Flag, ...]] = {
    # Collectives started early and finished late, fused with the compute scheduled between
    # their start and done: FSDP's parameter all-gathers and gradient all-reduces overlap the
    # layers' matmuls.
    "async_collectives": (
        Flag("xla_tpu_enable_async_collective_fusion", "true", JAX_DOCS,
             "fuse async collectives with the compute between their start and done"),
        Flag("xla_tpu_enable_async_collective_fusion_fuse_all_gather", "true", JAX_DOCS,
             "all-gathers too (FSDP's parameter gathers)"),
        Flag("xla_tpu_enable_async_collective_fusion_multiple_steps", "true", JAX_DOCS,
             "one async collective continued over several fusions"),
        Flag("xla_tpu_overlap_compute_collective_tc", "true", JAX_DOCS,
             "overlap compute and communication on one TensorCore"),
        Flag("xla_enable_async_all_gather", "true", JAX_DOCS, "asynchronous all-gathers"),
        Flag("xla_enable_async_collective_permute", "true", JAX_DOCS,
             "asynchronous collective-permutes"),
        Flag("xla_tpu_enable_async_collective_fusion_fuse_all_reduce", "true", MAXTEXT,
             "all-reduces fused as well (its all-reduce continuation-fusion group)"),
        Flag("xla_enable_async_all_reduce", "true", MAXTEXT, "asynchronous all-reduces"),
    ),
    # Data-parallel gradient all-reduces pipelined across loop iterations (DCN ones overlap).
    "data_parallel": (
        Flag("xla_tpu_enable_data_parallel_all_reduce_opt", "true", JAX_DOCS,
             "more overlap for the data-parallel (DCN) all-reduces"),
        Flag("xla_tpu_data_parallel_opt_different_sized_ops", "true", JAX_DOCS,
             "pipeline data-parallel ops across iterations even when sizes differ (can raise "
             "memory)"),
    ),
    # An all-reduce followed by a dynamic slice becomes a reduce-scatter, laid out for it.
    "reduce_scatter": (
        Flag("xla_tpu_use_minor_sharding_for_major_trivial_input", "true", MAXTEXT,
             "its reduce-scatter fusion group"),
        Flag("xla_tpu_relayout_group_size_threshold_for_reduce_scatter", "1", MAXTEXT,
             "its reduce-scatter fusion group"),
        Flag("xla_tpu_assign_all_reduce_scatter_layout", "true", MAXTEXT,
             "its layout-for-all-reduce-scatter group"),
    ),
    # Collective matmul: tensor parallelism's all-gather / reduce-scatter split into windows
    # overlapped with the einsum that consumes / produces them. Not a default: it pays off
    # with a model axis, and MaxText's recipes set it per model.
    "collective_matmul": (
        Flag("xla_tpu_enable_windowed_einsum_for_all_gather", "true", MAXTEXT,
             "windowed einsum for all-gather + matmul"),
        Flag("xla_tpu_enable_windowed_einsum_for_reduce_scatter", "true", MAXTEXT,
             "windowed einsum for matmul + reduce-scatter"),
        Flag("xla_jf_spmd_threshold_for_windowed_einsum_mib", "0", MAXTEXT,
             "every einsum is windowed, whatever its size"),
    ),
}
DEFAULT_GROUPS = ("async_collectives", "data_parallel", "reduce_scatter")


def groups_from_env(environ=None) -> tuple[str, ...]:
  """The groups `JAXFORMER_TPU_FLAGS` names (unset: DEFAULT_GROUPS; 'none': no group)."""
  environ = os.environ if environ is None else environ
  value = environ.get(GROUPS_ENV)
  if value is None or not value.strip():
    return DEFAULT_GROUPS
  if value.strip().lower() == "none":
    return ()
  names = tuple(n.strip() for n in value.split(",") if n.strip())
  unknown = [n for n in names if n not in GROUPS]
  if unknown:
    raise ValueError(f"{GROUPS_ENV}={value!r}: {unknown} unknown; choose from "
                     f"{', '.join(GROUPS)}, or 'none'")
  return names


def flags(groups=DEFAULT_GROUPS) -> list[Flag]:
  """The flags of `groups`, each name once (the first group to set it wins)."""
  out: dict[str, Flag] = {}
  for g in groups:
    for f in GROUPS[g]:
      out.setdefault(f.name, f)
  return list(out.values())


def _name(arg: str) -> str | None:
  if not arg.startswith("-"):
    return None
  return arg.lstrip("-").split("=", 1)[0].replace("-", "_")


def merge(user: str | None, groups=DEFAULT_GROUPS) -> str:
  """`LIBTPU_INIT_ARGS` with ours added after the user's: the user's flags (and anything
  else they wrote) kept as given, ours only where the user's do not name the flag."""
  given = shlex.split(user or "")
  named = {_name(a) for a in given} - {None}
  ours = [f.arg for f in flags(groups) if f.name not in named]
  return " ".join(given + ours)


_first: dict[str, str] = {}     # LIBTPU_INIT_ARGS when this process first applied the flags


def apply(environ=None) -> str:
  """Set `LIBTPU_INIT_ARGS` to `merge(its value, the groups of JAXFORMER_TPU_FLAGS)` and
  return it. Call before libtpu initialises (it reads the variable once); the first value set
  in this process is what `in_effect` reports."""
  environ = os.environ if environ is None else environ
  value = merge(environ.get(ENV), groups_from_env(environ))
  if value:
    environ[ENV] = value
  if environ is os.environ:
    _first.setdefault(ENV, value)
  return value


def in_effect() -> str:
  """The `LIBTPU_INIT_ARGS` libtpu read in this process, as far as jaxformer set it: the
  value at the first `apply` (else the variable as it is now)."""
  return _first.get(ENV, os.environ.get(ENV, ""))


def describe(value: str) -> str:
  """One line for a plan: how many of our flags are on in `value`, and the user's others."""
  args = shlex.split(value)
  ours = {f.name: f for fs in GROUPS.values() for f in fs}
  on = [a for a in args if _name(a) in ours]
  other = [a for a in args if _name(a) not in ours]
  groups = [g for g, fs in GROUPS.items() if all(f.arg in args for f in fs)]
  text = f"{len(on)} overlap flags ({', '.join(groups) or 'no whole group'})"
  return text + (f" + {' '.join(other)}" if other else "")
