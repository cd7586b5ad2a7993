"""A tiny GPT trained a few steps through `ShardingPlan` with a plain optax step: the shared
setup of test_parallel.py (mesh-by-mesh equality with one device).

Every process builds the same global batch of a step from a seeded RNG and passes only its
rows [p*L, (p+1)*L) to `plan.global_batch`, as the data pipeline does.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import shakespeare_char
from jaxformer import models

SEQ_LEN, GLOBAL_BATCH, LR = 16, 8, 1e-3
# Adam's eps above float32 gradient noise: a parameter whose gradient is exactly zero in exact
# arithmetic (an attention key bias) must not turn rounding noise into full-size steps.
EPS = 1e-6


def tiny_gpt_config(**overrides):
  """shakespeare_char:tiny with sizes every mesh axis of 8 devices divides."""
  model = shakespeare_char.get_config("tiny").model.to_dict()
  model.update(d_model=32, num_heads=8, mlp_dim=64, vocab_size=64, max_len=SEQ_LEN, num_layers=1,
               attention_impl="xla")
  model.update(overrides)
  return model


def token_batch(step: int, vocab: int, process_index: int = 0, process_count: int = 1):
  """This process's rows of the global {'inputs', 'targets'} batch of `step`."""
  tokens = np.random.default_rng(step).integers(0, vocab, (GLOBAL_BATCH, SEQ_LEN + 1))
  rows = GLOBAL_BATCH // process_count
  local = tokens[process_index * rows:(process_index + 1) * rows].astype(np.int32)
  return {"inputs": local[:, :-1], "targets": local[:, 1:]}


def boxed_init(module, tx, example):
  """Init returning the state with `nn.Partitioned` params (optimizer state inherits them)."""
  def init():
    params = module.init(jax.random.key(0), example)["params"]
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
  return init


def lm_step(module, tx, input_key="inputs"):
  """A plain AdamW step on mean token cross-entropy; returns (state, loss)."""
  def step(state, batch):
    def loss_fn(params):
      logits = module.apply({"params": params}, batch[input_key])
      return optax.softmax_cross_entropy_with_integer_labels(
          logits.astype(jnp.float32), batch["targets"]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    return {"step": state["step"] + 1, "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state}, loss
  return step


def train(plan, model_config, batches, input_key="inputs", initial_state=None):
  """Train on `batches` (this process's rows) through `plan`: (losses, state, step_fn).
  The state starts from `plan.init_state`, or from `initial_state` (host arrays) if given."""
  module, tx = models.build(model_config), optax.adamw(LR, eps=EPS)
  example = jnp.zeros((1,) + batches[0][input_key].shape[1:], batches[0][input_key].dtype)
  init = boxed_init(module, tx, example)
  if initial_state is None:
    state, shardings = plan.init_state(init)
  else:
    shardings = plan.state_shardings(jax.eval_shape(init))
    state = jax.device_put(initial_state, shardings)
  batch_shardings = {k: plan.batch_sharding(v.ndim) for k, v in batches[0].items()}
  step = plan.jit(lm_step(module, tx, input_key), in_shardings=(shardings, batch_shardings),
                  out_shardings=(shardings, plan.replicated), donate_argnums=(0,))
  losses = []
  for local in batches:
    state, loss = step(state, plan.global_batch(local))
    losses.append(float(loss))
  return losses, state, step
