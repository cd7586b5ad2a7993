"""`dot_product_attention`: the one attention entry point, with validation and dispatch.

Implementations (`impl=`):
  "xla"     the straightforward reference: materialises [B, H, Tq, Tk] float32 logits.
  "blocked" pure-JAX online-softmax attention over key blocks (`ops.blocked_attention`), O(T)
            memory.
  "pallas"  our Pallas flash-attention kernel (`ops.pallas`): skips key blocks outside the
            causal/window band; interpreted on CPU, Triton on GPU, Mosaic on TPU.
  "splash"  JAX's splash attention TPU kernel (`ops.pallas.splash`): causal/window block
            skipping, GQA/MQA, segment ids; no bias or dense mask (refused by name).
            Interpreted on CPU; refused on GPU.
  "cudnn"   `jax.nn.dot_product_attention(implementation="cudnn")` on NVIDIA GPUs.
  "auto"    on TPU (the platform compiled for, `pallas.target_platform`) a blocked kernel:
            `TPU_AUTO_KERNEL` where it takes the inputs, else the other kernel; on GPU cudnn
            where the inputs allow; otherwise blocked when the xla path's logits would
            exceed `AUTO_XLA_MAX_LOGIT_BYTES`, else xla.

All paths share the same semantics: masks combine by AND, a query row with no visible key
returns zeros (values and gradients stay finite), softmax is in float32.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.ops import blocked_attention, masks, pallas
from jaxformer.ops.pallas import splash

IMPLS = ("xla", "blocked", "pallas", "splash", "cudnn", "auto")
# impls that are custom kernels XLA cannot partition: under a mesh they run per device
KERNEL_IMPLS = ("pallas", "splash")
# The kernel "auto" picks on TPU when it takes the inputs (the other one otherwise): the one
# that plans faster for Llama-2 7B's attention (T=4096, bf16, causal) on compile-only v5e,
# `python -m experiments.tpu_attention_choice` (docs/design/attention.md, "Ours vs splash on
# TPU"): ours 16.1 ms per layer fwd+bwd, splash 17.3 (its 512 blocks compute more of the
# causal diagonal).
TPU_AUTO_KERNEL = "pallas"
# ...unless our kernel's whole-sequence VMEM blocks (K and V, and dk/dv's query and dO rows
# of a GQA group) would take more than this: splash streams its blocks and has no such bound
# (ours is refused past the core's VMEM, ~T=16k at D=128 with 4 query heads per kv head).
PALLAS_AUTO_MAX_RESIDENT_BYTES = 24 * 2**20
# Fewer queries than one 128-lane block (decoding with a KV cache) stay on the XLA paths: a
# kernel would pad them to a whole block.
TPU_AUTO_MIN_QUERIES = 128
# "auto" switches from xla to blocked once the float32 logits would take more than this.
AUTO_XLA_MAX_LOGIT_BYTES = 256 * 2**20
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def dot_product_attention(q, k, v, *, bias=None, mask=None, causal: bool = False,
                          window=None, segment_ids=None, scale: float | None = None,
                          impl: str = "auto", block_sizes: tuple[int, int] | None = None):
  """Scaled dot-product attention softmax(q k^T * scale + bias) v over visible keys.

  Args:
    q: [B, Tq, H, D] queries.
    k, v: [B, Tk, Hkv, D] keys/values; H % Hkv == 0 (Hkv < H is GQA, Hkv == 1 is MQA).
    bias: float array broadcastable to [B, H, Tq, Tk], added to the scaled logits.
    mask: bool array broadcastable to [B, H, Tq, Tk]; True = attend.
    causal: query i sees keys j <= i + (Tk - Tq) (queries are the last Tq positions).
    window: int `left` -> (left, 0), or (left, right) with None for unbounded: query at
      position p sees keys in [p - left, p + right] (positions aligned as for `causal`).
    segment_ids: [B, T] for self-attention (Tq == Tk), or (q_ids [B, Tq], kv_ids [B, Tk]);
      tokens attend only within their segment (packed sequences).
    scale: logit multiplier, default 1/sqrt(D).
    impl: one of IMPLS (see the module docstring).
    block_sizes: (block_q, block_k) tile sizes for impl="pallas" (powers of two; default
      `pallas.default_block_sizes` for the backend and head dim); "blocked" uses block_k.
      Ignored by "xla" and "cudnn".

  Returns:
    [B, Tq, H, D] in q's dtype; rows with no visible key are zeros.
  """
  a = _validate(q, k, v, bias, mask, causal, window, segment_ids, scale, impl)
  block_q, block_k = check_block_sizes(block_sizes)
  impl = _resolve_impl(impl, q, k, v, a, (block_q, block_k))
  if impl == "xla":
    return attend(_weights(q, k, a), v).astype(q.dtype)
  if impl == "blocked":
    return blocked_attention.blocked_attention(q, k, v, bias=a["bias"], mask=a["mask"],
                                   q_segment_ids=a["q_seg"], kv_segment_ids=a["kv_seg"],
                                   causal=causal, window=a["window"], scale=a["scale"],
                                   **({} if block_k is None else dict(block_k=block_k)))
  if impl == "cudnn":
    return _jax_nn_attention(q, k, v, a, implementation="cudnn")
  if impl == "splash":
    return splash.splash_attention(q, k, v, q_segment_ids=a["q_seg"], kv_segment_ids=a["kv_seg"],
                                   causal=causal, window=a["window"], scale=a["scale"],
                                   block_sizes=None if block_q is None else (block_q, block_k))
  return pallas.pallas_attention(q, k, v, bias=a["bias"], mask=a["mask"],
                                 q_segment_ids=a["q_seg"], kv_segment_ids=a["kv_seg"],
                                 causal=causal, window=a["window"], scale=a["scale"],
                                 block_q=block_q, block_k=block_k)


def dot_product_attention_weights(q, k, *, bias=None, mask=None, causal=False, window=None,
                                  segment_ids=None, scale=None):
  """The attention probabilities [B, H, Tq, Tk] (float32) that `impl="xla"` uses.

  For visualisation and attention dropout; rows with no visible key are all zeros.
  """
  a = _validate(q, k, k, bias, mask, causal, window, segment_ids, scale, "xla")
  probs = _weights(q, k, a)
  b, hkv, g, tq, tk = probs.shape
  return probs.reshape(b, hkv * g, tq, tk)


def attend(weights, v):
  """Weighted values: weights [B, H, Tq, Tk] (or grouped [B, Hkv, G, Tq, Tk]) and
  v [B, Tk, Hkv, D] -> [B, Tq, H, D] float32, without repeating v over query groups."""
  b, tk, hkv, d = v.shape
  weights = weights.reshape(b, hkv, -1, weights.shape[-2], tk)
  if weights.shape[2] == 1:           # MHA: no group axis (see _weights)
    return jnp.einsum('bhqk,bkhd->bqhd', weights[:, :, 0].astype(v.dtype), v,
                      preferred_element_type=jnp.float32)
  out = jnp.einsum('bhgqk,bkhd->bqhgd', weights.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.reshape(out.shape[:2] + (-1, d))


def _weights(q, k, a):
  """Grouped probabilities [B, Hkv, G, Tq, Tk] for validated inputs."""
  hkv = k.shape[2]
  b, tq, h, d = q.shape
  bias, visible = a["bias"], _full_mask(a, tq, k.shape[1])
  mha = h == hkv
  if mha:
    # MHA in 4-D, the unit group axis added at the end: with it inside, XLA:CPU lays the
    # batched dots out with extra transposes (attention forward + backward ~20% slower).
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
  else:
    qg = q.reshape(b, tq, hkv, h // hkv, d)
    logits = jnp.einsum('bqhgd,bkhd->bhgqk', qg, k, preferred_element_type=jnp.float32)
    bias, visible = masks.split_heads(bias, hkv), masks.split_heads(visible, hkv)
  logits = logits * a["scale"]
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  probs = masks.masked_softmax(logits, visible)
  return probs[:, :, None] if mha else probs


def _full_mask(a, tq, tk):
  """AND of the user mask, segment mask and structural mask as a [b, h, Tq, Tk]-broadcastable
  array (None if nothing is masked)."""
  q_pos = jnp.arange(tq) + (tk - tq)
  structural = masks.structural_mask(q_pos, jnp.arange(tk), causal=a["causal"],
                                     window=a["window"])
  seg = None if a["q_seg"] is None else masks.segment_mask(a["q_seg"], a["kv_seg"])
  return masks.combine_masks(a["mask"], seg,
                             None if structural is None else structural[None, None])


# ----------------------------------------------------------------------------------- cuDNN


def cudnn_unsupported_reason(q, k, v, *, bias=None) -> str | None:
  """Why `impl="cudnn"` cannot take these inputs, or None if it can."""
  platform = pallas.target_platform(q)       # the devices compiled for, not the host's
  if platform != "gpu":
    return f"it needs an NVIDIA GPU, but the program is compiled for {platform!r}"
  if q.dtype not in _CUDNN_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
    return f"it needs bfloat16/float16 q, k, v (got {q.dtype}, {k.dtype}, {v.dtype})"
  d = q.shape[-1]
  if d % 8 or d > 256 or v.shape[-1] != d:
    return f"it needs head_dim a multiple of 8 and <= 256, same for q/k/v (got {d}, {v.shape[-1]})"
  if bias is not None and jnp.dtype(bias.dtype) != q.dtype:
    return f"it needs bias in the inputs' dtype {q.dtype} (got {bias.dtype})"
  return None


def _jax_nn_attention(q, k, v, a, *, implementation):
  """Delegate to `jax.nn.dot_product_attention` with our mask semantics.

  jax.nn aligns causal/window masks top-left; ours align the last query with the last key.
  With Tq == Tk they agree and the structural mask is passed natively (fast cuDNN paths);
  otherwise, or with a user mask / segment ids, everything is folded into one explicit mask
  and rows left empty by it are zeroed, as in the other implementations.
  """
  tq, tk, causal = q.shape[1], k.shape[1], a["causal"]
  explicit = a["mask"] is not None or a["q_seg"] is not None or (
      tq != tk and (causal or a["window"] is not None))
  if explicit:
    full = _full_mask(a, tq, tk)
    out = jax.nn.dot_product_attention(q, k, v, a["bias"], full, scale=a["scale"],
                                       implementation=implementation)
    has_key = jnp.any(full, axis=-1)                      # [b, h, Tq]
    return jnp.where(jnp.moveaxis(has_key, 1, 2)[..., None], out, 0).astype(q.dtype)
  window = a["window"]
  if window is not None:
    window = tuple(tk if w is None else w for w in window)
  return jax.nn.dot_product_attention(q, k, v, a["bias"], None, scale=a["scale"],
                                      is_causal=causal, local_window_size=window,
                                      implementation=implementation)


# ------------------------------------------------------------------------ validation/dispatch


def resolve_impl(impl, q, k, v, *, bias=None, mask=None, segment_ids=None,
                 block_sizes=None) -> str:
  """The implementation `dot_product_attention` runs for these inputs (no tracing): "auto"
  resolved for the platform compiled for; a ValueError if an explicit impl cannot take them."""
  q_seg = kv_seg = None
  if segment_ids is not None:
    q_seg, kv_seg = (tuple(segment_ids) if isinstance(segment_ids, (tuple, list))
                     else (segment_ids, segment_ids))
  return _resolve_impl(impl, q, k, v, dict(bias=bias, mask=mask, q_seg=q_seg, kv_seg=kv_seg),
                       check_block_sizes(block_sizes))


def _splash_reason(q, k, v, a, block_sizes):
  blocks = None if block_sizes is None or block_sizes[0] is None else block_sizes
  return splash.unsupported_reason(q, k, v, bias=a["bias"], mask=a["mask"],
                                   q_segment_ids=a["q_seg"], kv_segment_ids=a["kv_seg"],
                                   block_sizes=blocks)


def _pallas_tpu_reason(q, k, v, a, block_sizes):
  if q.dtype not in (jnp.float32, jnp.bfloat16):
    return f"it needs float32/bfloat16 on TPU (got {q.dtype})"
  if block_sizes is not None and block_sizes[0] is not None and min(block_sizes) < 128:
    return "its TPU blocks must be >= 128"
  group = q.shape[2] // k.shape[2]
  d = -(-q.shape[-1] // 128) * 128
  resident = 2 * (k.shape[1] + group * q.shape[1]) * d * jnp.dtype(q.dtype).itemsize
  if resident > PALLAS_AUTO_MAX_RESIDENT_BYTES:
    return f"its whole-sequence VMEM blocks would take {resident / 2**20:.0f} MiB"
  return None


def _resolve_impl(impl, q, k, v, a, block_sizes=None):
  if impl == "splash":
    reason = _splash_reason(q, k, v, a, block_sizes)
    if reason:
      raise ValueError(f"impl='splash' (attention_impl in a config) cannot run these inputs: "
                       f"{reason}. Use impl='pallas' (bias, masks, any length), 'blocked' or "
                       "'xla'.")
    return impl
  if impl not in ("cudnn", "auto"):
    return impl
  platform = pallas.target_platform(q)
  if impl == "auto" and platform == "tpu" and q.shape[1] >= TPU_AUTO_MIN_QUERIES:
    reasons = {"splash": _splash_reason, "pallas": _pallas_tpu_reason}
    for kernel in (TPU_AUTO_KERNEL, *(i for i in KERNEL_IMPLS if i != TPU_AUTO_KERNEL)):
      if reasons[kernel](q, k, v, a, block_sizes) is None:
        return kernel
  reason = cudnn_unsupported_reason(q, k, v, bias=a["bias"])
  if impl == "cudnn" and reason:
    raise ValueError(f"impl='cudnn' cannot run these inputs: {reason}. "
                     "Use impl='auto', 'blocked' or 'xla'.")
  if reason is None:
    return "cudnn"
  b, tq, h, _ = q.shape
  logit_bytes = 4 * b * h * tq * k.shape[1]
  return "blocked" if logit_bytes > AUTO_XLA_MAX_LOGIT_BYTES else "xla"


def check_block_sizes(block_sizes, name: str = "block_sizes"
                      ) -> tuple[int | None, int | None]:
  """(block_q, block_k) as a tuple, (None, None) for None; a ValueError naming `name`
  otherwise (lists, as JSON/YAML configs give, are accepted)."""
  if block_sizes is None:
    return None, None
  if (not isinstance(block_sizes, (tuple, list)) or len(block_sizes) != 2
      or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                 for b in block_sizes)):
    raise ValueError(f"{name}={block_sizes!r} must be a (block_q, block_k) pair of "
                     "positive ints, e.g. (128, 64), or None for the defaults")
  return tuple(block_sizes)


def _as_4d(name, x, target):
  if x is None:
    return None
  x = jnp.asarray(x)
  if x.ndim > 4:
    raise ValueError(f"{name} must have at most 4 dims [B, H, Tq, Tk]; got shape {x.shape}")
  x = x.reshape((1,) * (4 - x.ndim) + x.shape)
  for n, t, axis in zip(x.shape, target, ("batch", "heads", "q_length", "kv_length")):
    if n not in (1, t):
      raise ValueError(f"{name} of shape {x.shape} does not broadcast to [B, H, Tq, Tk]="
                       f"{tuple(target)}: its {axis} dim is {n}, expected 1 or {t}")
  return x


def _validate(q, k, v, bias, mask, causal, window, segment_ids, scale, impl) -> dict[str, Any]:
  """Check shapes/arguments (before any compilation) and normalise them."""
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
  for name, x in (("q", q), ("k", k), ("v", v)):
    if getattr(x, "ndim", None) != 4:
      raise ValueError(f"{name} must be [batch, length, heads, head_dim]; got shape "
                       f"{getattr(x, 'shape', None)}")
  b, tq, h, d = q.shape
  if k.shape[0] != b or v.shape[0] != b:
    raise ValueError(f"batch sizes differ: q {q.shape}, k {k.shape}, v {v.shape}")
  if k.shape[:3] != v.shape[:3]:
    raise ValueError(f"k and v must agree in [batch, length, heads]; got k {k.shape}, v {v.shape}")
  if k.shape[3] != d:
    raise ValueError(f"q and k head_dim differ: q {q.shape}, k {k.shape}")
  hkv, tk = k.shape[2], k.shape[1]
  if h % hkv:
    raise ValueError(f"num_kv_heads={hkv} must divide num_heads={h} (the heads of k/v and q)")
  if not isinstance(causal, bool):
    raise ValueError(f"causal must be a bool; got {causal!r}")
  target = (b, h, tq, tk)
  bias = _as_4d("bias", bias, target)
  if bias is not None and not jnp.issubdtype(bias.dtype, jnp.floating):
    raise ValueError(f"bias must be a float array (use mask= for booleans); got {bias.dtype}")
  mask = _as_4d("mask", mask, target)
  if mask is not None and mask.dtype != jnp.bool_:
    raise ValueError(f"mask must be a bool array (True = attend); got dtype {mask.dtype}")
  q_seg = kv_seg = None
  if segment_ids is not None:
    if isinstance(segment_ids, (tuple, list)):
      if len(segment_ids) != 2:
        raise ValueError("segment_ids must be [B, T] or a (q_ids, kv_ids) pair")
      q_seg, kv_seg = (jnp.asarray(s) for s in segment_ids)
    else:
      if tq != tk:
        raise ValueError(f"segment_ids as one [B, T] array needs Tq == Tk (got {tq}, {tk}); "
                         "pass (q_segment_ids, kv_segment_ids)")
      q_seg = kv_seg = jnp.asarray(segment_ids)
    if q_seg.shape != (b, tq) or kv_seg.shape != (b, tk):
      raise ValueError(f"segment_ids shapes {q_seg.shape}, {kv_seg.shape} must be "
                       f"[B, Tq]={(b, tq)} and [B, Tk]={(b, tk)}")
  if scale is None:
    scale = 1.0 / math.sqrt(d)
  elif not isinstance(scale, (int, float, np.floating)):
    raise ValueError(f"scale must be a Python float (static), got {type(scale).__name__}")
  return dict(bias=bias, mask=mask, window=masks.normalize_window(window), q_seg=q_seg,
              kv_seg=kv_seg, scale=float(scale), causal=causal)
