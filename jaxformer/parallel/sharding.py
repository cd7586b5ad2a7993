"""`ShardingPlan`: everything the training loop needs to run one program on a device mesh.

Built from `config.mesh`, it owns the mesh and the logical-axis rules, turns the abstract
(boxed) train state into NamedShardings, checks divisibility before anything compiles,
assembles global batches from per-process rows without gathering them on one host, and
jits steps with explicit in/out shardings (compile time is logged).

Restoring onto another mesh: Orbax writes each array with its global shape, so a checkpoint
saved on 8 devices restores onto 1 (or 64) when the restore target carries the new
shardings: `ckpt.restore(args=StandardRestore(plan.restore_target(abstract_boxed_state)))`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer import compilation
from jaxformer.parallel.mesh import describe_devices, make_mesh, mesh_field
from jaxformer.parallel.rules import (REPLICA_AXIS, Rules, batch_axes, logical_axis_rules,
                                      mesh_axes_tuple)

_FIX_HINTS = {
    "heads": "choose a mesh.model that divides it, or change model.num_heads",
    "kv_heads": "choose a mesh.model that divides it, or change model.num_kv_heads",
    "mlp": "choose a mesh.model that divides it, or change model.mlp_dim",
    "vocab": "pad model.vocab_size to a multiple of {n} ({padded}), or use mesh.model=1",
    "embed": "choose a mesh.data that divides model.d_model, or set mesh.fsdp=False",
    "expert": "choose a mesh.expert that divides model.num_experts",
}


def _is_box(x) -> bool:
  return isinstance(x, nn.Partitioned)


def _strip_boxes(tree):
  """The tree with every `nn.Partitioned` box replaced by its value (no constraints)."""
  return jax.tree.map(lambda x: x.value if _is_box(x) else x, tree, is_leaf=_is_box)


def _path_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
                  for k in path)


def per_device_bytes(tree) -> int:
  """Bytes one device holds for `tree` (arrays or ShapeDtypeStructs with a sharding; leaves
  without one count in full)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, "sharding", None)
    shape = sharding.shard_shape(leaf.shape) if sharding is not None else np.shape(leaf)
    total += math.prod(shape) * leaf.dtype.itemsize
  return total


