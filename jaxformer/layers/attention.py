"""Attention layers: MultiHeadAttention (self/cross, MHA/GQA/MQA, KV cache) and Bahdanau's
AdditiveAttention."""

from __future__ import annotations

import math
from typing import Any, Callable

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from jaxformer.layers import kv_cache as kv_cache_lib
from jaxformer.layers.dense import default_kernel_init, dense
from jaxformer.ops import disentangled, masks, positions as pos_ops
from jaxformer.ops import pallas
from jaxformer.ops.attention import (IMPLS, KERNEL_IMPLS, attend, dot_product_attention,
                                     dot_product_attention_weights)
from jaxformer.ops.attention_variants import (VARIANTS, linear_attention,
                                              routing_cache_attention, routing_prefix_attention)
from jaxformer.parallel.rules import mesh_axes_tuple

# "disentangled": DeBERTa's c2p + p2c scores from a shared relative table (`rel_embeddings`)
POSITIONS = ("none", "rope", "alibi", "disentangled")


WEIGHTS_COLLECTION = "attention_weights"   # mutable -> every layer sows its probabilities


def per_device_attention(q, k, v, *, bias=None, mask=None, segment_ids=None, **kwargs):
  """`dot_product_attention` run once per device with `shard_map` under the current mesh.

  Why: attention only mixes positions within one (batch row, head), so every device can run
  a kernel the partitioner cannot split (impl="pallas") on its rows and heads, whole
  sequences, with no communication. Rows follow the logical rule for "batch", heads those
  for "heads"/"kv_heads" (both must map to the same mesh axes so GQA groups stay on one
  device); an axis that does not divide its dim stays replicated (correct, just redundant).
  That holds when nothing divides too (a batch of 1 on a data-parallel mesh while sampling):
  every device then runs the whole attention, still in `shard_map`, since a Mosaic (TPU)
  kernel outside one fails to compile on a multi-device mesh. Without a mesh (or with one
  device) this is `dot_product_attention`.
  """
  mesh = jax.sharding.get_abstract_mesh()
  batch = _divisible_mesh_axes(mesh, "batch", q.shape[0])
  heads = _divisible_mesh_axes(mesh, "heads", q.shape[2])
  if heads != _divisible_mesh_axes(mesh, "kv_heads", k.shape[2]):
    heads = None
  if batch is None and heads is None and _auto_devices(mesh) == 1:
    return dot_product_attention(q, k, v, bias=bias, mask=mask, segment_ids=segment_ids,
                                 **kwargs)

  def pair_spec(x):       # [b|1, h|1, Tq, Tk]: split only dims that are not broadcast
    return P(batch if x.shape[0] > 1 else None, heads if x.shape[1] > 1 else None)

  arrays = dict(q=q, k=k, v=v)
  for name, x in (("bias", bias), ("mask", mask)):
    if x is not None:
      x = jnp.asarray(x)
      arrays[name] = x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x
  if segment_ids is not None:
    arrays["segment_ids"] = (tuple(segment_ids) if isinstance(segment_ids, (tuple, list))
                             else segment_ids)
  specs = {name: (P(batch, None, heads) if name in ("q", "k", "v") else
                  jax.tree.map(lambda _: P(batch), x) if name == "segment_ids" else
                  pair_spec(x)) for name, x in arrays.items()}
  # check_vma=False: pallas_call outputs carry no varying-axes type; gradients of inputs
  # replicated over an axis (a head-broadcast bias) are summed over it by the transpose.
  per_device = jax.shard_map(lambda a: dot_product_attention(**a, **kwargs),
                             in_specs=(specs,), out_specs=P(batch, None, heads),
                             check_vma=False)
  return per_device(arrays)


def _auto_devices(mesh) -> int:
  """How many devices the mesh's non-manual axes span (1 without a mesh)."""
  if mesh.empty:
    return 1
  return math.prod(n for a, n in mesh.shape.items() if a not in mesh.manual_axes)


