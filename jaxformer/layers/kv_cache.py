"""Compressed KV caches for decoding: a fixed budget of slots per layer, filled by a policy.

    policy = KVCachePolicy(kind="sinks", budget=64, sinks=4)            # StreamingLLM
    inference.generate(config.model, params, prompt, max_new_tokens=500, kv_cache=policy)

Kinds (what stays when the cache is full and a new token needs a slot):
- "full": every token (the cache holds the whole decode). Without `dtype` this is exactly
  the default cache (`generate` then runs the default path, bit-identical); with
  dtype="int8" it is the int8 cache of `budget` = the decode's length.
- "window": the last `budget` tokens (a sliding window; the oldest slot is replaced).
- "sinks": the first `sinks` tokens (attention sinks, Xiao et al. 2023, StreamingLLM) plus
  the last `budget - sinks`.
- "heavy_hitter": H2O (Zhang et al. 2023): the first `sinks` tokens (default 0), the last
  `recent` (default budget // 2) and, in the other slots, the tokens with the largest
  accumulated attention mass: the sum, over every query since the token entered the cache and
  over the query heads sharing its KV head, of the probability it received. The slot of
  the smallest mass among the unprotected ones is replaced (ties: the lowest slot).
  Eviction is per (batch row, KV head) and per layer, like the paper's.

A token is inserted before its query attends, so every query sees at most `budget` keys,
itself included: "window" with budget B sees what a model trained with `model.window = B - 1`
(keys i - (B - 1) .. i) sees. A call with T tokens (a prompt) runs them one at a time through
the cache inside the layer (a `lax.scan`; the keys and values of all T are computed first,
as a full forward does), so a prompt and a token-by-token feed give the same outputs.

Keys are stored after RoPE, and every slot holds its token's absolute position (per batch
row and KV head: H2O's slots differ per head), so visibility (filled slots; `model.window`
if the model has one) and ALiBi come from positions, not slot order: models with learned,
sinusoidal, rotary or ALiBi positions decode past `budget` tokens (learned ones up to their
table, `model.max_len`).

dtype="int8": keys and values are stored as int8 with one float32 scale per (token, KV head):
scale = max|x| / 127 over the head dim, x ~ round(x / scale) * scale (dequantised on read), so
every element is within scale / 2 = max|x| / 254 of its float value. The attention itself
(logits, softmax, weighted values) runs in float32.

The cache collection holds, per layer: cached_key / cached_value [B, S, Hkv, D] (int8 with
key_scale / value_scale [B, S, Hkv] float32), cached_positions [B, S, Hkv] int32,
attention_mass [B, S, Hkv] float32 (heavy_hitter) and cache_index [] (tokens seen). Slots
at or past cache_index are empty: a cache of zeros (what `generate` starts from) is empty.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

KINDS = ("full", "window", "sinks", "heavy_hitter")
DTYPES = (None, "int8")
DEFAULT_SINKS = 4


@dataclasses.dataclass(frozen=True)
class KVCachePolicy:
  """What a decoding KV cache keeps (see the module docstring). Hashable: it is a static
  field of the attention layers.

  kind: one of KINDS; budget: slots per layer (None only for kind="full": the decode's
  length); sinks: first tokens never evicted (default 4 for "sinks", 0 otherwise; "window"
  and "full" take none); recent: "heavy_hitter"'s protected last tokens (default
  budget // 2); dtype: None (the model's dtype) or "int8".
  """
  kind: str = "full"
  budget: int | None = None
  sinks: int | None = None
  recent: int | None = None
  dtype: str | None = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kv_cache.kind={self.kind!r} is not one of {KINDS}")
    if self.dtype not in DTYPES:
      raise ValueError(f"kv_cache.dtype={self.dtype!r} is not one of {DTYPES} (None: the "
                       "model's dtype)")
    for name in ("budget", "sinks", "recent"):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or not isinstance(value,
                                                                           numbers.Integral)):
        raise ValueError(f"kv_cache.{name}={value!r} must be an int or None")
    if self.budget is None:
      if self.kind != "full":
        raise ValueError(f"kv_cache.kind={self.kind!r} needs a budget (slots per layer), e.g. "
                         "budget=64")
    elif self.budget < 1:
      raise ValueError(f"kv_cache.budget={self.budget} must be >= 1")
    if self.kind in ("full", "window") and self.sinks:
      raise ValueError(f"kv_cache.sinks={self.sinks} needs kind='sinks' or 'heavy_hitter'; "
                       f"kind={self.kind!r} keeps no sinks")
    if self.kind != "heavy_hitter" and self.recent is not None:
      raise ValueError(f"kv_cache.recent={self.recent} applies to kind='heavy_hitter' only")
    sinks, recent = self.num_sinks, self.num_recent
    if self.kind == "sinks" and not 1 <= sinks < self.budget:
      raise ValueError(f"kv_cache.sinks={sinks} must be in [1, budget - 1 = "
                       f"{self.budget - 1}] for kind='sinks'")
    if self.kind == "heavy_hitter" and (sinks < 0 or recent < 1 or sinks + recent > self.budget):
      raise ValueError(f"kv_cache: kind='heavy_hitter' needs sinks >= 0, recent >= 1 and "
                       f"sinks + recent <= budget; got sinks={sinks}, recent={recent}, "
                       f"budget={self.budget}")

  @property
  def num_sinks(self) -> int:
    if self.sinks is not None:
      return int(self.sinks)
    return DEFAULT_SINKS if self.kind == "sinks" else 0

  @property
  def num_recent(self) -> int:
    """Protected last tokens (the new one included) when the cache evicts."""
    if self.kind == "heavy_hitter":
      return int(self.recent) if self.recent is not None else max(self.budget // 2, 1)
    return 0

  @property
  def is_default(self) -> bool:
    """The default cache: everything, in the model's dtype (generate's own path)."""
    return self.kind == "full" and self.dtype is None

  def resolved(self, cache_len: int) -> "KVCachePolicy":
    """This policy with kind="full"'s budget set to `cache_len` (the decode's length)."""
    if self.kind == "full" and self.budget is None:
      return dataclasses.replace(self, budget=int(cache_len))
    return self


def quantize_int8(x):
  """x [..., D] float -> (int8 [..., D], float32 scale [...]) by the absmax of the last axis:
  x ~ q * scale, |x - q * scale| <= scale / 2 = max|x| / 254 elementwise."""
  x = x.astype(jnp.float32)
  scale = jnp.max(jnp.abs(x), axis=-1) / 127.0
  safe = jnp.where(scale > 0, scale, 1.0)
  q = jnp.clip(jnp.round(x / safe[..., None]), -127, 127).astype(jnp.int8)
  return q, scale


def dequantize_int8(q, scale):
  return q.astype(jnp.float32) * scale[..., None]


def cache_shapes(policy: KVCachePolicy, k) -> dict:
  """name -> (shape, dtype) of one layer's compressed cache for keys like k [B, T, Hkv, D]
  (budget None: T slots)."""
  b, t, hkv, d = k.shape
  s = policy.budget or t
  dtype = jnp.int8 if policy.dtype == "int8" else k.dtype
  out = {"cached_key": ((b, s, hkv, d), dtype), "cached_value": ((b, s, hkv, d), dtype),
         "cached_positions": ((b, s, hkv), jnp.int32)}
  if policy.dtype == "int8":
    out["key_scale"] = ((b, s, hkv), jnp.float32)
    out["value_scale"] = ((b, s, hkv), jnp.float32)
  if policy.kind == "heavy_hitter":
    out["attention_mass"] = ((b, s, hkv), jnp.float32)
  return out


def _store(cache, name, onehot, x, policy):
  """Write x [B, Hkv, D] into the slots `onehot` [B, S, Hkv] selects."""
  if policy.dtype == "int8":
    x, scale = quantize_int8(x)
    scale_name = "key_scale" if name == "cached_key" else "value_scale"
    cache[scale_name] = jnp.where(onehot, scale[:, None], cache[scale_name])
  cache[name] = jnp.where(onehot[..., None], x[:, None].astype(cache[name].dtype), cache[name])


def _read(cache, name, policy):
  if policy.dtype == "int8":
    scale_name = "key_scale" if name == "cached_key" else "value_scale"
    return dequantize_int8(cache[name], cache[scale_name])
  return cache[name].astype(jnp.float32)


def _victim(cache, policy, count, position):
  """[B, Hkv] slot the token at `position` [B] goes to: the first empty one while there is
  one, else the policy's eviction choice."""
  pos = cache["cached_positions"]                                   # [B, S, Hkv]
  s = pos.shape[1]
  slots = jnp.arange(s)[None, :, None]
  protected = pos < policy.num_sinks
  if policy.kind == "heavy_hitter":
    protected |= pos > position[:, None, None] - policy.num_recent
    score = cache["attention_mass"]
  else:                                # window / sinks / full: the oldest unprotected
    score = pos.astype(jnp.float32)
  score = jnp.where(protected, jnp.inf, score)
  score = jnp.where(slots >= count, -jnp.inf, score)                # empty slots first
  return jnp.argmin(score, axis=1)


