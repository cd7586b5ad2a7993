"""Norms, MLPs, embeddings and AdditiveAttention against float64 NumPy references.

Every layer is initialised, its parameters are replaced by random values (so that zero biases
or unit scales cannot hide a bug), and `apply` outputs and gradients (w.r.t. the input and
parameters) are compared with a NumPy float64 implementation written from the parameters.
"""

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from jaxformer.layers import (AdditiveAttention, Embed, LayerNorm, LearnedPositionEmbedding,
                              Mlp, PatchEmbed, RMSNorm, SwiGLU, make_norm)
from tests.arrays import rand
from tests.gradcheck import numeric_grad
from tests.np_reference import ACT_NP, layernorm_np, rmsnorm_np

B, T, E = 3, 37, 48
VAL_TOL = dict(rtol=1e-5, atol=1e-5)
GRAD_TOL = dict(rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- helpers

def init_params(model, *args, seed=0, **kwargs):
  """(raw params with random values, boxed variables from init at its shapes: init traced,
  not compiled, as its values are replaced)."""
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(seed), *args, **kwargs))
  params = nn.unbox(variables)["params"]
  return randomize(params, seed + 1), variables


def randomize(params, seed, scale=0.5):
  """Replace every parameter by N(0, scale^2) values; kernels by N(0, 1/fan_in)."""
  rng = np.random.default_rng(seed)
  flat = traverse_util.flatten_dict(params)
  out = {}
  for path, leaf in flat.items():
    shape = np.shape(leaf)
    if path[-1] == "kernel":
      std = 1.0 / math.sqrt(max(1, int(np.prod(shape[:-1]))))
    elif path[-1] == "scale":
      out[path] = jnp.asarray(1.0 + scale * rng.normal(size=shape), jnp.float32)
      continue
    else:
      std = scale
    out[path] = jnp.asarray(std * rng.normal(size=shape), jnp.float32)
  return traverse_util.unflatten_dict(out)


def np_params(params):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), params)


def replace_leaf(params, path, value):
  flat = traverse_util.flatten_dict(params)
  assert path in flat, (path, list(flat))
  flat = dict(flat)
  flat[path] = value
  return traverse_util.unflatten_dict(flat)


def compare_grad(g, np_loss, x, *, num=12, tol=GRAD_TOL):
  """A JAX gradient `g` of x at `num` random entries vs central differences of np_loss."""
  idx, ng = numeric_grad(np_loss, np.asarray(x, np.float64), num=num)
  np.testing.assert_allclose(np.asarray(g).ravel()[idx], ng, **tol)


def check_grads(fn, np_fn, params, args, ct, param_paths=()):
  """Gradients of sum(fn(params, *args) * ct) w.r.t. every float arg and the parameters at
  `param_paths`, from one jitted jax.grad, vs numeric_grad of the float64 reference
  np_fn(float64 params, *args). Returns (param grads, grads of the float args)."""
  args = [np.asarray(a) for a in args]
  float_idx = [i for i, a in enumerate(args) if np.issubdtype(a.dtype, np.floating)]

  def loss(p, *a):
    return jnp.sum(fn(p, *a) * ct)

  grads = jax.jit(jax.grad(loss, argnums=(0, *[i + 1 for i in float_idx])))(
      params, *[jnp.asarray(a) for a in args])
  chex.assert_tree_all_finite(grads)
  gparams, gargs = grads[0], grads[1:]
  pn = np_params(params)
  np_args = [a.astype(np.float64) if i in float_idx else a for i, a in enumerate(args)]
  for i, g in zip(float_idx, gargs):
    def np_loss(xi, i=i):
      a = list(np_args)
      a[i] = xi
      return np.sum(np_fn(pn, *a) * ct)
    compare_grad(g, np_loss, np_args[i])
  flat_g, flat_p = traverse_util.flatten_dict(gparams), traverse_util.flatten_dict(params)
  for path in param_paths:
    def np_loss(v, path=path):
      return np.sum(np_fn(np_params(replace_leaf(params, path, v)), *np_args) * ct)
    compare_grad(flat_g[path], np_loss, flat_p[path])
  return gparams, gargs


def _jit_apply(model, params, *args, **kwargs):
  """model.apply({"params": params}, *args, **kwargs) as one program (eager, each op compiles
  on its own)."""
  return jax.jit(lambda p, *a: model.apply({"params": p}, *a, **kwargs))(params, *args)


