"""`config.mesh` -> a `jax.sharding.Mesh` over ('data', 'model', 'expert'), validated before
anything compiles.

Axes are `AxisType.Auto` (linen's logical constraints rely on the compiler's propagation).
Device order: on TPU `mesh_utils.create_device_mesh` lays the axes onto the ICI torus (the last
axis, 'expert', then 'model' get the closest neighbours); across TPU slices the 'data' axis is
split over DCN with `create_hybrid_device_mesh`, so only data-parallel gradients cross slices.
On CPU/GPU devices are ordered by (process, id), so each process owns a contiguous block of
the 'data' axis (which is what per-process batch loading needs).
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

from jaxformer.parallel.rules import MESH_AXES


def mesh_field(mesh_config: Any, name: str, default: Any = None) -> Any:
  """`mesh_config.<name>` for a ConfigDict, a dict or any object with attributes."""
  if isinstance(mesh_config, Mapping):
    return mesh_config.get(name, default)
  return getattr(mesh_config, name, default)


def describe_devices(devices: Sequence[Any]) -> str:
  """'cpu x8' or 'NVIDIA H100 80GB HBM3 x8': device kinds and counts."""
  kinds = collections.Counter(d.device_kind for d in devices)
  return ", ".join(f"{kind} x{n}" for kind, n in kinds.items())


def _requested(sizes: Sequence[int]) -> str:
  return " x ".join(f"{name}={size}" for name, size in zip(MESH_AXES, sizes))


def resolve_mesh_shape(mesh_config: Any, devices: Sequence[Any]) -> tuple[int, int, int]:
  """(data, model, expert) sizes with a -1 filled in; ValueError if they do not fit `devices`."""
  sizes = [mesh_field(mesh_config, name, 1) for name in MESH_AXES]
  for name, size in zip(MESH_AXES, sizes):
    if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
      raise ValueError(f"mesh.{name}={size!r} must be a positive int or -1 (all remaining "
                       "devices)")
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh {_requested(sizes)}: at most one axis may be -1; set the others "
                     "explicitly")
  n, available = len(devices), describe_devices(devices)
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if n % fixed:
      raise ValueError(f"mesh {_requested(sizes)}: the fixed axes need a multiple of {fixed} "
                       f"devices; {n} available ({available}). Choose sizes whose product "
                       f"divides {n}")
    sizes[sizes.index(-1)] = n // fixed
  elif fixed != n:
    raise ValueError(f"mesh {_requested(sizes)} needs {fixed} devices; {n} available "
                     f"({available}). Set --config.mesh.data=-1 to fill the remaining devices, "
                     f"or sizes whose product is {n}")
  return tuple(sizes)


def _slice_count(devices: Sequence[Any]) -> int:
  return len({getattr(d, "slice_index", 0) for d in devices})


def _device_array(shape: tuple[int, int, int], devices: Sequence[Any]) -> np.ndarray:
  """Devices arranged in `shape`, topology-aware on TPU, (process, id) order elsewhere."""
  if devices[0].platform != "tpu":
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    return np.asarray(ordered, dtype=object).reshape(shape)
  slices = _slice_count(devices)
  if slices == 1:
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  if shape[0] % slices:
    raise ValueError(f"mesh.data={shape[0]} must be a multiple of the {slices} TPU slices "
                     "(data parallelism is the axis that crosses slices over DCN)")
  ici = (shape[0] // slices,) + tuple(shape[1:])
  return mesh_utils.create_hybrid_device_mesh(ici, (slices, 1, 1), devices,
                                              allow_split_physical_axes=True)


def make_mesh(mesh_config: Any, devices: Sequence[Any] | None = None) -> Mesh:
  """A Mesh with axes ('data', 'model', 'expert') sized by `mesh_config` (-1 fills the rest)."""
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("make_mesh got an empty device list")
  shape = resolve_mesh_shape(mesh_config, devices)
  return Mesh(_device_array(shape, devices), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))
