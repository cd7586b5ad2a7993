"""Sampling with a KV cache: greedy == full-forward argmax, filters vs NumPy, seeds, errors."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxformer import models
from jaxformer.inference import decode as gen_lib
from jaxformer.inference import filter_logits, generate
from tests import drawn

# One layer: `generate` carries the cache as a pytree, whatever the layers (test_models checks
# the model's per-layer caches at 3 layers); each decoding loop compiles ~30 % faster. The tests
# share their loops' static arguments where they can (24 new tokens after PROMPT; ragged: 5).
GPT = dict(family="decoder", vocab_size=37, d_model=32, num_layers=1, num_heads=4, mlp_dim=64,
           max_len=64)
LLAMA = dict(GPT, positions="rope", norm="rmsnorm", ffn="swiglu", num_kv_heads=2,
             use_bias=False, tie_embeddings=False)
KINDS = {"gpt": GPT, "llama": LLAMA}
PROMPT = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.int32)


@pytest.fixture(scope="module")
def model_params():
  """kind -> (full model, params); each kind's params are drawn once per module (and worker)."""
  cache = {}

  def get(kind):
    if kind not in cache:
      model = models.build(KINDS[kind])
      cache[kind] = model, drawn.params(model, jnp.zeros((1, 8), jnp.int32))
    return cache[kind]
  return get


def greedy_reference(model, params, prompt, n):
  """Re-run the full (uncached) model on the growing sequence; argmax at the last position.

  The sequence lives in a fixed-size buffer (one compilation): the model is causal, so the
  logits at position t only see tokens <= t and the unfilled tail does not matter."""
  b, p = prompt.shape
  buf = np.zeros((b, p + n), np.int32)
  buf[:, :p] = prompt
  forward = jax.jit(lambda x: model.apply({"params": params}, x))
  for i in range(n):
    logits = np.asarray(forward(jnp.asarray(buf)))
    buf[:, p + i] = logits[:, p + i - 1].argmax(-1)
  return buf


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_greedy_equals_full_forward_argmax(model_params, kind):
  model, params = model_params(kind)
  got = generate(KINDS[kind], params, PROMPT, max_new_tokens=24, temperature=0.0)
  assert got.dtype == np.int32 and got.shape == (2, 29)
  np.testing.assert_array_equal(got, greedy_reference(model, params, PROMPT, 24))


def test_sampling_is_reproducible_and_rows_are_independent(model_params):
  _, params = model_params("gpt")
  same = np.repeat(PROMPT[:1], 2, axis=0)            # two identical rows
  kw = dict(max_new_tokens=24, temperature=1.5, top_k=3)
  a = generate(GPT, params, same, seed=0, **kw)
  assert a.dtype == np.int32 and a.shape == (2, 29)
  np.testing.assert_array_equal(a[:, :5], same)
  assert ((a >= 0) & (a < GPT["vocab_size"])).all()
  # same seed, same tokens (ConfigDict and a {"params": ...} dict are accepted too)
  np.testing.assert_array_equal(
      generate(ml_collections.ConfigDict(GPT), {"params": params}, same, seed=0, **kw), a)
  assert not np.array_equal(a[0], a[1])              # rows draw their own samples
  assert not np.array_equal(generate(GPT, params, same, seed=1, **kw), a)
  # a row's tokens depend only on its prompt and the seed, not on the rest of the batch;
  # a 1-D prompt gives a 1-D result
  alone = generate(GPT, params, same[0], seed=0, **kw)
  assert alone.shape == (29,)
  np.testing.assert_array_equal(alone, a[0])


def test_top_k_one_sampling_with_bigger_cache_equals_greedy(model_params):
  _, params = model_params("llama")
  greedy = generate(LLAMA, params, PROMPT, max_new_tokens=24, temperature=0)
  # top_k=1 leaves only the argmax (top_p after it changes nothing); a cache longer than
  # needed must not change the result (unwritten slots are masked)
  got = generate(LLAMA, params, PROMPT, max_new_tokens=24, temperature=0.7, seed=3, top_k=1,
                 top_p=0.9, max_len=40)
  np.testing.assert_array_equal(got, greedy)


# ------------------------------------------------------------------------- filter_logits


