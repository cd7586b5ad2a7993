"""`config.mesh` -> a `jax.sharding.Mesh` over ('data', 'model', 'expert'), validated before
anything compiles; with `mesh.replica` > 1 a leading 'replica' axis too (hybrid sharding).

Axes are `AxisType.Auto` (linen's logical constraints rely on the compiler's propagation).
Device order: on TPU `mesh_utils.create_device_mesh` lays the axes onto the ICI torus (the last
axis, 'expert', then 'model' get the closest neighbours); across TPU slices the 'data' axis is
split over DCN with `create_hybrid_device_mesh`, so only data-parallel gradients cross slices.
On CPU/GPU devices are ordered by (process, id), so each process owns a contiguous block of
the 'data' axis (which is what per-process batch loading needs).

Hybrid sharding (`mesh.replica=R`, default 1 = no such axis): the devices form R replicas of
the ('data', 'model', 'expert') mesh. The batch is split over ('replica', 'data'), parameters
never over 'replica' (parallel/rules.py), so FSDP shards and gathers within a replica and
only gradients cross replicas. Across TPU slices the replicas are laid over DCN (R a
multiple of the slice count: R / slices replicas per slice; or a divisor of it: 'data' then
spans the remaining slices, as without replicas), so with R = slices every parameter
all-gather stays on ICI and the gradients cross DCN once per step.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from jaxformer.parallel.rules import MESH_AXES, REPLICA_AXIS


def mesh_field(mesh_config: Any, name: str, default: Any = None) -> Any:
  """`mesh_config.<name>` for a ConfigDict, a dict or any object with attributes."""
  if isinstance(mesh_config, Mapping):
    return mesh_config.get(name, default)
  return getattr(mesh_config, name, default)


def describe_devices(devices: Sequence[Any]) -> str:
  """'cpu x8' or 'NVIDIA H100 80GB HBM3 x8': device kinds and counts."""
  kinds = collections.Counter(d.device_kind for d in devices)
  return ", ".join(f"{kind} x{n}" for kind, n in kinds.items())


def _requested(sizes: Sequence[int], replica: int = 1) -> str:
  named = " x ".join(f"{name}={size}" for name, size in zip(MESH_AXES, sizes))
  return named if replica == 1 else f"{REPLICA_AXIS}={replica} x {named}"


def replica_count(mesh_config: Any) -> int:
  """`mesh.replica` (default 1), checked: the number of data-parallel replicas."""
  replica = mesh_field(mesh_config, REPLICA_AXIS, 1)
  if isinstance(replica, bool) or not isinstance(replica, int) or replica < 1:
    raise ValueError(f"mesh.{REPLICA_AXIS}={replica!r} must be a positive int (1: no replica "
                     "axis)")
  return replica


def resolve_mesh_shape(mesh_config: Any, devices: Sequence[Any]) -> tuple[int, int, int]:
  """(data, model, expert) sizes with a -1 filled in (per replica: `mesh.replica` copies of
  this mesh use the devices); ValueError if they do not fit `devices`."""
  replica = replica_count(mesh_config)
  if len(devices) % replica:
    raise ValueError(f"mesh.{REPLICA_AXIS}={replica} does not divide the {len(devices)} "
                     f"devices ({describe_devices(devices)})")
  devices = devices[:len(devices) // replica]        # one replica's share (only its count)
  sizes = [mesh_field(mesh_config, name, 1) for name in MESH_AXES]
  for name, size in zip(MESH_AXES, sizes):
    if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
      raise ValueError(f"mesh.{name}={size!r} must be a positive int or -1 (all remaining "
                       "devices)")
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh {_requested(sizes)}: at most one axis may be -1; set the others "
                     "explicitly")
  n, available = len(devices), describe_devices(devices)
  if replica > 1:
    available = f"{available} per replica"
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if n % fixed:
      raise ValueError(f"mesh {_requested(sizes, replica)}: the fixed axes need a multiple of "
                       f"{fixed} devices; {n} available ({available}). Choose sizes whose "
                       f"product divides {n}")
    sizes[sizes.index(-1)] = n // fixed
  elif fixed != n:
    raise ValueError(f"mesh {_requested(sizes, replica)} needs {fixed} devices; {n} available "
                     f"({available}). Set --config.mesh.data=-1 to fill the remaining devices, "
                     f"or sizes whose product is {n}")
  return tuple(sizes)


def _slice_count(devices: Sequence[Any]) -> int:
  return len({getattr(d, "slice_index", 0) for d in devices})


def _device_array(shape: tuple[int, ...], devices: Sequence[Any]) -> np.ndarray:
  """Devices arranged in `shape` ((replica,) data, model, expert), topology-aware on TPU,
  (process, id) order elsewhere (replica-major: each process's devices hold consecutive
  batch blocks)."""
  if devices[0].platform != "tpu":
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    return np.asarray(ordered, dtype=object).reshape(shape)
  slices = _slice_count(devices)
  if slices == 1:
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  if len(shape) == len(MESH_AXES):                 # no replica axis: 'data' spans the slices
    shape, replica = (1,) + tuple(shape), None
  else:
    replica = shape[0]
  if replica is not None and replica % slices == 0:
    ici, dcn = (replica // slices,) + tuple(shape[1:]), (slices,) + (1,) * (len(shape) - 1)
  elif replica is None or slices % replica == 0:
    over_data = slices // shape[0]                 # slices the 'data' axis spans
    if shape[1] % over_data:
      raise ValueError(f"mesh.data={shape[1]} must be a multiple of the {over_data} TPU slices "
                       "it spans (data parallelism is the axis that crosses slices over DCN; "
                       f"or set mesh.{REPLICA_AXIS}={slices}: one replica per slice)")
    ici = (1, shape[1] // over_data) + tuple(shape[2:])
    dcn = (shape[0], over_data) + (1,) * (len(shape) - 2)
  else:
    raise ValueError(f"mesh.{REPLICA_AXIS}={replica} must divide or be a multiple of the "
                     f"{slices} TPU slices (replicas are laid over the slices)")
  array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                               allow_split_physical_axes=True)
  return array if replica is not None else array.reshape(array.shape[1:])


def make_mesh(mesh_config: Any, devices: Sequence[Any] | None = None) -> Mesh:
  """A Mesh with axes ('data', 'model', 'expert') sized by `mesh_config` (-1 fills the rest),
  preceded by 'replica' when `mesh.replica` > 1."""
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("make_mesh got an empty device list")
  shape = resolve_mesh_shape(mesh_config, devices)
  replica = replica_count(mesh_config)
  names = MESH_AXES if replica == 1 else (REPLICA_AXIS,) + MESH_AXES
  shape = shape if replica == 1 else (replica,) + tuple(shape)
  return Mesh(_device_array(shape, devices), names, axis_types=(AxisType.Auto,) * len(names))
