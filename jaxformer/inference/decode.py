"""Autoregressive sampling from a decoder LM with a KV cache.

`generate(model_config, params, prompt, max_new_tokens=...)` builds the decoding variant of the
model (`decode=True`), prefills the cache with the whole prompt in one call and then produces
one token per step inside a single jitted `lax.fori_loop` (one compilation per model, prompt
shape, number of new tokens, cache length and filter setting; the seed and the temperature are
traced, so changing them does not recompile).

Sampling: temperature 0 is greedy argmax; otherwise logits / temperature, then the top-k filter,
then the top-p (nucleus) filter (`filter_logits`), then `jax.random.categorical`. The key of
step s (0-based index of the new token) is `fold_in(key(seed), s)`, split per batch row with
`fold_in(step_key, row)`, so a row's tokens depend only on the seed, its own prompt and the
model: the same prompt gives the same tokens alone or inside a batch (up to floating-point
differences between batched and unbatched forward passes).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jaxformer import models
from jaxformer.layers.kv_cache import KVCachePolicy


def _check_top_k(top_k):
  if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                            or top_k < 1):
    raise ValueError(f"top_k={top_k!r} must be an int >= 1 (or None for no top-k filter)")


def _check_top_p(top_p):
  if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
                            or not 0.0 < top_p <= 1.0):
    raise ValueError(f"top_p={top_p!r} must be a float in (0, 1] (or None for no nucleus "
                     "filter)")


def filter_logits(logits, *, top_k: int | None = None, top_p: float | None = None):
  """Top-k then top-p (nucleus) filtering over the last axis; removed entries become -inf.

  top_k keeps the k largest logits (k is clipped to the vocabulary size); top_p keeps the
  smallest set of most likely tokens whose probability mass (softmax of the top-k-filtered
  logits) is >= top_p. Both filters are thresholds on the logit value, so tokens tied with the
  last kept one are kept too (the result never depends on how a sort orders ties, and may hold
  more than k tokens when there are ties). The most likely token is always kept. Entries that
  are already -inf stay -inf. Returns float32 logits of the input's shape.
  """
  _check_top_k(top_k)
  _check_top_p(top_p)
  logits = jnp.asarray(logits, jnp.float32)
  vocab = logits.shape[-1]
  if top_k is not None and top_k < vocab:
    kth = jax.lax.top_k(logits, int(top_k))[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  if top_p is not None and top_p < 1.0:
    sorted_logits = -jnp.sort(-logits, axis=-1)                   # descending
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs              # mass of strictly better ones
    keep = mass_before < top_p                                    # index 0 always kept
    cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits >= cutoff, logits, -jnp.inf)
  return logits


def _checked_sampling(caller: str, model_config, *, max_new_tokens, temperature, top_k,
                      top_p, seed, vocab_limit) -> dict:
  """The decoder's config dict, after the sampling arguments `generate` and
  `generate_ragged` share are checked (a ValueError names the first bad one)."""
  cfg = models.config_as_dict(model_config)
  if cfg.get("family") != "decoder":
    raise ValueError(f"model_config.family={cfg.get('family')!r}: {caller} needs "
                     "family='decoder'")
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or (
      max_new_tokens < 1):
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
  if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (
      math.isfinite(temperature) and temperature >= 0):
    raise ValueError(f"temperature={temperature!r} must be a finite number >= 0 "
                     "(0 for greedy decoding)")
  _check_top_k(top_k)
  _check_top_p(top_p)
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise ValueError(f"seed={seed!r} must be an int")
  vocab = cfg.get("vocab_size")
  if vocab_limit is not None and (
      isinstance(vocab_limit, bool) or not isinstance(vocab_limit, numbers.Integral)
      or not 1 <= vocab_limit <= (vocab if isinstance(vocab, int) else vocab_limit)):
    raise ValueError(f"vocab_limit={vocab_limit!r} must be an int in [1, model.vocab_size="
                     f"{vocab}] (the tokenizer's vocabulary size)")
  return cfg


def generate(model_config: Any, params: Any, prompt, *, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             seed: int = 0, max_len: int | None = None,
             vocab_limit: int | None = None, kv_cache=None) -> np.ndarray:
  """Sample `max_new_tokens` tokens after `prompt` from a decoder LM.

  Args:
    model_config: the model's config (dict or ConfigDict, `family='decoder'`); the decoding
      variant is built from it with `decode=True`.
    params: the model's parameters (the "params" collection; a {"params": ...} variables dict
      and logically-partitioned boxes are accepted too).
    prompt: int tokens [B, P] (or [P]: one sequence, and the result is 1-D).
    max_new_tokens: number of tokens to generate (>= 1).
    temperature: 0 for greedy argmax decoding; otherwise logits are divided by it.
    top_k, top_p: sampling filters (see `filter_logits`); ignored when temperature == 0.
    seed: the sampling seed (an int, taken mod 2**32); the same seed gives the same tokens.
    max_len: length of the KV cache (default P + max_new_tokens; must be at least that).
    vocab_limit: ids >= this are never produced (greedy or sampled): a model vocabulary
      padded past the tokenizer's (e.g. to a multiple of the mesh) has rows no text maps to.
    kv_cache: a `layers.kv_cache.KVCachePolicy` (sliding window, attention sinks, heavy
      hitters, int8; a fixed budget of slots per layer), or None (the default: the full
      cache of max_len positions; KVCachePolicy() and None run the same path).

  Returns:
    np.ndarray int32 [B, P + max_new_tokens] (or [P + max_new_tokens]): prompt then samples.
  """
  cfg = _checked_sampling("generate", model_config, max_new_tokens=max_new_tokens,
                          temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                          vocab_limit=vocab_limit)
  vocab = cfg.get("vocab_size")

  tokens = np.asarray(prompt)
  if tokens.dtype.kind not in "iu":
    raise ValueError(f"prompt must be an integer array of token ids; got dtype {tokens.dtype}")
  if tokens.ndim not in (1, 2) or tokens.size == 0:
    raise ValueError(f"prompt must be a non-empty [batch, length] or [length] array; got "
                     f"shape {tokens.shape}")
  squeeze = tokens.ndim == 1
  if squeeze:
    tokens = tokens[None]
  if isinstance(vocab, int) and (tokens.min() < 0 or tokens.max() >= vocab):
    raise ValueError(f"prompt token ids must be in [0, vocab_size={vocab}); got range "
                     f"[{tokens.min()}, {tokens.max()}]")
  tokens = tokens.astype(np.int32)
  prompt_len = tokens.shape[1]
  needed = prompt_len + int(max_new_tokens)
  if max_len is None:
    max_len = needed
  elif isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral) or (
      max_len < needed):
    raise ValueError(f"max_len={max_len!r} must be an int >= prompt length + max_new_tokens "
                     f"= {prompt_len} + {max_new_tokens} = {needed}")

  cfg["decode"] = True
  model = with_kv_cache(models.build(cfg), kv_cache, int(max_len))   # validates the config
  if model.positions == "learned" and max_len > model.max_len:
    raise ValueError(f"max_len={max_len} (prompt length {prompt_len} + max_new_tokens "
                     f"{max_new_tokens} by default) exceeds the model's learned position "
                     f"table, model.max_len={model.max_len}")

  if isinstance(params, Mapping) and "params" in params:
    params = params["params"]
  params = nn.unbox(params)
  greedy = temperature == 0
  out = _generate(model, params, jnp.asarray(tokens), jnp.float32(temperature if not greedy
                                                                  else 1.0),
                  jnp.uint32(int(seed) % 2**32), max_new_tokens=int(max_new_tokens),
                  cache_len=int(max_len), greedy=greedy,
                  top_k=None if greedy or top_k is None else int(top_k),
                  top_p=None if greedy or top_p is None or top_p == 1 else float(top_p),
                  vocab_limit=None if vocab_limit is None or vocab_limit == vocab
                  else int(vocab_limit))
  out = np.asarray(out, np.int32)
  return out[0] if squeeze else out


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "cache_len", "greedy",
                                             "top_k", "top_p", "vocab_limit"))
def _generate(model, params, prompt, temperature, seed, *, max_new_tokens, cache_len, greedy,
              top_k, top_p, vocab_limit):
  batch, prompt_len = prompt.shape
  # The cache starts as zeros (what `init` allocates); only its shapes are traced here.
  shapes = jax.eval_shape(
      functools.partial(model.init, positions=jnp.arange(cache_len)[None]),
      jax.random.key(0), jnp.zeros((batch, cache_len), jnp.int32))["cache"]
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  key = jax.random.key(seed)
  rows = jnp.arange(batch)

  def step(cache, toks, start):
    positions = start + jnp.arange(toks.shape[1])[None]
    logits, state = model.apply({"params": params, "cache": cache}, toks, positions=positions,
                                mutable=["cache"])
    return logits[:, -1], state["cache"]

  def sample(logits, index):
    if vocab_limit is not None:                  # padded rows: never a token
      logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits, -jnp.inf)
    if greedy:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
    row_keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.fold_in(key, index), rows)
    return jax.vmap(jax.random.categorical)(row_keys, logits).astype(jnp.int32)

  logits, cache = step(cache, prompt, 0)
  new = jnp.zeros((batch, max_new_tokens), jnp.int32)
  new = new.at[:, 0].set(sample(logits, 0))

  def body(i, carry):
    cache, new = carry
    last = jax.lax.dynamic_slice_in_dim(new, i - 1, 1, axis=1)
    logits, cache = step(cache, last, prompt_len + i - 1)
    return cache, jax.lax.dynamic_update_slice_in_dim(new, sample(logits, i)[:, None], i, axis=1)

  _, new = jax.lax.fori_loop(1, max_new_tokens, body, (cache, new))
  return jnp.concatenate([prompt, new], axis=1)


def with_kv_cache(model, kv_cache, cache_len: int):
  """The decoding `model` with the compressed cache `kv_cache` (a KVCachePolicy; "full"
  sized to `cache_len`), or `model` itself for None / the default full cache."""
  if kv_cache is None:
    return model
  if not isinstance(kv_cache, KVCachePolicy):
    raise ValueError(f"kv_cache={kv_cache!r} must be a KVCachePolicy (jaxformer.inference."
                     "KVCachePolicy) or None")
  if kv_cache.is_default:
    return model
  if "kv_cache" not in {f.name for f in dataclasses.fields(model)}:
    raise ValueError(f"kv_cache: {type(model).__name__} has no compressed KV cache (decoder "
                     "LMs only)")
  return model.clone(kv_cache=kv_cache.resolved(cache_len))


def generate_ragged(model_config: Any, params, prompts, lengths, *, max_new_tokens: int,
                    temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None, seed: int = 0, rows=None,
                    vocab_limit: int | None = None, prefill: int | None = None,
                    on_step=None) -> np.ndarray:
  """`max_new_tokens` tokens after each of a batch of prompts of different lengths, with the
  KV cache: int32 [B, max_new_tokens] (row r's tokens follow its `lengths[r]` prompt tokens).

  `prompts` int [B, W] right-padded (what lies past a row's length is never read), `lengths`
  [B] in [1, W]. Every row shares the cache index: the common first `prefill` tokens (default
  min(lengths), rounded down to a multiple of 16 so a few shapes compile) fill the cache in one
  call, then one token per step is fed, a row's own prompt token while it has one left (teacher
  forced) and its sample after that, so every token sits at its true position and the
  positions past a row's prompt are its own samples: the logits equal those of the row alone.
  W + max_new_tokens - 1 - prefill steps and a cache of W + max_new_tokens - 1 positions. The key of row r's i-th new token is
  fold_in(fold_in(key(seed), i), rows[r]) (`rows` default arange(B)): a row's tokens do not
  depend on its batch, its padding or the other rows' lengths. Sampling as `generate`
  (temperature 0: greedy; top-k, top-p, vocab_limit).

  `seed` and `temperature` may also be one per row ([B] sequences: a server's batch of
  requests), row r then drawing exactly what it would with the scalar seed[r] and
  temperature[r] (0: that row is greedy). `on_step(j, tokens)`, when given, is called on the
  host from inside the decoding loop (`jax.experimental.io_callback`, ordered) for each slot
  j >= prefill with the int32 [B] tokens placed at slot j (row r's new token index is
  j - lengths[r] where that is >= 0): tokens as they are made, for streaming. It is a static
  argument of the compiled loop: pass the same callable each time (one compilation)."""
  per_row = np.ndim(seed) == 1 or np.ndim(temperature) == 1
  seeds = np.asarray(seed) if np.ndim(seed) == 1 else None
  temps = np.asarray(temperature, np.float64) if np.ndim(temperature) == 1 else None
  if seeds is not None and (seeds.dtype.kind not in "iu" or seeds.shape != np.shape(prompts)[:1]):
    raise ValueError(f"seed must be an int or one int per row; got {seeds.dtype} {seeds.shape}")
  if temps is not None and (temps.shape != np.shape(prompts)[:1] or not np.all(
      np.isfinite(temps) & (temps >= 0))):
    raise ValueError(f"temperature must be a number >= 0 or one per row; got {temps.tolist()}")
  cfg = _checked_sampling("generate_ragged", model_config, max_new_tokens=max_new_tokens,
                          temperature=float(temps.max()) if temps is not None else temperature,
                          top_k=top_k, top_p=top_p, seed=0 if seeds is not None else seed,
                          vocab_limit=vocab_limit)
  tokens = np.asarray(prompts)
  lengths = np.asarray(lengths)
  if tokens.ndim != 2 or tokens.dtype.kind not in "iu":
    raise ValueError(f"prompts must be an int [batch, width] array; got {tokens.dtype} "
                     f"{tokens.shape}")
  b, width = tokens.shape
  if lengths.shape != (b,) or lengths.min() < 1 or lengths.max() > width:
    raise ValueError(f"lengths must be [{b}] ints in [1, {width}]")
  if prefill is None:
    prefill = max(int(lengths.min()) // 16 * 16, 1)
  if not 1 <= prefill <= int(lengths.min()):
    raise ValueError(f"prefill={prefill} must be in [1, min(lengths)={int(lengths.min())}]")
  cache_len = width + int(max_new_tokens) - 1     # the last token is sampled, never fed
  cfg["decode"] = True
  model = models.build(cfg)
  if model.positions == "learned" and cache_len > model.max_len:
    raise ValueError(f"prompt width {width} + max_new_tokens {max_new_tokens} - 1 exceeds the "
                     f"model's learned position table, model.max_len={model.max_len}")
  if isinstance(params, Mapping) and "params" in params:
    params = params["params"]
  params = nn.unbox(params)
  rows = np.arange(b) if rows is None else np.asarray(rows)
  if per_row:
    temps = np.broadcast_to(temperature if temps is None else temps, (b,)).astype(np.float64)
    seeds = np.broadcast_to(seed if seeds is None else seeds, (b,)).astype(np.int64) % 2**32
    greedy = bool(np.all(temps == 0))
    temp_arg = jnp.asarray(np.where(temps == 0, -1.0, temps), jnp.float32)  # < 0: greedy row
    seed_arg = jnp.asarray(seeds, jnp.uint32)
  else:
    greedy = temperature == 0
    temp_arg = jnp.float32(temperature if not greedy else 1.0)
    seed_arg = jnp.uint32(int(seed) % 2**32)
  out = _generate_ragged(model, params, jnp.asarray(tokens, jnp.int32),
                         jnp.asarray(lengths, jnp.int32), jnp.asarray(rows, jnp.uint32),
                         temp_arg, seed_arg, max_new_tokens=int(max_new_tokens),
                         prefill=int(prefill), greedy=greedy, on_step=on_step,
                         top_k=None if greedy or top_k is None else int(top_k),
                         top_p=None if greedy or top_p is None or top_p == 1 else float(top_p),
                         vocab_limit=None if vocab_limit is None
                         or vocab_limit == cfg.get("vocab_size") else int(vocab_limit))
  return np.asarray(out, np.int32)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "prefill", "greedy",
                                             "top_k", "top_p", "vocab_limit", "on_step"))
def _generate_ragged(model, params, prompts, lengths, rows, temperature, seed, *,
                     max_new_tokens, prefill, greedy, top_k, top_p, vocab_limit, on_step=None):
  # temperature and seed: scalars, or [B] per row (a temperature < 0 marks a greedy row)
  batch, width = prompts.shape
  slots = width + max_new_tokens
  cache_len = slots - 1               # every slot but the last is fed
  shapes = jax.eval_shape(
      functools.partial(model.init, positions=jnp.arange(cache_len)[None]),
      jax.random.key(0), jnp.zeros((batch, cache_len), jnp.int32))["cache"]
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  key = jax.random.key(seed) if seed.ndim == 0 else jax.vmap(jax.random.key)(seed)
  seq = jnp.concatenate([prompts, jnp.zeros((batch, max_new_tokens), jnp.int32)], axis=1)

  def forward(cache, toks, start):
    positions = start + jnp.arange(toks.shape[1])[None]
    logits, state = model.apply({"params": params, "cache": cache}, toks, positions=positions,
                                mutable=["cache"])
    return logits[:, -1], state["cache"]

  def sample(logits, index):           # index [B]: the new token's index in its row
    if vocab_limit is not None:
      logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits, -jnp.inf)
    if greedy:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    temp = temperature if temperature.ndim == 0 else jnp.where(
        temperature < 0, 1.0, temperature)[:, None]
    filtered = filter_logits(logits / temp, top_k=top_k, top_p=top_p)
    keys = jax.vmap(lambda i, r, k: jax.random.fold_in(jax.random.fold_in(k, i), r),
                    (0, 0, None if key.ndim == 0 else 0))(jnp.maximum(index, 0), rows, key)
    drawn = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
    if temperature.ndim == 0:
      return drawn
    return jnp.where(temperature < 0, jnp.argmax(logits, axis=-1).astype(jnp.int32), drawn)

  logits, cache = forward(cache, prompts[:, :prefill], 0)

  def body(j, carry):                  # slot j gets a token, then it is fed
    cache, seq, logits = carry
    own = jax.lax.dynamic_slice_in_dim(seq, j, 1, axis=1)[:, 0]
    tok = jnp.where(j < lengths, own, sample(logits, j - lengths))
    seq = jax.lax.dynamic_update_slice_in_dim(seq, tok[:, None], j, axis=1)
    if on_step is not None:
      io_callback(on_step, None, j, tok, ordered=True)
    logits, cache = forward(cache, tok[:, None], j)
    return cache, seq, logits

  # the last slot any row needs is max(lengths) + max_new_tokens - 1 <= slots - 1; its token
  # needs no forward, so the loop stops one short and samples it after
  cache, seq, logits = jax.lax.fori_loop(prefill, slots - 1, body, (cache, seq, logits))
  j = slots - 1
  tok = jnp.where(j < lengths, seq[:, j], sample(logits, j - lengths))
  seq = seq.at[:, j].set(tok)
  if on_step is not None:
    io_callback(on_step, None, j, tok, ordered=True)
  at = lengths[:, None] + jnp.arange(max_new_tokens)[None]
  return jnp.take_along_axis(seq, at, axis=1)


__all__ = ["generate", "generate_ragged", "filter_logits", "with_kv_cache"]
