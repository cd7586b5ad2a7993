"""Mixture-of-experts FFN: softmax router, top-k experts, two dispatch modes, aux losses,
expert parallelism.

Why two dispatch modes:
- "dropless" (Mixtral, MegaBlocks): every assignment is computed. Assignments are grouped by
  expert and run as one grouped matmul: on TPU the megablox Pallas kernels (`gmm` forward
  and input gradient, `tgmm` weight gradient; XLA's `ragged_dot` transpose computes the
  weight gradient as one masked dense matmul per expert there, E x its FLOPs), on GPU
  `jax.lax.ragged_dot`; on CPU, where XLA lowers ragged_dot to one masked dense matmul per
  expert, each expert's rows are padded to a multiple of a block and the blocks run as one
  batched matmul (at most E * (block - 1) padding rows). `grouped_matmul` picks one by name.
- "capacity" (GShard, Switch): each expert takes at most C tokens per sequence, static shapes,
  one-hot dispatch/combine einsums; tokens over capacity get zero expert output and pass through
  the block's residual. C = min(T, ceil(capacity_factor * T * k / E)) for a sequence of T tokens
  (rounded up; never more than T since a token picks an expert at most once). Priority: the
  top-1 choices of all tokens of the sequence first (in token order), then the top-2 choices, ...
  Routing groups are sequences, so sharding the batch never changes which tokens are dropped.

Router: float32 linear -> softmax -> top-k; `router_jitter` multiplies the router input by
U(1 - eps, 1 + eps) during training (Switch), drawn from the 'dropout' rng stream (which the
train step already passes and `nn.scan` already splits per layer); `renormalize` rescales the
top-k probabilities to sum to 1 (Mixtral True, Switch False).

Aux losses / metrics are sown per layer into the "intermediates" collection (the one that
`BlockStack`'s `nn.scan` stacks over layers) under names starting with "moe_"; `collect_moe`
turns them into the training loss term and logged metrics:
- load balance (Switch): E * sum_i f_i * P_i, f_i = fraction of all N*k assignments that chose
  expert i (before capacity dropping), P_i = mean router probability of expert i; 1 if uniform.
- router z-loss (ST-MoE): mean over tokens of logsumexp(router logits)^2.
- expert load f_i [E] and the fraction of assignments dropped (0 for dropless).

Per device: under a mesh (`jax.set_mesh`) that splits the tokens (data/expert) or has a
`model` axis, dropless dispatch runs in `jax.shard_map`: each device sorts and computes its
own tokens (XLA cannot partition the sort over all rows, so outside shard_map every device
ran the whole batch's experts), with the experts' hidden units split over 'model' (partial
outputs summed, Megatron-style) when it divides them. A batch that does not split over the
token axes falls back to the unsplit program.

Expert parallelism: when the mesh has an 'expert' axis of size S > 1, the expert weights are
split over it and tokens over ('data', 'expert') on the batch dim: each device routes its own
tokens and exchanges them. Capacity mode sends [E, G_local * C, d] buffers by all_to_all.
Dropless mode on TPU/GPU sorts its rows by expert and sends each shard its run with
`jax.lax.ragged_all_to_all` (offsets from one all-gather of the [S, E] counts), so only the
assigned rows move; the receive buffer is static, S x the local rows (the dropless worst
case), and the grouped matmul visits only its filled tiles. XLA:CPU has no ragged
all-to-all: there dropless sends a fixed [S, n*k] buffer to every shard (S x the bytes).
Routing and aux losses are computed outside the shard_map, so they equal the unsharded values.
The batch must split over ('data', 'expert'): the trainer checks its batch and micro-batches
before compiling (`ShardingPlan.check_batch_size`) and initialises parameters outside the mesh
(`ShardingPlan.init_state`), so the error in `MoE._run` is only a backstop.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxformer.layers.dense import default_kernel_init, dense
from jaxformer.layers.mlp import activation_fn
from jaxformer.layers.block_settings import MoESettings
from jaxformer.ops.pallas import target_platform

MOE_COLLECTION = "intermediates"
# The expert kernels' parameter names (gated input, gated up, ungated input, output), each
# with a leading [num_experts] axis under the 'ffn' module: parameter counting finds the
# inactive experts by these names.
EXPERT_PARAMS = ("wi_gate", "wi_up", "wi", "wo")
# Sown metric name -> number of trailing (per-layer) dims.
MOE_METRICS = {"moe_load_balance_loss": 0, "moe_z_loss": 0, "moe_dropped_fraction": 0,
               "moe_expert_load": 1}
TOKEN_MESH_AXES = ("replica", "data", "expert")   # those of them the mesh has
CPU_BLOCK_ROWS = 128               # max rows per block of the CPU grouped matmul
# megablox tiles (at most; MaxText's defaults): rows are padded to whole row tiles (of 128
# when there are fewer rows than one); a row tile re-reads its expert's weight tiles and an
# output-column tile the rows, so small tiles multiply HBM traffic
MEGABLOX_TILE_ROWS = 512
MEGABLOX_TILE = 1024               # contraction and output-column tiles


def expert_capacity(tokens_per_group: int, num_experts: int, experts_per_token: int,
                    capacity_factor: float) -> int:
  """Slots per expert and sequence: min(T, ceil(capacity_factor * T * k / E))."""
  slots = math.ceil(capacity_factor * tokens_per_group * experts_per_token / num_experts)
  return min(tokens_per_group, slots)


def route(logits, experts_per_token: int, renormalize: bool):
  """float32 logits [..., E] -> (probs [..., E], gates [..., k], experts [..., k] int32)."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  gates, experts = jax.lax.top_k(probs, experts_per_token)
  if renormalize:
    gates = gates / gates.sum(-1, keepdims=True)
  return probs, gates, experts.astype(jnp.int32)


