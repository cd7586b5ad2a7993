"""Weight-only int8 (`inference.quantize`): scales and values against a float64 NumPy
reference, the matmul error within its derived bound, a decoder's converted params (every
dense kernel int8, the rest float; scanned and untied/GQA variants), and its forward equal to
the float model on the dequantized kernels."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import models
from jaxformer.inference import generate, quantize
from jaxformer.layers.dense import DenseGeneral
from tests import drawn

GPT = dict(family="decoder", vocab_size=37, d_model=32, num_layers=2, num_heads=4, mlp_dim=64,
           max_len=32)
KINDS = {"gpt": GPT, "scanned": dict(GPT, scan_layers=True),
         "llama": dict(GPT, positions="rope", norm="rmsnorm", ffn="swiglu", num_kv_heads=2,
                       use_bias=False, tie_embeddings=False)}


def _reference(w, contract):
  """float64 NumPy: per-output-channel symmetric int8 (scale 1 for an all-zero channel)."""
  w = np.asarray(w, np.float64)
  amax = np.abs(w).max(axis=contract, keepdims=True)
  scale = np.where(amax > 0, amax / 127, 1.0)
  return np.clip(np.round(w / scale), -127, 127), scale


@pytest.mark.parametrize("shape, contract", [((7, 5), (0,)), ((3, 4, 6), (0, 1)),
                                             ((6, 3, 2, 5), (0,))])
def test_kernel_matches_numpy_and_rounding_bound(shape, contract):
  w = np.random.default_rng(0).normal(size=shape).astype(np.float32)
  w[(slice(None),) * len(contract) + (0,) * (len(shape) - len(contract))] = 0   # a zero channel
  got = quantize.quantize_kernel(w, contract)
  q, scale = _reference(w, contract)
  assert got.q.dtype == jnp.int8 and got.q.shape == w.shape
  assert got.scale.shape == tuple(1 if i in contract else n for i, n in enumerate(shape))
  np.testing.assert_allclose(np.asarray(got.scale), scale, rtol=1e-6)
  # round-half cases may differ by one step between float32 and float64 division
  assert np.abs(np.asarray(got.q, np.float64) - q).max() <= 1
  deq = np.asarray(got.astype(jnp.float32), np.float64)
  assert np.all(np.abs(deq - w) <= scale / 2 * (1 + 1e-5) + 1e-7)
  assert np.all(deq[(slice(None),) * len(contract) + (0,) * (len(shape) - len(contract))] == 0)


def test_dense_error_within_the_derived_bound():
  """y = x.W over K contracted entries: |x.W - x.(q s)|_c <= sum_k |x_k| |W - q s|_kc
  <= ||x||_1 s_c / 2 (plus float32 rounding of the two matmuls)."""
  rng = np.random.default_rng(1)
  layer = DenseGeneral(features=(11,), axes=("heads", "kv", "embed"), num_in=2)
  x = rng.normal(size=(9, 4, 6)).astype(np.float32)
  params = nn.unbox(layer.init(jax.random.key(0), x))["params"]
  qparams = {"kernel": quantize.quantize_kernel(params["kernel"], (0, 1))}
  w = np.asarray(params["kernel"], np.float64)
  exact = np.einsum("bhd,hdc->bc", x.astype(np.float64), w)
  got = np.asarray(layer.apply({"params": qparams}, x), np.float64)
  scale = np.asarray(qparams["kernel"].scale, np.float64).reshape(1, 11)
  l1 = np.abs(x.astype(np.float64)).sum(axis=(1, 2))[:, None]
  bound = l1 * scale / 2
  slack = 1e-5 * (np.abs(x).reshape(9, -1).sum(1)[:, None] * np.abs(w).max())
  err = np.abs(got - exact)
  assert np.all(err <= bound + slack), (err / bound).max()
  assert err.max() > 0                     # int8 really changed something


@pytest.mark.parametrize("kind", list(KINDS))
def test_decoder_params_converted_and_forward_equals_dequantized(kind):
  cfg = KINDS[kind]
  model = models.build(cfg)
  tokens = jnp.asarray([[3, 1, 4, 1, 5, 9, 2, 6]])
  params = drawn.params(model, tokens)      # the init's shapes (its compile is not tested)
  # one program for every kernel (eager, each kernel's ops compile per shape)
  qparams = jax.jit(lambda p: quantize.quantize_params(cfg, {"params": p}))(params)
  flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(
      qparams, is_leaf=lambda x: isinstance(x, quantize.Int8Kernel))}
  int8 = {k for k, v in flat.items() if isinstance(v, quantize.Int8Kernel)}
  assert int8 == {k for k in flat if k.endswith("['kernel']")}        # every dense kernel
  assert not any("embedding" in k for k in int8)                      # tables stay float
  if kind == "llama":
    assert "['lm_head']['kernel']" in int8
  if kind == "scanned":                   # [layers, ...]: one scale per layer and channel
    qkv = next(v for k, v in flat.items() if k in int8 and "qkv" in k)
    assert qkv.scale.shape[0] == 2 and qkv.scale.shape[1] == 1
  dequantized = jax.tree.map(lambda x: x.astype(jnp.float32) if isinstance(
      x, quantize.Int8Kernel) else x, qparams,
      is_leaf=lambda x: isinstance(x, quantize.Int8Kernel))
  apply = jax.jit(lambda p: model.apply({"params": p}, tokens))
  got, want, float_logits = apply(qparams), apply(dequantized), apply(params)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
  gap = float(jnp.abs(got - float_logits).max())
  assert 0 < gap < 0.1 * float(jnp.abs(float_logits).max())
  assert quantize.param_bytes(qparams) < 0.5 * quantize.param_bytes(params)
  if kind == "gpt":                       # decoding reads the same kernels
    out = generate(cfg, qparams, np.asarray(tokens[0]), max_new_tokens=3, temperature=0.0)
    ref = generate(cfg, dequantized, np.asarray(tokens[0]), max_new_tokens=3, temperature=0.0)
    np.testing.assert_array_equal(out, ref)


def test_refusals():
  with pytest.raises(ValueError, match="model.family='bert'.*decoder"):
    quantize.quantize_params(dict(family="bert"), {})
  with pytest.raises(ValueError, match="do not fit model_config"):
    quantize.quantize_params(GPT, {"embed": {"embedding": np.zeros((37, 32))}})
