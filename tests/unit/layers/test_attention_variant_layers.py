"""model.attention_variant: MultiHeadAttention and the decoder with linear attention and the
routing cache against float64 NumPy references, KV-cache decoding against the full forward
pass, parameter counts, and the config errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import shakespeare_char
from jaxformer import models, scaling
from jaxformer.inference import decode
from jaxformer.layers import MultiHeadAttention
from tests.arrays import rand
from tests.unit.ops.test_attention_variants import np_linear, np_routing, np_routing_prefix

B, T, E = 2, 11, 24


def init(module, x, seed=0):
  """The module's variables with every param random, drawn from the init's shapes (traced, not
  run); other collections (a decode cache) zeros, as the init leaves them."""
  variables = nn.unbox(jax.eval_shape(module.init, jax.random.key(seed), x))
  variables = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables)
  leaves, tree = jax.tree.flatten(variables["params"])
  rng = np.random.default_rng(seed + 1)
  leaves = [(rng.normal(size=a.shape) * 0.3).astype(np.float32) for a in leaves]
  return {**variables, "params": jax.tree.unflatten(tree, leaves)}


def test_linear_layer_matches_float64_reference_with_gqa():
  module = MultiHeadAttention(num_heads=4, num_kv_heads=2, causal=True, variant="linear",
                              qkv_bias=True)
  x = rand((B, T, E))
  p = init(module, x)["params"]
  x64 = np.asarray(x, np.float64)
  q = np.einsum("bte,ehd->bthd", x64, p["query"]["kernel"]) + p["query"]["bias"]
  kv = np.einsum("bte,ezhd->btzhd", x64, p["kv"]["kernel"]) + p["kv"]["bias"]
  ctx = np_linear(q, kv[:, :, 0], kv[:, :, 1], causal=True)
  want = np.einsum("bthd,hde->bte", ctx, p["out"]["kernel"])
  np.testing.assert_allclose(apply(module, p, x), want, atol=1e-4, rtol=1e-4)


def apply(module, params, x):
  """module.apply jitted: one compile instead of an eager compile per op."""
  return jax.jit(lambda p, x: module.apply({"params": p}, x))(params, x)


def test_routing_cache_layer_matches_float64_reference_and_has_only_a_query_projection():
  module = MultiHeadAttention(num_heads=3, causal=True, variant="routing_cache",
                              routing_slots=5, head_gates=True)
  x = rand((B, T, E))
  p = init(module, x)["params"]
  assert sorted(p) == ["head_gates", "out", "query", "routing_keys", "routing_values"]
  assert p["routing_keys"].shape == p["routing_values"].shape == (5, 3, 8)
  q = np.einsum("bte,ehd->bthd", np.asarray(x, np.float64), p["query"]["kernel"])
  q = q * np.asarray(p["head_gates"], np.float64)[:, None]
  ctx = np_routing(q, p["routing_keys"], p["routing_values"])
  want = np.einsum("bthd,hde->bte", ctx, p["out"]["kernel"])
  np.testing.assert_allclose(apply(module, p, x), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", ["linear", "routing_cache", "routing_prefix"])
def test_kv_cache_decoding_equals_full_forward(variant):
  kw = dict(num_heads=4, causal=True, variant=variant, routing_slots=3)
  full, dec = MultiHeadAttention(**kw), MultiHeadAttention(decode=True, **kw)
  x = rand((B, T, E))
  variables = init(full, x)
  want = apply(full, variables["params"], x)
  cache = init(dec, jnp.zeros((B, 16, E)))["cache"]                     # zeros
  step = jax.jit(lambda cache, xt: dec.apply({"params": variables["params"], "cache": cache},
                                             xt, mutable=["cache"]))
  out, state = step(cache, x[:, :4])
  outs = [out]
  for t in range(4, T):
    out, state = step(state["cache"], x[:, t:t + 1])
    outs.append(out)
  assert int(state["cache"]["cache_index"]) == T
  np.testing.assert_allclose(jnp.concatenate(outs, axis=1), want, atol=2e-5, rtol=1e-5)


def _config(variant, **kw):
  config = shakespeare_char.get_config("tiny")
  config.model.update(attention_variant=variant, **kw)
  return config


def test_routing_prefix_layer_matches_float64_reference():
  module = MultiHeadAttention(num_heads=2, num_kv_heads=1, causal=True, variant="routing_prefix",
                              routing_slots=4)
  x = rand((B, T, E))
  p = init(module, x)["params"]
  assert p["routing_writes"].shape == (4, 2, 12)
  x64 = np.asarray(x, np.float64)
  q = np.einsum("bte,ehd->bthd", x64, p["query"]["kernel"])
  kv = np.einsum("bte,ezhd->btzhd", x64, p["kv"]["kernel"])
  ctx = np_routing_prefix(q, kv[:, :, 0], kv[:, :, 1], p["routing_writes"], causal=True)
  want = np.einsum("bthd,hde->bte", ctx, p["out"]["kernel"])
  np.testing.assert_allclose(apply(module, p, x), want, atol=1e-4, rtol=1e-4)


def test_parameter_counts():
  """linear: exactly softmax's parameters; routing_prefix: softmax's plus M H D write queries
  per layer; routing_cache: the k/v projections (2 E x E per layer here) replaced by 2 M H D
  slot parameters."""
  counts = {v: scaling.count_params(_config(v).model)["total"]
            for v in ("softmax", "linear", "routing_cache", "routing_prefix")}
  c = _config("softmax").model
  assert counts["linear"] == counts["softmax"]
  assert counts["routing_prefix"] - counts["softmax"] == c.num_layers * 16 * c.d_model
  per_layer = 2 * c.d_model * c.d_model - 2 * 16 * c.d_model
  assert counts["softmax"] - counts["routing_cache"] == c.num_layers * per_layer
  m64 = scaling.count_params(_config("routing_cache", routing_slots=64).model)["total"]
  assert m64 - counts["routing_cache"] == c.num_layers * 2 * 48 * c.d_model


def test_a_routing_cache_decoder_generates_what_its_full_forward_pass_predicts():
  """The routing cache keeps no KV cache (only its index): generate still runs. (The other
  variants' cached decoding is checked layer by layer above.)"""
  config = _config("routing_cache")
  module = models.build(config.model)
  params = jax.jit(module.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  prompt = np.array([[3, 1, 4, 1, 5]], np.int32)
  out = decode.generate(config.model, params, prompt, max_new_tokens=6, temperature=0.0)
  assert out.shape == (1, 11)                    # the prompt, then 6 new tokens
  np.testing.assert_array_equal(out[:, :5], prompt)
  logits = apply(module, params, jnp.asarray(out[:, :-1]))
  np.testing.assert_array_equal(np.argmax(logits[0, 4:], -1), out[0, 5:])


@pytest.mark.parametrize("kw,match", [
    (dict(attention_variant="cosine"), "model.attention_variant='cosine' is not one of"),
    (dict(attention_variant="linear", window=8), "model.window=8 is a sliding window"),
    (dict(attention_variant="routing_cache", attention_dropout_rate=0.1),
     "model.attention_dropout_rate=0.1"),
    (dict(attention_variant="routing_cache", routing_slots=0), "model.routing_slots=0"),
])
def test_config_mistakes_name_the_key(kw, match):
  config = shakespeare_char.get_config("tiny")
  config.model.update(**kw)
  with pytest.raises(ValueError, match=match):
    models.build(config.model)


def test_rope_with_the_routing_cache_is_refused():
  module = MultiHeadAttention(num_heads=2, positions="rope", variant="routing_cache")
  with pytest.raises(ValueError, match="positions='rope' acts on query-key pairs"):
    module.init(jax.random.key(0), jnp.zeros((1, 3, 8)))


def test_hf_save_refuses_other_variants_by_name(tmp_path):
  from jaxformer.convert import hf
  config = _config("linear")
  params = jax.eval_shape(models.build(config.model).init, jax.random.key(0),
                          jnp.zeros((1, 4), jnp.int32))                  # refused: no values
  with pytest.raises(ValueError, match="model.attention_variant='linear': Hugging Face"):
    hf.save(config.model, params["params"], str(tmp_path / "linear"))
  assert not (tmp_path / "linear").exists()