def capacity_positions(experts, num_experts: int):
  """experts [G, T, k] -> each assignment's slot in its expert [G, T, k]: top-1 choices of
  the whole sequence first (token order), then top-2, ..."""
  g, t, k = experts.shape
  onehot = jax.nn.one_hot(experts.transpose(0, 2, 1).reshape(g, k * t), num_experts,
                          dtype=jnp.int32)                              # [G, k*T, E]
  slots = jnp.sum((jnp.cumsum(onehot, axis=1) - 1) * onehot, axis=-1)   # [G, k*T]
  return slots.reshape(g, k, t).transpose(0, 2, 1)


# The named (vmap) axis the batch is split over when a train step maps its gradient over the
# batch shards (train/step.py, optim.grad_reduce="once"); None otherwise. Token statistics
# are then averaged over it, so each shard's aux losses are those of the whole micro-batch.
# Entries: (vmap axis name, the mesh axes it is laid on: `spmd_axis_name`).
_SHARD_AXIS: list = [(None, ())]


@contextlib.contextmanager
def batch_shard_axis(name: str, mesh_axes: tuple = ()):
  """Inside: MoE token statistics are averaged over the named vmap axis `name`, laid on the
  mesh axes `mesh_axes`; dropless routing then runs per block of the vmap (not in its own
  shard_map, which could not name those axes)."""
  _SHARD_AXIS.append((name, tuple(mesh_axes)))
  try:
    yield
  finally:
    _SHARD_AXIS.pop()


def _over_shards(x):
  """`x` (a mean over this shard's tokens) averaged over the batch shards, if mapped."""
  name = _SHARD_AXIS[-1][0]
  return x if name is None else jax.lax.pmean(x, name)


def load_balance_loss(probs, experts):
  """Switch load-balancing loss E * sum_i f_i P_i from probs [N, E], experts [N, k]."""
  num_experts = probs.shape[-1]
  return num_experts * jnp.sum(_over_shards(expert_load(experts, num_experts))
                               * _over_shards(probs.mean(0)))


def expert_load(experts, num_experts: int):
  """Fraction of all assignments [N, k] that chose each expert -> [E] (sums to 1)."""
  counts = jnp.bincount(experts.reshape(-1), length=num_experts)
  return counts.astype(jnp.float32) / experts.size


def router_z_loss(logits):
  """Mean over tokens of logsumexp(logits)^2 (ST-MoE)."""
  return _over_shards(
      jnp.mean(jnp.square(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1))))