def np_filter(logits, top_k=None, top_p=None):
  """Loop-by-loop reference: keep the k largest (ties with the k-th kept), then walk tokens
  from most to least likely adding them while the mass before them is < top_p (ties with the
  last one added kept)."""
  out = np.array(logits, np.float64)
  for row in out.reshape(-1, out.shape[-1]):
    if top_k is not None:
      kth = np.sort(row)[::-1][min(top_k, row.size) - 1]
      row[row < kth] = -np.inf
    if top_p is not None and top_p < 1:            # top_p=1: every token (mass reaches 1)
      p = np.exp(row - row.max())
      p /= p.sum()
      order = np.argsort(-row, kind="stable")
      mass, last = 0.0, None
      for i in order:
        if mass >= top_p:
          break
        # the decision must not hinge on float32 vs float64 rounding
        assert abs(mass - top_p) > 1e-5, "test data too close to the top_p boundary"
        mass, last = mass + p[i], i
      row[row < row[last]] = -np.inf
  return out


def assert_same_filter(got, want):
  got = np.asarray(got)
  np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
  kept = ~np.isneginf(want)
  np.testing.assert_allclose(got[kept], want[kept], rtol=1e-6)
  assert kept.any(-1).all()                          # at least one token always survives
  rows = np.arange(want.shape[0])
  assert kept[rows, np.asarray(want).argmax(-1)].all()


@pytest.mark.parametrize("vocab", [7, 13, 31])
@pytest.mark.parametrize("top_k,top_p", [
    (1, None), (3, None), (6, None), (100, None),
    (None, 0.05), (None, 0.5), (None, 0.9), (None, 1.0),
    (4, 0.6), (2, 0.99), (10, 0.3)])
def test_filter_logits_matches_numpy(vocab, top_k, top_p):
  logits = np.asarray(jax.random.normal(jax.random.key(vocab), (5, vocab))) * 2.0
  logits[0, 1] = -np.inf                             # already-masked entries stay masked
  assert_same_filter(filter_logits(logits, top_k=top_k, top_p=top_p),
                     np_filter(logits, top_k, top_p))


def test_filter_logits_ties_and_edge_cases():
  x = np.array([[2.0, 0.5, 2.0, -1.0, 2.0, 0.5, 1.0]], np.float32)
  got = np.asarray(filter_logits(x, top_k=2))        # the 2nd largest is tied with the 1st
  np.testing.assert_array_equal(np.isfinite(got[0]), x[0] == 2.0)
  got = np.asarray(filter_logits(x, top_p=0.5))      # each 2.0 has ~0.26 of the mass
  np.testing.assert_array_equal(np.isfinite(got[0]), x[0] == 2.0)
  assert_same_filter(filter_logits(x, top_k=5, top_p=0.9), np_filter(x, 5, 0.9))
  flat = np.zeros((1, 9), np.float32)                # all tied: everything is kept
  assert np.isfinite(np.asarray(filter_logits(flat, top_k=1, top_p=0.01))).all()
  one = np.full((1, 5), -np.inf, np.float32)
  one[0, 3] = 0.0                                    # a single finite token survives any filter
  np.testing.assert_array_equal(np.asarray(filter_logits(one, top_k=2, top_p=0.1)), one)
  np.testing.assert_array_equal(np.asarray(filter_logits(x)), x)   # no filter: identity
  assert filter_logits(jnp.ones((2, 3, 4)), top_k=2, top_p=0.5).shape == (2, 3, 4)


def _chi_square(counts, probs):
  n = counts.sum()
  return float(((counts - n * probs) ** 2 / (n * probs)).sum())


@pytest.mark.parametrize("top_k,top_p", [(None, 0.8), (5, 0.9)])
def test_filtered_sampling_follows_renormalised_distribution(top_k, top_p):
  logits = np.asarray(jax.random.normal(jax.random.key(7), (11,))) * 1.5
  want = np_filter(logits, top_k, top_p)
  probs = np.exp(want - want.max())
  probs /= probs.sum()                               # the renormalised nucleus distribution
  n = 40_000
  # the filter is under test, not the key: an "rbg" key compiles much faster than threefry
  keys = jax.random.split(jax.random.key(0, impl="rbg"), n)
  filtered = filter_logits(logits, top_k=top_k, top_p=top_p)
  samples = jax.jit(jax.vmap(lambda k: jax.random.categorical(k, filtered)))(keys)
  counts = np.bincount(np.asarray(samples), minlength=logits.size).astype(np.float64)
  kept = probs > 0
  assert 2 <= kept.sum() < logits.size               # the filter removed something
  assert counts[~kept].sum() == 0                    # nothing outside the nucleus
  df = kept.sum() - 1
  # chi-square with df <= 10: mean df, sd sqrt(2 df); this bound has p < 1e-6
  assert _chi_square(counts[kept], probs[kept]) < df + 8 * np.sqrt(2 * df) + 5