def applier(model, **kwargs):
  return lambda p, *a: model.apply({"params": p}, *a, **kwargs)


def specs(variables):
  return traverse_util.flatten_dict(nn.get_partition_spec(variables)["params"])


# ----------------------------------------------------------------------------- norms

NORM_CASES = {
    "layernorm": (LayerNorm(epsilon=1e-5), layernorm_np, ("scale", "bias")),
    "layernorm_nobias": (LayerNorm(epsilon=1e-3, use_bias=False),
                         lambda p, x: layernorm_np(p, x, 1e-3, False), ("scale",)),
    "rmsnorm": (RMSNorm(epsilon=1e-6), rmsnorm_np, ("scale",)),
}


@pytest.mark.parametrize("name", sorted(NORM_CASES))
def test_norm_values_and_grads(name):
  model, ref, param_names = NORM_CASES[name]
  x = rand((B, T, E), 0, scale=2.0) + 0.7             # non-zero mean matters for LayerNorm
  ct = rand((B, T, E), 1)
  params, variables = init_params(model, jnp.asarray(x))
  assert sorted(params) == sorted(param_names)
  for n in param_names:
    chex.assert_shape(params[n], (E,))
    assert specs(variables)[(n,)] == P("embed")
  out = _jit_apply(model, params, jnp.asarray(x))
  chex.assert_shape(out, (B, T, E))
  np.testing.assert_allclose(np.asarray(out), ref(np_params(params), x), **VAL_TOL)

  check_grads(applier(model), ref, params, [x], ct, [(n,) for n in param_names])


def test_norm_default_init_and_dtype():
  x = jnp.asarray(rand((2, 5, 8), 0))
  v = nn.unbox(LayerNorm().init(jax.random.PRNGKey(0), x))["params"]
  np.testing.assert_array_equal(np.asarray(v["scale"]), 1.0)
  np.testing.assert_array_equal(np.asarray(v["bias"]), 0.0)
  out = LayerNorm(dtype=jnp.bfloat16).apply({"params": v}, x.astype(jnp.bfloat16))
  assert out.dtype == jnp.bfloat16
  out = RMSNorm(dtype=jnp.bfloat16).apply({"params": {"scale": v["scale"]}}, x)
  assert out.dtype == jnp.bfloat16


def test_make_norm():
  ln = make_norm("layernorm", epsilon=1e-3, name="ln")
  assert isinstance(ln, LayerNorm) and ln.epsilon == 1e-3 and ln.name == "ln"
  rms = make_norm("rmsnorm", epsilon=1e-6, dtype=jnp.bfloat16)
  assert isinstance(rms, RMSNorm) and rms.dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="norm="):
    make_norm("batchnorm", epsilon=1e-5)


# ----------------------------------------------------------------------------- MLPs

def dense_np(p, x):
  y = np.asarray(x, np.float64) @ p["kernel"]
  return y + p["bias"] if "bias" in p else y


def mlp_np(p, x, activation):
  return dense_np(p["wo"], ACT_NP[activation](dense_np(p["wi"], x)))


def swiglu_np(p, x, activation):
  h = ACT_NP[activation](dense_np(p["wi_gate"], x)) * dense_np(p["wi_up"], x)
  return dense_np(p["wo"], h)


@pytest.mark.parametrize("activation", sorted(ACT_NP))
def test_mlp_values_and_grads(activation):
  hidden, out_dim = 40, 24
  model = Mlp(hidden_dim=hidden, out_dim=out_dim, activation=activation)
  x = rand((B, T, E), 0)
  ct = rand((B, T, out_dim), 1)
  params, _ = init_params(model, jnp.asarray(x))
  chex.assert_shape(params["wi"]["kernel"], (E, hidden))
  chex.assert_shape(params["wo"]["kernel"], (hidden, out_dim))
  ref = lambda p, xn: mlp_np(p, xn, activation)
  out = _jit_apply(model, params, jnp.asarray(x))
  chex.assert_shape(out, (B, T, out_dim))
  np.testing.assert_allclose(np.asarray(out), ref(np_params(params), x), **VAL_TOL)

  check_grads(applier(model), ref, params, [x], ct,
              [("wi", "kernel"), ("wi", "bias"), ("wo", "kernel"), ("wo", "bias")])


