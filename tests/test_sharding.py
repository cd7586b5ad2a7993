"""Layers under an 8-device (data, model, expert) mesh: logical axes -> shardings, same numbers."""

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jaxformer.parallel.rules import MESH_AXES, logical_axis_rules
from tests.arrays import assert_close_f32
from tests.modules import make_block


def test_block_sharded_over_data_and_model_matches_single_device():
  assert jax.device_count() == 8, "conftest must provide 8 CPU devices"
  mesh = jax.make_mesh((2, 4, 1), MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  rules = logical_axis_rules()
  module = make_block(num_heads=4, num_kv_heads=4, mlp_dim=64, causal=True,
                            positions="rope", attention_impl="blocked")
  x = jax.random.normal(jax.random.key(1), (4, 16, 32))
  boxed = module.init(jax.random.key(0), x)
  params = nn.unbox(boxed)["params"]
  want = module.apply({"params": params}, x)

  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)["params"]
  assert shardings["self_attention"]["qkv"]["kernel"].spec == P(None, None, "model", None)
  assert shardings["ffn"]["wi"]["kernel"].spec == P(None, "model")
  sharded_params = jax.device_put(params, shardings)
  x_sharded = jax.device_put(x, NamedSharding(mesh, P("data")))

  @jax.jit
  def apply(p, x):
    with nn.logical_axis_rules(rules):
      return module.apply({"params": p}, x)

  with jax.set_mesh(mesh):
    got = apply(sharded_params, x_sharded)
  # the block's chain: 2 norms over d_model 32, qkv 32, scores over head dim 8, 16 keys, out 32,
  # mlp 32 and 64
  assert_close_f32(got, want, 2 * 32 + 32 + 8 + 16 + 32 + 32 + 64)
  assert got.sharding.spec[0] == "data"


def test_fsdp_rules_shard_embed_over_data():
  rules = dict(logical_axis_rules(fsdp=True))
  assert rules["embed"] == "data" and rules["heads"] == "model" and rules["batch"] == "data"
  assert dict(logical_axis_rules())["embed"] is None
