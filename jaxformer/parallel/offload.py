"""Host-memory offload: the train state's optimizer moments and rematerialised activations kept
in the host's pinned memory (JAX memory kinds) instead of the accelerator's.

`optim.offload_state=True` puts `opt_state` in `pinned_host` memory between steps: the train
step's argument and result shardings carry that memory kind, and the step moves the moments
to the device for the update only (`to_device`), after the backward pass has freed the
activations, so the step's peak holds them no longer alongside the activations. The
`offload_*` remat policies (layers/block_settings.py) keep named activations on the host between the
forward and the backward pass. Both compute what the run without them computes, bit for bit:
only where the bytes wait changes.

A platform whose devices have no `pinned_host` memory cannot do either: `check` refuses the
lever by its config field before anything compiles.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

HOST = "pinned_host"
DEVICE = "device"


def has_host_memory(devices: Sequence[Any]) -> bool:
  """Whether the devices can address pinned host memory (TPU, GPU and CPU with JAX's memory
  kinds; libtpu's compile-only devices too). Only this process's devices list their
  memories (another host's list none), so those are the ones asked."""
  try:
    kinds = [{m.kind for m in d.addressable_memories()} for d in devices]
  except (AttributeError, NotImplementedError, jax.errors.JaxRuntimeError):
    return False
  kinds = [k for k in kinds if k]
  return bool(kinds) and all(HOST in k for k in kinds)


def check(fields: Sequence[str], devices: Sequence[Any]) -> None:
  """ValueError naming each config field (`fields`, as `field=value`) that asks for host
  memory, when the devices do not have it."""
  if fields and not has_host_memory(devices):
    platform = getattr(devices[0], "platform", "?")
    raise ValueError(f"{', '.join(fields)} keeps data in host memory ({HOST!r}), which the "
                     f"{platform} devices here do not offer: turn it off (optim.offload_state="
                     "False; a model.remat_policy without 'offload_', e.g. 'full')")


def state_shardings(shardings: dict, offload_state: bool) -> dict:
  """The train state's shardings with `opt_state` in host memory when `offload_state`."""
  if not offload_state:
    return shardings
  return {**shardings, "opt_state": jax.tree.map(lambda s: s.with_memory_kind(HOST),
                                                 shardings["opt_state"])}


def on_device(shardings):
  """The same shardings in device memory (what the step computes in)."""
  return jax.tree.map(lambda s: s.with_memory_kind(DEVICE), shardings)


def host_bytes(tree) -> int:
  """Bytes per device of the leaves of `tree` (ShapeDtypeStructs or arrays with shardings)
  that live in host memory."""
  from jaxformer.parallel.sharding import per_device_bytes
  return per_device_bytes([x for x in jax.tree.leaves(tree)
                           if getattr(getattr(x, "sharding", None), "memory_kind", None) == HOST])