@functools.cache
def check_process_layout(mesh: Mesh, axes) -> None:
  """ValueError unless process p's devices hold batch block p of the batch split over `axes`
  (each process loads only rows [p*L, (p+1)*L) of the global batch)."""
  processes = jax.process_count()
  shards = math.prod(mesh.shape[a] for a in mesh_axes_tuple(axes))
  if processes == 1:
    return
  if shards % processes:
    raise ValueError(f"the batch is split {shards} ways over the mesh, which is not a "
                     f"multiple of the {processes} processes (each process loads only its "
                     "own rows); raise mesh.data")
  sharding = NamedSharding(mesh, PartitionSpec(axes))
  for device, (rows,) in sharding.devices_indices_map((shards,)).items():
    owner = (rows.start or 0) * processes // shards
    if owner != device.process_index:
      raise ValueError(f"device {device} of process {device.process_index} holds batch block "
                       f"{rows.start or 0}, which process {owner} loads; build the mesh with "
                       "make_mesh (process-major device order)")


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
  """A mesh plus the logical-axis rules for it (see `parallel/rules.py`)."""
  mesh: Mesh
  rules: Rules

  @classmethod
  def from_config(cls, mesh_config: Any, devices: Sequence[Any] | None = None
                  ) -> "ShardingPlan":
    """From `config.mesh` (`data`, `model`, `expert`, `fsdp`); -1 fills remaining devices."""
    fsdp = mesh_field(mesh_config, "fsdp", False)
    if not isinstance(fsdp, bool):
      raise ValueError(f"mesh.fsdp={fsdp!r} must be True or False")
    mesh = make_mesh(mesh_config, devices)
    return cls(mesh, logical_axis_rules(fsdp=fsdp, expert_parallel=mesh.shape["expert"] > 1,
                                        replica=REPLICA_AXIS in mesh.axis_names))

  def describe(self) -> str:
    sizes = " x ".join(f"{k}={v}" for k, v in self.mesh.shape.items())
    fsdp = dict(self.rules)["embed"] is not None
    return f"mesh {sizes}, fsdp={fsdp} ({describe_devices(self.mesh.devices.flat)})"

  @contextlib.contextmanager
  def scope(self) -> Iterator["ShardingPlan"]:
    """Set the mesh and the logical rules, for tracing model code that names logical axes."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield self

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  def sharding(self, logical_names: Sequence[str | None]) -> NamedSharding:
    """The NamedSharding of an array whose dims have these logical names."""
    return NamedSharding(self.mesh, nn.logical_to_mesh_axes(tuple(logical_names), self.rules))

  # --- train state -------------------------------------------------------------------------

  def state_shardings(self, abstract_boxed_state):
    """NamedSharding pytree matching the *unboxed* state: boxed (`nn.Partitioned`) leaves by
    their logical names, everything else (step counters, scalars) replicated."""
    self.check_divisible(abstract_boxed_state)

    def leaf_sharding(x):
      if _is_box(x):
        sharding = self.sharding(x.names)
        return jax.tree.map(lambda _: sharding, x.value)
      return self.replicated

    return jax.tree.map(leaf_sharding, abstract_boxed_state, is_leaf=_is_box)

  def check_divisible(self, abstract_boxed_state) -> None:
    """ValueError naming the first parameter whose sharded dim the mesh does not divide
    (parameters before optimizer state, which repeats their shapes)."""
    errors = []
    leaves = jax.tree_util.tree_flatten_with_path(abstract_boxed_state, is_leaf=_is_box)[0]
    for path, box in leaves:
      if not _is_box(box):
        continue
      mesh_axes = nn.logical_to_mesh_axes(tuple(box.names), self.rules)
      for leaf in jax.tree.leaves(box.value):
        errors += self._divisibility_errors(_path_str(path), leaf.shape, box.names, mesh_axes)
    if errors:
      errors.sort(key=lambda e: e.startswith("opt_state"))
      more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
      raise ValueError(errors[0] + more)

  def _divisibility_errors(self, path, shape, names, mesh_axes) -> list[str]:
    errors = []
    for dim, (size, name, axes) in enumerate(zip(shape, names, mesh_axes)):
      axes = mesh_axes_tuple(axes)
      n = math.prod(self.mesh.shape[a] for a in axes)
      if size % n:
        where = "*".join(f"mesh.{a}" for a in axes)
        hint = _FIX_HINTS.get(name, "choose mesh sizes that divide it").format(
            n=n, padded=-(-size // n) * n)
        errors.append(f"{path} dim {dim} ({name}={size}) is not divisible by {where}={n}; "
                      f"{hint}")
    return errors

  def restore_target(self, abstract_boxed_state):
    """Unboxed ShapeDtypeStructs carrying this plan's shardings: the Orbax restore target
    (restores a checkpoint written on any mesh onto this one)."""
    shardings = self.state_shardings(abstract_boxed_state)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        _strip_boxes(abstract_boxed_state), shardings)

  def init_state(self, init_boxed: Callable[[], Any]):
    """(state, shardings): runs `init_boxed` (returns a state with `nn.Partitioned` params,
    e.g. optimizer state from boxed params) directly into its shardings, unboxed.

    Traced outside the plan's scope, as `jax.eval_shape` traces it for the shardings (and
    `jaxformer.plan` for the state): parameters do not depend on the mesh, and `out_shardings`
    alone places them (each device generates only its shards: per-device memory of the
    compiled init is the same with or without the scope). Under the mesh, `module.init`'s
    forward pass on the family's 1-row example would have to be runnable by every layer's
    sharded path, and expert parallelism's all-to-all needs the batch split over
    mesh.data * mesh.expert (layers/moe.py)."""
    shardings = self.state_shardings(jax.eval_shape(init_boxed))
    state = jax.jit(lambda: _strip_boxes(init_boxed()), out_shardings=shardings,
                    compiler_options=compilation.run_once_options())()
    return state, shardings

  # --- batches -----------------------------------------------------------------------------

  @property
  def batch_shards(self) -> int:
    """How many ways the batch dim is split."""
    return math.prod(self.mesh.shape[a] for a in mesh_axes_tuple(self._batch_axes))

  @property
  def _batch_axes(self):
    return batch_axes(expert_parallel=self.mesh.shape["expert"] > 1,
                      replica=REPLICA_AXIS in self.mesh.axis_names)

  @property
  def batch_mesh_axes(self) -> tuple[str, ...]:
    """The mesh axes the batch dim is split over."""
    return mesh_axes_tuple(self._batch_axes)

  @staticmethod
  def sharded_over(shardings) -> set[str]:
    """The mesh axes any NamedSharding in `shardings` splits an array over."""
    return {a for s in jax.tree.leaves(shardings) for entry in s.spec
            for a in mesh_axes_tuple(entry)}

  def batch_sharding(self, ndim: int) -> NamedSharding:
    """Leading (batch) dim split over the batch axes, the rest replicated."""
    if ndim < 1:
      raise ValueError(f"batch arrays need a leading batch dim; got ndim={ndim}")
    return NamedSharding(self.mesh, PartitionSpec(self._batch_axes, *([None] * (ndim - 1))))

  def check_batch_size(self, global_batch_size: int, field: str = "train.batch_size",
                       grad_accum: int = 1) -> None:
    """Before any step: the batch (`field` names it) must split evenly over the batch shards,
    and with expert parallelism so must each of its `grad_accum` micro-batches: the experts'
    all-to-all (layers/moe.py) takes each device's own rows, where other layers let XLA
    reshard a micro-batch that does not split evenly."""
    axes = "*".join(f"mesh.{a}" for a in mesh_axes_tuple(self._batch_axes))
    if global_batch_size % self.batch_shards:
      raise ValueError(f"{field}={global_batch_size} is not divisible by "
                       f"{axes}={self.batch_shards}; use a multiple of {self.batch_shards}")
    micro = global_batch_size // grad_accum
    if self.mesh.shape["expert"] > 1 and micro % self.batch_shards:
      raise ValueError(f"optim.grad_accum={grad_accum} splits {field}={global_batch_size} into "
                       f"micro-batches of {micro} rows, not divisible by "
                       f"{axes}={self.batch_shards} (expert parallelism routes each device's "
                       f"own rows); use a {field} that is a multiple of "
                       f"{grad_accum * self.batch_shards} or a smaller optim.grad_accum")

  def global_batch(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Global arrays from this process's rows [p*L, (p+1)*L) of every batch field; rows go
    straight to the local devices that hold them (no host gathers the global batch)."""
    check_process_layout(self.mesh, self._batch_axes)
    out = {}
    for key, rows in local_batch.items():
      rows = np.asarray(rows)
      global_shape = (rows.shape[0] * jax.process_count(),) + rows.shape[1:]
      if global_shape[0] % self.batch_shards:
        raise ValueError(f"batch[{key!r}] has {global_shape[0]} rows in all, not divisible "
                         f"by the {self.batch_shards} batch shards of the mesh")
      out[key] = jax.make_array_from_process_local_data(self.batch_sharding(rows.ndim), rows,
                                                        global_shape)
    return out

  def replicate(self, tree):
    """Host values (numpy, scalars, PRNG keys) as arrays replicated over the whole mesh,
    identical on every process (they must already be equal across processes)."""
    def put(x):
      if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        return jax.random.wrap_key_data(put(jax.random.key_data(x)),
                                        impl=jax.random.key_impl(x))
      host = np.asarray(x)
      return jax.make_array_from_callback(host.shape, self.replicated, lambda i: host[i])
    return jax.tree.map(put, tree)

  # --- compiled steps ----------------------------------------------------------------------

  def jit(self, fn: Callable, *, in_shardings, out_shardings, donate_argnums=(),
          name: str | None = None) -> "CompiledStep":
    """`fn` jitted with explicit shardings, traced under this plan's scope, compiled once per
    input shape with the compile time logged (see CompiledStep)."""
    return CompiledStep(self, fn, in_shardings=in_shardings, out_shardings=out_shardings,
                        donate_argnums=donate_argnums, name=name)


