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


def test_fsdp_kernel_is_gathered_once_in_the_compute_dtype_and_its_gradient_scattered():
  """layers.gather.gathered: under FSDP rules the kernel comes out cast and whole along embed
  (model axes kept), its gradient lands on the parameter's own sharding, values and gradients
  equal the plain cast's; without rules it is the plain cast (nothing constrained)."""
  import jax.numpy as jnp
  from jaxformer.layers.gather import gathered
  mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  axes = ("embed", "heads")
  w = jax.device_put(jax.random.normal(jax.random.key(0), (8, 6), np.float32),
                     NamedSharding(mesh, P("data", "model")))
  x = jax.device_put(jax.random.normal(jax.random.key(1), (16, 8), np.float32),
                     NamedSharding(mesh, P("data", None)))

  def loss(w, x, use):
    k = use(w)
    return jnp.sum(jnp.tanh(x.astype(jnp.bfloat16) @ k).astype(jnp.float32)), k

  plain = lambda w: w.astype(jnp.bfloat16)
  with jax.set_mesh(mesh), nn.logical_axis_rules(logical_axis_rules(fsdp=True)):
    (value, k), grad = jax.jit(jax.value_and_grad(
        lambda w, x: loss(w, x, lambda w: gathered(w, axes, jnp.bfloat16)), has_aux=True))(w, x)
  (ref_value, _), ref_grad = jax.jit(jax.value_and_grad(
      lambda w, x: loss(w, x, plain), has_aux=True))(w, x)
  assert k.dtype == jnp.bfloat16 and k.sharding.spec == P(None, "model")
  assert grad.sharding.spec == P("data", "model") and grad.dtype == np.float32
  np.testing.assert_allclose(value, ref_value, rtol=1e-6)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-6)
  assert str(jax.make_jaxpr(lambda w: gathered(w, axes, jnp.bfloat16))(w)).count(
      "sharding_constraint") == 0
