"""The chunked loss (`ops.cross_entropy`) against a float64 NumPy reference: values and
gradients with respect to the hidden states, the readout kernel (tied [V, d] and untied
[d, V]) and its bias, with odd lengths, fully masked rows, label smoothing, z-loss, μP's
output multiplier and bfloat16 inputs."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.ops.cross_entropy import Readout, chunked_cross_entropy
from tests.arrays import EPS32, LAMBDA, rand

EPS_BF16 = 2.0 ** -7


def reference(h, kernel, bias, labels, a, c, *, vocab_major, scale, s, z):
  """float64: per-position (objective, nll, correct) and the gradients of
  sum(a * objective + c * nll) wrt h, kernel, bias."""
  h, kernel = np.asarray(h, np.float64), np.asarray(kernel, np.float64)
  k = kernel.T if vocab_major else kernel                     # [d, V]
  logits = (h @ k) * (scale or 1.0) + (0.0 if bias is None else np.asarray(bias, np.float64))
  v = logits.shape[-1]
  m = logits.max(-1, keepdims=True)
  log_z = (np.log(np.exp(logits - m).sum(-1, keepdims=True)) + m)[..., 0]
  onehot = np.eye(v)[labels]
  nll = log_z - (onehot * logits).sum(-1)
  objective = (1 - s) * nll + s * (log_z - logits.mean(-1)) + z * log_z ** 2
  correct = (logits.argmax(-1) == labels).astype(np.float64)
  p = np.exp(logits - log_z[..., None])
  g = (a[..., None] * (p * (1 + 2 * z * log_z[..., None]) - (1 - s) * onehot - s / v)
       + c[..., None] * (p - onehot))
  db = g.sum((0, 1))
  g = g * (scale or 1.0)
  dh = g @ k.T
  dk = np.einsum("btd,btv->dv", h, g)
  return (objective, nll, correct), (dh, dk.T if vocab_major else dk, db)


def run(h, kernel, bias, labels, a, c, *, vocab_major, scale, s, z, chunk):
  def loss(h, kernel, bias):
    readout = Readout(kernel, bias, vocab_major=vocab_major, scale=scale)
    obj, nll, correct = chunked_cross_entropy(h, readout, labels, chunk=chunk,
                                              label_smoothing=s, z_loss=z)
    return jnp.sum(a * obj + c * nll), (obj, nll, correct)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(h, kernel, bias)


CASES = [  # (B, T, d, V, chunk, vocab_major, bias, scale, smoothing, z)
    (2, 13, 16, 37, 4, True, False, None, 0.0, 0.0),      # odd T: 4 tiles, the last padded
    (3, 7, 8, 50, 3, False, True, 0.5, 0.1, 1e-3),        # untied, bias, μP multiplier
    (1, 9, 12, 29, 16, True, True, None, 0.2, 1e-2),      # chunk > T: one tile
    (2, 6, 8, 31, 6, False, False, 0.25, 0.0, 1e-2),
]


@pytest.mark.parametrize("b, t, d, v, chunk, vocab_major, with_bias, scale, s, z", CASES)
def test_chunked_loss_matches_float64(b, t, d, v, chunk, vocab_major, with_bias, scale, s, z):
  h = rand((b, t, d), seed=1)
  kernel = rand((v, d) if vocab_major else (d, v), seed=2, scale=0.5)
  bias = rand((v,), seed=3) if with_bias else None
  rng = np.random.default_rng(4)
  labels = rng.integers(0, v, size=(b, t))
  a = rng.uniform(size=(b, t)).astype(np.float32)
  a[0] = 0.0                                         # a fully masked row: no gradient from it
  c = rng.uniform(size=(b, t)).astype(np.float32)
  c[0] = 0.0
  (dh, dk, db), (obj, nll, correct) = run(h, kernel, bias, labels, a, c,
                                          vocab_major=vocab_major, scale=scale, s=s, z=z,
                                          chunk=chunk)
  (w_obj, w_nll, w_correct), (w_dh, w_dk, w_db) = reference(
      h, kernel, bias, labels, a, c, vocab_major=vocab_major, scale=scale, s=s, z=z)
  # float32: a d-term dot, then a V-term log-sum-exp (and mean); the gradients add a V-term
  # (dh) or B*T-term (dW, db) sum of those
  tol = lambda n, want: LAMBDA * math.sqrt(n) * EPS32 * float(np.abs(want).max())
  for got, want in ((obj, w_obj), (nll, w_nll)):
    np.testing.assert_allclose(got, want, rtol=0, atol=tol(d + v, np.abs(w_obj) + 10))
  np.testing.assert_array_equal(correct, w_correct)
  np.testing.assert_allclose(dh, w_dh, rtol=0, atol=tol(d + 2 * v, w_dh) + 1e-7)
  np.testing.assert_allclose(dk, w_dk, rtol=0, atol=tol(d + v + b * t, w_dk) + 1e-7)
  assert np.all(np.asarray(dh)[0] == 0)              # the masked row
  if with_bias:
    np.testing.assert_allclose(db, w_db, rtol=0, atol=tol(d + v + b * t, w_db) + 1e-7)
  else:
    assert db is None


@pytest.mark.parametrize("vocab_major", [True, False])
def test_chunked_loss_in_bfloat16_matches_float64_of_the_rounded_inputs(vocab_major):
  """bf16 hidden states and kernel: the matmuls run in bf16 with float32 accumulation, the
  logits' gradient is rounded to bf16 before its two matmuls (as the dense bf16 path); dW
  accumulates in float32 over the tiles."""
  b, t, d, v = 2, 11, 16, 40
  h = jnp.asarray(rand((b, t, d), seed=5), jnp.bfloat16)
  kernel = jnp.asarray(rand((v, d) if vocab_major else (d, v), seed=6, scale=0.5),
                       jnp.bfloat16)
  labels = np.random.default_rng(7).integers(0, v, size=(b, t))
  a = np.ones((b, t), np.float32)
  c = np.zeros((b, t), np.float32)
  (dh, dk, _), (obj, nll, _) = run(h, kernel, None, labels, a, c, vocab_major=vocab_major,
                                   scale=None, s=0.1, z=1e-3, chunk=4)
  assert dh.dtype == jnp.bfloat16 and dk.dtype == jnp.bfloat16 and obj.dtype == jnp.float32
  (w_obj, w_nll, _), (w_dh, w_dk, _) = reference(
      np.asarray(h, np.float64), np.asarray(kernel, np.float64), None, labels, a, c,
      vocab_major=vocab_major, scale=None, s=0.1, z=1e-3)
  # float32 accumulation of exact bf16 products: the float32 bound; the outputs and the
  # rounded logit gradient cost a bf16 rounding each (relative 2^-8), summed over v or b*t
  np.testing.assert_allclose(obj, w_obj, rtol=0, atol=LAMBDA * math.sqrt(d + v) * EPS32
                             * np.abs(w_obj).max())
  np.testing.assert_allclose(nll, w_nll, rtol=0, atol=LAMBDA * math.sqrt(d + v) * EPS32
                             * np.abs(w_obj).max())
  bf16_tol = lambda n, want: LAMBDA * math.sqrt(n) * EPS_BF16 * float(np.abs(want).max())
  np.testing.assert_allclose(np.asarray(dh, np.float64), w_dh, rtol=0, atol=bf16_tol(v, w_dh))
  np.testing.assert_allclose(np.asarray(dk, np.float64), w_dk, rtol=0,
                             atol=bf16_tol(b * t, w_dk))


def test_chunked_loss_refuses_bad_shapes():
  h = jnp.zeros((2, 5, 8))
  with pytest.raises(ValueError, match="chunk=0"):
    chunked_cross_entropy(h, Readout(jnp.zeros((8, 11))), jnp.zeros((2, 5), int), chunk=0)
  with pytest.raises(ValueError, match="does not match hidden width 8"):
    chunked_cross_entropy(h, Readout(jnp.zeros((8, 11)), vocab_major=True),
                          jnp.zeros((2, 5), int))


# --- the train step: the chunked loss equals the dense one --------------------------------

def _step_pair(config, inputs, labels_key, extra, *, chunk, smoothing=0.1, z=1e-3):
  import optax
  from jaxformer import models
  from jaxformer import tasks
  from jaxformer.train.step import loss_mode, make_train_step
  module = models.build(config)
  task = tasks.task_for(config)
  init_args = tuple(jnp.asarray(inputs[k]) for k in task.inputs)
  # the init's shapes, drawn (its compile is not what is tested): N(0, 0.2^2), norm scales 1 +
  # that, as tests/runs.py's write_run(random=True)
  shapes = jax.eval_shape(module.init, jax.random.key(0), *init_args)["params"]
  shapes = jax.tree.map(lambda x: getattr(x, "value", x), shapes,
                        is_leaf=lambda x: hasattr(x, "value"))
  params = jax.tree_util.tree_map_with_path(lambda path, x, i=iter(range(10**6)): jnp.asarray(
      rand(x.shape, seed=next(i), scale=0.2) + ("scale" in jax.tree_util.keystr(path)),
      x.dtype), shapes)
  assert loss_mode(module, task, chunk) == chunk and loss_mode(module, task, 0) == 0
  tx = optax.sgd(1.0)
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
           "skipped": jnp.zeros((), jnp.int32)}
  batch = dict(inputs, **extra)
  steps = [make_train_step(module, tx, task, label_smoothing=smoothing, z_loss=z, loss_chunk=c)
           for c in (0, chunk)]
  # both steps in one program: one compile instead of two
  return jax.jit(lambda *args: [step(*args) for step in steps])(state, batch, jax.random.key(0))


def _assert_same_step(dense, chunked, chain):
  from tests.arrays import sum_tol
  (s0, m0), (s1, m1) = dense, chunked
  for key in ("loss", "total_loss", "grad_norm"):
    np.testing.assert_allclose(m1[key], m0[key], rtol=sum_tol(chain), err_msg=key)
  np.testing.assert_array_equal(m1["accuracy"], m0["accuracy"])
  # SGD at lr 1: the new params differ by the gradients' rounding
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=EPS32, atol=sum_tol(chain)),
               s1["params"], s0["params"])


@pytest.mark.parametrize("tie, parametrization", [(True, "standard"), (False, "mup")])
def test_train_step_with_the_chunked_loss_equals_the_dense_one_gpt(tie, parametrization):
  config = dict(family="decoder", vocab_size=37, d_model=16, num_layers=1, num_heads=2,
                mlp_dim=32, max_len=16, dropout_rate=0.0, tie_embeddings=tie,
                parametrization=parametrization, mup_base_width=8)
  rng = np.random.default_rng(1)
  batch = {"inputs": rng.integers(0, 37, (3, 9)).astype(np.int32),
           "targets": rng.integers(0, 37, (3, 9)).astype(np.int32),
           "weights": (rng.random((3, 9)) < 0.7).astype(np.float32)}
  batch["weights"][1] = 0.0                          # a row that counts nowhere
  dense, chunked = _step_pair(config, batch, "targets", {}, chunk=4)
  _assert_same_step(dense, chunked, 27 + 4 * 16 + 9 + 32 + 16 + 37)


def test_train_step_with_the_chunked_loss_equals_the_dense_one_bert_nsp():
  """An encoder family: BERT's MLM head (tied embedding + bias) and its NSP head."""
  config = dict(family="bert", vocab_size=41, d_model=16, num_layers=1, num_heads=2,
                mlp_dim=32, max_len=16, dropout_rate=0.0, attention_dropout_rate=0.0,
                nsp=True)
  rng = np.random.default_rng(2)
  batch = {"inputs": rng.integers(0, 41, (2, 11)).astype(np.int32),
           "targets": rng.integers(0, 41, (2, 11)).astype(np.int32),
           "weights": (rng.random((2, 11)) < 0.3).astype(np.float32),
           "attention_mask": np.ones((2, 11), np.int32),
           "nsp_labels": np.array([0, 1], np.int32)}
  dense, chunked = _step_pair(config, batch, "targets", {}, chunk=5)
  _assert_same_step(dense, chunked, 22 + 4 * 16 + 11 + 32 + 2 * 16 + 41)
  np.testing.assert_allclose(chunked[1]["nsp_loss"], dense[1]["nsp_loss"], rtol=1e-6)


