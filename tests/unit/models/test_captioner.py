"""The captioner family (every encoder x decoder x attention combination), its attention maps,
caption decoding and caption metrics, against NumPy recomputations."""

import itertools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import models, scaling
from jaxformer.inference import captions
from jaxformer.layers.attention import WEIGHTS_COLLECTION
from jaxformer.models import captioner
from jaxformer.models.captioner import Captioner

S, L, V = 16, 6, 9
TINY = dict(family="captioner", vocab_size=V, max_len=L, image_size=S, channels=1, d_model=16,
            num_heads=2, mlp_dim=32, encoder_layers=1, decoder_layers=2, patch_size=4,
            cnn_features=(4, 8), embed_dim=8, hidden_dim=12, attention_dim=10,
            dropout_rate=0.0)
COMBOS = list(itertools.product(captioner.ENCODERS, captioner.DECODERS, (True, False)))
# every pair of (encoder, decoder, attention) values once: the fast subset's combinations
# (the decoder's causality does not see the encoder; the memory length is the encoder's grid
# or 1); the other six run in the full suite
PAIRWISE = {("vit", "transformer", True), ("cnn", "transformer", False), ("vit", "lstm", False),
            ("cnn", "lstm", True), ("vit", "gru", True), ("cnn", "gru", False)}


def config(encoder="vit", decoder="transformer", attention=True, **kw):
  return dict(TINY, encoder=encoder, decoder=decoder, attention=attention, **kw)


def images(b=4, seed=0):
  return jax.random.uniform(jax.random.key(seed), (b, S, S, 1))


def init(cfg, seed=1):
  """(module, random params): shapes from an abstract init (no per-op compiles, which
  dominate these tiny models' eager init on CPU), values N(0, 0.3^2)."""
  module = models.build(cfg)
  shapes = jax.eval_shape(module.init, jax.random.key(0), *scaling.dummy_inputs(cfg))
  rng = np.random.default_rng(seed)
  return module, jax.tree.map(lambda s: jnp.asarray(0.3 * rng.normal(size=s.shape), s.dtype),
                              nn.unbox(shapes["params"]))


@pytest.mark.parametrize("encoder,decoder,attention", [
    c if c in PAIRWISE else pytest.param(*c, marks=pytest.mark.slow) for c in COMBOS])
def test_every_combination_is_causal_and_attends_over_the_grid(encoder, decoder, attention):
  cfg = config(encoder, decoder, attention)
  module, params = init(cfg)
  rng = np.random.default_rng(0)
  toks = rng.integers(1, V, (2, L)).astype(np.int32)
  changed = toks.copy()
  changed[:, 3:] = toks[:, 3:] % (V - 1) + 1            # another id in [1, V)
  assert np.all(changed[:, 3:] != toks[:, 3:])
  x = jnp.concatenate([images(2), images(2)])
  both = jnp.asarray(np.concatenate([toks, changed]))
  logits, state = module.apply({"params": params}, x, both, mutable=["intermediates"])
  logits = np.asarray(logits)
  assert logits.shape == (4, L, V) and logits.dtype == np.float32
  np.testing.assert_allclose(logits[2:, :3], logits[:2, :3], atol=1e-5)   # causal
  assert np.abs(logits[2:, 3:] - logits[:2, 3:]).max() > 1e-4

  rows, cols = captioner.grid_shape(cfg)
  assert (rows, cols) == (4, 4)          # 16 / patch_size 4; 16 / 2^2 (two CNN stages)
  n = rows * cols if attention else 1
  assert captioner.memory_length(cfg) == n
  w = np.asarray(state["intermediates"]["caption_attention"][0])
  assert w.shape == (4, L, n)
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
  assert np.all(w >= 0)

  # encode + decode is __call__
  memory = module.apply({"params": params}, x, method=Captioner.encode)
  assert memory.shape == (4, n, 16)
  split = module.apply({"params": params}, memory, both, method=Captioner.decode)
  np.testing.assert_allclose(np.asarray(split), logits, atol=1e-5)


