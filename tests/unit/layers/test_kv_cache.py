"""Compressed KV caches (jaxformer/layers/kv_cache.py) against a float64 NumPy simulation of each
policy: which positions stay, the attention outputs, int8 within its bound, evicted tokens
unseen; and at the model level: a window cache == a model.window forward, budget >= length ==
the full cache, the default path untouched."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import models
from jaxformer.evaluate import needle
from jaxformer.inference import KVCachePolicy, generate, stream_logits_fn, streaming_nll
from jaxformer.inference import decode as decode_lib
from jaxformer.layers import kv_cache as kvc
from jaxformer.ops import positions as pos_ops

POLICIES = [KVCachePolicy("window", 5), KVCachePolicy("sinks", 6, sinks=2),
            KVCachePolicy("heavy_hitter", 6), KVCachePolicy("heavy_hitter", 7, sinks=1,
                                                            recent=2)]


def np_stream(policy, q, k, v, positions, *, scale, left=None, slopes=None, quantize=False):
  """float64 simulation: per (row, kv head) a list of slots [pos, k, v, mass], filled in order,
  then replaced by the policy's victim. Returns (out [B, T, H, D], kept positions per
  (row, kv head) after the last token)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, t, h, d = q.shape
  hkv = k.shape[2]
  g = h // hkv
  if quantize:
    k, v = np_int8(k), np_int8(v)
  out = np.zeros((b, t, h, d))
  kept = {}
  for r in range(b):
    for kh in range(hkv):
      slots = []
      for i in range(t):
        p = positions[i]
        entry = [p, k[r, i, kh], v[r, i, kh], 0.0]
        if len(slots) < policy.budget:
          slots.append(entry)
        else:
          sinks = policy.num_sinks
          if policy.kind == "heavy_hitter":
            free = [j for j, s in enumerate(slots)
                    if s[0] >= sinks and s[0] <= p - policy.num_recent]
            victim = min(free, key=lambda j: (slots[j][3], j))
          else:
            free = [j for j, s in enumerate(slots) if s[0] >= sinks]
            victim = min(free, key=lambda j: slots[j][0])
          slots[victim] = entry
        vis = [j for j, s in enumerate(slots) if left is None or s[0] >= p - left]
        for gi in range(g):
          head = kh * g + gi
          logits = np.array([q[r, i, head] @ slots[j][1] * scale for j in vis])
          if slopes is not None:
            logits -= slopes[head] * np.array([p - slots[j][0] for j in vis])
          w = np.exp(logits - logits.max())
          w /= w.sum()
          out[r, i, head] = sum(wj * slots[j][2] for wj, j in zip(w, vis))
          for wj, j in zip(w, vis):
            slots[j][3] += wj
      kept[r, kh] = sorted(s[0] for s in slots)
  return out, kept


def np_int8(x):
  scale = np.abs(x).max(-1, keepdims=True) / 127
  safe = np.where(scale > 0, scale, 1)
  return np.clip(np.round(x / safe), -127, 127) * scale


def run(policy, q, k, v, positions, **kw):
  cache = {name: jnp.zeros(shape, dtype)
           for name, (shape, dtype) in kvc.cache_shapes(policy, k).items()}
  out, cache = kvc.streaming_attention(cache, q, k, v, positions, 0, policy, **kw)
  return np.asarray(out), cache


def qkv(b=2, t=13, h=4, hkv=2, d=8, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(b, t, h, d)).astype(np.float32),
          rng.normal(size=(b, t, hkv, d)).astype(np.float32),
          rng.normal(size=(b, t, hkv, d)).astype(np.float32))


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.kind}{p.budget}")
@pytest.mark.parametrize("left, alibi", [(None, False), (3, False), (None, True)])
def test_policy_matches_numpy_reference(policy, left, alibi):
  q, k, v = qkv(t=13, h=4, hkv=2)
  positions = np.arange(13)
  slopes = np.asarray(pos_ops.alibi_slopes(4)) if alibi else None
  got, cache = run(policy, q, k, v, positions, scale=0.35,
                   window=None if left is None else (left, 0), alibi_slopes=slopes)
  want, kept = np_stream(policy, q, k, v, positions, scale=0.35, left=left, slopes=slopes)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  pos = np.asarray(cache["cached_positions"])
  for (r, kh), positions_kept in kept.items():
    assert sorted(pos[r, :, kh]) == positions_kept
  if policy.kind == "window":
    assert kept[0, 0] == list(range(8, 13))
  if policy.kind == "sinks":
    assert kept[0, 0] == [0, 1, 9, 10, 11, 12]