_COMPILE_EVENT = "/jax/core/compile/"
_calls = threading.local()          # the compile events of the CompiledStep call in progress


def _record_compile_event(event: str, duration: float, **kwargs) -> None:
  sink = getattr(_calls, "events", None)
  if sink is not None and event.startswith(_COMPILE_EVENT):
    sink.append((event, duration))


@functools.lru_cache(maxsize=None)
def _listen_for_compiles() -> None:
  """Register the (process-wide) jax.monitoring listener once."""
  jax.monitoring.register_event_duration_secs_listener(_record_compile_event)


class CompiledStep:
  """A function jitted with explicit shardings whose compiles are timed and logged.

  Calls go through `jax.jit`'s own dispatch (its C++ fast path, one cached executable per
  input signature), traced under the plan's scope. A call during which JAX reported compile
  events (`jax.monitoring`, `/jax/core/compile/*`: tracing, lowering, backend compile) was a
  compile; its wall time (compile + that first run) is appended to `compile_seconds`.
  """

  def __init__(self, plan: ShardingPlan, fn: Callable, *, in_shardings, out_shardings,
               donate_argnums=(), name: str | None = None):
    self.plan = plan
    self.name = name or getattr(fn, "__name__", "step")
    self._jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings,
                           donate_argnums=donate_argnums)
    self.compile_seconds: list[float] = []

  def lower(self, *args):
    with self.plan.scope():
      return self._jitted.lower(*args)

  def __call__(self, *args):
    _listen_for_compiles()
    _calls.events = events = []
    start = time.perf_counter()
    try:
      with self.plan.scope():
        out = self._jitted(*args)
    finally:
      _calls.events = None
    if events:
      jax.block_until_ready(out)
      seconds = time.perf_counter() - start
      self.compile_seconds.append(seconds)
      logging.info("compiled %s in %.2fs (incl. its first run; %s)", self.name, seconds,
                   self.plan.describe())
    return out