# ------------------------------------------------------------------------------ errors


@pytest.fixture
def no_compile(monkeypatch):
  """Errors must come before anything is traced or compiled."""
  def fail(*args, **kwargs):
    raise AssertionError("compiled despite bad arguments")
  monkeypatch.setattr(gen_lib, "_generate", fail)


@pytest.mark.parametrize("kwargs,name", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=2.0), "max_new_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(prompt=np.zeros((2, 0), np.int32)), "prompt"),
    (dict(prompt=np.ones((2, 3), np.float32)), "prompt"),
    (dict(prompt=np.ones((1, 2, 3), np.int32)), "prompt"),
    (dict(prompt=np.array([[1, 37]])), "prompt"),
    (dict(model_config=dict(GPT, family="bert")), "family"),
    (dict(max_len=10), "max_len"),                   # smaller than 5 + 6
    (dict(max_new_tokens=60), "max_len"),            # 5 + 60 > learned model.max_len=64
    (dict(max_len=65), "max_len"),
])
def test_bad_arguments_raise_value_error_naming_them(no_compile, kwargs, name):
  args = dict(model_config=GPT, params={}, prompt=PROMPT, max_new_tokens=6)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    generate(args.pop("model_config"), args.pop("params"), args.pop("prompt"), **args)


def test_filter_logits_rejects_bad_arguments():
  for kw, name in ((dict(top_k=0), "top_k"), (dict(top_p=0.0), "top_p"),
                   (dict(top_p=1.01), "top_p")):
    with pytest.raises(ValueError, match=name):
      filter_logits(jnp.zeros((3,)), **kw)


def test_rope_model_may_exceed_max_len(monkeypatch):
  """max_len bounds only a learned position table: RoPE needs no check (and compiles)."""
  seen = {}

  def fake(model, params, prompt, temperature, seed, **static):
    seen.update(static, decode=model.decode)
    return jnp.zeros((prompt.shape[0], prompt.shape[1] + static["max_new_tokens"]), jnp.int32)
  monkeypatch.setattr(gen_lib, "_generate", fake)
  out = generate(LLAMA, {}, PROMPT, max_new_tokens=70)
  assert out.shape == (2, 75)
  assert seen == dict(max_new_tokens=70, cache_len=75, greedy=False, top_k=None, top_p=None,
                      vocab_limit=None, decode=True)


# Greedy, and sampling through each filter (the unfiltered draw is their last step).
@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, None, None), (2.0, 3, None),
                                                       (1.0, None, 0.9)])
def test_vocab_limit_never_produces_padded_ids(model_params, temperature, top_k, top_p):
  """A model vocabulary padded past the tokenizer's: ids >= vocab_limit are never drawn."""
  _, params = model_params("gpt")
  kw = dict(max_new_tokens=24, temperature=temperature, top_k=top_k, top_p=top_p, seed=1)
  free = generate(GPT, params, PROMPT, **kw)[:, 5:]
  assert free.max() >= 4                              # unlimited, the padded ids do come up
  limited = generate(GPT, params, PROMPT, vocab_limit=4, **kw)[:, 5:]
  assert limited.min() >= 0 and limited.max() < 4
  with pytest.raises(ValueError, match="vocab_limit=38 must be an int in"):
    generate(GPT, params, PROMPT, vocab_limit=38, **kw)


class _Chars:
  """A tokenizer stub: ids are the text's code points minus 'a' (vocabulary 26)."""
  vocab_size = 26

  def encode(self, text):
    return np.array([ord(c) - ord("a") for c in text], np.int32)

  def decode(self, ids):
    return "".join(chr(ord("a") + int(i)) for i in ids)