def test_heavy_hitter_keeps_different_tokens_per_head():
  q, k, v = qkv(t=20, h=4, hkv=4, seed=1)
  _, kept = np_stream(POLICIES[2], q, k, v, np.arange(20), scale=1.0)
  assert len({tuple(x) for x in kept.values()}) > 1          # the test above covers per-head
  for x in kept.values():
    assert x[-3:] == [17, 18, 19]                             # recent = budget // 2 = 3


@pytest.mark.parametrize("policy", POLICIES + [KVCachePolicy("full", 13)],
                         ids=lambda p: p.kind)
def test_budget_at_least_length_is_full_attention(policy):
  q, k, v = qkv(t=13)
  big = KVCachePolicy(policy.kind, 13, sinks=policy.sinks, recent=policy.recent)
  got, _ = run(big, q, k, v, np.arange(13), scale=0.35)
  want, _ = np_stream(KVCachePolicy("window", 13), q, k, v, np.arange(13), scale=0.35)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.kind}{p.budget}")
def test_evicted_tokens_are_unseen(policy):
  """Changing the key and value of a token the reference has evicted before query t leaves
  t's output alone; changing a kept one does not."""
  q, k, v = qkv(t=13, b=1, hkv=4, seed=2)
  t = 12
  _, kept = np_stream(policy, q[:, :t + 1], k[:, :t + 1], v[:, :t + 1], np.arange(t + 1),
                      scale=0.35)
  base, _ = run(policy, q, k, v, np.arange(13), scale=0.35)
  evicted = sorted(set(range(t + 1)) - set(kept[0, 0]))
  assert evicted
  for j, should_change in ((evicted[-1], False), (kept[0, 0][0], True)):
    k2, v2 = k.copy(), v.copy()
    k2[0, j, 0] += 3.0
    v2[0, j, 0] += 3.0
    got, _ = run(policy, q, k2, v2, np.arange(13), scale=0.35)
    changed = not np.allclose(got[0, t, :1], base[0, t, :1])    # query head 0 <- kv head 0
    assert changed == should_change, (j, policy)


def test_int8_quantization_error_bound():
  x = np.random.default_rng(4).normal(size=(5, 7, 3, 16)).astype(np.float32) * 3
  x[0, 0, 0] = 0.0                                            # an all-zero vector: scale 0
  q, scale = kvc.quantize_int8(jnp.asarray(x))
  assert q.dtype == jnp.int8 and scale.shape == x.shape[:-1]
  back = np.asarray(kvc.dequantize_int8(q, scale), np.float64)
  bound = np.abs(x).max(-1, keepdims=True) / 254
  assert np.all(np.abs(back - x) <= bound * (1 + 1e-6) + 1e-7)
  np.testing.assert_array_equal(back[0, 0, 0], 0.0)


