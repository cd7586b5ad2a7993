"""Optax optimizer from the `optim` settings (`run_settings.OptimSettings`): AdamW with a decay mask, warmup + decay schedules,
global-norm clipping and, under μP, per-parameter learning-rate multipliers. (Gradient
accumulation lives in the train step: `optim.grad_accum` micro-batches per optimizer step,
so `train.steps` always counts optimizer updates.)"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from jaxformer import run_settings
from jaxformer.run_settings import OptimSettings


def wsd_decay_start(optim: OptimSettings, total_steps: int) -> int:
  """`run_settings.wsd_decay_start` of these settings: where the stable phase ends."""
  return run_settings.wsd_decay_start(total_steps, optim.decay_fraction, optim.decay_steps)


def learning_rate_schedule(optim: OptimSettings, total_steps: int) -> optax.Schedule:
  """Linear warmup to `lr`, then cosine / linear decay to `min_lr_ratio * lr` at
  `decay_steps` (default: total_steps), constant, Vaswani's inverse square root, or
  warmup-stable-decay (constant, then a decay over the last `decay_fraction` of the steps to
  `decay_steps`: "1-sqrt" is Hägele et al.'s 1 - sqrt(x), x the fraction of the decay done)."""
  lr, warmup = optim.lr, optim.warmup_steps
  decay_steps = optim.decay_steps or total_steps
  final = lr * optim.min_lr_ratio
  if optim.schedule == "wsd":
    start = wsd_decay_start(optim, total_steps)
    length = decay_steps - start

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = lr * (step + 1) / max(warmup, 1)
    frac = jnp.clip((step - warmup) / max(decay_steps - warmup, 1), 0.0, 1.0)
    if optim.schedule == "wsd":
      x = jnp.clip((step - start) / length, 0.0, 1.0)
      shape = {"1-sqrt": 1 - jnp.sqrt(x), "linear": 1 - x,
               "cosine": 0.5 * (1 + jnp.cos(math.pi * x))}[optim.decay_shape]
      after = final + (lr - final) * shape
    elif optim.schedule == "cosine":
      after = final + 0.5 * (lr - final) * (1 + jnp.cos(math.pi * frac))
    elif optim.schedule == "linear":
      after = lr + (final - lr) * frac
    elif optim.schedule == "constant":
      after = jnp.full_like(step, lr)
    else:
      after = lr * jnp.sqrt(max(warmup, 1) / jnp.maximum(step + 1, 1))
    return jnp.where(step < warmup, warm, after)

  return schedule


def decay_mask(params):
  """True where weight decay applies: matrices, but not embeddings, norms or biases."""
  def decays(path, leaf):
    names = {str(getattr(p, "key", p)) for p in path}
    return leaf.ndim >= 2 and "embedding" not in names
  return jax.tree_util.tree_map_with_path(decays, params)


def scale_by_multipliers(multipliers) -> optax.GradientTransformation:
  """Each update times its parameter's float in `multipliers` (a tree shaped like the
  params). After AdamW this is a per-parameter learning rate, weight decay included (which
  AdamW multiplies by the LR), as the `mup` package's MuAdamW groups give it."""
  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, m: u if m == 1.0 else u * m, updates, multipliers), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def with_state_dtype(tx: optax.GradientTransformation, dtype) -> optax.GradientTransformation:
  """`tx` with its floating-point state (Adam's moments) stored in `dtype`: each update
  computes in float32 from the stored state and rounds the new state to `dtype` (round to
  nearest even); the update itself is float32's, from the unrounded moments."""
  dtype = jnp.dtype(dtype)
  def cast(tree, to):
    return jax.tree.map(lambda x: x.astype(to) if jnp.issubdtype(x.dtype, jnp.floating)
                        else x, tree)

  def init(params):
    return cast(tx.init(params), dtype)

  def update(updates, state, params=None):
    updates, state = tx.update(updates, cast(state, jnp.float32), params)
    return updates, cast(state, dtype)
  return optax.GradientTransformation(init, update)


def make_optimizer(optim: OptimSettings, total_steps: int, lr_multipliers=None
                   ) -> optax.GradientTransformation:
  """AdamW (the only `optim.name`), its moments stored in `optim.state_dtype`;
  `lr_multipliers` (a tree of floats shaped like the params,
  `layers.parametrization.learning_rate_multipliers`) scales each parameter's LR."""
  parts = [
      optax.clip_by_global_norm(optim.clip) if optim.clip else optax.identity(),
      optax.adamw(learning_rate_schedule(optim, total_steps), b1=optim.b1, b2=optim.b2,
                  eps=optim.eps, weight_decay=optim.weight_decay, mask=decay_mask)]
  if lr_multipliers is not None:
    parts.append(scale_by_multipliers(lr_multipliers))
  tx = optax.chain(*parts)
  return tx if optim.state_dtype == "float32" else with_state_dtype(tx, optim.state_dtype)