def test_long_sample_compiles_twice_and_equals_chunk_by_chunk_generation():
  """Past a learned-position model's max_len, sample_text continues in windows of max_len // 2
  tokens: the chunks after the first share one compilation (the last one is a full window,
  cut), and the text equals generating each chunk with exactly the tokens it needs."""
  from jaxformer.inference import sample_text
  cfg = dict(GPT, vocab_size=26, max_len=16)
  params = drawn.params(models.build(cfg), jnp.zeros((1, 8), jnp.int32))
  config = ml_collections.ConfigDict(dict(model=cfg))
  before = gen_lib._generate._cache_size()
  text = sample_text(config, params, _Chars(), prompt="abc", max_new_tokens=43, seed=3,
                     temperature=1.0)
  assert gen_lib._generate._cache_size() - before <= 2
  out, chunk, ids = [0, 1, 2], 0, np.array([0, 1, 2])
  while len(out) < 3 + 43:                   # 13, then 8 per window, the last one 6
    n = min(3 + 43 - len(out), 16 - len(ids))
    seed = int(np.random.SeedSequence([3, chunk]).generate_state(1)[0])
    out += generate(cfg, params, ids, max_new_tokens=n, temperature=1.0, seed=seed,
                    vocab_limit=26)[len(ids):].tolist()
    chunk, ids = chunk + 1, np.array(out[-8:])
  assert text == _Chars().decode(out)


def test_generate_ragged_rows_equal_each_prompt_alone(model_params):
  """Ragged prompts through one cache: a row's tokens (greedy, and sampled with its row id)
  equal `generate` on its prompt alone, whatever the other rows and the padding."""
  _, params = model_params("gpt")
  prompts = [np.array([3, 1, 4, 1, 5, 9, 2]), np.array([9, 2]), np.array([6, 5, 3, 5])]
  width = 9
  padded = np.full((3, width), 36, np.int32)        # padding past a row's length is never read
  for r, p in enumerate(prompts):
    padded[r, :len(p)] = p
  lengths = np.array([len(p) for p in prompts])
  greedy = gen_lib.generate_ragged(GPT, params, padded, lengths, max_new_tokens=5,
                                   temperature=0.0)
  assert greedy.shape == (3, 5)
  for r, p in enumerate(prompts):
    alone = generate(GPT, params, p, max_new_tokens=5, temperature=0.0)[len(p):]
    np.testing.assert_array_equal(greedy[r], alone)
  # sampled: a row with row id 0 draws the keys `generate` gives its only row
  got = gen_lib.generate_ragged(GPT, params, padded, lengths, max_new_tokens=5,
                                temperature=1.0, seed=11, rows=np.array([7, 0, 9]), prefill=1)
  alone = generate(GPT, params, prompts[1], max_new_tokens=5, temperature=1.0, seed=11)[2:]
  np.testing.assert_array_equal(got[1], alone)
  with pytest.raises(ValueError, match="lengths"):
    gen_lib.generate_ragged(GPT, params, padded, np.array([0, 2, 3]), max_new_tokens=2)


def test_generate_ragged_per_row_seeds_temperatures_and_on_step(model_params):
  """One batch of requests with their own seeds and temperatures (0: greedy): each row equals
  `generate` on its prompt alone with its seed; `on_step` sees every new token, in order."""
  _, params = model_params("gpt")
  prompts = [np.array([3, 1, 4, 1, 5, 9, 2]), np.array([9, 2]), np.array([6, 5, 3, 5])]
  padded = np.zeros((3, 7), np.int32)
  for r, p in enumerate(prompts):
    padded[r, :len(p)] = p
  lengths = np.array([len(p) for p in prompts])
  temps, seeds = [0.0, 1.0, 0.7], [5, 6, 7]
  seen = []
  got = gen_lib.generate_ragged(GPT, params, padded, lengths, max_new_tokens=5,
                                temperature=temps, seed=seeds, rows=np.zeros(3, int),
                                on_step=lambda j, t: seen.append((int(j), np.asarray(t))))
  for r, p in enumerate(prompts):
    alone = generate(GPT, params, p, max_new_tokens=5, temperature=temps[r], seed=seeds[r])
    np.testing.assert_array_equal(got[r], alone[len(p):])
  assert [j for j, _ in seen] == list(range(1, 7 + 5))     # from prefill = 1 to the last slot
  for r in range(3):
    streamed = [int(t[r]) for j, t in seen if 0 <= j - lengths[r] < 5]
    assert streamed == got[r].tolist()
  with pytest.raises(ValueError, match="seed must be an int or one int per row"):
    gen_lib.generate_ragged(GPT, params, padded, lengths, max_new_tokens=2, seed=[1, 2])
  with pytest.raises(ValueError, match="temperature must be"):
    gen_lib.generate_ragged(GPT, params, padded, lengths, max_new_tokens=2,
                            temperature=[1.0, -1.0, 0.0])