@pytest.mark.parametrize("kind", ["full", "window", "sinks"])
def test_int8_cache_within_bound_of_float(kind):
  """Per query: logits move by <= delta = scale * |q|_1 * max_j max|k_j| / 254, so the
  probabilities by <= e^(2 delta) - 1 in L1, and the output by <= max|v| / 254 + that *
  max|v| (stated in docs/design/kv-cache.md); and int8 equals the NumPy int8 reference."""
  q, k, v = qkv(t=11, seed=5)
  policy = KVCachePolicy(kind, 11 if kind == "full" else 6,
                         sinks=2 if kind == "sinks" else None)
  int8 = KVCachePolicy(policy.kind, policy.budget, sinks=policy.sinks, dtype="int8")
  got, cache = run(int8, q, k, v, np.arange(11), scale=0.35)
  assert cache["cached_key"].dtype == jnp.int8
  want, _ = np_stream(policy, q, k, v, np.arange(11), scale=0.35)
  want8, _ = np_stream(policy, q, k, v, np.arange(11), scale=0.35, quantize=True)
  np.testing.assert_allclose(got, want8, atol=1e-4)
  g = q.shape[2] // k.shape[2]
  kmax = np.repeat(np.abs(k).max(axis=(1, 3)), g, axis=1)          # [B, H] over all tokens
  vmax = np.repeat(np.abs(v).max(axis=(1, 3)), g, axis=1)
  delta = 0.35 * np.abs(q).sum(-1) * kmax[:, None] / 254            # [B, T, H]
  bound = vmax[:, None] / 254 + np.expm1(2 * delta) * vmax[:, None]
  err = np.abs(got - want).max(-1)
  assert np.all(err <= bound + 1e-5)
  assert err.max() > 0                                             # it is quantised


def test_policy_validation():
  for kwargs, match in [(dict(kind="lru", budget=4), "kind='lru'"),
                        (dict(kind="window"), "needs a budget"),
                        (dict(kind="window", budget=0), "budget=0"),
                        (dict(kind="window", budget=8, sinks=2), "sinks=2"),
                        (dict(kind="sinks", budget=4, sinks=4), "sinks=4"),
                        (dict(kind="heavy_hitter", budget=4, sinks=2, recent=3), "recent=3"),
                        (dict(kind="sinks", budget=8, recent=2), "recent=2"),
                        (dict(kind="full", dtype="int4"), "dtype='int4'"),
                        (dict(kind="window", budget=8.0), "budget=8.0")]:
    with pytest.raises(ValueError, match=match):
      KVCachePolicy(**kwargs)
  assert KVCachePolicy("sinks", 8).num_sinks == 4
  assert KVCachePolicy("heavy_hitter", 9).num_recent == 4
  assert KVCachePolicy().is_default and not KVCachePolicy(dtype="int8").is_default


# ----------------------------------------------------------------------- through the model

GPT = dict(family="decoder", vocab_size=37, d_model=32, num_layers=2, num_heads=4, mlp_dim=64,
           max_len=64)
LLAMA = dict(GPT, positions="rope", norm="rmsnorm", ffn="swiglu", num_kv_heads=2,
             use_bias=False, tie_embeddings=False)
KINDS = {"gpt": GPT, "llama": LLAMA}
TOKENS = np.random.default_rng(0).integers(0, 37, (2, 24)).astype(np.int32)


def forward(model, params, tokens):
  """The model's logits, jitted (one compile, not one per op)."""
  return np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t))(params, tokens))


@pytest.fixture(scope="module")
def model_params():
  cache = {}

  def get(kind):
    if kind not in cache:
      model = models.build(KINDS[kind])
      variables = jax.jit(model.init)(jax.random.key(0, impl="rbg"),
                                      jnp.zeros((1, 8), jnp.int32))
      cache[kind] = model, nn.unbox(variables)["params"]
    return cache[kind]
  return get


@pytest.mark.parametrize("kind, policies", [
    ("gpt", (None, KVCachePolicy("sinks", 24))),
    ("llama", (KVCachePolicy("heavy_hitter", 30), KVCachePolicy("window", 24)))])