def test_mlp_partitioning_defaults_and_no_bias():
  x = jnp.asarray(rand((B, T, E), 0))
  variables = Mlp(hidden_dim=40).init(jax.random.PRNGKey(0), x)
  s = specs(variables)
  assert s[("wi", "kernel")] == P("embed", "mlp")
  assert s[("wi", "bias")] == P("mlp")
  assert s[("wo", "kernel")] == P("mlp", "embed")
  assert s[("wo", "bias")] == P("embed")
  # out_dim defaults to the input width.
  out = Mlp(hidden_dim=40).apply(variables, x)
  chex.assert_shape(out, (B, T, E))
  # use_bias=False: kernels only.
  nb = nn.unbox(Mlp(hidden_dim=40, use_bias=False).init(jax.random.PRNGKey(0), x))["params"]
  assert set(traverse_util.flatten_dict(nb)) == {("wi", "kernel"), ("wo", "kernel")}


def test_mlp_dropout():
  x = jnp.asarray(rand((2, 5, 16), 0))
  model = Mlp(hidden_dim=64, dropout_rate=0.5)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), x)
  ref = jax.jit(Mlp(hidden_dim=64).apply)(variables, x)
  chex.assert_trees_all_close(jax.jit(model.apply)(variables, x), ref)  # deterministic default
  train = jax.jit(lambda v, xx, r: model.apply(v, xx, deterministic=False,
                                               rngs={"dropout": r}))(
      variables, x, jax.random.PRNGKey(1))
  chex.assert_tree_all_finite(train)
  assert not np.allclose(np.asarray(train), np.asarray(ref))


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("use_bias", [False, True])
def test_swiglu_values_and_grads(activation, use_bias):
  hidden = 40
  model = SwiGLU(hidden_dim=hidden, activation=activation, use_bias=use_bias)
  x = rand((B, T, E), 0)
  ct = rand((B, T, E), 1)
  params, variables = init_params(model, jnp.asarray(x))
  s = specs(variables)
  assert s[("wi_gate", "kernel")] == P("embed", "mlp")
  assert s[("wi_up", "kernel")] == P("embed", "mlp")
  assert s[("wo", "kernel")] == P("mlp", "embed")
  assert ("wo", "bias") in s if use_bias else ("wo", "bias") not in s
  ref = lambda p, xn: swiglu_np(p, xn, activation)
  out = _jit_apply(model, params, jnp.asarray(x))
  chex.assert_shape(out, (B, T, E))
  np.testing.assert_allclose(np.asarray(out), ref(np_params(params), x), **VAL_TOL)
  check_grads(applier(model), ref, params, [x], ct,
              [("wi_gate", "kernel"), ("wi_up", "kernel"), ("wo", "kernel")])


@pytest.mark.parametrize("cls", [Mlp, SwiGLU])
def test_unknown_activation_raises(cls):
  with pytest.raises(ValueError, match="activation="):
    cls(hidden_dim=8, activation="tanh").init(jax.random.PRNGKey(0), jnp.zeros((1, 2, 4)))


# ----------------------------------------------------------------------------- embeddings

VOCAB = 11


def _embed_setup():
  model = Embed(num_embeddings=VOCAB, features=E)
  ids = np.random.default_rng(0).integers(0, VOCAB, size=(B, T)).astype(np.int32)
  params, variables = init_params(model, jnp.asarray(ids))
  return model, ids, params, variables


def test_embed_lookup_values_grads_and_spec():
  model, ids, params, variables = _embed_setup()
  assert specs(variables)[("embedding",)] == P("vocab", "embed")
  chex.assert_shape(params["embedding"], (VOCAB, E))
  out = _jit_apply(model, params, jnp.asarray(ids))
  chex.assert_shape(out, (B, T, E))
  table = np.asarray(params["embedding"])
  np.testing.assert_array_equal(np.asarray(out), table[ids])
  # Gradient w.r.t. the table: scatter-add of the cotangent.
  ct = rand((B, T, E), 1)
  gparams, _ = check_grads(applier(model), lambda p, i: p["embedding"][i], params, [ids], ct,
                           [("embedding",)])
  expected = np.zeros((VOCAB, E))
  np.add.at(expected, ids, ct)
  np.testing.assert_allclose(np.asarray(gparams["embedding"]), expected, rtol=1e-5, atol=1e-5)


