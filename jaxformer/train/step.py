"""The train and eval step functions (pure; the loop jits them with their shardings).

The step knows no task: the task (`jaxformer.tasks`) gives its loss as sums over a
(micro-)batch (`Task.loss` -> `LossSums`) and the step divides them by the whole batch's
weight (`Task.weight`), so the loss is float32 whatever the compute dtype and, for the token
tasks, the weighted mean of per-prediction cross-entropy over the whole global batch. What
the step adds itself: auxiliary losses the model sows while the task's loss runs it (MoE's
load balancing and router z-loss, `layers.moe.collect_moe`), accumulation, the skip of
non-finite steps and the update; every metric the task returns is passed on.

With `grad_accum > 1` the batch is split into that many micro-batches scanned in sequence
and their gradients summed, so one optimizer step sees exactly the gradient of the full
batch with a fraction of the activation memory.

Where the gradient is reduced (`optim.grad_reduce`, resolved by `grad_reduce_axes`):
scanning micro-batches of a batch sharded over devices, XLA all-reduces (data parallel) or
reduce-scatters (FSDP) each micro-batch's gradient inside the loop, so gradient traffic grows
with `grad_accum`. Reducing once instead, each micro-batch's rows are split into the blocks
of some of the batch mesh axes (`map_axes`, a leading part of them) and the gradient is
`jax.vmap`ped over those blocks (`spmd_axis_name=map_axes`, parameters unmapped): the
gradients come out with a leading axis laid on those mesh axes, unreduced, accumulate there,
and are summed once after the loop: one all-reduce / reduce-scatter over `map_axes` per step
(over the other batch axes, e.g. FSDP's 'data' under hybrid sharding, XLA still reduces per
micro-batch). Sums over rows are unchanged by the split; the MoE token statistics and a
task's means over rows (BERT's next-sentence loss), which are not sums over rows, are
averaged / summed over the mapped axis before the loss uses them
(`layers.moe.batch_shard_axis`, `LossContext.over_blocks`), so the loss is that of the whole
micro-batch; a task whose loss is no sum over rows at all (`Task.row_sums=False`) is not
split.

The token loss of a model with a vocabulary head is the chunked loss (`ops.cross_entropy`,
`tasks.cross_entropy.head_sums`): the model returns its final hidden states and readout
(`return_hidden=True`) and the loss computes the logits a tile of `loss_chunk` positions at
a time, never holding the float32 [batch, length, vocab] logits (`loss_mode` says which path
a step takes).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from jaxformer.layers.moe import MOE_COLLECTION, batch_shard_axis, collect_moe
from jaxformer.ops.cross_entropy import DEFAULT_CHUNK
from jaxformer.parallel.rules import mesh_axes_tuple, without_mesh_axes
from jaxformer.tasks import LossContext, Task
from jaxformer.tasks.cross_entropy import returns_hidden

# `loss_chunk=None` (auto) takes the chunked loss from this vocabulary size up: below it the
# float32 logits are small (a character-level model's 65 classes) and the dense loss, whose
# backward reuses the stored logits instead of recomputing them, is the cheaper one.
AUTO_MIN_VOCAB = 1024
# The metrics the step itself returns (the loop logs the rest, a task's and the model's, as
# they are): `loss` (weighted nll mean of this batch), `total_loss` (what the gradient is of:
# label smoothing, z-loss and auxiliary losses included), `accuracy`, `grad_norm`, `finite`,
# `skipped`. The loop adds `interval_loss` / `interval_accuracy` (`log_interval`).
STEP_METRICS = ("loss", "total_loss", "accuracy", "grad_norm", "finite", "skipped")


def loss_mode(module, task: Task, loss_chunk: int | None = None) -> int:
  """Positions per tile of the chunked loss the train step uses, or 0 for the dense loss.
  loss_chunk: 0 = dense, N > 0 = tiles of N positions, None = auto (DEFAULT_CHUNK for a
  vocabulary of AUTO_MIN_VOCAB or more). Dense whatever it says: a task whose loss is not the
  cross-entropy of the model's head (`Task.head_loss=False`: ELECTRA's replaced-token
  detection, DPO) and a model whose __call__ has no `return_hidden` (ViT's classifier, the
  captioner, the RNN seq2seq)."""
  if loss_chunk is not None and not (isinstance(loss_chunk, int) and loss_chunk >= 0):
    raise ValueError(f"train.loss_chunk={loss_chunk!r} must be an int >= 0 (0: the dense "
                     "loss) or None (auto)")
  if loss_chunk == 0 or not task.head_loss:
    return 0
  if not returns_hidden(module):
    return 0
  if loss_chunk is None:
    return DEFAULT_CHUNK if getattr(module, "vocab_size", 0) >= AUTO_MIN_VOCAB else 0
  return loss_chunk


GRAD_REDUCE = ("auto", "once", "per_microbatch")
_SHARDS = "batch_shards"        # the vmap axis name of the reduce-once path


def grad_reduce_axes(requested: str, *, grad_accum: int, batch_size: int,
                     batch_axes: dict[str, int], param_axes: set[str], expert_parallel: bool,
                     row_sums: bool = True) -> tuple[str, ...]:
  """The batch mesh axes whose micro-batch gradients accumulate unreduced and are reduced
  once per step (see the module docstring) for `optim.grad_reduce=requested`; () = reduce
  per micro-batch. `batch_axes`: the batch's mesh axes (in order) and sizes; `param_axes`:
  the mesh axes some parameter is sharded over; `row_sums`: the task's loss is a sum over
  rows (`Task.row_sums`). ValueError where "once" cannot apply.

  "auto" maps the leading batch axes no parameter is sharded over: there the accumulator
  [blocks, ...] holds one gradient per device in the parameters' own sharding, as the per-
  micro-batch path's does, so it costs no memory. Under FSDP ('data' shards parameters) that
  leaves only hybrid sharding's 'replica', whose DCN reduction then happens once while the
  reduce-scatters inside a slice stay per micro-batch. "once" maps every batch axis: under
  FSDP the accumulator is then a whole unsharded gradient per device (mesh.data times the
  sharded one), traded for one reduce-scatter per step. Nothing changes with grad_accum=1."""
  if requested not in GRAD_REDUCE:
    raise ValueError(f"optim.grad_reduce={requested!r} must be one of "
                     + ", ".join(repr(r) for r in GRAD_REDUCE))
  shards = math.prod(batch_axes.values())
  if requested == "per_microbatch" or grad_accum == 1 or shards == 1:
    return ()
  why_not = None
  if expert_parallel:
    why_not = "expert parallelism (mesh.expert > 1) routes each device's rows itself"
  elif not row_sums:
    why_not = "this task's loss is not a sum over rows"
  elif batch_size % (grad_accum * shards):
    why_not = (f"train.batch_size={batch_size} does not split into optim.grad_accum="
               f"{grad_accum} micro-batches of whole blocks of the {shards} batch shards; "
               f"use a multiple of {grad_accum * shards}")
  if requested == "once" and why_not is not None:
    raise ValueError(f"optim.grad_reduce='once' cannot apply: {why_not}; use "
                     "optim.grad_reduce='per_microbatch' (or 'auto')")
  if why_not is not None:
    return ()
  names = list(batch_axes)
  if requested == "auto":
    free = next((i for i, a in enumerate(names) if a in param_axes), len(names))
    names = names[:free]
  if math.prod(batch_axes[a] for a in names) == 1:
    return ()
  return tuple(names)


def _split_micro(batch: dict, n: int, shards: int = 1, shard_axes: tuple = (),
                 map_axes: tuple = (), map_shards: int = 1) -> dict:
  """The batch as `n` micro-batches [n, rows / n, ...]; with `shards` batch shards over
  `shard_axes` (rows laid out as `shards` consecutive device blocks) micro-batch i takes
  block i of every device's rows, so no row changes device (on one shard: rows
  [i*B/n, (i+1)*B/n)). With `map_axes` (the leading `shard_axes`, `map_shards` blocks):
  [n, map_shards, rows / (n * map_shards), ...]."""
  def split(x):
    if x.shape[0] % n:
      raise ValueError(f"the per-step batch ({x.shape[0]} rows) is not divisible by "
                       f"optim.grad_accum={n}; use a batch size that is a multiple of it")
    if x.shape[0] % (n * shards):          # whole rows of a micro-batch leave their device
      return x.reshape((n, x.shape[0] // n) + x.shape[1:])
    m, rest = x.shape[0] // (n * shards), x.shape[1:]
    y = x.reshape((shards, n, m) + rest).swapaxes(0, 1)      # [n, shards, m, ...]
    if not map_axes:
      y = y.reshape((n, shards * m) + rest)
      return y if not shard_axes else jax.lax.with_sharding_constraint(y, P(None, shard_axes))
    y = y.reshape((n, map_shards, shards // map_shards * m) + rest)
    inner = tuple(shard_axes[len(map_axes):])
    return jax.lax.with_sharding_constraint(y, P(None, map_axes, inner or None))
  return jax.tree.map(split, batch)


def _without(entry, axes):
  """A PartitionSpec entry without the mesh `axes` (under "once" with FSDP the accumulator
  of each block is whole over them)."""
  left = tuple(a for a in mesh_axes_tuple(entry) if a not in axes)
  return None if not left else left[0] if len(left) == 1 else left


def make_train_step(module, tx, task: Task, *, label_smoothing: float = 0.0,
                    z_loss: float = 0.0, grad_accum: int = 1, batch_shards: int = 1,
                    shard_axes: tuple = (), map_axes: tuple = (), map_shards: int = 1,
                    param_specs=None, loss_chunk: int | None = None,
                    opt_state_in=None):
  """(state, batch, dropout_key) -> (state, metrics); state = {'step', 'params',
  'opt_state', 'skipped', ...}: other entries (the log interval's sums, `log_interval`) pass
  through. A step with a non-finite loss or gradient leaves params and optimizer untouched and
  counts as skipped (reset to 0 by the next good step).

  `batch_shards` / `shard_axes`: how many ways and over which mesh axes the batch is split
  (micro-batches keep each device's rows on it). `map_axes` (leading `shard_axes`, their
  sizes multiplying to `map_shards`): accumulate the gradients unreduced over them and
  reduce once per step (module docstring); they come from `grad_reduce_axes`, which decides
  and refuses what cannot reduce once (e.g. a task whose loss is not a sum over rows: it
  is not checked again here); `param_specs`: the
  parameters' PartitionSpecs, which the accumulator keeps (None: the compiler chooses).
  With dropout the masks then come from a key per block (as good, not the same numbers).

  The loss is the task's (`Task.loss`; its `LossSums.aux`, a mean over the micro-batch,
  enters scaled like the auxiliary losses). Mixture-of-experts models add the weighted
  auxiliary losses (load balancing, router z-loss; weights on the model config) they sow in
  the task's forward pass and report `moe_*` metrics. The metrics are STEP_METRICS and the
  task's and model's own.

  loss_chunk: the chunked loss's tile (positions), 0 for the dense loss, None auto
  (`loss_mode`).

  `opt_state_in` (optional) maps the optimizer state before the update: with
  `optim.offload_state`, from host to device memory (train/run_builder.py).
  """
  moe = getattr(getattr(module, "block", None), "moe", None)     # MoESettings or None
  chunk = loss_mode(module, task, loss_chunk)

  def weighted_sums(params, batch, rng, aux_scale, extra, mapped=False):
    """(sum of loss * w + aux * aux_scale, (sum nll * w, sum correct * w, metrics));
    `mapped`: one block's rows under the reduce-once vmap (aux losses of the whole
    micro-batch, each block adding its 1 / map_shards part)."""
    ctx = LossContext(module, params, rng, extra, chunk, label_smoothing, z_loss,
                      collections=(MOE_COLLECTION,) if moe is not None else (),
                      over_blocks=(lambda x: jax.lax.psum(x, _SHARDS)) if mapped else
                      (lambda x: x))
    sums = task.loss(ctx, batch)
    aux, metrics = jnp.zeros(()), {}
    if moe is not None:             # what the model sowed in the task's forward passes
      aux, metrics = collect_moe(ctx.sown[0] if len(ctx.sown) == 1 else ctx.sown,
                                 load_balance_weight=moe.load_balance_weight,
                                 z_loss_weight=moe.z_loss_weight)
    if sums.aux is not None:        # the task's mean over the micro-batch
      aux = aux + sums.aux
    total = sums.weighted + aux * aux_scale
    return total, (sums.nll, sums.correct, {**metrics, **sums.metrics})

  grad_fn = jax.value_and_grad(weighted_sums, has_aux=True)
  once = bool(map_axes) and grad_accum > 1 and map_shards > 1

  def block_grads(params, mb, rng, aux_scale, extra):
    """Gradients per block of the mapped axes: mb [map_shards, rows, ...] -> a leading
    [map_shards] on every output (laid on `map_axes`, not reduced)."""
    local_rules = without_mesh_axes(nn.get_logical_axis_rules(), map_axes)

    def one(mb, block):
      with nn.logical_axis_rules(local_rules), batch_shard_axis(_SHARDS, map_axes):
        return grad_fn(params, mb, jax.random.fold_in(rng, block), aux_scale / map_shards,
                       extra, mapped=True)
    return jax.vmap(one, axis_name=_SHARDS, spmd_axis_name=map_axes)(
        mb, jnp.arange(map_shards))

  def train_step(state, batch, dropout_key):
    rng = jax.random.fold_in(dropout_key, state["step"])
    params = state["params"]
    extra = state[task.extra_state] if task.extra_state is not None else None
    total_weight = jnp.maximum(task.weight(batch), 1e-9)
    aux_scale = total_weight / grad_accum     # aux enters the loss once, micro-batch mean
    if grad_accum == 1:
      (total, (nll, correct, metrics)), grads = grad_fn(params, batch, rng, aux_scale, extra)
    elif once:
      specs = param_specs if param_specs is not None else jax.tree.map(
          lambda p: P(*(P.UNCONSTRAINED,) * p.ndim), params)

      def lead(x, spec):            # [blocks, ...]: blocks on map_axes, the rest as the param
        rest = [e if e is P.UNCONSTRAINED else _without(e, map_axes) for e in spec]
        return jax.lax.with_sharding_constraint(x, P(map_axes, *rest))

      def micro(carry, xs):
        i, mb = xs
        (o, (n, c, mm)), g = block_grads(params, mb, jax.random.fold_in(rng, i), aux_scale,
                                         extra)
        acc_o, acc_n, acc_c, acc_g = carry
        acc_g = jax.tree.map(lambda a, b, spec: lead(a + b, spec), acc_g, g, specs)
        return (acc_o + o, acc_n + n, acc_c + c, acc_g), mm
      zeros = jax.tree.map(lambda p, spec: lead(jnp.zeros((map_shards,) + p.shape, p.dtype),
                                                spec), params, specs)
      init = (jnp.zeros((map_shards,)),) * 3 + (zeros,)
      (total, nll, correct, grads), metrics = jax.lax.scan(
          micro, init, (jnp.arange(grad_accum),
                        _split_micro(batch, grad_accum, batch_shards, shard_axes, map_axes,
                                     map_shards)))
      total, nll, correct = total.sum(), nll.sum(), correct.sum()
      grads = jax.tree.map(lambda g: g.sum(0), grads)      # the one reduction of the step
      metrics = jax.tree.map(lambda x: x.mean((0, 1)), metrics)
    else:
      def micro(carry, xs):
        i, mb = xs
        (o, (n, c, mm)), g = grad_fn(params, mb, jax.random.fold_in(rng, i), aux_scale,
                                    extra)
        acc_o, acc_n, acc_c, acc_g = carry
        return (acc_o + o, acc_n + n, acc_c + c, jax.tree.map(jnp.add, acc_g, g)), mm
      zeros = jax.tree.map(jnp.zeros_like, params)
      init = (jnp.zeros(()), jnp.zeros(()), jnp.zeros(()), zeros)
      (total, nll, correct, grads), metrics = jax.lax.scan(
          micro, init, (jnp.arange(grad_accum),
                        _split_micro(batch, grad_accum, batch_shards, shard_axes)))
      metrics = jax.tree.map(lambda x: x.mean(0), metrics)
    grads = jax.tree.map(lambda g: g / total_weight, grads)
    loss = total / total_weight
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    def update(grads, opt_state, params):
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    def skip(grads, opt_state, params):
      return params, opt_state

    # A branch, not a select of new vs old: `where(finite, new, old)` over every leaf made
    # XLA copy each parameter and moment out of its donated buffer (~12% of a CPU step for
    # the README model) and always paid for the update.
    opt_state = state["opt_state"] if opt_state_in is None else opt_state_in(state["opt_state"])
    new_params, opt_state = jax.lax.cond(finite, update, skip, grads, opt_state, params)
    new_state = {**state, "step": state["step"] + 1, "params": new_params, "opt_state": opt_state,
                 "skipped": jnp.where(finite, 0, state["skipped"] + 1)}
    return new_state, {"loss": nll / total_weight, "total_loss": loss,
                       "accuracy": correct / total_weight, "grad_norm": grad_norm,
                       "finite": finite, "skipped": new_state["skipped"], **metrics}

  return train_step


def log_interval(sums: dict, step, metrics: dict, log_every: int):
  """(the log interval's sums (`state.train_state.LOG_SUMS`) with this step's loss and
  accuracy added if it was finite, {'interval_loss', 'interval_accuracy'}: their means so far,
  NaN when no step of the interval was finite}). `step` counts the steps done before this one:
  at a multiple of `log_every` the previous interval is over and the sums start from zero, so
  at a multiple of `log_every` the means are over the last `log_every` steps.

  The sums live in the train state, so they are checkpointed and a run resumed mid-interval
  logs what the uninterrupted run logs. The loop runs this as its own small program after the
  step: computed inside the train step, it grew the TPU compiler's temporaries by 4.5 GB (a
  0.9 B-parameter step on v5e, 13.0 -> 17.5 GB: `tests/unit/layers/test_memory_levers.py`)."""
  finite = metrics["finite"]
  fresh = step % log_every == 0
  count = jnp.where(fresh, 0, sums["steps"]) + finite.astype(jnp.int32)
  new = {"steps": count}
  for key in ("loss", "accuracy"):
    new[key] = jnp.where(fresh, 0.0, sums[key]) + jnp.where(finite, metrics[key], 0.0).astype(
        sums[key].dtype)
  means = {f"interval_{k}": jnp.where(count > 0, new[k] / jnp.maximum(count, 1), jnp.nan)
           for k in ("loss", "accuracy")}
  return new, means


def make_eval_step(module, task: Task):
  """(params, batch) -> the task's eval sums (`Task.eval_sums`); with an extra state entry
  (`Task.extra_state`) (params, batch, extra)."""
  if task.extra_state is not None:
    return lambda params, batch, extra: task.eval_sums(module, params, batch, extra)
  return lambda params, batch: task.eval_sums(module, params, batch)
