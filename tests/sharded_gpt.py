"""Tiny models trained a few steps through `ShardingPlan` with the library's train state and
step (`jaxformer.state.train_state`, `jaxformer.train.step`): the shared setup of the tests that
check mesh-by-mesh equality with one device.

Every process builds the same global batch of a step from a seeded RNG and passes only its
rows [p*L, (p+1)*L) to `plan.global_batch`, as the data pipeline does.
"""

from __future__ import annotations


import jax
import numpy as np

from configs import shakespeare_char
from jaxformer.parallel import ShardingPlan
from jaxformer.state import train_state as state_lib
from jaxformer import tasks
from jaxformer.train import step as step_lib
from tests.arrays import LAMBDA, adam_tol, assert_trained_close, sum_tol

SEQ_LEN, GLOBAL_BATCH = 16, 8


def constant_lr(cfg):
  """`cfg` trained at its peak LR from the first step (every one of a few steps moves the
  params), with Adam's eps (1e-3) far above float32 gradient noise (~1e-5 of the gradients'
  scale): a coordinate whose gradient is ~0 in exact arithmetic (an attention key bias) takes
  a step of lr * noise / eps instead of a full-size one of random sign, which is what makes
  two runs' parameters comparable at a derived bound (`tests.arrays.adam_tol`). It also makes
  the step follow the gradient's size (a gradient summed twice, or averaged over too few rows,
  moves the parameters differently), where Adam at eps=1e-8 would take the same step."""
  cfg.optim.update(schedule="constant", warmup_steps=0, eps=1e-3)
  return cfg


def assert_runs_close(got, want, config, *, seq: int = SEQ_LEN, batch: int = GLOBAL_BATCH):
  """Two `train` results ((losses, state, ...)) of `config` on the same batches of `batch`
  sequences of `seq` tokens, computed differently (a mesh, a kernel, a CPU), agree to the
  float32 bounds of tests/arrays.py. Parameters: `adam_tol`, each gradient coordinate a sum
  over the batch's tokens whose terms' magnitudes add up to <= 1 (the loss is a token mean of
  terms bounded by layer-normed activations times a softmax error; the tiny GPT's largest
  gradient coordinate is 0.09). Losses: the network's chain of reductions (the tokens, per
  layer d_model for q/k/v, the sequence, d_model and mlp_dim, then the logits' d_model and
  the vocabulary or classes), plus what the parameters' differences move a later step's loss
  by: sum_i g_i dp_i over independent |dp_i| <= adam_tol, at most LAMBDA |g|_2 adam_tol with
  |g|_2 <= the clip norm (1.0)."""
  (losses, state), (want_losses, want_state) = got[:2], want[:2]
  steps, m, opt, tokens = len(want_losses), config.model, config.optim, batch * seq
  assert len(losses) == steps
  kw = dict(steps=steps, lr=opt.lr, eps=opt.eps, grad_length=tokens)
  outputs = m.get("vocab_size") or m.num_classes
  chain = tokens + m.num_layers * (4 * m.d_model + seq + m.mlp_dim) + m.d_model + outputs
  np.testing.assert_allclose(losses, want_losses, rtol=sum_tol(chain),
                             atol=LAMBDA * (opt.clip or 1.0) * adam_tol(**kw))
  assert_trained_close(state["params"], want_state["params"], **kw)


def tiny_gpt_config(**model):
  """shakespeare_char:tiny with sizes every mesh axis of 8 devices divides; `model` overrides
  model.* fields."""
  cfg = shakespeare_char.get_config("tiny")
  cfg.model.update(d_model=32, num_heads=8, mlp_dim=64, vocab_size=64, max_len=SEQ_LEN,
                   num_layers=1, attention_impl="xla")
  cfg.model.update(model)
  return constant_lr(cfg)


def init_boxed(config):
  """The config's train-state init, parameters in their `nn.Partitioned` boxes."""
  return state_lib.train_state_fns(config)[2]


def host_state(config):
  """The config's initial train state, initialised on one device, as host arrays."""
  plan = ShardingPlan.from_config(dict(data=1, model=1, expert=1), jax.devices()[:1])
  return jax.device_get(plan.init_state(init_boxed(config))[0])


def token_batch(step: int, vocab: int, process_index: int = 0, process_count: int = 1):
  """This process's rows of the global {'inputs', 'targets'} batch of `step`."""
  tokens = np.random.default_rng(step).integers(0, vocab, (GLOBAL_BATCH, SEQ_LEN + 1))
  rows = GLOBAL_BATCH // process_count
  local = tokens[process_index * rows:(process_index + 1) * rows].astype(np.int32)
  return {"inputs": local[:, :-1], "targets": local[:, 1:]}


def train(plan, config, batches, initial_state=None):
  """Train on `batches` (this process's rows) through `plan`: (losses, state, step_fn).
  The state starts from `plan.init_state`, or from `initial_state` (host arrays) if given."""
  module, tx, init = state_lib.train_state_fns(config)
  if initial_state is None:
    state, shardings = plan.init_state(init)
  else:
    shardings = plan.state_shardings(jax.eval_shape(init))
    state = jax.device_put(initial_state, shardings)
  batch_shardings = {k: plan.batch_sharding(v.ndim) for k, v in batches[0].items()}
  step = plan.jit(step_lib.make_train_step(module, tx, tasks.task_for(config.model)),
                  in_shardings=(shardings, batch_shardings, plan.replicated),
                  out_shardings=(shardings, plan.replicated), donate_argnums=(0,))
  dropout_key = plan.replicate(jax.random.key(0))
  losses = []
  for local in batches:
    state, metrics = step(state, plan.global_batch(local), dropout_key)
    losses.append(float(metrics["loss"]))
  return losses, state, step
