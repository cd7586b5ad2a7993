"""The train and eval step functions (pure; the loop jits them with their shardings).

Loss is float32 whatever the compute dtype: the weighted mean of per-prediction cross-entropy
over the whole global batch. With `grad_accum > 1` the batch is split into that many
micro-batches scanned in sequence and their gradients summed, so one optimizer step sees
exactly the gradient of the full batch with a fraction of the activation memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxformer.layers.moe import MOE_COLLECTION, collect_moe
from jaxformer.train.tasks import Task, cross_entropy, eval_sums, nsp_sums


def _split_micro(batch: dict, n: int) -> dict:
  def split(x):
    if x.shape[0] % n:
      raise ValueError(f"the per-step batch ({x.shape[0]} rows) is not divisible by "
                       f"optim.grad_accum={n}; use a batch size that is a multiple of it")
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])
  return jax.tree.map(split, batch)


def make_train_step(module, tx, task: Task, *, label_smoothing: float = 0.0,
                    z_loss: float = 0.0, grad_accum: int = 1, opt_state_in=None):
  """(state, batch, dropout_key) -> (state, metrics); state = {'step', 'params',
  'opt_state', 'skipped'}. A step with a non-finite loss or gradient leaves params and
  optimizer untouched and counts as skipped (reset to 0 by the next good step).

  Mixture-of-experts models add their weighted auxiliary losses (load balancing, router
  z-loss; weights on the model config) to the objective and report `moe_*` metrics; BERT
  with next-sentence prediction (task 'mlm_nsp') adds the NSP cross-entropy's mean over rows
  (so the objective is HF BertForPreTraining's MLM mean + NSP mean) and reports `nsp_loss`,
  `nsp_accuracy`.

  `opt_state_in` (optional) maps the optimizer state before the update: with
  `optim.offload_state`, from host to device memory (train/setup.py).
  """
  moe = getattr(getattr(module, "block", None), "moe", None)     # MoESettings or None

  def weighted_sums(params, batch, rng, aux_scale, frozen):
    """(sum of objective * w [+ aux * aux_scale], (sum nll * w, sum correct * w, moe))."""
    if task.frozen_key is not None:         # e.g. DPO: the reference params, not trained
      return task.objective.train_sums(module, params, batch, rng, frozen=frozen)
    if task.objective is not None:          # its own loss (tasks.Task.objective)
      return task.objective.train_sums(module, params, batch, rng)
    args, kwargs = task.model_args(batch)
    apply = lambda **extra: module.apply({"params": params}, *args, **kwargs,
                                         deterministic=False, rngs={"dropout": rng}, **extra)
    aux, moe_metrics = jnp.zeros(()), {}
    if moe is not None:
      logits, mutated = apply(mutable=[MOE_COLLECTION])
      aux, moe_metrics = collect_moe(mutated, load_balance_weight=moe.load_balance_weight,
                                     z_loss_weight=moe.z_loss_weight)
    else:
      logits = apply()
    if task.nsp_labels is not None:    # + next-sentence loss (mean over rows, as HF's)
      sums = nsp_sums(task, logits["nsp"], batch)
      count = jnp.maximum(sums["nsp_count"], 1.0)
      aux = aux + sums["nsp_nll"] / count
      moe_metrics = {**moe_metrics, "nsp_loss": sums["nsp_nll"] / count,
                     "nsp_accuracy": sums["nsp_correct"] / count}
      logits = logits["mlm"]
    labels, w = batch[task.labels], task.weights(batch)
    objective, nll = cross_entropy(logits, labels, label_smoothing=label_smoothing,
                                   z_loss=z_loss)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    total = jnp.sum(objective * w) + aux * aux_scale
    return total, (jnp.sum(nll * w), jnp.sum(correct * w), moe_metrics)

  grad_fn = jax.value_and_grad(weighted_sums, has_aux=True)

  def train_step(state, batch, dropout_key):
    rng = jax.random.fold_in(dropout_key, state["step"])
    params = state["params"]
    frozen = state[task.frozen_key] if task.frozen_key is not None else None
    total_weight = jnp.maximum(jnp.sum(task.weights(batch)), 1e-9)
    aux_scale = total_weight / grad_accum     # aux enters the loss once, micro-batch mean
    if grad_accum == 1:
      (objective, (nll, correct, moe_metrics)), grads = grad_fn(params, batch, rng, aux_scale, frozen)
    else:
      def micro(carry, xs):
        i, mb = xs
        (o, (n, c, mm)), g = grad_fn(params, mb, jax.random.fold_in(rng, i), aux_scale,
                                    frozen)
        acc_o, acc_n, acc_c, acc_g = carry
        return (acc_o + o, acc_n + n, acc_c + c, jax.tree.map(jnp.add, acc_g, g)), mm
      zeros = jax.tree.map(jnp.zeros_like, params)
      init = (jnp.zeros(()), jnp.zeros(()), jnp.zeros(()), zeros)
      (objective, nll, correct, grads), moe_metrics = jax.lax.scan(
          micro, init, (jnp.arange(grad_accum), _split_micro(batch, grad_accum)))
      moe_metrics = jax.tree.map(lambda x: x.mean(0), moe_metrics)
    grads = jax.tree.map(lambda g: g / total_weight, grads)
    loss = objective / total_weight
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
    return new_state, {"loss": nll / total_weight, "train_objective": loss,
                       "accuracy": correct / total_weight, "grad_norm": grad_norm,
                       "finite": finite, "skipped": new_state["skipped"], **moe_metrics}

  return train_step


def make_eval_step(module, task: Task):
  """(params, batch) -> sums of nll / correct / count (see tasks.eval_sums); with a frozen
  state entry (`Task.frozen_key`) (params, batch, frozen)."""
  if task.frozen_key is not None:
    return lambda params, batch, frozen: task.objective.eval_sums(module, params, batch,
                                                                  frozen=frozen)

  def eval_step(params, batch):
    if task.objective is not None:
      return task.objective.eval_sums(module, params, batch)
    args, kwargs = task.model_args(batch)
    logits = module.apply({"params": params}, *args, **kwargs, deterministic=True)
    return eval_sums(task, logits, batch)
  return eval_step
