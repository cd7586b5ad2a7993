"""Compile-only TPU devices for a named topology, on a machine without a TPU.

libtpu describes any slice shape (`v5e:4x4`, `v5p:2x2x2`, two slices of `v6e:8x8`) as devices
that can be compiled for but not run on, so the real training step can be compiled for a pod
from a laptop. `devices` returns one device per chip for every generation: libtpu's default
for v4 is one device per TensorCore (2 per chip), but a v4 runs in megacore mode (one JAX
device per chip, both cores working on it), so `chip_config_name="megacore"` is asked for
(v5p already defaults to one device per chip; v5e and v6e have one core per chip).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re

import jaxformer
from jaxformer import tpu_flags

GENERATIONS = ("v4", "v5e", "v5p", "v6e")
_DIMS = {"v4": 3, "v5p": 3, "v5e": 2, "v6e": 2}      # 3D torus / 2D torus
_HOST = {"v4": (2, 2, 1), "v5p": (2, 2, 1), "v5e": (2, 2), "v6e": (2, 2)}   # libtpu's default
_EXAMPLES = "v4:2x2x1, v5e:4x4, v5p:2x2x2, v6e:8x8"
# Cloud accelerator-type names (`gcloud ... --accelerator-type`): v5e/v6e count chips, v4/v5p
# count TensorCores (2 per chip)
_ACCELERATOR_TYPE = re.compile(r"^(v5litepod|v5e|v6e|v4|v5p)-(\d+)$")
_NAME = re.compile(r"^(v\d+[a-z]*):(\d+(?:x\d+)*)$")
# what libtpu reads at start-up on a TPU VM; on a machine without TPUs it warns without them
_LIBTPU_ENV = {"v4": "v4-8", "v5e": "v5litepod-4", "v5p": "v5p-8", "v6e": "v6e-4"}


def parse(topology: str) -> tuple[str, tuple[int, ...]]:
  """("v5e", (4, 4)) for "v5e:4x4" (or "v5litepod-16"); a one-line ValueError otherwise."""
  name = topology.strip().lower()
  alias = _ACCELERATOR_TYPE.match(name)
  if alias:
    return _from_accelerator_type(topology, alias.group(1), int(alias.group(2)))
  match = _NAME.match(name)
  if not match:
    raise ValueError(f"--topology={topology!r} is not GENERATION:DIMS; use one of "
                     f"{', '.join(GENERATIONS)} with chip counts per axis, e.g. {_EXAMPLES}")
  gen, dims = match.group(1), tuple(int(d) for d in match.group(2).split("x"))
  if gen not in GENERATIONS:
    raise ValueError(f"--topology={topology!r}: unknown TPU generation {gen!r}; known: "
                     f"{', '.join(GENERATIONS)} (e.g. {_EXAMPLES})")
  if len(dims) != _DIMS[gen] or min(dims) < 1:
    shape = "x".join(["N"] * _DIMS[gen])
    raise ValueError(f"--topology={topology!r}: a {gen} slice is {_DIMS[gen]}-D ({gen}:{shape}, "
                     f"each N >= 1), e.g. {_EXAMPLES}")
  return gen, dims


def generation(topology: str) -> str:
  """"v4" | "v5e" | "v5p" | "v6e"."""
  return parse(topology)[0]


def devices(topology: str, slices: int = 1) -> list:
  """Compile-only devices, one per chip, of `slices` copies of `topology` (a multi-slice job
  when slices > 1: `device.slice_index` says which slice a device is in)."""
  if not isinstance(slices, int) or slices < 1:
    raise ValueError(f"--slices={slices!r}: the number of slices is an integer >= 1")
  gen, dims = parse(topology)
  return list(_devices(gen, dims, slices, topology))


@functools.lru_cache(maxsize=None)
def _devices(gen: str, dims: tuple[int, ...], slices: int, topology: str) -> tuple:
  if importlib.util.find_spec("libtpu") is None:
    raise ValueError(f"--topology={topology}: compiling for a TPU needs libtpu: "
                     'pip install "jaxformer[tpu]"')
  quiet_libtpu(gen)
  tpu_flags.apply()        # compiled with the run's overlap flags (libtpu reads them once)
  from jax.experimental import topologies      # after the environment is set
  kwargs = {}
  if gen == "v4":
    kwargs["chip_config_name"] = "megacore"
  host = _HOST[gen]
  if any(d % h for d, h in zip(dims, host)):
    # smaller than one host (v5e:1x1, v4:2x1x1): a host of exactly this slice; libtpu accepts
    # a host bound per axis that divides the axis
    bounds = [d if d < h else h for d, h in zip(dims, host)]
    if all(d % b == 0 for d, b in zip(dims, bounds)):
      kwargs["chips_per_host_bounds"] = (bounds + [1] * 3)[:3]
  if slices > 1:
    kwargs["num_slices"] = slices
  name = f"{gen}:{'x'.join(map(str, dims))}"
  try:
    desc = topologies.get_topology_desc(platform="tpu", topology_name=name, **kwargs)
  except Exception as e:          # libtpu's JaxRuntimeError: INVALID_ARGUMENT: ...
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "INVALID_ARGUMENT" in message or "not divisible" in message:
      raise ValueError(f"--topology={topology}: libtpu rejects it ({_short(message)}); each "
                       f"axis must be a multiple of the {gen} host's "
                       f"{'x'.join(map(str, host))} chips (or smaller than it), e.g. "
                       f"{_EXAMPLES}") from None
    raise
  return tuple(desc.devices)


def _short(message: str) -> str:
  return message.replace("INVALID_ARGUMENT: ", "").strip()[:160]


def _from_accelerator_type(topology: str, kind: str, count: int) -> tuple[str, tuple[int, ...]]:
  """v5litepod-16 -> v5e 4x4; v5p-8 (8 TensorCores = 4 chips) -> v5p 2x2x1; the shapes
  Cloud TPU gives these types by default."""
  gen = {"v5litepod": "v5e"}.get(kind, kind)
  chips = count // 2 if gen in ("v4", "v5p") else count
  power = chips.bit_length() - 1
  if chips < 1 or chips != 1 << power or (gen in ("v4", "v5p") and (count % 2 or chips < 4)):
    raise ValueError(f"--topology={topology!r}: {kind}-N takes a power-of-two N "
                     f"({'TensorCores, 2 per chip, >= 8' if gen in ('v4', 'v5p') else 'chips'});"
                     f" or name the shape, e.g. {_EXAMPLES}")
  if _DIMS[gen] == 2:                                  # 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, ...
    return gen, (1 << (power // 2), 1 << (power - power // 2))
  dims = [2, 2, 1]                                     # 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...
  while dims[0] * dims[1] * dims[2] < chips:
    smallest = min(dims)
    i = max(j for j, d in enumerate(dims) if d == smallest)
    dims[i] *= 2
  return gen, tuple(dims)


def libtpu_version() -> str | None:
  """The installed libtpu's version (compiled programs and their estimates depend on it)."""
  try:
    return importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    return None


def quiet_libtpu(gen: str = "v5e") -> None:
  """Give libtpu the environment it looks up on a TPU VM before it initialises, so that on a
  machine without TPUs it neither warns that it could not determine the accelerator type and
  worker hostnames nor refuses a second process (its lock file is for owning real chips; the
  devices here only compile). Variables already set win, and nothing is set where TPU chips
  are attached: there libtpu finds the real values itself."""
  if jaxformer.real_tpu_attached():
    return
  if os.environ.get(jaxformer.LIBTPU_QUIETED):     # jaxformer's placeholder, not the user's
    os.environ["TPU_ACCELERATOR_TYPE"] = _LIBTPU_ENV.get(gen, "v5litepod-4")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", _LIBTPU_ENV.get(gen, "v5litepod-4"))
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