def test_transformer_map_is_the_last_cross_attention_averaged_over_heads():
  """The sown map against the layers' own attention_weights, averaged in NumPy."""
  cfg = config()
  module, params = init(cfg)
  toks = jnp.asarray(np.random.default_rng(1).integers(1, V, (4, L)), jnp.int32)
  _, state = module.apply({"params": params}, images(), toks,
                          mutable=["intermediates", WEIGHTS_COLLECTION])
  layer = state[WEIGHTS_COLLECTION]["decoder"]["layers_1"]["block"]
  want = np.asarray(layer["cross_attention"]["weights"][0], np.float64).mean(axis=1)
  np.testing.assert_allclose(state["intermediates"]["caption_attention"][0], want, atol=1e-6)
  # the same map when only the intermediates are kept (the stack re-applied on its params)
  recorded, only = module.apply({"params": params}, images(), toks, mutable=["intermediates"])
  np.testing.assert_allclose(only["intermediates"]["caption_attention"][0], want, atol=1e-6)
  np.testing.assert_allclose(recorded, module.apply({"params": params}, images(), toks),
                             atol=1e-6)


def test_rnn_weights_reach_the_training_attention_maps():
  from jaxformer.train import attention_maps
  cfg = config("cnn", "gru")
  module, params = init(cfg)
  toks = jnp.asarray(np.random.default_rng(1).integers(1, V, (4, L)), jnp.int32)
  _, state = module.apply({"params": params}, images(), toks,
                          mutable=["intermediates", WEIGHTS_COLLECTION])
  flat = {attention_maps._layer_name(path): leaf for path, leaf in
          jax.tree_util.tree_flatten_with_path(state[WEIGHTS_COLLECTION])[0]}
  name, w = attention_maps.pick_layer(flat)
  assert name == "cross_attention" and w.shape == (1, L, 16)
  np.testing.assert_allclose(w[0], state["intermediates"]["caption_attention"][0][0],
                             atol=1e-6)


def test_scanned_decoder_gives_the_same_map():
  from jaxformer.models.stack import stack_layers
  module, params = init(config())
  scanned = models.build(config(scan_layers=True))
  p2 = dict(params, decoder=stack_layers(params["decoder"], 2),
            encoder=stack_layers(params["encoder"], 1))
  toks = jnp.asarray(np.random.default_rng(2).integers(1, V, (4, L)), jnp.int32)
  a, sa = module.apply({"params": params}, images(), toks, mutable=["intermediates"])
  b, sb = scanned.apply({"params": p2}, images(), toks, mutable=["intermediates"])
  np.testing.assert_allclose(a, b, atol=1e-5)
  np.testing.assert_allclose(sa["intermediates"]["caption_attention"][0],
                             sb["intermediates"]["caption_attention"][0], atol=1e-6)


@pytest.mark.parametrize("decoder", ["transformer", "lstm"])
def test_dropout_while_training_with_the_maps_recorded(decoder):
  cfg = config("cnn", decoder, dropout_rate=0.5)
  module, params = init(cfg)
  toks = jnp.ones((4, L), jnp.int32)
  run = lambda seed: module.apply({"params": params}, images(), toks, deterministic=False,
                                  rngs={"dropout": jax.random.key(seed)},
                                  mutable=["intermediates"])
  (a, sa), (b, _) = run(0), run(1)
  assert np.all(np.isfinite(a)) and np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3
  np.testing.assert_allclose(sa["intermediates"]["caption_attention"][0].sum(-1), 1.0,
                             atol=1e-5)


