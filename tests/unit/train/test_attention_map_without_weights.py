"""The training evaluation's attention map when no layer records probabilities (every
self-attention a `model.attention_variant` other than softmax): nothing is written."""

import jax
import jax.numpy as jnp

from configs import shakespeare_char
from jaxformer import models, tasks
from jaxformer.train import attention_maps


def test_no_recorded_weights_writes_no_map(tmp_path):
  config = shakespeare_char.get_config("tiny")
  config.model.attention_variant = "linear"
  module = models.build(config.model)
  tokens = jnp.zeros((2, 8), jnp.int32)
  params = module.init(jax.random.key(0), tokens)["params"]
  snapshot = attention_maps.make_snapshot_fn(module, tasks.task_for(config.model))
  batch = {"inputs": tokens, "targets": tokens}
  assert snapshot(params, batch) == {}
  assert attention_maps.write_attention_map(snapshot, params, batch, step=1,
                                            workdir=str(tmp_path)) is None
  assert not (tmp_path / "attention").exists()
