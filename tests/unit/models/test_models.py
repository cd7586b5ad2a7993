"""Full models: scan/remat equivalence, decoding, masking/packing invariances, build errors."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import models
from jaxformer.models.stack import stack_layers
from jaxformer.models.vit import resize_pos_embed
from tests import drawn
from tests.gradcheck import numeric_grad
from tests.modules import make_moe

GPT = dict(family="decoder", vocab_size=61, d_model=32, num_layers=3, num_heads=4, mlp_dim=64,
           max_len=32)
LLAMA = dict(family="decoder", vocab_size=61, d_model=32, num_layers=3, num_heads=4,
             num_kv_heads=2, mlp_dim=48, positions="rope", norm="rmsnorm", ffn="swiglu",
             use_bias=False, tie_embeddings=False, window=5)
MIXTRAL = dict(LLAMA, num_experts=4, experts_per_token=2, window=None)
BERT = dict(family="bert", vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=64,
            max_len=32, dropout_rate=0.0, attention_dropout_rate=0.0)
SEQ2SEQ = dict(family="seq2seq", vocab_size=61, d_model=32, num_encoder_layers=2,
               num_decoder_layers=2, num_heads=4, mlp_dim=64, dropout_rate=0.0)
VIT = dict(family="vit", num_classes=7, patch_size=4, image_size=12, d_model=32, num_layers=2,
           num_heads=4, mlp_dim=64)


def tokens(b=2, t=12, seed=0, vocab=61):
  """Drawn on the host (jax.random would compile its generator for each shape)."""
  return jnp.asarray(np.random.default_rng(seed).integers(1, vocab, (b, t)), jnp.int32)


def inputs(cfg):
  if cfg["family"] == "seq2seq":
    return (tokens(t=9), tokens(t=7, seed=1))
  if cfg["family"] == "vit":
    return (np.random.default_rng(0).normal(size=(2, 12, 12, 3)).astype(np.float32),)
  return (tokens(),)


def init(cfg, *args):
  """The module and params drawn on the host at its init's shapes and dtypes (`jax.eval_shape`,
  nothing compiled; tests/drawn.py).
  These tests are of what a model computes, not of its init (each family's init runs in its
  trainings and test_registry); a compiled init costs more CPU than the programs a test is
  about, and its zero heads (ViT's logits are all 0) would make some comparisons vacuous."""
  module = models.build(cfg)
  return module, drawn.params(module, *args)


@functools.cache
def jit_apply(module, mutable=False):
  """module.apply as one compiled program, one per module: tests applying one model to the same
  shapes (the decoders at [2, 12]) share its compile."""
  return jax.jit(lambda variables, *args, **kw: module.apply(variables, *args, **kw,
                                                             mutable=mutable))


def _stack_all(params, cfg):
  """Unscanned -> scanned layout for every BlockStack in the model."""
  out = dict(params)
  for name in ("decoder", "encoder"):
    if name in out:
      n = {"decoder": cfg.get("num_decoder_layers", cfg.get("num_layers")),
           "encoder": cfg.get("num_encoder_layers", cfg.get("num_layers"))}[name]
      out[name] = stack_layers(out[name], n)
  return out


# GPT and Llama differ only inside the blocks, which the scan does not look into: Llama
# stands for both (the suite's time budget).
@pytest.mark.slow
@pytest.mark.parametrize("cfg", [LLAMA, MIXTRAL, BERT, SEQ2SEQ, VIT],
                         ids=["llama", "mixtral", "bert", "seq2seq", "vit"])
def test_scanned_layers_give_identical_outputs(cfg):
  args = inputs(cfg)
  module, params = init(cfg, *args)
  want = jit_apply(module)({"params": params}, *args)
  scanned = models.build(dict(cfg, scan_layers=True, remat_policy="full"))   # scan(remat)
  # the scanned model's own init has the stacked layout
  shapes = jax.tree.map(jnp.shape, nn.unbox(jax.eval_shape(scanned.init, jax.random.key(0),
                                                           *args))["params"])
  stacked = _stack_all(params, cfg)
  chex.assert_trees_all_equal_shapes(jax.tree.map(jnp.zeros, shapes,
                                                  is_leaf=lambda x: isinstance(x, tuple)),
                                     stacked)
  got = jax.jit(scanned.apply)({"params": stacked}, *args)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_rematerialised_layers_give_identical_gradients():
  """Every remat policy (BlockStack wraps each block the same way for every family, so one
  family stands for all: Mixtral's, whose blocks also sow the MoE metrics); two layers are
  enough to cross a block boundary and compile a third faster."""
  cfg = dict(MIXTRAL, num_layers=2)
  args = inputs(cfg)
  module, params = init(cfg, *args)
  shape = jax.eval_shape(module.apply, {"params": params}, *args).shape
  ct = np.random.default_rng(3).normal(size=shape).astype(np.float32)
  loss = lambda p, m: jnp.mean(m.apply({"params": p}, *args) * ct)
  g_plain = jax.jit(jax.grad(lambda p: loss(p, module)))(params)
  for policy in ("full", "dots", "dots_no_batch"):
    remat = models.build(dict(cfg, remat_policy=policy))
    g_remat = jax.jit(jax.grad(lambda p: loss(p, remat)))(params)
    for a, b in zip(jax.tree.leaves(g_remat), jax.tree.leaves(g_plain)):
      # recomputation reorders float32 ops: compare relative to each leaf's scale
      assert np.abs(a - b).max() <= 1e-4 * max(np.abs(b).max(), 1e-3)


# The scanned cache is the stack's (models/stack.py), the same for every family: one family
# scanned is enough (the suite's time budget).
@pytest.mark.slow
@pytest.mark.parametrize("cfg, scan", [(GPT, False), (LLAMA, False), (MIXTRAL, False),
                                       (LLAMA, True)],
                         ids=["gpt", "llama", "mixtral", "llama-scanned"])
def test_decoder_kv_cache_equals_full_forward(cfg, scan):
  toks = tokens()
  module, params = init(cfg, toks)
  want = jit_apply(module)({"params": params}, toks)
  if scan:
    params = _stack_all(params, cfg)
  dec = models.build(dict(cfg, decode=True, scan_layers=scan))
  positions = jnp.arange(12)[None]
  # an empty cache is zeros at the shapes init allocates (what `generate` starts from)
  shapes = jax.eval_shape(dec.init, jax.random.key(0), jnp.zeros((2, 16), jnp.int32),
                          positions=jnp.arange(16)[None])["cache"]
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  step = jax.jit(lambda c, t, pos: dec.apply({"params": params, "cache": c}, t, positions=pos,
                                             mutable=["cache"]))
  out, state = step(cache, toks[:, :4], positions[:, :4])
  outs = [out]
  for t in range(4, 12):
    out, state = step(state["cache"], toks[:, t:t + 1], positions[:, t:t + 1])
    outs.append(out)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cfg", [GPT, LLAMA], ids=["gpt", "llama"])
def test_decoder_is_causal(cfg):
  toks = tokens()
  module, params = init(cfg, toks)
  apply = jit_apply(module)
  base = apply({"params": params}, toks)
  changed = apply({"params": params}, toks.at[:, 8:].set(3))
  np.testing.assert_allclose(changed[:, :8], base[:, :8], atol=1e-5)
  assert not np.allclose(changed[:, 8:], base[:, 8:])


@pytest.mark.parametrize("cfg", [GPT, LLAMA], ids=["gpt", "llama"])
def test_packed_sequences_equal_separate_sequences(cfg):
  """Two documents packed in one row with segment ids and per-document positions give
  exactly the logits each document gets alone."""
  a, b = tokens(b=1, t=7, seed=1), tokens(b=1, t=5, seed=2)
  packed = jnp.concatenate([a, b], axis=1)
  module, params = init(cfg, packed)
  apply = jit_apply(module)
  seg = jnp.array([[1] * 7 + [2] * 5])
  pos = jnp.array([list(range(7)) + list(range(5))])
  got = apply({"params": params}, packed, segment_ids=seg, positions=pos)
  # Each document alone, unpacked: first in its own row (the model is causal, so what follows
  # it there does not reach it), both rows in one call (one more compile, not two).
  alone = apply({"params": params}, jnp.concatenate([packed, jnp.concatenate([b, a], 1)]))
  np.testing.assert_allclose(got[:, :7], alone[:1, :7], atol=1e-5)
  np.testing.assert_allclose(got[:, 7:], alone[1:, :5], atol=1e-5)


def test_bert_ignores_padding_and_uses_token_types():
  toks = tokens()
  module, params = init(BERT, toks)
  mask = jnp.array([[1] * 12, [1] * 6 + [0] * 6])
  apply = jit_apply(module, mutable=("intermediates",))
  base, state = apply({"params": params}, toks, attention_mask=mask)
  other, _ = apply({"params": params}, toks.at[1, 6:].set(5), attention_mask=mask)
  np.testing.assert_allclose(other[1, :6], base[1, :6], atol=1e-5)
  chex.assert_shape(state["intermediates"]["pooled"][0], (2, 32))
  typed, _ = apply({"params": params}, toks, token_type_ids=jnp.ones_like(toks),
                   attention_mask=mask)
  assert not np.allclose(typed, base)
  assert set(params) >= {"embed", "pos_embed", "type_embed", "embed_norm", "encoder", "pooler",
                         "mlm_transform", "mlm_norm", "mlm_bias"}


def test_seq2seq_causal_target_and_masked_source():
  src, tgt = tokens(t=9), tokens(t=7, seed=1)
  module, params = init(SEQ2SEQ, src, tgt)
  apply = jit_apply(module)
  src_mask = jnp.array([[1] * 9, [1] * 5 + [0] * 4])
  base = apply({"params": params}, src, tgt, src_mask=src_mask)
  future = apply({"params": params}, src, tgt.at[:, 4:].set(2), src_mask=src_mask)
  np.testing.assert_allclose(future[:, :4], base[:, :4], atol=1e-5)
  padded = apply({"params": params}, src.at[1, 5:].set(7), tgt, src_mask=src_mask)
  np.testing.assert_allclose(padded[1], base[1], atol=1e-5)
  assert "embed" in params and "lm_head" not in params          # one shared embedding


def test_vit_pooling_and_position_resize():
  images = inputs(VIT)[0]
  for pool in ("gap", "cls"):                                     # "cls": VIT's default
    module, params = init(dict(VIT, pool=pool), images)
    chex.assert_shape(jit_apply(module)({"params": params}, images), (2, 7))
    rows = 9 + (pool == "cls")
    chex.assert_shape(params["pos_embed"]["embedding"], (rows, 32))
    if pool == "gap":
      table = params["pos_embed"]["embedding"]                    # 3x3 grid, no cls
      np.testing.assert_allclose(resize_pos_embed(table, 3, has_cls=False), table, atol=1e-6)
  assert models.build(VIT) == module                              # params: VIT's own
  # a table linear in the grid coordinates stays linear under bilinear resizing
  grid = np.stack(np.meshgrid(np.arange(3.), np.arange(3.), indexing="ij"), -1).reshape(9, 2)
  lin = np.concatenate([np.zeros((1, 2)), grid], 0).astype(np.float32)
  resized = np.asarray(resize_pos_embed(jnp.asarray(lin), 6))
  chex.assert_shape(resized, (37, 2))
  np.testing.assert_allclose(resized[0], 0)
  d = np.diff(resized[1:].reshape(6, 6, 2)[1:-1, 1:-1, 0], axis=0)
  np.testing.assert_allclose(d, d[0, 0], atol=1e-5)
  big = models.build(dict(VIT, image_size=24))
  new_params = dict(params, pos_embed={"embedding": resize_pos_embed(
      params["pos_embed"]["embedding"], 6)})
  chex.assert_shape(jit_apply(big)({"params": new_params}, jnp.ones((1, 24, 24, 3))), (1, 7))
  with pytest.raises(ValueError, match="image_size"):
    models.build(VIT).apply({"params": params}, jnp.ones((1, 24, 24, 3)))


# Each cell and each way the source reaches the decoder (attention, or the final state
# alone); the cell does not touch the masking, so two of the four pairs cover them.
@pytest.mark.slow
@pytest.mark.parametrize("cell, attention", [("gru", True), ("lstm", False)])
def test_rnn_seq2seq_masks_source_padding(attention, cell):
  cfg = dict(family="rnn_seq2seq", vocab_size=61, embed_dim=16, hidden_dim=24,
             attention=attention, cell=cell)
  src, tgt = tokens(t=9), tokens(t=6, seed=1)
  module, params = init(cfg, src, tgt)
  apply = jit_apply(module)                     # one compile for the three (eager: each scan)
  mask = jnp.array([[1] * 9, [1] * 5 + [0] * 4])
  base = apply({"params": params}, src, tgt, src_mask=mask)
  chex.assert_shape(base, (2, 6, 61))
  padded = apply({"params": params}, src.at[1, 5:].set(3), tgt, src_mask=mask)
  np.testing.assert_allclose(padded[1], base[1], atol=1e-5)
  early = apply({"params": params}, src.at[:, 0].set(4), tgt, src_mask=mask)
  assert not np.allclose(early, base)           # the first source token reaches the output
  assert ("attention" in str(jax.tree_util.tree_structure(params))) == attention


def test_moe_matches_numpy_top_k_mixture():
  moe = make_moe(num_experts=5, experts_per_token=2, hidden_dim=12)
  x = np.random.default_rng(0).normal(size=(2, 7, 16)).astype(np.float32)
  params = drawn.params(moe, x, seed=2)          # at the init's shapes (not compiled)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)

  def np_moe(x):
    t = x.reshape(-1, 16)
    logits = t @ p["router"]["kernel"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(t)
    for n in range(t.shape[0]):
      top = np.argsort(-probs[n])[:2]
      w = probs[n, top] / probs[n, top].sum()
      for e, wt in zip(top, w):
        h = t[n] @ p["wi_gate"][e]
        out[n] += wt * ((h / (1 + np.exp(-h))) * (t[n] @ p["wi_up"][e])) @ p["wo"][e]
    return out.reshape(x.shape)

  apply = jax.jit(lambda x: moe.apply({"params": params}, x))
  np.testing.assert_allclose(apply(x), np_moe(x.astype(np.float64)), atol=1e-5)
  ct = np.random.default_rng(1).normal(size=x.shape)
  g = jax.jit(jax.grad(lambda x: jnp.sum(apply(x) * ct)))(x)
  idx, num = numeric_grad(lambda xx: np.sum(np_moe(xx) * ct), x)
  np.testing.assert_allclose(np.ravel(g)[idx], num, atol=1e-4, rtol=1e-3)
  specs = nn.get_partition_spec(jax.eval_shape(moe.init, jax.random.key(0), x))["params"]
  assert tuple(specs["wi_gate"]) == ("expert", "embed", "mlp")       # (abstractly: no init)


def test_bfloat16_decoder_keeps_float32_params_and_logits():
  toks = tokens()
  module, params = init(dict(LLAMA, dtype="bfloat16"), toks)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  assert jit_apply(module)({"params": params}, toks).dtype == jnp.float32


@pytest.mark.parametrize("cfg, match", [
    (dict(GPT, family="gpt5"), "model.family='gpt5'"),
    (dict(GPT, num_heads=5), "model.num_heads=5 does not divide model.d_model=32"),
    (dict(LLAMA, num_kv_heads=3), "model.num_kv_heads=3 must divide model.num_heads=4"),
    (dict(VIT, patch_size=5), "model.patch_size=5 does not divide model.image_size=12"),
    (dict(GPT, n_layer=3), "model.n_layer is not a field"),
    ({k: v for k, v in GPT.items() if k != "vocab_size"}, "model.vocab_size is required"),
    (dict(GPT, positions="relative"), "model.positions='relative'"),
    (dict(GPT, dtype="float8"), "model.dtype='float8'"),
    (dict(GPT, dropout_rate=1.5), "model.dropout_rate"),
    (dict(MIXTRAL, experts_per_token=5), "model.experts_per_token=5"),
    (dict(GPT, remat_policy="some"), "model.remat_policy='some'"),
    (dict(GPT, num_layers=0), "model.num_layers=0"),
    (dict(BERT, type_vocab_size=0), "model.type_vocab_size=0"),
    (dict(VIT, channels=0), "model.channels=0"),
    (dict(LLAMA, head_dim=-8), "model.head_dim=-8"),
    (dict(MIXTRAL, moe_grouped_matmul="fast"), "model.moe_grouped_matmul='fast'"),
    (dict(GPT, ffn="moe"), "model.ffn='moe' is not one of"),     # experts: num_experts > 0
    (dict(GPT, num_experts=-1), "model.num_experts=-1 must be an int >= 0"),
    (dict(BERT, norm_eps=0.0), "model.norm_eps=0.0 must be > 0"),
    (dict(VIT, window=(2, -1)), r"model.window sides must be ints >= 0"),
])
def test_build_rejects_bad_config_naming_the_field(cfg, match):
  with pytest.raises(ValueError, match=match):
    models.build(cfg)