def test_grid_positions_are_2d_sinusoids():
  rows, cols, d = 3, 4, 8
  table = np.asarray(captioner.grid_positions(rows, cols, d))
  inv = 1.0 / 10_000.0 ** (np.arange(0, d // 2, 2) / (d // 2))
  for r, c in itertools.product(range(rows), range(cols)):
    want = []
    for p in (r, c):
      want += [f(p * w) for w in inv for f in (np.sin, np.cos)]
    np.testing.assert_allclose(table[r * cols + c], want, atol=1e-6)


@pytest.mark.parametrize("decoder,attention", [("transformer", True), ("gru", True),
                                               ("lstm", False)])
def test_attention_maps_on_the_grid(decoder, attention):
  cfg = config("cnn", decoder, attention)
  module, params = init(cfg)
  toks = np.random.default_rng(3).integers(3, V, (4, L)).astype(np.int32)
  maps = np.asarray(captions.attention_maps(cfg, params, images(), toks))
  assert maps.shape == (4, L, 4, 4)
  np.testing.assert_allclose(maps.sum((-1, -2)), 1.0, atol=1e-5)
  inputs = np.concatenate([np.full((4, 1), captions.BOS_ID), toks[:, :-1]], axis=1)
  _, state = module.apply({"params": params}, images(), jnp.asarray(inputs),
                          mutable=["intermediates"])
  w = np.asarray(state["intermediates"]["caption_attention"][0])
  if attention:
    np.testing.assert_allclose(maps, w.reshape(4, L, 4, 4), atol=1e-6)
  else:       # one pooled key: the grid is seen through its mean, uniformly
    np.testing.assert_allclose(maps, np.full((4, L, 4, 4), 1 / 16), atol=1e-6)


def log_softmax64(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("decoder,greedy", [("transformer", True), ("gru", False)])
def test_caption_images_greedy_and_beam(decoder, greedy):
  cfg = config("vit", decoder)
  module, params = init(cfg)
  x = images(2, seed=4)
  forward = jax.jit(lambda x, t: module.apply({"params": params}, x, t))
  bos, eos, pad = captions.BOS_ID, captions.EOS_ID, captions.PAD_ID
  if greedy:
    tokens, scores = captions.caption_images(cfg, params, x)
    tokens, scores = np.asarray(tokens), np.asarray(scores)
    assert tokens.shape == (2, L) and scores.shape == (2,)
    for row in range(2):     # the argmax path, recomputed with a forward pass per prefix
      seq = []
      while len(seq) < L and (not seq or seq[-1] != eos):
        inp = np.array([[bos] + seq + [pad] * (L - 1 - len(seq))], np.int32)
        logp = log_softmax64(forward(x[row:row + 1], inp)[0, len(seq)])
        logp[[pad, bos]] = -np.inf
        seq.append(int(np.argmax(logp)))
      assert list(tokens[row]) == seq + [pad] * (L - len(seq))
  # beam: the best beam's score is its teacher-forced log-prob sum (float64)
  btoks, bscores = captions.caption_images(cfg, params, x, beam_size=3, max_len=4)
  btoks, bscores = np.asarray(btoks), np.asarray(bscores)
  assert btoks.shape == (2, 4)
  for row in range(2):
    seq = list(btoks[row])
    n = seq.index(eos) + 1 if eos in seq else 4
    inp = np.array([[bos] + seq[:-1] + [pad] * (L - 4)], np.int32)
    logp = log_softmax64(forward(x[row:row + 1], inp)[0])
    assert all(t == pad for t in seq[n:]) and bos not in seq and pad not in seq[:n]
    np.testing.assert_allclose(bscores[row], sum(logp[i, seq[i]] for i in range(n)),
                               rtol=1e-4)
  with pytest.raises(ValueError, match="max_len"):
    captions.caption_images(cfg, params, x, max_len=L + 1)


def test_caption_metrics_hand_made():
  hyps = [["3", "1"], ["2", "4", "5", "6"], ["7"], [1, 2, 3, 4, 5]]
  refs = [["3", "1"], ["2", "4", "5", "6"], ["7", "8"], [1, 2, 3, 4, 9]]
  m = captions.caption_metrics(hyps, refs)
  assert m["count"] == 4
  assert m["exact"] == pytest.approx(2 / 4)
  # reference positions incl. EOS: 3 + 5 + 3 + 6; right: 3 + 5 + 1 + 4 (+ EOS at 5) = 14
  assert m["token_accuracy"] == pytest.approx(14 / 17)
  same = captions.caption_metrics(refs[:2], refs[:2])
  assert same["bleu"] == pytest.approx(100.0)
  assert same["exact"] == 1.0 and same["token_accuracy"] == 1.0
  # "a b c d e" vs "a b c d f": n-gram precisions 4/5, 3/4, 2/3, 1/2, no brevity penalty
  one = captions.caption_metrics([list("abcde")], [list("abcdf")])
  assert one["bleu"] == pytest.approx(100 * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25, abs=1e-3)
  grouped = captions.caption_metrics(hyps, refs, by=[2, 4, 1, 5])
  assert list(grouped) == [1, 2, 4, 5]
  assert grouped[1]["exact"] == 0.0 and grouped[1]["token_accuracy"] == pytest.approx(1 / 3)
  assert grouped[2]["exact"] == 1.0 and grouped[4]["bleu"] == pytest.approx(100.0)
  assert grouped[5]["token_accuracy"] == pytest.approx(5 / 6)
  by_two = captions.caption_metrics(hyps, refs, by=["a", "a", "b", "b"])
  assert by_two["a"]["count"] == 2 and by_two["b"]["exact"] == 0.0
  with pytest.raises(ValueError, match="by has"):
    captions.caption_metrics(hyps, refs, by=[1])


@pytest.mark.parametrize("change,match", [
    (dict(encoder="resnet"), "model.encoder='resnet'"),
    (dict(decoder="rnn"), "model.decoder='rnn'"),
    (dict(patch_size=5), "model.patch_size=5 does not divide model.image_size=16"),
    (dict(encoder="cnn", cnn_features=(4, 8, 8, 8, 8)), "model.cnn_features has 5"),
    (dict(encoder="cnn", cnn_features=()), "model.cnn_features"),
    (dict(d_model=18, num_heads=2), "model.d_model=18"),
    (dict(num_heads=3), "model.num_heads=3"),
    (dict(attention="yes"), "model.attention"),
    (dict(hidden_dim=0), "model.hidden_dim"),
    (dict(colour=True), "model.colour is not a field"),
])
def test_config_errors_name_the_field(change, match):
  with pytest.raises(ValueError, match=match.replace("(", r"\(")):
    models.build(config(**change))


def test_images_of_the_wrong_size_are_refused():
  module, params = init(config())
  with pytest.raises(ValueError, match="model.image_size"):
    module.apply({"params": params}, jnp.zeros((1, S * 2, S * 2, 1)), jnp.ones((1, L), jnp.int32))


def test_parameter_counts_and_flops():
  cfg = config("vit", "transformer")
  _, params = init(cfg)
  sizes = {k: sum(math.prod(x.shape) for x in jax.tree.leaves(v)) for k, v in params.items()}
  counts = scaling.count_params(cfg)
  assert counts["total"] == sum(sizes.values())
  assert counts["non_embedding"] == counts["total"] - sizes["embed"] - sizes["pos_embed"] - (
      sizes["head"])
  assert counts["backbone"] == counts["total"] - sizes["head"]
  n = counts["non_embedding"]
  # attention term per caption token: ViT self-attention (16 patches, 1 layer) spread over the
  # caption, decoder self- (L keys) and cross-attention (16 keys) in 2 layers, width 16
  attn = 1 * 16 * 16 * 16 / L + 2 * (L + 16) * 16
  assert scaling.flops_per_token(cfg, L) == 6 * n + 6 * round(attn)
  rnn = config("cnn", "lstm", attention=False)
  assert scaling.flops_per_token(rnn, L) == 6 * scaling.count_params(rnn)["non_embedding"] + (
      6 * 1 * (10 + 12))
  with pytest.raises(ValueError, match="kaplan"):
    scaling.flops_per_token(cfg, L, method="hoffmann")
  from jaxformer import tasks
  from jaxformer.train import progress
  batch = {"tgt_out": np.zeros((4, L), np.int32)}
  assert progress.flops_per_step(cfg, tasks.get("captioning"), batch, 1) == (
      scaling.flops_per_token(cfg, L) * L * 4)
