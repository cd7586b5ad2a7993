"""The train state's layout, one definition for training (init, resume) and inference (restore).

A checkpoint holds the pytree {'step', 'params', 'opt_state', 'skipped', 'log_sums'}.
Restoring it needs that tree's shapes, which follow from the run's saved config (the model and
the optimizer), so both sides build them here and cannot disagree on the layout.

'log_sums' holds the sums of the log interval in progress (`LOG_SUMS`: the train loss and
accuracy summed over its finite steps, and their count), from which the step reports the
interval's mean loss (`train.step`): in the checkpoint so that a run resumed in the middle of
an interval logs the same mean as the uninterrupted run. A checkpoint written before it
existed restores with zero sums (`ADDED_LATER`, `state.checkpoint`).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from jaxformer import models
from jaxformer.layers import parametrization
from jaxformer import paths, workdir_layout, run_settings
from jaxformer.jsonfile import read_json
from jaxformer.state import optim


def read_config(workdir: str) -> dict | None:
  """The config a run saved in `workdir` as JSON data (None if there is none yet)."""
  path = paths.path(workdir) / workdir_layout.CONFIG         # an unusable scheme names --workdir
  if not path.exists():
    return None
  return read_json(path, fix="it is written by training: restore it or retrain in a new "
                   "--workdir")


def init_inputs(model_config) -> tuple:
  """Zero positional inputs for `module.init`, of the kind the family's registry entry says
  (parameter shapes do not depend on the batch or the length)."""
  cfg = models.with_defaults(model_config)
  return tuple(jnp.zeros(x.shape, x.dtype)
               for x in models.get(cfg["family"]).example_inputs(cfg, 1, 2))


def lr_multipliers(module, init_params):
  """The per-parameter LR multipliers of the model's parametrization (None: all 1), read off
  the logical axis names of the abstract params (`init_params` is traced, not run)."""
  block = getattr(module, "block", None)
  if block is None or parametrization.width_multiplier(block, module.d_model) == 1.0:
    return None
  return parametrization.learning_rate_multipliers(jax.eval_shape(init_params), block,
                                                   module.d_model)


LOG_SUMS = "log_sums"
# Top-level entries newer than some checkpoints: restored as zeros where a checkpoint lacks them.
ADDED_LATER = (LOG_SUMS,)


def zero_log_sums() -> dict:
  """The sums of an empty log interval (see the module docstring)."""
  return {"loss": jnp.zeros((), jnp.float32), "accuracy": jnp.zeros((), jnp.float32),
          "steps": jnp.zeros((), jnp.int32)}


def train_state_fns(config, settings: run_settings.RunSettings | None = None):
  """(module, optimizer, init_boxed) of `config`'s model and its typed `settings`
  (parsed from `config` unless given: only `train`, `optim`, `posttrain`, `model` are
  read): init_boxed() builds the train state pytree
  {'step', 'params', 'opt_state', 'skipped', 'log_sums'} (+ 'reference' for DPO: the frozen
  reference params, checkpointed with the state) with parameters (and their optimizer moments)
  still in their `nn.Partitioned` boxes, which name the logical axes the sharding plan maps
  to the mesh; `nn.unbox` of it is the state itself."""
  settings = settings or run_settings.parse(config, only=("train", "optim", "model"))
  model = settings.model if settings.model is not None else models.settings_of(config)
  module = models.build(model)
  init_key = jax.random.split(jax.random.key(settings.train.seed))[0]
  init_params = lambda: module.init(init_key, *init_inputs(model))["params"]
  tx = optim.make_optimizer(settings.optim, settings.train.steps,
                            lr_multipliers=lr_multipliers(module, init_params))

  reference = settings.posttrain is not None and (settings.posttrain.method
                                                   in run_settings.REFERENCE_METHODS)

  def init_boxed():
    params = init_params()
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
             "skipped": jnp.zeros((), jnp.int32), LOG_SUMS: zero_log_sums()}
    if reference:           # DPO's / GRPO's frozen reference model, never trained
      state["reference"] = params
    return state

  return module, tx, init_boxed
