"""MultiHeadAttention and TransformerBlock against float64 NumPy references."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.layers import MultiHeadAttention
from tests import attention_reference as ref
from tests.arrays import rand
from tests.gradcheck import numeric_grad
from tests.modules import make_block
from tests.np_reference import ACT_NP, layernorm_np, rope_np

B, T, E = 2, 13, 48


def init(module, *args, seed=0, **kw):
  """Every param random (zeros/ones would hide bugs), drawn from the init's shapes (traced,
  not run); other collections (a decode cache) zeros, as the init leaves them."""
  variables = nn.unbox(jax.eval_shape(functools.partial(module.init, **kw), jax.random.key(seed),
                                      *args))
  variables = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables)
  leaves, tree = jax.tree.flatten(variables["params"])
  rng = np.random.default_rng(seed + 1)
  leaves = [(rng.normal(size=x.shape) * 0.3).astype(np.float32) for x in leaves]
  return {**variables, "params": jax.tree.unflatten(tree, leaves)}


def apply(module, variables, *args, **kw):
  """module.apply jitted: one compile instead of an eager compile per op."""
  return jax.jit(lambda v, *a: module.apply(v, *a, **kw))(variables, *args)


# ------------------------------------------------------------------- NumPy references


def np_mha(p, x, context=None, *, num_heads, num_kv_heads=None, positions="none",
           mask=None, **mask_kw):
  x = np.asarray(x, np.float64)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  if "qkv" in p:
    qkv = np.einsum("bte,ezhd->btzhd", x, p["qkv"]["kernel"])
    if "bias" in p["qkv"]:
      qkv = qkv + p["qkv"]["bias"]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  else:
    q = np.einsum("bte,ehd->bthd", x, p["query"]["kernel"])
    kv = np.einsum("bte,ezhd->btzhd", x if context is None else np.asarray(context, np.float64),
                   p["kv"]["kernel"])
    k, v = kv[:, :, 0], kv[:, :, 1]
  t = x.shape[1]
  bias = None
  if positions == "rope":
    q, k = rope_np(q, np.arange(t)), rope_np(k, np.arange(t))
  if positions == "alibi":
    slopes = 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)
    bias = -slopes[None, :, None, None] * np.abs(np.arange(t)[:, None] - np.arange(t))
  o, _ = ref.attention(q, k, v, bias=bias, mask=mask, **mask_kw)
  out = np.einsum("bthd,hde->bte", o, p["out"]["kernel"])
  return out + p["out"]["bias"] if "bias" in p["out"] else out


MHA_CASES = {
    "mha_fused_bias": (dict(num_heads=4, qkv_bias=True, out_bias=True), {}),
    "gqa_12_4_causal_rope": (dict(num_heads=12, num_kv_heads=4, head_dim=8, causal=True,
                                  positions="rope"), {}),
    "mqa_8_1_window_alibi": (dict(num_heads=8, num_kv_heads=1, causal=True, window=4,
                                  positions="alibi"), {}),
}


@pytest.mark.parametrize("name", sorted(MHA_CASES))
def test_mha_matches_numpy_values_and_grads(name):
  cfg, _ = MHA_CASES[name]
  module = MultiHeadAttention(**cfg)
  x = rand((B, T, E))
  variables = init(module, x)
  p = variables["params"]
  mask_kw = dict(causal=cfg.get("causal", False), window=cfg.get("window"))
  np_kw = dict(num_heads=cfg["num_heads"], num_kv_heads=cfg.get("num_kv_heads"),
               positions=cfg.get("positions", "none"), **mask_kw)
  out = apply(module, variables, x)
  np.testing.assert_allclose(out, np_mha(p, x, **np_kw), atol=1e-4, rtol=1e-4)

  ct = rand((B, T, E), seed=7)
  loss = lambda params, x: jnp.sum(module.apply({"params": params}, x) * ct)
  g_params, g_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(p, x)
  idx, num = numeric_grad(lambda xx: np.sum(np_mha(p, xx, **np_kw) * ct), x)
  np.testing.assert_allclose(np.ravel(g_x)[idx], num, atol=1e-3, rtol=1e-3)
  proj = "qkv" if "qkv" in p else "kv"
  kernel = p[proj]["kernel"]

  def np_loss_kernel(kk):
    return np.sum(np_mha({**p, proj: {**p[proj], "kernel": kk}}, x, **np_kw) * ct)
  idx, num = numeric_grad(np_loss_kernel, kernel)
  np.testing.assert_allclose(np.ravel(g_params[proj]["kernel"])[idx], num, atol=1e-3, rtol=1e-3)


def test_cross_attention_with_empty_rows_matches_numpy():
  module = MultiHeadAttention(num_heads=6, num_kv_heads=2, head_dim=8)
  x, ctx = rand((B, T, E)), rand((B, 7, 24), seed=3)
  mask = np.random.default_rng(4).random((B, 1, T, 7)) > 0.4
  mask[:, :, 2] = False
  variables = init(module, x, ctx)
  out = apply(module, variables, x, ctx, mask=mask)
  want = np_mha(variables["params"], x, ctx, num_heads=6, num_kv_heads=2, mask=mask)
  np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-4)
  # row 2 attends to nothing: its pre-projection output is 0, so it equals the output bias (none)
  np.testing.assert_allclose(out[:, 2], 0, atol=1e-6)


@pytest.mark.parametrize("impl", ["blocked", "auto"])
def test_impls_agree_in_layer(impl):
  x = rand((B, T, E))
  kw = dict(num_heads=4, num_kv_heads=2, causal=True, window=5, positions="alibi")
  variables = init(MultiHeadAttention(impl="xla", **kw), x)
  np.testing.assert_allclose(apply(MultiHeadAttention(impl=impl, **kw), variables, x),
                             apply(MultiHeadAttention(impl="xla", **kw), variables, x), atol=1e-5)


def test_permutation_equivariant_without_positions():
  module = MultiHeadAttention(num_heads=4)
  x = rand((1, T, E))
  variables = init(module, x)
  perm = np.random.default_rng(1).permutation(T)
  np.testing.assert_allclose(apply(module, variables, x[:, perm]),
                             apply(module, variables, x)[:, perm], atol=1e-5)


def test_rope_layer_depends_on_relative_positions_only():
  module = MultiHeadAttention(num_heads=4, positions="rope", causal=True)
  x = rand((B, T, E))
  variables = init(module, x)
  base = apply(module, variables, x, positions=jnp.arange(T))
  shifted = apply(module, variables, x, positions=jnp.arange(T) + 1000)
  np.testing.assert_allclose(shifted, base, atol=2e-4)
  # ... but not permutation-equivariant: positions matter
  perm = np.random.default_rng(1).permutation(T)
  assert not np.allclose(apply(module, variables, x[:, perm]), base[:, perm], atol=1e-3)


@pytest.mark.parametrize("kw", [
    dict(num_heads=4),
    dict(num_heads=12, num_kv_heads=4, head_dim=8, positions="rope", rope_theta=500_000.0),
    dict(num_heads=8, num_kv_heads=1, positions="alibi", window=3),
], ids=["mha", "gqa_rope", "mqa_alibi_window"])
@pytest.mark.parametrize("prefill", [1, 6])
def test_kv_cache_decoding_equals_full_forward(kw, prefill):
  full = MultiHeadAttention(causal=True, **kw)
  dec = MultiHeadAttention(causal=True, decode=True, **kw)
  x = rand((B, T, E))
  variables = init(full, x)
  want = apply(full, variables, x)
  cache = init(dec, jnp.zeros((B, 16, E)))["cache"]                      # zeros
  step = jax.jit(lambda cache, xt: dec.apply({"params": variables["params"], "cache": cache},
                                             xt, mutable=["cache"]))
  out, mutated = step(cache, x[:, :prefill])
  outs = [out]
  for t in range(prefill, T):
    out, mutated = step(mutated["cache"], x[:, t:t + 1])
    outs.append(out)
  assert int(mutated["cache"]["cache_index"]) == T
  np.testing.assert_allclose(jnp.concatenate(outs, axis=1), want, atol=2e-5, rtol=1e-5)


def test_kv_cache_overflow_under_jit_is_loud():
  dec = MultiHeadAttention(num_heads=4, causal=True, decode=True)
  variables = init(dec, jnp.zeros((1, 4, E)))
  step = jax.jit(lambda c, x: dec.apply({"params": variables["params"], "cache": c}, x,
                                        mutable=["cache"]))
  cache = variables["cache"]
  for _ in range(4):
    out, state = step(cache, jnp.ones((1, 1, E)))
    cache = state["cache"]
    assert np.isfinite(out).all()
  out, _ = step(cache, jnp.ones((1, 1, E)))        # a 5th token in a 4-slot cache
  assert np.isnan(out).all()


def test_kv_cache_overflow_raises():
  dec = MultiHeadAttention(num_heads=4, causal=True, decode=True)
  variables = init(dec, jnp.zeros((1, 4, E)))
  with pytest.raises(ValueError, match="exceed the KV cache"):
    apply(dec, variables, jnp.zeros((1, 5, E)), mutable=["cache"])


def test_mutable_attention_weights_collection_returns_probabilities():
  module = MultiHeadAttention(num_heads=4, causal=True)
  x = rand((B, T, E))
  variables = init(module, x)
  out, state = apply(module, variables, x, mutable=["attention_weights"])
  (w,) = state["attention_weights"]["weights"]
  chex.assert_shape(w, (B, 4, T, T))
  np.testing.assert_allclose(w.sum(-1), 1, atol=1e-5)
  np.testing.assert_array_equal(np.triu(np.asarray(w), 1), 0)
  np.testing.assert_allclose(out, apply(module, variables, x), atol=1e-5)


def test_attention_dropout_uses_rng_and_is_off_when_deterministic():
  module = MultiHeadAttention(num_heads=4, dropout_rate=0.5)
  x = rand((B, T, E))
  variables = init(module, x)
  plain = apply(MultiHeadAttention(num_heads=4), variables, x)
  np.testing.assert_allclose(apply(module, variables, x, deterministic=True), plain, atol=1e-6)
  train = jax.jit(lambda v, x, key: module.apply(v, x, deterministic=False,
                                                  rngs={"dropout": key}))
  run = lambda seed: train(variables, x, jax.random.key(seed))
  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))


def test_bfloat16_compute_keeps_float32_params():
  x = rand((B, T, E))
  kw = dict(num_heads=4, num_kv_heads=2, causal=True, positions="rope")
  variables = init(MultiHeadAttention(**kw), x)
  boxed = jax.eval_shape(MultiHeadAttention(dtype=jnp.bfloat16, **kw).init, jax.random.key(0), x)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nn.unbox(boxed)))
  out = apply(MultiHeadAttention(dtype=jnp.bfloat16, **kw), variables, x)
  assert out.dtype == jnp.bfloat16
  want = np.asarray(apply(MultiHeadAttention(**kw), variables, x))
  rel = np.abs(np.asarray(out, np.float32) - want).max() / np.abs(want).max()
  assert rel < 3e-2, rel      # bfloat16 has an 8-bit mantissa


def test_cross_attention_batch_mismatch_is_caught_at_the_boundary():
  with pytest.raises(AssertionError, match="shape"):
    MultiHeadAttention(num_heads=4).init(jax.random.key(0), rand((2, 5, E)), rand((3, 4, E)))


def test_param_logical_axes():
  x = rand((B, T, E))
  specs = nn.get_partition_spec(                    # abstract inits: the specs, no values
      jax.eval_shape(MultiHeadAttention(num_heads=4).init, jax.random.key(0), x))
  assert tuple(specs["params"]["qkv"]["kernel"]) == ("embed", "qkv", "heads", "kv")
  assert tuple(specs["params"]["out"]["kernel"]) == ("heads", "kv", "embed")
  specs = nn.get_partition_spec(jax.eval_shape(
      MultiHeadAttention(num_heads=4, num_kv_heads=2).init, jax.random.key(0), x))
  assert tuple(specs["params"]["query"]["kernel"]) == ("embed", "heads", "kv")
  assert tuple(specs["params"]["kv"]["kernel"]) == ("embed", "qkv", "kv_heads", "kv")


@pytest.mark.parametrize("kw, args, match", [
    (dict(num_heads=4, num_kv_heads=3), (), "num_kv_heads=3 must divide num_heads=4"),
    (dict(num_heads=5), (), "num_heads=5 does not divide the input width 48"),
    (dict(num_heads=4, positions="learned"), (), "positions='learned'"),
    (dict(num_heads=4, positions="rope"), ("context",), "self-attention only"),
    (dict(num_heads=4, decode=True), (), "decode=True"),
    (dict(num_heads=4, dropout_rate=0.1, impl="blocked"), (), "attention dropout"),
    (dict(num_heads=4, impl="fast"), (), "impl='fast'"),
    (dict(num_heads=4, causal=True, window=-2), (), "window"),
])
def test_mha_bad_config_raises(kw, args, match):
  x = rand((1, 5, E))
  extra = (rand((1, 3, E)),) if args else ()
  with pytest.raises(ValueError, match=match):
    MultiHeadAttention(**kw).init(jax.random.key(0), x, *extra)


# ------------------------------------------------------------------------- TransformerBlock


def np_block(p, x, context=None, *, pre_norm, num_heads, eps=1e-5, causal=False):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  x = np.asarray(x, np.float64)

  def ffn(h):
    f = p["ffn"]
    return ACT_NP["gelu"](h @ f["wi"]["kernel"] + f["wi"]["bias"]) @ f["wo"]["kernel"] + f["wo"]["bias"]

  subs = [("self_attention", lambda h: np_mha(p["self_attention"], h, num_heads=num_heads,
                                              causal=causal))]
  if context is not None:
    subs.append(("cross_attention", lambda h: np_mha(p["cross_attention"], h, context,
                                                     num_heads=num_heads)))
  subs.append(("ffn", ffn))
  for name, f in subs:
    norm = lambda h: layernorm_np(p[f"{name}_norm"], h, eps)
    x = x + f(norm(x)) if pre_norm else norm(x + f(x))
  return x


@pytest.mark.parametrize("pre_norm", [True, False])
@pytest.mark.parametrize("cross", [False, True])
def test_block_matches_numpy_values_and_grads(pre_norm, cross):
  module = make_block(num_heads=4, mlp_dim=64, pre_norm=pre_norm, causal=not cross,
                            cross_attention=cross)
  x = rand((B, 9, E))
  context = rand((B, 5, E), seed=5) if cross else None
  args = (x, context) if cross else (x,)
  variables = init(module, *args)
  p = variables["params"]
  kw = dict(pre_norm=pre_norm, num_heads=4, causal=not cross)
  np.testing.assert_allclose(apply(module, variables, *args), np_block(p, x, context, **kw),
                             atol=1e-4, rtol=1e-4)
  ct = rand((B, 9, E), seed=9)
  g_x = jax.jit(jax.grad(lambda x: jnp.sum(module.apply(variables, x, *args[1:]) * ct)))(x)
  idx, num = numeric_grad(lambda xx: np.sum(np_block(p, xx, context, **kw) * ct), x)
  np.testing.assert_allclose(np.ravel(g_x)[idx], num, atol=1e-3, rtol=1e-3)


def test_block_llama_style_runs_and_decodes():
  kw = dict(num_heads=4, num_kv_heads=2, mlp_dim=96, norm="rmsnorm", ffn="swiglu",
            activation="silu", use_bias=False, positions="rope", causal=True)
  x = rand((B, T, E))
  full = make_block(**kw)
  variables = init(full, x)
  assert set(variables["params"]["ffn"]) == {"wi_gate", "wi_up", "wo"}
  want = apply(full, variables, x)
  dec = make_block(decode=True, **kw)
  cache = init(dec, jnp.zeros((B, T, E)))["cache"]                      # zeros
  step = jax.jit(lambda cache, xt: dec.apply({"params": variables["params"], "cache": cache},
                                             xt, mutable=["cache"]))
  outs = []
  for t in range(T):
    out, mutated = step(cache, x[:, t:t + 1])
    cache = mutated["cache"]
    outs.append(out)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, atol=2e-5, rtol=1e-5)


def test_block_ffn_activation_defaults_to_the_ffn_kind():
  x = rand((1, 5, E))
  for ffn, default, other in (("mlp", "gelu", "relu"), ("swiglu", "silu", "gelu")):
    variables = init(make_block(num_heads=4, mlp_dim=32, ffn=ffn), x)
    run = lambda **kw: apply(make_block(num_heads=4, mlp_dim=32, ffn=ffn, **kw), variables, x)
    np.testing.assert_array_equal(run(), run(activation=default))
    assert not np.allclose(run(), run(activation=other))


def test_block_dropout_only_when_training():
  module = make_block(num_heads=4, mlp_dim=64, dropout_rate=0.3)
  x = rand((B, T, E))
  variables = init(module, x)
  det = apply(module, variables, x)
  np.testing.assert_allclose(det, apply(make_block(num_heads=4, mlp_dim=64), variables, x))
  train = apply(module, variables, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  assert not np.allclose(train, det)


@pytest.mark.parametrize("kw, with_context, match", [
    (dict(cross_attention=True), False, "cross_attention=True"),
    (dict(), True, "cross_attention=False"),
    (dict(ffn="dense"), False, "ffn=.dense."),
    (dict(norm="batchnorm"), False, "norm='batchnorm'"),
    (dict(activation="tanh"), False, "activation='tanh'"),
])
def test_block_bad_config_raises(kw, with_context, match):
  x = rand((1, 5, E))
  args = (x, rand((1, 3, E))) if with_context else (x,)
  with pytest.raises(ValueError, match=match):
    make_block(num_heads=4, mlp_dim=32, **kw).init(jax.random.key(0), *args)