def _divisible_mesh_axes(mesh, logical: str, size: int):
  """The mesh axes the logical rules put `logical` on, or None if there are none (no mesh or
  rule, or only manual axes) or they do not divide `size`."""
  if mesh.empty:
    return None
  axes = tuple(a for a in mesh_axes_tuple(nn.logical_to_mesh_axes((logical,))[0])
               if a in mesh.axis_names and a not in mesh.manual_axes and mesh.shape[a] > 1)
  if not axes or size % math.prod(mesh.shape[a] for a in axes):
    return None
  return axes


class MultiHeadAttention(nn.Module):
  """Multi-head attention over [B, T, E] inputs.

  Projections: self-attention with num_kv_heads == num_heads uses one fused QKV kernel
  [E, 3, H, D]; otherwise (GQA/MQA, or cross-attention) a query kernel [E, H, D] and a fused
  KV kernel [E, 2, Hkv, D]. Head axes are logically named so tensor parallelism shards them.

  Decoding: with `decode=True`, `init` on a [B, max_len, E] input allocates a KV cache of
  max_len positions in the "cache" collection; then `apply(..., mutable=["cache"])` with a
  prompt (prefill) and with one token at a time appends to the cache and gives the outputs a
  full causal forward pass would give. With `kv_cache` (a `kv_cache.KVCachePolicy`) the cache
  is instead a fixed budget of slots filled by that policy (sliding window, attention sinks,
  heavy hitters; optionally int8): layers/kv_cache.py.

  Attention weights: applying with `mutable=["attention_weights"]` stores the [B, H, Tq, Tk]
  probabilities of every attention layer in that collection (computed by the xla path), so
  any model can be inspected without a config switch. Attention dropout also needs the
  probabilities, so it runs on the xla path while training.

  Meshes: impl="pallas"/"splash" (and "auto" on TPU, which picks one of them) are custom
  kernels that XLA's partitioner cannot split, so under a mesh they run per device in
  `shard_map` (see `per_device_attention`).
  """
  num_heads: int
  head_dim: int | None = None         # default: input width // num_heads
  num_kv_heads: int | None = None     # default: num_heads; 1 = multi-query
  out_features: int | None = None     # default: input width
  qkv_bias: bool = False
  out_bias: bool = False
  causal: bool = False
  window: int | tuple[int | None, int | None] | None = None
  positions: str = "none"             # one of POSITIONS (self-attention only)
  rope_theta: float = 10_000.0
  dropout_rate: float = 0.0           # on the attention probabilities
  impl: str = "auto"
  block_sizes: tuple[int, int] | None = None    # (block_q, block_k) for impl pallas/blocked
  scale: float | None = None          # logit multiplier; None: 1/sqrt(head_dim)
  # the query projection's init is multiplied by this (T5: scale 1 with q init / sqrt(d))
  query_init_scale: float = 1.0
  # a learned scalar per (query) head multiplying its q.k logits, init 1 (exact no-op): the
  # param `head_gates` [H]. Applied to q after RoPE, which scales the logits q.k * scale and
  # leaves additive biases (ALiBi, `bias`) and masks alone, the same for every impl and the
  # KV cache (which holds k and v only).
  head_gates: bool = False
  # what self-attention computes (ops/attention_variants.py): "softmax" over the keys;
  # "linear" (phi = elu + 1; the same parameters; decoding keeps the KV cache and computes the
  # same function over it); "routing_cache": softmax over `routing_slots` learned key/value
  # slots (params `routing_keys`, `routing_values` [M, H, D]) instead of the sequence, with a
  # query projection only (no k/v projections, no KV cache: each position is independent);
  # "routing_prefix": softmax over `routing_slots` slots written from the visible keys/values
  # by learned write queries (param `routing_writes` [M, H, D]; decoding keeps the KV cache)
  variant: str = "softmax"
  routing_slots: int = 16
  decode: bool = False
  # decode=True only: a compressed cache (kv_cache.KVCachePolicy); None: the full cache
  kv_cache: Any = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init   # (in_axis, out_axis) -> initializer

  def _check(self, embed: int, cross: bool):
    h, hkv = self.num_heads, self.num_kv_heads or self.num_heads
    if h < 1 or hkv < 1:
      raise ValueError(f"num_heads={h} and num_kv_heads={hkv} must be >= 1")
    if self.head_dim is None and embed % h:
      raise ValueError(f"num_heads={h} does not divide the input width {embed}; "
                       "set head_dim explicitly")
    if self.positions not in POSITIONS:
      raise ValueError(f"positions={self.positions!r} is not one of {POSITIONS}")
    if cross and self.positions != "none":
      raise ValueError(f"positions={self.positions!r} applies to self-attention only; use "
                       "positions='none' for cross-attention")
    if self.impl not in IMPLS:
      raise ValueError(f"impl={self.impl!r} is not one of {IMPLS}")
    masks.normalize_window(self.window)
    if self.dropout_rate and self.impl not in ("xla", "auto"):
      raise ValueError(f"attention dropout (dropout_rate={self.dropout_rate}) needs the "
                       f"probabilities: use impl='xla' or 'auto', not {self.impl!r}")
    if self.positions == "disentangled" and (hkv != h or self.decode):
      raise ValueError(f"positions='disentangled' (DeBERTa, an encoder) projects the relative "
                       f"table with the fused query/key projection and has no KV cache: "
                       f"num_kv_heads={self.num_kv_heads} must be None or num_heads={h}, and "
                       f"decode={self.decode} False")
    if self.head_gates and self.positions == "disentangled":
      raise ValueError("model.head_gates=True multiplies each head's q.k logits through q, but "
                       "positions='disentangled' (DeBERTa) also feeds q into its "
                       "content-to-position scores; set model.head_gates=False for this family")
    if self.variant not in VARIANTS:
      raise ValueError(f"model.attention_variant={self.variant!r} is not one of {VARIANTS}")
    if self.variant != "softmax":
      if cross:
        raise ValueError(f"model.attention_variant={self.variant!r} applies to "
                         "self-attention only; cross-attention is softmax")
      if self.kv_cache is not None:
        raise ValueError(f"a compressed KV cache (kv_cache) evicts keys of a softmax over the "
                         f"sequence; model.attention_variant={self.variant!r} decodes with the "
                         "full cache only: leave kv_cache unset")
      if self.window is not None or self.dropout_rate:
        raise ValueError(f"model.attention_variant={self.variant!r} has no softmax over the "
                         f"sequence: model.window={self.window!r} must be None and the "
                         f"attention dropout {self.dropout_rate} 0")
      if self.positions in ("alibi", "disentangled") or (
          self.variant == "routing_cache" and self.positions == "rope"):
        raise ValueError(f"positions={self.positions!r} acts on query-key pairs of the "
                         f"sequence, which model.attention_variant={self.variant!r} does not "
                         "have: use learned positions (or 'rope' with attention_variant='linear')")
      if isinstance(self.routing_slots, bool) or not isinstance(self.routing_slots, int) or (
          self.routing_slots < 1):
        raise ValueError(f"model.routing_slots={self.routing_slots!r} must be an int > 0")
    if self.decode and (cross or not self.causal):
      raise ValueError("decode=True (KV cache) needs causal self-attention: set causal=True "
                       "and call without context")
    if self.kv_cache is not None and not (
        self.decode and isinstance(self.kv_cache, kv_cache_lib.KVCachePolicy)):
      raise ValueError(f"kv_cache={self.kv_cache!r} must be a kv_cache.KVCachePolicy, used "
                       f"with decode=True (got decode={self.decode})")

  @nn.compact
  def __call__(self, x, context=None, *, mask=None, segment_ids=None, positions=None,
               bias=None, rel_embeddings=None, kv_inputs=None, deterministic: bool = True):
    """x [B, T, E]; context [B, S, E'] for cross-attention; mask/segment_ids as in
    `dot_product_attention`; positions [B, T] or [T] for RoPE/ALiBi (default 0..T-1, or the
    cache offset onwards when decoding); bias: float broadcastable to [B, H, T, S], added
    to the logits (e.g. T5's relative position bias); rel_embeddings [2T - 1, E] for
    positions="disentangled": the shared relative table's rows of relative positions
    -(T-1) .. T-1 (`ops.disentangled.relative_rows`); kv_inputs [B, T, E] (self-attention
    only): keys and values are projected from kv_inputs instead of x, queries still from x,
    with this layer's own projections and positions (DeBERTa's enhanced mask decoder: a
    query stream attending over a fixed hidden state). With the fused QKV kernel the whole
    projection runs on both inputs and the unused thirds are dropped (one extra projection
    per call; the decoder makes two such calls per step)."""
    cross = context is not None
    if x.ndim != 3:
      raise ValueError(f"x must be [batch, length, features]; got shape {x.shape}")
    if cross:
      chex.assert_rank(context, 3)
      chex.assert_equal_shape_prefix([x, context], 1)   # same batch
    self._check(x.shape[-1], cross)
    if kv_inputs is not None and (cross or self.decode or kv_inputs.shape != x.shape):
      raise ValueError(f"kv_inputs (keys/values of self-attention from another input) needs "
                       f"self-attention without a KV cache and the shape of x {x.shape}; got "
                       f"{kv_inputs.shape}, context given: {cross}, decode={self.decode}")
    h, hkv = self.num_heads, self.num_kv_heads or self.num_heads
    d = self.head_dim or x.shape[-1] // h
    if self.variant == "routing_cache":
      if kv_inputs is not None or bias is not None:
        raise ValueError("model.attention_variant='routing_cache' attends over learned slots only: "
                         "it takes no kv_inputs and no bias")
      return self._routing_cache(x, h, d)
    kw = dict(use_bias=self.qkv_bias, dtype=self.dtype, param_dtype=self.param_dtype,
              kernel_init=self.kernel_init)
    fused = not cross and hkv == h
    if self.query_init_scale != 1.0:
      kw["kernel_init"] = _scaled_query_init(self.kernel_init, self.query_init_scale, fused)
    if fused:
      qkv_proj = dense((3, h, d), ("embed", "qkv", "heads", "kv"), name="qkv", **kw)
      qkv = qkv_proj(x)
      kv = qkv if kv_inputs is None else qkv_proj(kv_inputs)
      q, k, v = qkv[:, :, 0], kv[:, :, 1], kv[:, :, 2]
    else:
      q = dense((h, d), ("embed", "heads", "kv"), name="query", **kw)(x)
      kw["kernel_init"] = self.kernel_init
      kv = dense((2, hkv, d), ("embed", "qkv", "kv_heads", "kv"), name="kv",
                 **kw)(context if cross else x if kv_inputs is None else kv_inputs)
      k, v = kv[:, :, 0], kv[:, :, 1]
    # names for the remat policies that keep them (layers/block_settings.py ACTIVATION_NAMES)
    q = checkpoint_name(nn.with_logical_constraint(q, ("batch", "length", "heads", "kv")),
                        "query_proj")
    k = checkpoint_name(nn.with_logical_constraint(k, ("batch", "length", "kv_heads", "kv")),
                        "key_proj")
    v = checkpoint_name(nn.with_logical_constraint(v, ("batch", "length", "kv_heads", "kv")),
                        "value_proj")

    t = x.shape[1]
    compressed = self.kv_cache is not None
    cache_index, cache_filled = (self._compressed_cache(k) if compressed else
                                 self._cache_index(k) if self.decode else (None, False))
    if positions is None:
      positions = jnp.arange(t) if cache_index is None else cache_index + jnp.arange(t)
    if self.positions == "rope":
      q = pos_ops.apply_rope(q, positions, theta=self.rope_theta)
      k = pos_ops.apply_rope(k, positions, theta=self.rope_theta)
    if self.head_gates:     # gate_h * (q_h . k) == (gate_h q_h) . k: every impl, the cache too
      gates = self.param("head_gates", nn.with_logical_partitioning(nn.initializers.ones,
                                                                    ("heads",)),
                         (h,), self.param_dtype)
      q = q * gates.astype(q.dtype)[:, None]

    if compressed:
      return self._output(self._compressed_attention(q, k, v, positions, cache_index,
                                                     cache_filled, mask, segment_ids, bias), x)

    causal, window = self.causal, self.window
    k_positions = positions
    if cache_index is not None:          # attend over the whole cache with an explicit mask
      if segment_ids is not None:
        raise ValueError("segment_ids are not supported while decoding with a KV cache")
      k, v = self._update_cache(k, v, cache_index, cache_filled)
      k_positions = jnp.arange(k.shape[1])
      mask = masks.combine_masks(mask, masks.structural_mask(
          jnp.asarray(positions), k_positions, causal=True,
          window=masks.normalize_window(window))[..., None, :, :])
      causal, window = False, None
    if self.positions == "alibi":
      alibi = pos_ops.alibi_bias(h, positions, k_positions)
      bias = alibi if bias is None else bias + alibi
    scale = self.scale
    if self.positions == "disentangled":
      # DeBERTa: share_att_key (the table goes through this layer's own q/k projections);
      # the c2p + p2c scores enter as a bias, all terms scaled by 1/sqrt(3 d).
      if rel_embeddings is None:
        raise ValueError("positions='disentangled' needs rel_embeddings [2T - 1, E]")
      rel = qkv_proj(rel_embeddings[None].astype(x.dtype))[0]        # [2T - 1, 3, H, D]
      scale = (1.0 / math.sqrt(d) if scale is None else scale) / math.sqrt(3.0)
      scores = disentangled.disentangled_scores(q, k, rel[:, 0], rel[:, 1]) * scale
      bias = scores if bias is None else bias + scores

    attn = dict(bias=bias, mask=mask, causal=causal, window=window, segment_ids=segment_ids,
                scale=scale)
    use_dropout = self.dropout_rate > 0 and not deterministic
    record = self.is_mutable_collection(WEIGHTS_COLLECTION) and not self.is_initializing()
    if self.variant in ("linear", "routing_prefix"):
      if bias is not None:
        raise ValueError(f"model.attention_variant={self.variant!r} has no query-key logits "
                         "to add a bias to")
      if segment_ids is not None:
        q_ids, kv_ids = (segment_ids if isinstance(segment_ids, (tuple, list))
                         else (segment_ids, segment_ids))
        mask = masks.combine_masks(mask, masks.segment_mask(q_ids, kv_ids))
      if self.variant == "linear":
        out = linear_attention(q, k, v, causal=causal, mask=mask)
      else:
        writes = self.param("routing_writes", nn.with_logical_partitioning(
            nn.initializers.normal(1.0), (None, "heads", "kv")), (self.routing_slots, h, d),
                            self.param_dtype)
        out = routing_prefix_attention(q, k, v, writes.astype(q.dtype), causal=causal,
                                       mask=mask, scale=scale)
    elif record or use_dropout:
      weights = dot_product_attention_weights(q, k, **attn)
      if record:
        self.sow(WEIGHTS_COLLECTION, "weights", weights)
      weights = nn.Dropout(self.dropout_rate)(weights, deterministic=deterministic)
      out = attend(weights, v).astype(self.dtype)
    else:
      impl = self.impl
      if impl == "splash" and self.is_initializing():
        impl = "xla"        # init traces a short dummy input (shapes only); splash needs 128s
      attn.update(impl=impl, block_sizes=self.block_sizes)
      # a kernel (or "auto" on TPU, which picks one) runs per device under a mesh
      if impl in KERNEL_IMPLS or (impl == "auto"
                                       and pallas.target_platform(q) == "tpu"):
        out = per_device_attention(q, k, v, **attn)
      else:
        out = dot_product_attention(q, k, v, **attn)
    if cache_index is not None and cache_filled:
      # The index is traced, so overflowing the cache cannot raise under jit; make it loud
      # (NaN outputs) instead of silently overwriting the last slots.
      out = jnp.where(cache_index + t <= k.shape[1], out, jnp.nan)
    return self._output(out, x)

  def _output(self, out, x):
    """The output projection of the attention context out [B, T, H, D]."""
    out = checkpoint_name(nn.with_logical_constraint(out, ("batch", "length", "heads", "kv")),
                          "attention_context")
    return checkpoint_name(dense(self.out_features or x.shape[-1], ("heads", "kv", "embed"),
                                 num_in=2, name="out", use_bias=self.out_bias, dtype=self.dtype,
                                 param_dtype=self.param_dtype, kernel_init=self.kernel_init)(out),
                           "attention_out")

  def _routing_cache(self, x, h, d):
    """attention_variant='routing_cache': each position's query against the learned slots. When
    decoding, the cache collection holds only `cache_index` (positions are independent)."""
    kernel_init = self.kernel_init
    if self.query_init_scale != 1.0:
      kernel_init = _scaled_query_init(kernel_init, self.query_init_scale, False)
    q = dense((h, d), ("embed", "heads", "kv"), name="query", use_bias=self.qkv_bias,
              dtype=self.dtype, param_dtype=self.param_dtype, kernel_init=kernel_init)(x)
    q = checkpoint_name(nn.with_logical_constraint(q, ("batch", "length", "heads", "kv")),
                        "query_proj")
    if self.head_gates:
      gates = self.param("head_gates", nn.with_logical_partitioning(nn.initializers.ones,
                                                                    ("heads",)),
                         (h,), self.param_dtype)
      q = q * gates.astype(q.dtype)[:, None]
    slot_init = nn.with_logical_partitioning(nn.initializers.normal(1.0), (None, "heads", "kv"))
    keys = self.param("routing_keys", slot_init, (self.routing_slots, h, d), self.param_dtype)
    values = self.param("routing_values", slot_init, (self.routing_slots, h, d),
                        self.param_dtype)
    if self.decode:
      exists = self.has_variable("cache", "cache_index")
      index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
      if exists:
        index.value = index.value + x.shape[1]
    out = routing_cache_attention(q, keys.astype(self.dtype), values.astype(self.dtype),
                                  scale=self.scale)
    return self._output(out, x)

  def _cache_index(self, k):
    """(cache offset, whether the cache existed before this call). During `init` the cache
    does not exist yet and is sized from the init input."""
    exists = self.has_variable("cache", "cached_key")
    self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    self.variable("cache", "cached_value", jnp.zeros, k.shape, k.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    return index.value, exists

  def _compressed_cache(self, k):
    """`_cache_index` for a compressed cache: its arrays (kv_cache.cache_shapes) are created
    at init, sized by the policy's budget."""
    exists = self.has_variable("cache", "cached_key")
    for name, (shape, dtype) in kv_cache_lib.cache_shapes(self.kv_cache, k).items():
      self.variable("cache", name, jnp.zeros, shape, dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    return index.value, exists

  def _compressed_attention(self, q, k, v, positions, index, exists, mask, segment_ids, bias):
    """Attention of the new tokens through the compressed cache (kv_cache.py), which is
    updated unless this is `init` (the cache then stays empty)."""
    if mask is not None or segment_ids is not None or bias is not None:
      raise ValueError("a compressed KV cache (kv_cache) takes no mask, segment_ids or bias: "
                       "it masks by the cached positions")
    names = kv_cache_lib.cache_shapes(self.kv_cache, k)
    cache = {name: self.get_variable("cache", name) for name in names}
    d = q.shape[-1]
    out, cache = kv_cache_lib.streaming_attention(
        cache, q, k, v, positions, index, self.kv_cache,
        scale=1.0 / math.sqrt(d) if self.scale is None else self.scale,
        window=masks.normalize_window(self.window),
        alibi_slopes=pos_ops.alibi_slopes(q.shape[2]) if self.positions == "alibi" else None)
    if exists:
      for name, value in cache.items():
        self.put_variable("cache", name, value)
      self.put_variable("cache", "cache_index", index + q.shape[1])
    return out.astype(self.dtype)

  def _update_cache(self, k, v, index, exists):
    ck, cv = self.get_variable("cache", "cached_key"), self.get_variable("cache", "cached_value")
    if not exists:                      # init: nothing cached yet, attend within x
      return k, v
    if k.shape[1] > ck.shape[1]:
      raise ValueError(f"{k.shape[1]} new tokens exceed the KV cache length {ck.shape[1]}")
    ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, index, 0, 0))
    cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, index, 0, 0))
    self.put_variable("cache", "cached_key", ck)
    self.put_variable("cache", "cached_value", cv)
    self.put_variable("cache", "cache_index", index + k.shape[1])
    return ck, cv