def collect_moe(mutated: Any, *, load_balance_weight: float, z_loss_weight: float):
  """(aux_loss, metrics) from the collections `apply(..., mutable=[MOE_COLLECTION])` returned.

  Each metric is averaged over every MoE layer (unscanned layers and `nn.scan`-stacked ones);
  aux_loss = load_balance_weight * mean load-balance loss + z_loss_weight * mean z-loss.
  A model without MoE layers gives (0.0, {}).
  """
  found: dict[str, list] = {name: [] for name in MOE_METRICS}
  for path, leaf in jax.tree_util.tree_flatten_with_path(mutated)[0]:
    name = next((k.key for k in path if getattr(k, "key", None) in MOE_METRICS), None)
    if name is not None:
      ndim = MOE_METRICS[name]
      found[name].append(jnp.reshape(leaf, (-1,) + leaf.shape[leaf.ndim - ndim:]))
  metrics = {name: jnp.concatenate(v).mean(0) for name, v in found.items() if v}
  if not metrics:
    return jnp.zeros((), jnp.float32), {}
  aux = (load_balance_weight * metrics["moe_load_balance_loss"]
         + z_loss_weight * metrics["moe_z_loss"])
  return aux, metrics


def expert_ffn(xs, weights: dict, act: Callable, matmul: Callable):
  """The expert MLP on grouped rows: gated (wi_gate, wi_up) or not (wi), then wo."""
  if "wi_gate" in weights:
    h = act(matmul(xs, weights["wi_gate"])) * matmul(xs, weights["wi_up"])
  else:
    h = act(matmul(xs, weights["wi"]))
  return matmul(h, weights["wo"])