def test_embed_rejects_float_ids():
  model, ids, params, _ = _embed_setup()
  with pytest.raises(ValueError, match="integers"):
    model.apply({"params": params}, jnp.asarray(ids, jnp.float32))


def test_embed_attend_values_and_grads():
  model, _, params, _ = _embed_setup()
  x = rand((B, T, E), 2)
  ct = rand((B, T, VOCAB), 3)
  logits = _jit_apply(model, params, jnp.asarray(x), method=Embed.attend)
  chex.assert_shape(logits, (B, T, VOCAB))
  ref = lambda p, xn: np.asarray(xn, np.float64) @ p["embedding"].T
  np.testing.assert_allclose(np.asarray(logits), ref(np_params(params), x), **VAL_TOL)
  check_grads(applier(model, method="attend"), ref, params, [x], ct, [("embedding",)])


@pytest.mark.parametrize("pos_kind", ["1d", "2d"])
def test_learned_position_embedding(pos_kind):
  max_len = 64
  model = LearnedPositionEmbedding(max_length=max_len, features=E)
  if pos_kind == "1d":
    positions = np.arange(T, dtype=np.int32)
  else:
    positions = (np.random.default_rng(0).integers(0, max_len - T, size=(B, 1))
                 + np.arange(T)[None]).astype(np.int32)
  params, variables = init_params(model, jnp.asarray(positions))
  assert specs(variables)[("embedding",)] == P(None, "embed")
  chex.assert_shape(params["embedding"], (max_len, E))
  out = _jit_apply(model, params, jnp.asarray(positions))
  chex.assert_shape(out, positions.shape + (E,))
  np.testing.assert_array_equal(np.asarray(out), np.asarray(params["embedding"])[positions])
  ct = rand(positions.shape + (E,), 1)
  check_grads(applier(model), lambda p, pos: p["embedding"][pos], params, [positions], ct,
              [("embedding",)])


def test_learned_position_embedding_too_long_raises():
  model = LearnedPositionEmbedding(max_length=16, features=8)
  with pytest.raises(ValueError, match="max_length"):
    model.init(jax.random.PRNGKey(0), jnp.arange(17))
  variables = model.init(jax.random.PRNGKey(0), jnp.arange(16))
  with pytest.raises(ValueError, match="max_length"):
    model.apply(variables, jnp.zeros((2, 17), jnp.int32))