def _scaled_query_init(kernel_init: Callable, multiplier: float, fused: bool) -> Callable:
  """`kernel_init` with the query kernel (slice 0 of a fused qkv kernel) times multiplier."""
  def make(in_axis, out_axis):
    init = kernel_init(in_axis, out_axis)

    def scaled(key, shape, dtype=jnp.float32):
      w = init(key, shape, dtype)
      return w.at[:, 0].multiply(multiplier) if fused else w * multiplier
    return scaled
  return make


class AdditiveAttention(nn.Module):
  """Bahdanau et al. (2015) attention: score(q, k) = v^T tanh(W_q q + W_k k + b).

  Returns (context [B, Tq, Dv], weights [B, Tq, Tk]); used as the alignment model of an RNN
  decoder by calling it with one query step (Tq = 1).
  """
  hidden_dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init   # (in_axis, out_axis) -> initializer

  @nn.compact
  def __call__(self, query, keys, values=None, *, mask=None):
    """query [B, Tq, Dq]; keys [B, Tk, Dk]; values [B, Tk, Dv] (default keys); mask bool
    broadcastable to [B, Tq, Tk] (True = attend; a row with nothing visible gives zeros)."""
    values = keys if values is None else values
    if query.ndim != 3 or keys.ndim != 3 or values.ndim != 3:
      raise ValueError(f"query/keys/values must be [batch, length, features]; got "
                       f"{query.shape}, {keys.shape}, {values.shape}")
    if keys.shape[:2] != values.shape[:2] or query.shape[0] != keys.shape[0]:
      raise ValueError(f"query {query.shape}, keys {keys.shape} and values {values.shape} "
                       "disagree in batch or key length")
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, kernel_init=self.kernel_init)
    wq = dense(self.hidden_dim, ("embed", "mlp"), name="query", **kw)(query)
    wk = dense(self.hidden_dim, ("embed", "mlp"), name="key", use_bias=True, **kw)(keys)
    energy = jnp.tanh(wq[:, :, None, :] + wk[:, None, :, :])
    scores = dense(1, ("mlp", None), name="energy", **kw)(energy)[..., 0]
    weights = masks.masked_softmax(scores, mask)
    context = jnp.einsum("bqk,bkd->bqd", weights, values.astype(jnp.float32))
    return context.astype(self.dtype), weights