def test_streaming_full_cache_equals_forward(model_params, kind, policies):
  """Nothing evicted: the streamed logits and NLL are the forward pass's."""
  model, params = model_params(kind)
  want = forward(model, params, TOKENS)
  for policy in policies:
    got = stream_logits_fn(KINDS[kind], params, kv_cache=policy)(TOKENS)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  if kind == "gpt":                       # the needle's reference scorer: the forward pass
    np.testing.assert_allclose(needle.forward_logits_fn(GPT, {"params": params})(TOKENS), want,
                               atol=1e-6)
  nll = streaming_nll(KINDS[kind], params, TOKENS, kv_cache=policies[-1])
  logits = want.astype(np.float64)[:, :-1]
  logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  want_nll = -np.take_along_axis(logp, TOKENS[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(nll["nll"], want_nll, atol=1e-4)
  assert nll["tokens"] == 2 * 23 and nll["sum"] == pytest.approx(want_nll.sum(), abs=1e-3)


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_window_cache_equals_a_window_model(model_params, kind):
  """Budget B sees keys p - (B - 1) .. p at every layer: the forward pass of the same
  weights with model.window = B - 1 (what the mitigation fine-tunes)."""
  model, params = model_params(kind)
  windowed = models.build(dict(KINDS[kind], window=5))
  want = forward(windowed, params, TOKENS)
  got = stream_logits_fn(KINDS[kind], params, kv_cache=KVCachePolicy("window", 6))(TOKENS)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  full = forward(model, params, TOKENS)
  assert not np.allclose(got[:, 6:], full[:, 6:], atol=1e-3)


def test_token_by_token_equals_one_call(model_params):
  _, params = model_params("llama")
  for policy in (KVCachePolicy("heavy_hitter", 6, sinks=1, dtype="int8"),):
    one = stream_logits_fn(LLAMA, params, kv_cache=policy)(TOKENS)
    steps = stream_logits_fn(LLAMA, params, kv_cache=policy, chunk=5)(TOKENS)
    np.testing.assert_allclose(steps, one, atol=1e-5)


def test_generate_default_policy_is_the_default_path(model_params):
  model, params = model_params("gpt")
  assert decode_lib.with_kv_cache(model, KVCachePolicy(), 10) is model
  assert decode_lib.with_kv_cache(model, None, 10) is model
  base = generate(GPT, params, TOKENS[:, :5], max_new_tokens=6, temperature=0.0)
  same = generate(GPT, params, TOKENS[:, :5], max_new_tokens=6, temperature=0.0,
                  kv_cache=KVCachePolicy())
  np.testing.assert_array_equal(same, base)
  big = generate(GPT, params, TOKENS[:, :5], max_new_tokens=6, temperature=0.0,
                 kv_cache=KVCachePolicy("heavy_hitter", 11))
  np.testing.assert_array_equal(big, base)


def test_generate_with_window_follows_the_window_model(model_params):
  """Greedy decoding through a window cache == argmax of the window model's forward pass on
  the growing sequence, past the budget."""
  _, params = model_params("llama")
  got = generate(LLAMA, params, TOKENS[:, :4], max_new_tokens=8, temperature=0.0,
                 kv_cache=KVCachePolicy("window", 4))
  windowed = models.build(dict(LLAMA, window=3))
  buf = got.copy()
  logits = forward(windowed, params, buf)
  np.testing.assert_array_equal(buf[:, 4:], logits[:, 3:-1].argmax(-1))


def test_bad_kv_cache_arguments(model_params):
  _, params = model_params("gpt")
  with pytest.raises(ValueError, match="kv_cache='window'"):
    generate(GPT, params, TOKENS[:, :4], max_new_tokens=2, kv_cache="window")
  with pytest.raises(ValueError, match="chunk=0"):
    stream_logits_fn(GPT, params, chunk=0)
  with pytest.raises(ValueError, match="model.max_len=64"):
    stream_logits_fn(GPT, params)(np.zeros((1, 65), np.int32))


@pytest.mark.parametrize("variant", ["linear", "routing_prefix"])
def test_a_compressed_cache_is_refused_for_attention_variants(variant):
  """Eviction is defined for a softmax over cached keys; the variants decode with the full
  cache only (one line naming the setting)."""
  from jaxformer.layers.attention import MultiHeadAttention
  layer = MultiHeadAttention(num_heads=2, causal=True, decode=True, variant=variant,
                             kv_cache=KVCachePolicy("window", 4))
  with pytest.raises(ValueError, match=f"attention_variant='{variant}' decodes with the full"):
    layer.init(jax.random.key(0), jnp.zeros((1, 8, 8)))