def streaming_attention(cache: dict, q, k, v, positions, count, policy: KVCachePolicy, *,
                        scale: float, window=None, alibi_slopes=None):
  """Attend T new tokens through a compressed cache, one at a time.

  cache: this layer's arrays (`cache_shapes`); q [B, T, H, D], k, v [B, T, Hkv, D] (after
  RoPE); positions [B or 1, T] or [T] absolute int positions; count: tokens already cached
  (scalar); window: `masks.normalize_window` form (left keys, right ignored: causal);
  alibi_slopes [H] or None. Returns (out [B, T, H, D] float32, the new cache)."""
  b, t, h, d = q.shape
  hkv = k.shape[2]
  g = h // hkv
  positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32).reshape(-1, t), (b, t))
  left = None if window is None else window[0]

  def step(carry, xs):
    cache, count = carry
    q_t, k_t, v_t, p = xs                           # [B, H, D], [B, Hkv, D] x 2, [B]
    slot = _victim(cache, policy, count, p)                              # [B, Hkv]
    cache = dict(cache)
    onehot = jnp.arange(cache["cached_positions"].shape[1])[None, :, None] == slot[:, None]
    _store(cache, "cached_key", onehot, k_t, policy)
    _store(cache, "cached_value", onehot, v_t, policy)
    cache["cached_positions"] = jnp.where(onehot, p[:, None, None], cache["cached_positions"])
    if policy.kind == "heavy_hitter":
      cache["attention_mass"] = jnp.where(onehot, 0.0, cache["attention_mass"])
    count = count + 1
    keys, values = _read(cache, "cached_key", policy), _read(cache, "cached_value", policy)
    pos = cache["cached_positions"]                                      # [B, S, Hkv]
    s = pos.shape[1]
    visible = (jnp.arange(s) < count)[None, :, None] & (pos <= p[:, None, None])
    if left is not None:
      visible &= pos >= p[:, None, None] - left
    qg = q_t.astype(jnp.float32).reshape(b, hkv, g, d)
    logits = jnp.einsum("bkgd,bskd->bkgs", qg, keys) * scale            # [B, Hkv, G, S]
    if alibi_slopes is not None:
      dist = (p[:, None, None] - pos).astype(jnp.float32).transpose(0, 2, 1)   # [B, Hkv, S]
      logits = logits - jnp.asarray(alibi_slopes, jnp.float32).reshape(hkv, g)[
          None, :, :, None] * dist[:, :, None]
    vis = visible.transpose(0, 2, 1)[:, :, None]                        # [B, Hkv, 1, S]
    logits = jnp.where(vis, logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = jnp.where(vis, probs, 0.0)
    out = jnp.einsum("bkgs,bskd->bkgd", probs, values).reshape(b, h, d)
    if policy.kind == "heavy_hitter":
      cache["attention_mass"] = cache["attention_mass"] + probs.sum(2).transpose(0, 2, 1)
    return (cache, count), out

  xs = (jnp.moveaxis(q, 1, 0), jnp.moveaxis(k, 1, 0), jnp.moveaxis(v, 1, 0),
        jnp.moveaxis(positions, 1, 0))
  (cache, _), out = jax.lax.scan(step, (dict(cache), jnp.asarray(count, jnp.int32)), xs)
  return jnp.moveaxis(out, 0, 1), cache


__all__ = ["KVCachePolicy", "KINDS", "DTYPES", "quantize_int8", "dequantize_int8",
           "cache_shapes", "streaming_attention"]
