"""`model.head_gates` (a learned scalar per head on its q.k logits) against a float64 NumPy
reference, and the head tools of `jaxformer.models.heads`: pruning, dropping layers, Michel et
al.'s importance, folding gates into the query projection."""

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import shakespeare_char
from jaxformer import models
from jaxformer.layers import MultiHeadAttention
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models import heads
from tests import attention_reference as ref
from tests.arrays import rand

B, T, E = 2, 11, 30        # odd shapes: head_dim 5 with 6 heads


def _params(module, x, seed=0):
  """Every param random (gates too: ones would hide a missing multiply), drawn from the
  shapes of the init (traced, not run)."""
  variables = nn.unbox(jax.eval_shape(module.init, jax.random.key(seed), x))
  leaves, tree = jax.tree.flatten(variables["params"])
  rng = np.random.default_rng(seed + 1)
  leaves = [(rng.normal(size=a.shape) * 0.4).astype(np.float32) for a in leaves]
  return jax.tree.unflatten(tree, leaves)


def np_gated_mha(p, x, *, num_heads, num_kv_heads, mask, causal):
  """(out [B, T, E], dq-free pieces) of gated attention in float64: q_h times gate_h."""
  x = np.asarray(x, np.float64)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  if "qkv" in p:
    qkv = np.einsum("bte,ezhd->btzhd", x, p["qkv"]["kernel"])
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  else:
    q = np.einsum("bte,ehd->bthd", x, p["query"]["kernel"])
    kv = np.einsum("bte,ezhd->btzhd", x, p["kv"]["kernel"])
    k, v = kv[:, :, 0], kv[:, :, 1]
  qg = q * p["head_gates"][:, None]
  o, _ = ref.attention(qg, k, v, mask=mask, causal=causal)
  return np.einsum("bthd,hde->bte", o, p["out"]["kernel"]), (q, qg, k, v)


LAYER_CASES = {
    "mha_fused": dict(num_heads=6, causal=True),
    "gqa_6_2": dict(num_heads=6, num_kv_heads=2, causal=False),
}


@pytest.mark.parametrize("name, impl", [("mha_fused", "xla"), ("gqa_6_2", "xla"),
                                        ("mha_fused", "blocked"), ("gqa_6_2", "pallas")])
def test_gated_attention_matches_float64_values_and_gate_grads(name, impl):
  cfg = LAYER_CASES[name]
  module = MultiHeadAttention(head_gates=True, impl=impl,
                              block_sizes=(4, 4) if impl != "xla" else None, **cfg)
  x = rand((B, T, E))
  p = _params(MultiHeadAttention(head_gates=True, **cfg), x)
  mask = np.random.default_rng(3).random((B, 1, T, T)) > 0.3
  mask[:, :, 4] = False                                   # a row that sees nothing
  kw = dict(num_heads=cfg["num_heads"], num_kv_heads=cfg.get("num_kv_heads"), mask=mask,
            causal=cfg["causal"])
  want, (q, qg, k, v) = np_gated_mha(p, x, **kw)
  # jitted: one compile each instead of an eager compile per op
  out = jax.jit(lambda pp: module.apply({"params": pp}, x, mask=mask))(p)
  np.testing.assert_allclose(out, want, atol=2e-4, rtol=2e-4)

  ct = rand((B, T, E), seed=7)
  grads = jax.jit(jax.grad(lambda pp: jnp.sum(module.apply({"params": pp}, x, mask=mask) * ct)))(
      p)
  d_o = np.einsum("bte,hde->bthd", np.asarray(ct, np.float64),
                  np.asarray(p["out"]["kernel"], np.float64))
  dqg, _, _, _ = ref.attention_grads(qg, k, v, d_o, mask=mask, causal=cfg["causal"])
  want_dgate = np.einsum("bthd,bthd->h", dqg, q)          # d/d gate_h of (gate_h q_h) . k
  np.testing.assert_allclose(grads["head_gates"], want_dgate, atol=2e-3, rtol=2e-3)
  assert np.all(np.abs(want_dgate) > 1e-3)                # the check can fail


def _tiny(**kw):
  cfg = shakespeare_char.get_config("tiny").model
  cfg.update(dict(d_model=24, num_heads=3, mlp_dim=32, num_layers=2, max_len=16), **kw)
  return cfg