def patch_embed_np(p, images, ph, pw):
  images = np.asarray(images, np.float64)
  b, h, w, c = images.shape
  patches = images.reshape(b, h // ph, ph, w // pw, pw, c).transpose(0, 1, 3, 2, 4, 5)
  patches = patches.reshape(b, (h // ph) * (w // pw), ph * pw * c)
  kernel = p["proj"]["kernel"]                                   # [ph, pw, C, E]
  return patches @ kernel.reshape(ph * pw * c, -1) + p["proj"]["bias"]


@pytest.mark.parametrize("patch", [4, (4, 5)])
def test_patch_embed_values_grads_and_spec(patch):
  ph, pw = (patch, patch) if isinstance(patch, int) else patch
  feats, c = 24, 3
  images = rand((B, 12, 20, c), 0)
  model = PatchEmbed(patch_size=patch, features=feats)
  params, variables = init_params(model, jnp.asarray(images))
  s = specs(variables)
  assert s[("proj", "kernel")] == P(None, None, None, "embed")
  assert s[("proj", "bias")] == P("embed")
  chex.assert_shape(params["proj"]["kernel"], (ph, pw, c, feats))
  n = (12 // ph) * (20 // pw)
  out = _jit_apply(model, params, jnp.asarray(images))
  chex.assert_shape(out, (B, n, feats))
  ref = lambda p, im: patch_embed_np(p, im, ph, pw)
  np.testing.assert_allclose(np.asarray(out), ref(np_params(params), images), **VAL_TOL)
  ct = rand((B, n, feats), 1)
  check_grads(applier(model), ref, params, [images], ct, [("proj", "kernel"), ("proj", "bias")])


def test_patch_embed_errors():
  model = PatchEmbed(patch_size=4, features=8)
  with pytest.raises(ValueError, match="divisible"):
    model.init(jax.random.PRNGKey(0), jnp.zeros((1, 13, 20, 3)))
  with pytest.raises(ValueError, match="divisible"):
    PatchEmbed(patch_size=(4, 6), features=8).init(jax.random.PRNGKey(0),
                                                   jnp.zeros((1, 12, 20, 3)))
  with pytest.raises(ValueError):
    model.init(jax.random.PRNGKey(0), jnp.zeros((12, 20, 3)))


# ----------------------------------------------------------------------------- AdditiveAttention

def masked_softmax_np(scores, mask):
  scores = np.asarray(scores, np.float64)
  if mask is not None:
    mask = np.broadcast_to(mask, scores.shape)
    scores = np.where(mask, scores, -np.inf)
  m = np.max(scores, -1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  e = np.exp(scores - m)
  d = e.sum(-1, keepdims=True)
  return e / np.where(d == 0, 1.0, d)


def additive_np(p, query, keys, values=None, mask=None):
  """Bahdanau: score = v^T tanh(W_q q + W_k k + b); the layer's v is `energy`, b is key/bias."""
  query = np.asarray(query, np.float64)
  keys = np.asarray(keys, np.float64)
  values = keys if values is None else np.asarray(values, np.float64)
  wq = query @ p["query"]["kernel"]                          # [B, Tq, A] (no bias)
  wk = keys @ p["key"]["kernel"] + p["key"]["bias"]          # [B, Tk, A]
  energy = np.tanh(wq[:, :, None, :] + wk[:, None, :, :])    # [B, Tq, Tk, A]
  scores = (energy @ p["energy"]["kernel"])[..., 0]          # [B, Tq, Tk]
  weights = masked_softmax_np(scores, mask)
  return weights @ values, weights


TQ, TK, DQ, DK, DV, HID = 5, 37, 24, 48, 20, 32


def _additive_setup(seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, TQ, DQ)).astype(np.float32)
  k = rng.normal(size=(B, TK, DK)).astype(np.float32)
  v = rng.normal(size=(B, TK, DV)).astype(np.float32)
  model = AdditiveAttention(hidden_dim=HID)
  params, variables = init_params(model, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
  return model, params, variables, q, k, v


def test_additive_attention_params():
  _, params, variables, *_ = _additive_setup()
  flat = {path: np.shape(a) for path, a in traverse_util.flatten_dict(params).items()}
  assert flat == {("query", "kernel"): (DQ, HID), ("key", "kernel"): (DK, HID),
                  ("key", "bias"): (HID,), ("energy", "kernel"): (HID, 1)}
  s = specs(variables)
  assert s[("query", "kernel")] == P("embed", "mlp")
  assert s[("energy", "kernel")] == P("mlp", None)


def _mask(seed=3):
  mask = np.random.default_rng(seed).random((B, TQ, TK)) > 0.4
  mask[:, :, 0] = True                          # every row sees something
  return mask


@pytest.mark.parametrize("masked", [False, True])
def test_additive_attention_values_and_grads(masked):
  model, params, _, q, k, v = _additive_setup()
  mask = _mask() if masked else None
  jmask = None if mask is None else jnp.asarray(mask)
  ctx, w = _jit_apply(model, params, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                       mask=jmask)
  chex.assert_shape([ctx, w], [(B, TQ, DV), (B, TQ, TK)])
  ref_ctx, ref_w = additive_np(np_params(params), q, k, v, mask)
  np.testing.assert_allclose(np.asarray(w), ref_w, **VAL_TOL)
  np.testing.assert_allclose(np.asarray(ctx), ref_ctx, **VAL_TOL)
  np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5)
  if masked:
    assert np.all(np.asarray(w)[~mask] == 0.0)

  # Gradients of the context w.r.t. query, keys, values and the parameters.
  ct = rand((B, TQ, DV), 7)
  check_grads(lambda p, *a: model.apply({"params": p}, *a, mask=jmask)[0],
              lambda p, *a: additive_np(p, *a, mask=mask)[0], params, [q, k, v], ct,
              [("energy", "kernel"), ("key", "bias"), ("key", "kernel"), ("query", "kernel")])
  # ... and of the weights (which the caller may use, e.g. for coverage / plots).
  ct_w = rand((B, TQ, TK), 8)
  check_grads(lambda p, *a: model.apply({"params": p}, *a, mask=jmask)[1],
              lambda p, *a: additive_np(p, *a, mask=mask)[1], params, [q, k, v], ct_w,
              [("energy", "kernel")])


def test_additive_attention_values_default_to_keys():
  model, params, _, q, k, _ = _additive_setup()
  ctx, w = _jit_apply(model, params, jnp.asarray(q), jnp.asarray(k))
  chex.assert_shape(ctx, (B, TQ, DK))
  ref_ctx, ref_w = additive_np(np_params(params), q, k)
  np.testing.assert_allclose(np.asarray(ctx), ref_ctx, **VAL_TOL)
  np.testing.assert_allclose(np.asarray(w), ref_w, **VAL_TOL)


def test_additive_attention_empty_row_gives_zeros_and_finite_grads():
  model, params, _, q, k, v = _additive_setup()
  mask = _mask()
  mask[1, 2, :] = False                         # query 2 of batch 1 sees nothing
  mask[0, :, 5] = False                         # key 5 of batch 0 is padding
  jmask = jnp.asarray(mask)
  ctx, w = _jit_apply(model, params, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                       mask=jmask)
  chex.assert_tree_all_finite((ctx, w))
  np.testing.assert_array_equal(np.asarray(ctx)[1, 2], 0.0)
  np.testing.assert_array_equal(np.asarray(w)[1, 2], 0.0)
  ref_ctx, ref_w = additive_np(np_params(params), q, k, v, mask)
  np.testing.assert_allclose(np.asarray(ctx), ref_ctx, **VAL_TOL)
  np.testing.assert_allclose(np.asarray(w), ref_w, **VAL_TOL)

  ct = rand((B, TQ, DV), 7)

  # Finite gradients (check_grads asserts it) that match the reference, exact zeros for the
  # empty query row and for the padded key / value.
  gparams, (gq, gk, gv) = check_grads(
      lambda p, *a: model.apply({"params": p}, *a, mask=jmask)[0],
      lambda p, *a: additive_np(p, *a, mask=mask)[0], params, [q, k, v], ct,
      [("energy", "kernel"), ("key", "bias")])
  np.testing.assert_array_equal(np.asarray(gq)[1, 2], 0.0)
  np.testing.assert_array_equal(np.asarray(gv)[0, 5], 0.0)
  np.testing.assert_array_equal(np.asarray(gk)[0, 5], 0.0)
  # Also finite through the weights output (squared, so the empty row is differentiated).
  g_w = jax.jit(jax.grad(lambda p: jnp.sum(model.apply({"params": p}, jnp.asarray(q), jnp.asarray(k),
                                               jnp.asarray(v), mask=jmask)[1] ** 2)))(params)
  chex.assert_tree_all_finite(g_w)


def test_additive_attention_single_query_step():
  """RNN-decoder use: one query step at a time equals the rows of a full Tq call."""
  model, params, _, q, k, v = _additive_setup()
  key_mask = np.ones((B, 1, TK), bool)
  key_mask[0, 0, 30:] = False                   # padded keys, broadcast over queries
  jmask = jnp.asarray(key_mask)
  full_ctx, full_w = _jit_apply(model, params, jnp.asarray(q), jnp.asarray(k),
                                 jnp.asarray(v), mask=jmask)
  step = jax.jit(lambda qt: model.apply({"params": params}, qt, jnp.asarray(k),
                                        jnp.asarray(v), mask=jmask))
  for t in range(TQ):
    ctx, w = step(jnp.asarray(q[:, t:t + 1]))
    chex.assert_shape([ctx, w], [(B, 1, DV), (B, 1, TK)])
    chex.assert_trees_all_close((ctx, w), (full_ctx[:, t:t + 1], full_w[:, t:t + 1]),
                                rtol=1e-5, atol=1e-6)
  ref_ctx, _ = additive_np(np_params(params), q[:, :1], k, v, key_mask)
  np.testing.assert_allclose(np.asarray(step(jnp.asarray(q[:, :1]))[0]), ref_ctx, **VAL_TOL)
  assert np.all(np.asarray(full_w)[0, :, 30:] == 0.0)


def test_additive_attention_shape_errors():
  model, params, _, q, k, v = _additive_setup()
  with pytest.raises(ValueError):
    model.apply({"params": params}, jnp.asarray(q[0]), jnp.asarray(k), jnp.asarray(v))
  with pytest.raises(ValueError):
    model.apply({"params": params}, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v[:, :-1]))