def _block_rows(rows: int, num_groups: int) -> int:
  """Block size of the CPU grouped matmul: ~rows per group, a multiple of 8, at most 128."""
  return int(min(CPU_BLOCK_ROWS, max(8, -(-rows // num_groups // 8) * 8)))


def grouped_experts(rows, group_ids, weights: dict, act: Callable, impl: str):
  """Run each row [R, d] through expert `group_ids[r]` of the stacked weights [G, ...];
  rows with id == G (padding) give zeros. impl: "ragged" (ragged_dot), "megablox" (the
  Pallas grouped matmul, interpreted off TPU) or "blocked"."""
  num_groups = next(iter(weights.values())).shape[0]
  order = jnp.argsort(group_ids, stable=True)
  sorted_ids = group_ids[order]
  sizes = jnp.bincount(group_ids, length=num_groups).astype(jnp.int32)
  if impl == "ragged":
    ys = expert_ffn(rows[order], weights, act,
                    lambda a, w: jax.lax.ragged_dot(a, w, sizes))
  elif impl == "megablox":
    ys = _megablox_experts(rows[order], sizes, weights, act)
  else:
    ys = _blocked_experts(rows[order], sorted_ids, sizes, weights, act)
  ys = jnp.where((sorted_ids < num_groups)[:, None], ys, 0)
  return jnp.zeros_like(ys).at[order].set(ys)


def _megablox_experts(rows, sizes, weights: dict, act: Callable):
  """Rows sorted by group through megablox `gmm` (forward and input gradient) and `tgmm`
  (weight gradient): on TPU both are Pallas kernels that visit only the tiles holding rows,
  where XLA's ragged_dot transpose computes the weight gradient as one masked dense matmul
  per expert (E x its FLOPs). Rows are padded to whole row tiles; off TPU it is interpreted
  (tests)."""
  from jax.experimental.pallas.ops.tpu.megablox import gmm
  interpret = target_platform(rows) != "tpu"
  m = rows.shape[0]
  tile_rows = min(MEGABLOX_TILE_ROWS, -(-m // 128) * 128)
  padded = -(-m // tile_rows) * tile_rows
  xs = jnp.pad(rows, ((0, padded - m), (0, 0)))

  def matmul(a, w):
    tiling = (tile_rows, min(a.shape[1], MEGABLOX_TILE), min(w.shape[2], MEGABLOX_TILE))
    return gmm(a, w, sizes, preferred_element_type=a.dtype, tiling=tiling, interpret=interpret)

  return expert_ffn(xs, weights, act, matmul)[:m]


def _blocked_experts(rows, sorted_ids, sizes, weights: dict, act: Callable):
  """Rows sorted by group -> each group padded to whole blocks -> one batched matmul."""
  num_rows, num_groups = rows.shape[0], sizes.shape[0]
  block = _block_rows(num_rows, num_groups)
  num_blocks = -(-(num_rows + num_groups * (block - 1)) // block)
  padded = -(-sizes // block) * block
  padded_start = jnp.cumsum(padded) - padded
  ids = jnp.minimum(sorted_ids, num_groups - 1)
  rank = jnp.arange(num_rows) - (jnp.cumsum(sizes) - sizes)[ids]
  dest = jnp.where(sorted_ids < num_groups, padded_start[ids] + rank, num_blocks * block)
  xs = jnp.zeros((num_blocks * block, rows.shape[1]), rows.dtype).at[dest].set(
      rows, mode="drop").reshape(num_blocks, block, -1)
  block_group = jnp.minimum(jnp.searchsorted(jnp.cumsum(padded), jnp.arange(num_blocks) * block,
                                             side="right"), num_groups - 1)
  matmul = lambda a, w: jnp.einsum("nbd,ndh->nbh", a, w[block_group])
  ys = expert_ffn(xs, weights, act, matmul).reshape(num_blocks * block, -1)
  return ys.at[dest].get(mode="fill", fill_value=0)


def _exchange(x, axis: str | None):
  """all_to_all over `axis` of x [S, ...]: x[s] goes to shard s; the result's [s] came from
  shard s. Identity without an expert axis."""
  if axis is None:
    return x
  return jax.lax.all_to_all(x, axis, 0, 0, tiled=True)


def capacity_dispatch(x, experts, gates, slots, weights: dict, *, num_experts: int,
                      capacity: int, act: Callable, axis: str | None):
  """GShard dispatch on one device's sequences: x [G, T, d], experts/gates/slots [G, T, k];
  weights hold this device's E / S experts. Returns float32 [G, T, d]."""
  g, _, d = x.shape
  shards = num_experts // next(iter(weights.values())).shape[0]
  onehot_expert = jax.nn.one_hot(experts, num_experts, dtype=x.dtype)      # [G, T, k, E]
  onehot_slot = jax.nn.one_hot(slots, capacity, dtype=x.dtype)             # 0 when dropped
  dispatch = jnp.einsum("gtke,gtkc->gtec", onehot_expert, onehot_slot)
  combine = jnp.einsum("gtke,gtkc,gtk->gtec", onehot_expert.astype(jnp.float32),
                       onehot_slot.astype(jnp.float32), gates)
  xe = jnp.einsum("gtec,gtd->egcd", dispatch, x).reshape(shards, -1, g * capacity, d)
  xe = _exchange(xe, axis)                                  # [S (source), E / S, G * C, d]
  local = xe.transpose(1, 0, 2, 3).reshape(xe.shape[1], -1, d)
  ye = expert_ffn(local, weights, act, lambda a, w: jnp.einsum("erd,edh->erh", a, w))
  ye = _exchange(ye.reshape(xe.shape[1], shards, -1, d).transpose(1, 0, 2, 3), axis)
  ye = ye.reshape(num_experts, g, capacity, d).astype(jnp.float32)
  return jnp.einsum("gtec,egcd->gtd", combine, ye)


def dropless_dispatch(x, experts, gates, weights: dict, *, num_experts: int, act: Callable,
                      axis: str | None, impl: str, exchange: str = "padded"):
  """Dropless dispatch on one device's tokens: x [n, d], experts/gates [n, k]; weights hold
  this device's E / S experts. exchange (with an expert axis): "ragged" moves only the
  assigned rows (`jax.lax.ragged_all_to_all`, TPU/GPU), "padded" a fixed worst-case buffer
  (CPU, where XLA has no ragged all-to-all). Returns float32 [n, d]."""
  n, k = experts.shape
  local_experts = next(iter(weights.values())).shape[0]
  rows, ids = jnp.repeat(x, k, axis=0), experts.reshape(-1)
  if axis is None:
    ys = grouped_experts(rows, ids, weights, act, impl)
  elif exchange == "padded":
    ys = _exchange_dropless(rows, ids, weights, act, impl, axis, num_experts // local_experts)
  else:
    transport = (jax.lax.ragged_all_to_all if exchange == "ragged"
                 else emulated_ragged_all_to_all)
    ys = _ragged_exchange(rows, ids, weights, act, impl, axis, num_experts // local_experts,
                          transport)
  return jnp.einsum("nkd,nk->nd", ys.reshape(n, k, -1).astype(jnp.float32), gates)


def _exchange_dropless(rows, ids, weights, act, impl, axis, shards):
  """Send every assignment to the shard owning its expert in a fixed [S, n*k] buffer (the
  worst case), run the local experts, send the results back, undo the sort."""
  m, local_experts = rows.shape[0], next(iter(weights.values())).shape[0]
  order = jnp.argsort(ids, stable=True)
  sorted_ids, sorted_rows = ids[order], rows[order]
  dst = sorted_ids // local_experts
  counts = jnp.bincount(dst, length=shards)
  starts = jnp.cumsum(counts) - counts
  src = starts[:, None] + jnp.arange(m)[None]                        # [S, m]
  valid = jnp.arange(m)[None] < counts[:, None]
  src = jnp.minimum(src, m - 1)
  send_rows = jnp.where(valid[..., None], sorted_rows[src], 0)
  send_ids = jnp.where(valid, sorted_ids[src] % local_experts, local_experts)
  recv_rows, recv_ids = _exchange(send_rows, axis), _exchange(send_ids, axis)
  out = grouped_experts(recv_rows.reshape(shards * m, -1), recv_ids.reshape(-1), weights, act,
                        impl)
  back = _exchange(out.reshape(shards, m, -1), axis)
  ys_sorted = back[dst, jnp.arange(m) - starts[dst]]
  return jnp.zeros_like(ys_sorted).at[order].set(ys_sorted)


def _ragged_exchange(rows, ids, weights, act, impl, axis, shards, transport):
  """Expert parallelism that moves only the assigned rows: sort by expert, send each shard
  its contiguous run with `transport` (ragged_all_to_all), run the local experts on the
  received rows, send the results back the same way, undo the sort.

  The per-expert counts of every shard ([S, E] int32, one all-gather) give every offset and
  the local expert of every received row, so no ids travel. The receive buffer is static:
  S * m rows (every assignment of every shard may pick this shard's experts; dropless), but
  only the received rows cross the links and the grouped matmul visits only their tiles."""
  m, local = rows.shape[0], next(iter(weights.values())).shape[0]
  me = jax.lax.axis_index(axis)
  order = jnp.argsort(ids, stable=True)
  sorted_rows = rows[order]
  counts = jax.lax.all_gather(jnp.bincount(ids, length=shards * local).astype(jnp.int32),
                              axis)                                   # [S src, E]
  per_shard = counts.reshape(shards, shards, local).sum(-1)           # [src, dst] rows
  send_sizes = per_shard[me]
  send_offsets = jnp.cumsum(send_sizes) - send_sizes
  recv_sizes = per_shard[:, me]
  recv_offsets = jnp.cumsum(recv_sizes) - recv_sizes                  # my buffer, by source
  # where my run for shard s starts in s's buffer: what the sources before me send s
  out_offsets = jnp.sum(jnp.where(jnp.arange(shards)[:, None] < me, per_shard, 0), axis=0)
  buffer = jnp.zeros((shards * m,) + rows.shape[1:], rows.dtype)
  recv = transport(sorted_rows, buffer, send_offsets, send_sizes, out_offsets, recv_sizes,
                   axis_name=axis)
  # received rows: source by source, each run sorted by local expert; the rest padding
  mine = jax.lax.dynamic_slice_in_dim(counts, me * local, local, axis=1).reshape(-1)
  recv_ids = jnp.repeat(jnp.arange(shards * local, dtype=jnp.int32) % local, mine,
                        total_repeat_length=shards * m)
  recv_ids = jnp.where(jnp.arange(shards * m) < mine.sum(), recv_ids, local)
  out = grouped_experts(recv, recv_ids, weights, act, impl)
  back = transport(out, jnp.zeros_like(sorted_rows), recv_offsets, recv_sizes,
                   _sent_offsets(per_shard, me, axis), send_sizes, axis_name=axis)
  return jnp.zeros_like(back).at[order].set(back)


def _sent_offsets(per_shard, me, axis):
  """For the return trip: where shard s's results land in its own sorted rows, i.e. the
  offset s used for its run to me (what s sends the shards before me)."""
  del axis
  shards = per_shard.shape[0]
  return jnp.sum(jnp.where(jnp.arange(shards)[None, :] < me, per_shard, 0), axis=1)


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                               recv_sizes, *, axis_name):
  """`jax.lax.ragged_all_to_all` (one run per shard) from a padded all_to_all, for CPU,
  where XLA has no ragged all-to-all: it checks `_ragged_exchange`'s offsets there."""
  shards, m = input_offsets.shape[0], operand.shape[0]
  r = jnp.arange(m)
  src = jnp.minimum(input_offsets[:, None] + r, m - 1)
  send = jnp.where((r < send_sizes[:, None])[..., None], operand[src], 0)   # [S, m, ...]
  got = jax.lax.all_to_all(send, axis_name, 0, 0, tiled=True)
  at = jax.lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True)
  dest = jnp.where(r < recv_sizes[:, None], at[:, None] + r, output.shape[0])
  return output.at[dest.reshape(-1)].set(got.reshape((shards * m,) + got.shape[2:]),
                                         mode="drop")


def exchange_kind() -> str:
  """The dropless expert-parallel exchange for the devices compiled for: "ragged" on TPU/GPU,
  "padded" on CPU (XLA:CPU has no ragged-all-to-all). Tests set "emulated" to run the
  ragged path's offsets on CPU."""
  return "padded" if target_platform() == "cpu" else "ragged"


def _expert_axis_size() -> int:
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or "expert" not in mesh.axis_names:
    return 1
  return mesh.shape["expert"]


class MoE(nn.Module):
  """Top-k mixture of experts (`settings`, see layers/block_settings.py) of width `hidden_dim` on
  [..., T, d] (see the module docstring)."""
  settings: MoESettings
  hidden_dim: int
  activation: str = "silu"
  use_bias: bool = False              # accepted for FFN-interface parity; experts have none
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init   # (in_axis, out_axis, batch_axis) -> init
  router_multiplier: float | None = None   # μP's output multiplier (layers/parametrization.py)

  def _expert_weights(self, name, shape, axes):
    """Stacked expert kernels [experts, in, out], initialised per expert."""
    init = self.kernel_init(1, 2, batch_axis=0)
    return self.param(name, nn.with_logical_partitioning(init, axes), shape,
                      self.param_dtype).astype(self.dtype)

  def _weights(self, d: int) -> dict:
    e, h = self.settings.num_experts, self.hidden_dim
    gate, up, plain, out = EXPERT_PARAMS
    names = (gate, up) if self.settings.gated else (plain,)
    weights = {n: self._expert_weights(n, (e, d, h), ("expert", "embed", "mlp")) for n in names}
    weights[out] = self._expert_weights(out, (e, h, d), ("expert", "mlp", "embed"))
    return weights

  def _router_logits(self, x, deterministic: bool):
    r, jitter = x.astype(jnp.float32), self.settings.router_jitter
    if jitter and not deterministic:
      r = r * jax.random.uniform(self.make_rng("dropout"), r.shape, jnp.float32, 1 - jitter,
                                 1 + jitter)
    logits = dense(self.settings.num_experts, ("embed", None), name="router",
                   dtype=jnp.float32, param_dtype=self.param_dtype)(r)
    return logits if self.router_multiplier is None else logits * self.router_multiplier

  def _grouped_matmul_impl(self) -> str:
    if self.settings.grouped_matmul != "auto":
      return self.settings.grouped_matmul
    # the devices compiled for (a TPU plan traces on a CPU host), not the default backend
    return {"cpu": "blocked", "tpu": "megablox"}.get(target_platform(), "ragged")

  @nn.compact
  def __call__(self, x, *, deterministic: bool = True):
    s = self.settings
    impl = self._grouped_matmul_impl()
    act = activation_fn(self.activation)
    shape, d = x.shape, x.shape[-1]
    seqs = x.reshape((-1,) + x.shape[-2:]) if x.ndim >= 3 else x[None]   # [G, T, d]
    logits = self._router_logits(seqs, deterministic)                    # [G, T, E]
    probs, gates, experts = route(logits, s.experts_per_token, s.renormalize)
    flat_probs = probs.reshape(-1, s.num_experts)
    flat_experts = experts.reshape(-1, s.experts_per_token)
    self.sow(MOE_COLLECTION, "moe_load_balance_loss", load_balance_loss(flat_probs,
                                                                        flat_experts))
    self.sow(MOE_COLLECTION, "moe_z_loss", router_z_loss(logits))
    self.sow(MOE_COLLECTION, "moe_expert_load",
             _over_shards(expert_load(flat_experts, s.num_experts)))
    weights = self._weights(d)
    inputs = (seqs.astype(self.dtype), experts, gates)
    if s.dispatch == "capacity":
      capacity = expert_capacity(seqs.shape[1], s.num_experts, s.experts_per_token,
                                 s.capacity_factor)
      slots = capacity_positions(experts, s.num_experts)
      self.sow(MOE_COLLECTION, "moe_dropped_fraction",
               _over_shards(jnp.mean(slots >= capacity, dtype=jnp.float32)))
      fn = lambda xs, ex, gs, sl, w, axis: capacity_dispatch(
          xs, ex, gs, sl, w, num_experts=s.num_experts, capacity=capacity, act=act, axis=axis)
      inputs = inputs + (slots,)
    else:
      self.sow(MOE_COLLECTION, "moe_dropped_fraction", jnp.zeros((), jnp.float32))
      exchange = exchange_kind()
      fn = lambda xs, ex, gs, w, axis: dropless_dispatch(
          xs.reshape(-1, d), ex.reshape(-1, ex.shape[-1]), gs.reshape(-1, gs.shape[-1]), w,
          num_experts=s.num_experts, act=act, axis=axis, impl=impl,
          exchange=exchange).reshape(xs.shape)
    out = self._run(fn, inputs, weights, per_device=s.dispatch == "dropless",
                    check_vma=not (s.dispatch == "dropless" and impl == "megablox"))
    return out.reshape(shape).astype(self.dtype)

  def _run(self, fn: Callable, inputs: tuple, weights: dict, per_device: bool = False,
           check_vma: bool = True):
    """fn on one device, or per device under shard_map when the mesh has an expert axis or
    (`per_device`: dropless, whose sort is over all rows and which XLA cannot partition, so it
    would run whole on every device) splits the tokens or the experts' hidden units.
    check_vma=False for Pallas kernels (their outputs carry no varying-axes type)."""
    shards = _expert_axis_size()
    mesh = jax.sharding.get_abstract_mesh()
    mapped = _SHARD_AXIS[-1][1]              # under the reduce-once vmap: its mesh axes
    if mapped:
      # the vmap already runs each block of rows on its own devices (spmd_axis_name), so the
      # dropless sort is per block; a shard_map inside it cannot name the mapped axes
      per_device = False
    if shards == 1 and not per_device:
      return fn(*inputs, weights, None)
    if self.settings.num_experts % shards:
      raise ValueError(f"model.num_experts={self.settings.num_experts} is not divisible by "
                       f"mesh.expert={shards}: use a multiple of mesh.expert experts or a "
                       "mesh.expert that divides model.num_experts")
    token_axes = tuple(a for a in TOKEN_MESH_AXES
                       if not mesh.empty and a in mesh.axis_names and a not in mapped)
    devices = math.prod(mesh.shape[a] for a in token_axes)
    model = mesh.shape["model"] if not mesh.empty and "model" in mesh.axis_names else 1
    hidden_axis = "model" if per_device and model > 1 and self.hidden_dim % model == 0 else None
    if shards == 1 and (inputs[0].shape[0] % devices or (devices == 1 and hidden_axis is None)):
      return fn(*inputs, weights, None)      # nothing to split (or a batch that does not)
    if inputs[0].shape[0] % devices:
      raise ValueError(f"expert parallelism splits the batch over mesh axes {token_axes} "
                       f"({devices} devices): batch size {inputs[0].shape[0]} must be a "
                       "multiple of it")
    expert_axis = "expert" if shards > 1 else None
    token_spec = P(token_axes)
    in_w = {n: (P(expert_axis, None, hidden_axis) if n != EXPERT_PARAMS[3]
                else P(expert_axis, hidden_axis, None)) for n in weights}

    def local(*a):
      out = fn(*a[:-1], a[-1], expert_axis)
      if hidden_axis is not None:          # each model shard holds a slice of the hidden
        out = jax.lax.psum(out.astype(self.dtype), hidden_axis)   # units: sum the partials
      return out

    sharded = jax.shard_map(local, in_specs=(token_spec,) * len(inputs) + (in_w,),
                            out_specs=token_spec, check_vma=check_vma)
    return sharded(*inputs, weights)