def _model_params(cfg, seed=0):
  """The model and its init's params (a fresh copy of the tree); each config's init jitted
  (one compile, not one per op) and run once in this file."""
  module, params = _init(cfg.to_json(), seed)
  return module, jax.tree.map(lambda a: a, params)


@functools.cache
def _init(cfg_json, seed):
  module = models.build(json.loads(cfg_json))
  tokens = jnp.zeros((1, 8), jnp.int32)
  return module, nn.unbox(jax.jit(module.init)(jax.random.key(seed), tokens))["params"]


def _logits(module, params, tokens):
  return jax.jit(lambda p, t: module.apply({"params": p}, t))(params, tokens)


def _tokens(n=9, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 65, (2, n)), jnp.int32)


def test_gates_at_init_are_an_exact_no_op():
  gated, p_gated = _model_params(_tiny(head_gates=True))
  plain, p_plain = _model_params(_tiny(head_gates=False))
  flat = heads._flat(p_gated)
  gate_keys = [k for k in flat if k[-1] == "head_gates"]
  assert len(gate_keys) == 2 and all(np.all(flat[k] == 1.0) for k in gate_keys)
  # everything else is initialised identically, and the logits are bit for bit the same
  rest = {k: v for k, v in flat.items() if k[-1] != "head_gates"}
  assert jax.tree.all(jax.tree.map(np.array_equal, rest, heads._flat(p_plain)))
  tokens = _tokens()
  np.testing.assert_array_equal(_logits(gated, p_gated, tokens), _logits(plain, p_plain, tokens))


@pytest.mark.parametrize("scan", [False, True])
def test_fold_gates_gives_the_same_logits_without_gates(scan):
  cfg = _tiny(head_gates=True, num_kv_heads=1 if scan else None, positions="rope",
              qkv_bias=True, scan_layers=scan)
  module, p = _model_params(cfg)
  p = jax.tree.map(lambda a: a + 0.3 * rand(a.shape, seed=a.size), p)   # gates off 1 too
  folded_cfg, folded = heads.fold_gates(cfg, p)
  assert folded_cfg["head_gates"] is False and cfg.head_gates is True
  tokens = _tokens()
  np.testing.assert_allclose(_logits(models.build(folded_cfg), folded, tokens),
                             _logits(module, p, tokens), atol=2e-5, rtol=2e-5)


def test_kv_cache_decoding_with_gates_equals_full_forward():
  cfg = _tiny(head_gates=True)
  module, p = _model_params(cfg)
  p = jax.tree.map(lambda a: a + 0.3 * rand(a.shape, seed=a.size), p)
  tokens = _tokens(n=7)
  want = _logits(module, p, tokens)
  dec = models.build({**cfg.to_dict(), "decode": True})
  cache = jax.eval_shape(lambda: dec.init(jax.random.key(0), jnp.zeros((2, 16), jnp.int32),
                                          positions=jnp.arange(16)[None])["cache"])
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache)     # init's: all zeros
  step = jax.jit(lambda cache, tok, pos: dec.apply({"params": p, "cache": cache}, tok,
                                                   positions=pos, mutable=["cache"]))
  out, mutated = step(cache, tokens[:, :3], jnp.arange(3)[None])
  outs = [out]
  for t in range(3, 7):
    out, mutated = step(mutated["cache"], tokens[:, t:t + 1], jnp.array([[t]]))
    outs.append(out)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, atol=2e-5, rtol=2e-5)


def _np_layer_heads_out(p, x, drop):
  """float64: one unscanned MHA (fused qkv) with the heads in `drop` contributing nothing."""
  x = np.asarray(x, np.float64)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  qkv = np.einsum("bte,ezhd->btzhd", x, p["qkv"]["kernel"])
  o, _ = ref.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
  o[:, :, list(drop)] = 0
  return np.einsum("bthd,hde->bte", o, p["out"]["kernel"])


def test_prune_heads_zeroes_exactly_the_heads_outputs():
  module = MultiHeadAttention(num_heads=6, causal=True)
  x = rand((B, T, E))
  p = _params(module, x)
  tree = {"layers_0": {"self_attention": p}}
  keep = np.ones((1, 6), bool)
  keep[0, [1, 4]] = False
  pruned = heads.prune_heads(tree, keep)["layers_0"]["self_attention"]
  np.testing.assert_allclose(jax.jit(lambda q: module.apply({"params": q}, x))(pruned),
                             _np_layer_heads_out(p, x, [1, 4]), atol=1e-4, rtol=1e-4)
  assert np.all(np.asarray(p["out"]["kernel"][1]) != 0)        # the input is not modified


