"""Teacher-forced decoding through a KV cache: the logits and the NLL a text gets when it is fed
to the decoding model (full or compressed cache, layers/kv_cache.py) instead of a forward pass.

    fn = stream_logits_fn(config.model, params, kv_cache=KVCachePolicy("sinks", budget=32))
    logits = fn(tokens)                                   # [B, T] -> [B, T, V]
    streaming_nll(config.model, params, tokens, kv_cache=...)   # {"nll": [B, T - 1], ...}

The text is fed `chunk` tokens per call (default: all at once, a prefill). A compressed cache
runs a call's tokens one at a time inside every layer, so the chunking does not change the
logits: every token sees what the cache holds when it arrives, as in generation. With the
default full cache (kv_cache None) the logits equal the model's forward pass up to float
error: this is what the tests check, and what makes the compressed numbers comparable.
`fn` is a causal "logits of a token sequence" callable, so it plugs into
`jaxformer.evaluate.needle.score_needles`.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import models
from jaxformer.inference.decode import with_kv_cache


def stream_logits_fn(model_config, params, *, kv_cache=None, chunk: int | None = None):
  """`tokens [B, T] int -> logits [B, T, V] float32 (numpy)` by decoding through the cache
  `kv_cache` (a KVCachePolicy or None: the full cache) from an empty cache, `chunk` tokens per
  call (None: the whole row in one call). Jitted once per (B, T)."""
  cfg = models.config_as_dict(model_config)
  if cfg.get("family") != "decoder":
    raise ValueError(f"model_config.family={cfg.get('family')!r}: streaming needs "
                     "family='decoder'")
  if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral)
                            or chunk < 1):
    raise ValueError(f"chunk={chunk!r} must be an int >= 1 or None (the whole row at once)")
  cfg["decode"] = True
  base = models.build(cfg)
  if isinstance(params, Mapping) and "params" in params:
    params = params["params"]
  params = nn.unbox(params)
  vocab = cfg.get("vocab_size")

  def fn(tokens):
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.dtype.kind not in "iu" or tokens.size == 0:
      raise ValueError(f"tokens must be a non-empty int [batch, length] array; got "
                       f"{tokens.dtype} {tokens.shape}")
    if isinstance(vocab, int) and (tokens.min() < 0 or tokens.max() >= vocab):
      raise ValueError(f"token ids must be in [0, vocab_size={vocab})")
    t = tokens.shape[1]
    if base.positions == "learned" and t > base.max_len:
      raise ValueError(f"{t} tokens exceed the model's learned position table, "
                       f"model.max_len={base.max_len}")
    model = with_kv_cache(base, kv_cache, t)
    return np.asarray(_stream(model, params, jnp.asarray(tokens, jnp.int32),
                              chunk=min(chunk or t, t)))

  return fn


@functools.partial(jax.jit, static_argnames=("model", "chunk"))
def _stream(model, params, tokens, *, chunk):
  b, t = tokens.shape
  shapes = jax.eval_shape(functools.partial(model.init, positions=jnp.arange(t)[None]),
                          jax.random.key(0), jnp.zeros((b, t), jnp.int32))["cache"]
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  outs = []
  for start in range(0, t, chunk):         # a few chunks: unrolled (chunk=1 is for tests)
    toks = tokens[:, start:start + chunk]
    positions = start + jnp.arange(toks.shape[1])[None]
    logits, state = model.apply({"params": params, "cache": cache}, toks, positions=positions,
                                mutable=["cache"])
    cache = state["cache"]
    outs.append(logits)
  return jnp.concatenate(outs, axis=1)


def streaming_nll(model_config, params, tokens, *, kv_cache=None, chunk: int | None = None,
                  batch_size: int | None = None) -> dict:
  """Teacher-forced NLL of `tokens` [B, T] decoded through `kv_cache`: {"nll": float64
  [B, T - 1] (nats of tokens[:, 1:]), "sum": total nats, "tokens": count, "mean": nats per
  token}. `batch_size` rows per call (default all)."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 2 or tokens.shape[1] < 2:
    raise ValueError(f"tokens must be [batch, length >= 2]; got shape {tokens.shape}")
  fn = stream_logits_fn(model_config, params, kv_cache=kv_cache, chunk=chunk)
  batch_size = batch_size or tokens.shape[0]
  rows = []
  for lo in range(0, tokens.shape[0], batch_size):
    part = tokens[lo:lo + batch_size]
    logits = fn(part).astype(np.float64)[:, :-1]
    logz = np.logaddexp.reduce(logits, axis=-1)
    target = np.take_along_axis(logits, part[:, 1:, None].astype(np.int64), axis=-1)[..., 0]
    rows.append(logz - target)
  nll = np.concatenate(rows)
  return {"nll": nll, "sum": float(nll.sum()), "tokens": int(nll.size),
          "mean": float(nll.mean())}


__all__ = ["stream_logits_fn", "streaming_nll"]
