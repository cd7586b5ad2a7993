"""The short training runs of the tests: shakespeare_char:tiny trained a few steps, in-process
or through `python -m jaxformer.train` with the flags that give the same config.

One factory keeps those runs' programs the same where their settings agree, so the persistent
compilation cache (conftest.py) serves one test's train and eval steps to the next."""

from __future__ import annotations

import os

from ml_collections import ConfigDict

from configs import shakespeare_char


def tiny_run_config(*, eval_batches: int = 2, **train) -> ConfigDict:
  """shakespeare_char:tiny as a short run: 24 steps, logging every 4, evaluating on
  `eval_batches` batches every 12, a checkpoint every 8, no samples and no attention maps
  (each has its own tests); `train` overrides any train.* field."""
  cfg = shakespeare_char.get_config("tiny")
  cfg.train.update(steps=24, log_every=4, eval_every=12, checkpoint_every=8, sample_tokens=0,
                   attention_maps=False)
  cfg.train.update(train)
  cfg.data.eval_batches = eval_batches
  return cfg


def config_overrides(cfg: ConfigDict) -> dict:
  """The {"<section>.<field>": value} that turn shakespeare_char:tiny into `cfg`."""
  base = _fields(shakespeare_char.get_config("tiny"))
  return {key: value for key, value in _fields(cfg).items() if base.get(key) != value}


def config_flags(cfg: ConfigDict) -> list[str]:
  """The --config.<section>.<field> flags that turn shakespeare_char:tiny into `cfg`."""
  return [f"--config.{key}={value}" for key, value in config_overrides(cfg).items()]


def _fields(cfg: ConfigDict) -> dict:
  return {f"{section}.{key}": value for section, fields in cfg.to_dict().items()
          for key, value in fields.items()}


def on_one_device(monkeypatch) -> None:
  """In-process runs of this test build their mesh on the first of the suite's 8 CPU devices
  (`mesh.data=-1` then means 1): a tiny model's step split 8 ways on 2 cores pays the split
  and its all-reduce for nothing (the five family trainings that use it: 170 -> 112 s of CPU,
  RoBERTa's 40.6 -> 19.9). For trainings whose point is what they learn; the mesh tests (and
  runs compared with a subprocess on 8 devices) keep all 8."""
  import jax
  from jaxformer.parallel import mesh, sharding
  def make_mesh(mesh_config, devices=None, _real=mesh.make_mesh):
    return _real(mesh_config, jax.devices()[:1] if devices is None else devices)
  monkeypatch.setattr(mesh, "make_mesh", make_mesh)
  monkeypatch.setattr(sharding, "make_mesh", make_mesh)


def write_run(workdir, cfg: ConfigDict, tokenizer, steps=(8,), *, random: bool = False
              ) -> dict:
  """A run directory as training leaves it, without the training: config.json, the tokenizer
  (None: none), and a checkpoint of the initial train state at each of `steps` (step s's
  params scaled by 1 + s/8, so steps differ). Returns {step: params}.

  random=True: the state is not initialised (its init is compiled: 10-30 s of CPU for a tiny
  model on a loaded machine) but drawn from its shapes: params N(0, 0.2^2) (norm scales 1 +
  that), everything else zeros; for tests of what a model computes, not of its init."""
  import flax.linen as nn
  import jax
  import numpy as np
  from jaxformer.state import checkpoint, train_state
  from tests import drawn
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(cfg.to_json(indent=2))
  if tokenizer is not None:
    tokenizer.save(workdir)
  _, _, init_boxed = train_state.train_state_fns(cfg)
  if random:
    state = drawn.state(init_boxed)
  else:
    state = jax.device_get(nn.unbox(jax.jit(init_boxed)()))
  ckpts = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"))
  saved = {}
  for step in steps:
    params = jax.tree.map(lambda p, s=step: p * np.float32(1 + s / 8), state["params"])
    ckpts.save(step, dict(state, params=params, step=np.int32(step)))
    saved[step] = params
  ckpts.close()
  return saved