def test_loss_mode_auto_and_dense_only_heads():
  from jaxformer import models
  from jaxformer import tasks
  from jaxformer.train.step import AUTO_MIN_VOCAB, loss_mode
  small = dict(family="decoder", vocab_size=65, d_model=16, num_layers=1, num_heads=2,
               mlp_dim=32, max_len=16)
  big = dict(small, vocab_size=AUTO_MIN_VOCAB)
  lm = tasks.get("lm")
  assert loss_mode(models.build(small), lm) == 0            # the README model: dense
  assert loss_mode(models.build(big), lm) == 512
  assert loss_mode(models.build(big), lm, 0) == 0 and loss_mode(models.build(big), lm, 64) == 64
  vit = dict(family="vit", image_size=8, patch_size=4, channels=1, num_classes=10, d_model=16,
             num_layers=1, num_heads=2, mlp_dim=32)
  assert loss_mode(models.build(vit), tasks.task_for(vit), 64) == 0    # no vocabulary head
  with pytest.raises(ValueError, match="train.loss_chunk=-1"):
    loss_mode(models.build(small), lm, -1)


HEADS = {   # every family with return_hidden, tiny; (config, number of token inputs or images)
    "seq2seq": dict(family="seq2seq", vocab_size=23, d_model=16, num_encoder_layers=1,
                    num_decoder_layers=1, num_heads=2, mlp_dim=32, dropout_rate=0.0),
    "t5_tied": dict(family="t5", vocab_size=23, d_model=16, num_encoder_layers=1,
                    num_decoder_layers=1, num_heads=2, head_dim=8, mlp_dim=32,
                    dropout_rate=0.0, attention_dropout_rate=0.0),
    "t5_untied": dict(family="t5", vocab_size=23, d_model=16, num_encoder_layers=1,
                      num_decoder_layers=1, num_heads=2, head_dim=8, mlp_dim=32,
                      dropout_rate=0.0, attention_dropout_rate=0.0, tie_embeddings=False,
                      ffn="swiglu", activation="gelu"),
    "bart_bias": dict(family="bart", vocab_size=23, d_model=16, num_encoder_layers=1,
                      num_decoder_layers=1, num_heads=2, mlp_dim=32, max_len=16,
                      dropout_rate=0.0, attention_dropout_rate=0.0, logits_bias=True),
    "deberta": dict(family="deberta", vocab_size=23, d_model=16, num_layers=1, num_heads=2,
                    mlp_dim=32, max_len=16, position_buckets=4, dropout_rate=0.0,
                    attention_dropout_rate=0.0, emd_layers=1),
    "rnn_seq2seq": dict(family="rnn_seq2seq", vocab_size=23, embed_dim=8, hidden_dim=12),
    "captioner": dict(family="captioner", vocab_size=23, max_len=8, image_size=8, channels=1,
                      d_model=16, num_heads=2, mlp_dim=32, dropout_rate=0.0,
                      encoder="cnn", cnn_features=(4, 8), decoder="transformer",
                      decoder_layers=1),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_return_hidden_readout_gives_the_models_logits(name):
  """Each family's (hidden, Readout) is its output head: Readout.logits(hidden) equals the
  logits of the ordinary call (so the chunked loss sees the model's logits)."""
  from jaxformer import models
  from jaxformer import tasks
  config = HEADS[name]
  module, task = models.build(config), tasks.task_for(config)
  rng = np.random.default_rng(0)
  inputs = []
  for key in task.inputs:
    if key == "images":
      inputs.append(jnp.asarray(rng.normal(size=(2, 8, 8, 1)), jnp.float32))
    else:
      inputs.append(jnp.asarray(rng.integers(1, 23, (2, 7)), jnp.int32))
  # the init's shapes, every leaf random (zero-initialised logit biases, BART's and the MLM
  # heads', count too); both calls and the readout in one program: ~half the CPU of an eager
  # init and calls
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *inputs))["params"]
  leaves, tree = jax.tree.flatten(shapes)
  params = jax.tree.unflatten(tree, [jnp.asarray(0.5 * rand(x.shape, seed=i), x.dtype)
                                     for i, x in enumerate(leaves)])

  def calls(p):
    hidden, readout = module.apply({"params": p}, *inputs, return_hidden=True)
    return hidden, readout.logits(hidden), module.apply({"params": p}, *inputs)

  hidden, read_logits, logits = jax.jit(calls)(params)
  assert hidden.shape == logits.shape[:-1] + hidden.shape[-1:]
  np.testing.assert_allclose(read_logits, logits, rtol=0,
                             atol=LAMBDA * math.sqrt(64) * EPS32 * float(np.abs(logits).max()))