def test_drop_whole_block_equals_the_model_without_that_layer():
  cfg = _tiny(use_bias=True)
  module, p = _model_params(cfg)
  p = jax.tree.map(lambda a: a + 0.2 * rand(a.shape, seed=a.size), p)
  dropped = heads.drop_layers(p, np.array([True, False]), whole_block=True)
  one = models.build({**cfg.to_dict(), "num_layers": 1})
  p_one = {k: v for k, v in p.items() if k != "decoder"}
  p_one["decoder"] = {k: v for k, v in p["decoder"].items() if k != "layers_1"}
  tokens = _tokens()
  np.testing.assert_allclose(_logits(module, dropped, tokens), _logits(one, p_one, tokens),
                             atol=1e-5, rtol=1e-5)
  # attention only: all heads plus the output bias of layer 1 go, its FFN stays
  attn = heads.drop_layers(p, np.array([True, False]))
  sa = attn["decoder"]["layers_1"]["block"]["self_attention"]["out"]
  assert not np.any(sa["kernel"]) and not np.any(sa["bias"])
  assert np.any(attn["decoder"]["layers_1"]["block"]["ffn"]["wo"]["kernel"])


def test_head_importance_is_the_derivative_of_a_head_output_mask():
  cfg = _tiny(scan_layers=True)
  module, p = _model_params(cfg)
  batches = [_tokens(seed=s) for s in range(2)]

  def loss(params, tokens):
    logits = module.apply({"params": params}, tokens[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

  got = heads.head_importance(loss, p, batches, normalize=False)
  assert got.shape == (2, 3)

  def masked_loss(xi, tokens):      # xi [L, H] on each head's output, through out/kernel
    q = jax.tree.map(lambda a: a, p)
    sa = q["decoder"]["layers"]["block"]["self_attention"]
    sa["out"] = {"kernel": sa["out"]["kernel"] * xi[:, :, None, None]}
    return loss(q, tokens)
  d_xi = jax.jit(jax.grad(masked_loss))
  want = np.mean([np.abs(d_xi(jnp.ones((2, 3)), t)) for t in batches], 0)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  normed = heads.head_importance(loss, p, batches)
  np.testing.assert_allclose(np.linalg.norm(normed, axis=1), 1.0, rtol=1e-6)


def test_keep_lowest_removed_and_gates():
  scores = np.array([[3.0, 1.0, 2.0], [0.5, 5.0, 4.0]])
  np.testing.assert_array_equal(heads.keep_lowest_removed(scores, 0.5),
                                [[True, False, False], [False, True, True]])
  assert heads.keep_lowest_removed(scores, 0.0).all()
  assert not heads.keep_lowest_removed(scores, 1.0).any()
  _, p = _model_params(_tiny(head_gates=True, scan_layers=True))
  np.testing.assert_array_equal(heads.gates(p), np.ones((2, 3)))
  assert heads.num_heads(p) == (2, 3)


@pytest.mark.parametrize("call, match", [
    (lambda: BlockSettings(num_heads=2, mlp_dim=4, head_gates="yes"),
     "model.head_gates='yes' must be True or False"),
    (lambda: MultiHeadAttention(num_heads=2, head_gates=True, positions="disentangled").init(
        jax.random.key(0), jnp.zeros((1, 3, 4)), rel_embeddings=jnp.zeros((5, 4))),
     "model.head_gates=True multiplies"),
    (lambda: heads.gates(_model_params(_tiny())[1]), "params have no head_gates"),
    (lambda: heads.prune_heads(_model_params(_tiny())[1], np.ones((2, 2), bool)),
     r"keep must be a bool array of shape \(2, 3\)"),
    (lambda: heads.keep_lowest_removed(np.ones((2, 3)), 1.5), "fraction=1.5"),
])
def test_mistakes_are_named(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_hf_save_refuses_gates_by_name_and_saves_once_folded(tmp_path):
  from jaxformer.convert import hf
  cfg = _tiny(head_gates=True)
  _, p = _model_params(cfg)
  with pytest.raises(ValueError, match="model.head_gates=True: Hugging Face .*fold_gates"):
    hf.save(cfg, p, str(tmp_path / "gated"))
  assert not (tmp_path / "gated").exists()
  hf.save(*heads.fold_gates(cfg, p), str(tmp_path / "folded"))
  assert (tmp_path / "folded" / "config.json").exists()
