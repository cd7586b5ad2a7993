"""The jitted train and eval steps for language models (loss in float32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def cross_entropy(logits, targets, *, label_smoothing: float = 0.0, z_loss: float = 0.0):
  """Mean token cross-entropy in float32, with optional label smoothing and z-loss
  (z_loss * log(Z)^2, PaLM) that keeps the softmax normaliser near 1."""
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  loss = nll
  if label_smoothing:   # (1 - s) * nll + s * mean over the vocabulary of -log p
    loss = (1 - label_smoothing) * nll + label_smoothing * (log_z - logits.mean(-1))
  if z_loss:
    loss = loss + z_loss * jnp.square(log_z)
  return loss.mean(), nll.mean()


def make_train_step(module, tx, *, label_smoothing=0.0, z_loss=0.0):
  """state = {'step', 'params', 'opt_state', 'skipped'} -> (state, metrics). A step with a
  non-finite loss or gradient leaves params/optimizer untouched and counts as skipped."""

  def train_step(state, batch, dropout_key):
    rng = jax.random.fold_in(dropout_key, state["step"])

    def loss_fn(params):
      logits = module.apply({"params": params}, batch["inputs"], deterministic=False,
                            rngs={"dropout": rng})
      loss, nll = cross_entropy(logits, batch["targets"], label_smoothing=label_smoothing,
                                z_loss=z_loss)
      return loss, nll

    (loss, nll), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = {"step": state["step"] + 1, "params": keep(params, state["params"]),
                 "opt_state": keep(opt_state, state["opt_state"]),
                 "skipped": jnp.where(finite, 0, state["skipped"] + 1)}
    return new_state, {"loss": nll, "train_objective": loss, "grad_norm": grad_norm,
                       "finite": finite}

  return jax.jit(train_step, donate_argnums=(0,))


def make_eval_step(module):
  def eval_step(params, batch):
    logits = module.apply({"params": params}, batch["inputs"], deterministic=True)
    _, nll = cross_entropy(logits, batch["targets"])
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["targets"])
    return {"loss": nll, "accuracy": accuracy}
  return jax.jit(eval_step)
