"""Attention heads in a trained model's params: gates, folding, pruning, importance, dropping layers.

Every function reads and returns plain (unboxed) params pytrees, the layout models build
(`layers_0 ... layers_{L-1}` or a scanned `layers` with a leading layer axis; several stacks in
an encoder-decoder), so it works for every family and needs no model code. "Layers" below are
the self-attention layers of all stacks in path order (`layers_2` before `layers_10`), and a
keep mask is a bool array [num_layers, num_heads].

Pruning a head zeroes its slice of the output projection's kernel (`out/kernel[h]`, the
[head_dim, d_model] rows its context vector goes through), which is exactly removing the head:
its output is gone and nothing else changes. It is NOT a gate of 0 (`model.head_gates`): a gate
multiplies the head's logits, and a gate of 0 makes the head attend uniformly over the visible
keys (an average of the values), which still writes to the residual stream.

- `gates(params)`: the learned gates [L, H] (`model.head_gates=True`).
- `prune_heads(params, keep)`: zero the pruned heads' outputs.
- `drop_layers(params, keep_layers, whole_block=False)`: remove every head of a layer and its
  output bias (the attention sub-layer adds nothing), or with `whole_block` the FFN's output
  too, which for a pre-norm block makes the block the identity (a post-norm block still
  normalises: not a skip).
- `head_importance(loss_fn, params, batches)`: Michel et al. (2019, "Are Sixteen Heads Really
  Better than One?") importance |dL/d xi_h| of a mask xi_h on each head's output, averaged
  over calibration batches and l2-normalised within each layer as they do. Since xi_h scales
  out/kernel[h] only, dL/d xi_h at xi = 1 is <dL/d out/kernel[h], out/kernel[h]>, read off one
  ordinary gradient per batch (per batch, not per example: the absolute value is taken of each
  batch's mean-loss derivative).
- `keep_lowest_removed(scores, fraction)`: the keep mask that removes the round(fraction * L * H)
  heads with the lowest scores.
- `fold_gates(model_config, params)`: the same function without gates (each gate multiplied
  into its head's query projection), e.g. for Hugging Face conversion, which has no gates.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import core, traverse_util

from jaxformer.models.registry import config_as_dict

Params = Any
_LAYER = re.compile(r"layers_(\d+)$")


def _flat(params) -> dict[tuple[str, ...], Any]:
  return traverse_util.flatten_dict(core.unfreeze(params))


def _sort_key(path):
  return tuple((0, int(m.group(1)), "") if (m := _LAYER.match(p)) else (1, 0, p) for p in path)


def _sites(flat, module: str = "self_attention"):
  """[(prefix, index)]: each layer's `module` subtree prefix and its index along a scanned
  stack's leading axis (None when unscanned), in path order."""
  prefixes = sorted({k[:-2] for k in flat if len(k) >= 3 and k[-3] == module
                     and k[-2:] == ("out", "kernel")}, key=_sort_key)
  sites = []
  for prefix in prefixes:
    kernel = flat[prefix + ("out", "kernel")]
    if "layers" in prefix:                 # scanned: [L, H, D, E]
      sites += [(prefix, i) for i in range(kernel.shape[0])]
    else:
      sites.append((prefix, None))
  if not sites:
    raise ValueError(f"params have no {module}/out/kernel: not a Transformer's params (pass "
                     "the 'params' collection, unboxed)")
  return sites


def num_heads(params) -> tuple[int, int]:
  """(self-attention layers, heads per layer)."""
  flat = _flat(params)
  sites = _sites(flat)
  heads = {flat[p + ("out", "kernel")].shape[-3] for p, _ in sites}
  if len(heads) != 1:
    raise ValueError(f"self-attention layers have different head counts {sorted(heads)}")
  return len(sites), heads.pop()


def _check_mask(mask, shape, name):
  mask = np.asarray(mask)
  if mask.shape != shape or mask.dtype != bool:
    raise ValueError(f"{name} must be a bool array of shape {shape} (layers, heads); got "
                     f"{mask.dtype} {mask.shape}")
  return mask


def _set(flat, key, index, fn):
  x = jnp.asarray(flat[key])        # numpy leaves (a restored checkpoint) have no .at
  flat[key] = fn(x) if index is None else x.at[index].set(fn(x[index]))


def gates(params) -> np.ndarray:
  """The self-attention head gates [L, H] (float64 copy)."""
  flat = _flat(params)
  out = []
  for prefix, index in _sites(flat):
    g = flat.get(prefix + ("head_gates",))
    if g is None:
      raise ValueError("params have no head_gates: the model was built with "
                       "model.head_gates=False (gate-magnitude pruning needs gates)")
    out.append(np.asarray(g if index is None else g[index], np.float64))
  return np.stack(out)


def prune_heads(params, keep) -> Params:
  """params with every head where `keep` [L, H] is False removed (its slice of out/kernel
  zeroed); the input is not modified."""
  flat = _flat(params)
  sites = _sites(flat)
  keep = _check_mask(keep, num_heads(params), "keep")
  for (prefix, index), row in zip(sites, keep):
    m = jnp.asarray(row)[:, None, None]
    _set(flat, prefix + ("out", "kernel"), index, lambda w: w * m.astype(w.dtype))
  return traverse_util.unflatten_dict(flat)


def drop_layers(params, keep_layers, *, whole_block: bool = False) -> Params:
  """params with the attention of every layer where `keep_layers` [L] is False removed (all
  heads and the output bias); with whole_block=True also the FFN's output (kernel, bias), so a
  pre-norm block adds nothing to the residual stream. Dense FFNs only (`ffn/wo`)."""
  flat = _flat(params)
  sites = _sites(flat)
  keep_layers = np.asarray(keep_layers)
  if keep_layers.shape != (len(sites),) or keep_layers.dtype != bool:
    raise ValueError(f"keep_layers must be a bool array of shape ({len(sites)},); got "
                     f"{keep_layers.dtype} {keep_layers.shape}")
  zero = lambda w: jnp.zeros_like(w)
  for (prefix, index), keep in zip(sites, keep_layers):
    if keep:
      continue
    outputs = [prefix + ("out",)]
    if whole_block:
      ffn = prefix[:-1] + ("ffn", "wo")
      if ffn + ("kernel",) not in flat:
        raise ValueError(f"whole_block=True zeroes the FFN output {'/'.join(ffn)}/kernel, which "
                         "these params lack (a mixture-of-experts FFN?); drop the attention only")
      outputs.append(ffn)
    for out in outputs:
      for leaf in ("kernel", "bias"):
        if out + (leaf,) in flat:
          _set(flat, out + (leaf,), index, zero)
  return traverse_util.unflatten_dict(flat)


def _out_kernel_products(grads, params) -> np.ndarray:
  """[L, H]: <dL/d out/kernel[h], out/kernel[h]> per layer and head = dL/d xi_h."""
  fg, fp = _flat(grads), _flat(params)
  rows = []
  for prefix, index in _sites(fp):
    key = prefix + ("out", "kernel")
    g, w = fg[key], fp[key]
    if index is not None:
      g, w = g[index], w[index]
    rows.append(np.asarray(jnp.sum(g.astype(jnp.float32) * w.astype(jnp.float32), axis=(1, 2)),
                           np.float64))
  return np.stack(rows)


def head_importance(loss_fn: Callable[[Params, Any], jax.Array], params,
                    batches: Iterable[Any], *, normalize: bool = True) -> np.ndarray:
  """Michel et al.'s head importance [L, H]: the mean over `batches` of |dL/d xi_h|, xi_h a
  mask on head h's output at xi = 1, with loss_fn(params, batch) -> scalar; l2-normalised
  within each layer when `normalize` (their default)."""
  grad = jax.jit(jax.grad(loss_fn))
  total, n = None, 0
  for batch in batches:
    d = np.abs(_out_kernel_products(grad(params, batch), params))
    total, n = (d if total is None else total + d), n + 1
  if not n:
    raise ValueError("head_importance needs at least one calibration batch")
  scores = total / n
  if normalize:
    norms = np.linalg.norm(scores, axis=1, keepdims=True)
    scores = scores / np.where(norms == 0, 1, norms)
  return scores


def keep_lowest_removed(scores, fraction: float) -> np.ndarray:
  """Keep mask [L, H] removing the round(fraction * L * H) heads of lowest score (ties: the
  earlier layer and head first)."""
  scores = np.asarray(scores, np.float64)
  if scores.ndim != 2:
    raise ValueError(f"scores must be [layers, heads]; got shape {scores.shape}")
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f"fraction={fraction} must be in [0, 1]")
  k = int(round(fraction * scores.size))
  order = np.argsort(scores, axis=None, kind="stable")
  keep = np.ones(scores.size, bool)
  keep[order[:k]] = False
  return keep.reshape(scores.shape)


def fold_gates(model_config, params) -> tuple[dict, Params]:
  """(config with head_gates=False, params without `head_gates`): each gate multiplied into
  its head's query projection (kernel and bias), which computes the same logits since the
  gate scales q (RoPE is linear per head, so scaling before or after it is the same)."""
  cfg = config_as_dict(model_config)
  flat = _flat(params)
  keys = [k for k in flat if k[-1] == "head_gates"]
  if not cfg.get("head_gates") and not keys:
    return cfg, params
  if not keys:
    raise ValueError("model.head_gates=True but the params have no head_gates")
  for key in keys:
    prefix, g = key[:-1], jnp.asarray(flat.pop(key))    # g [H] or scanned [L, H]
    if prefix + ("qkv", "kernel") in flat:             # [(L,) E, 3, H, D] / bias [(L,) 3, H, D]
      for leaf, lead in (("kernel", 1), ("bias", 0)):
        name = prefix + ("qkv", leaf)
        if name in flat:
          w = jnp.asarray(flat[name])
          scan = w.ndim - (4 if leaf == "kernel" else 3)
          at = (slice(None),) * (scan + lead) + (0,)
          flat[name] = w.at[at].set(w[at] * _bcast(g, scan, lead).astype(w.dtype))
    elif prefix + ("query", "kernel") in flat:         # [(L,) E, H, D] / bias [(L,) H, D]
      for leaf, lead in (("kernel", 1), ("bias", 0)):
        name = prefix + ("query", leaf)
        if name in flat:
          w = jnp.asarray(flat[name])
          scan = w.ndim - (3 if leaf == "kernel" else 2)
          flat[name] = w * _bcast(g, scan, lead).astype(w.dtype)
    else:
      raise ValueError(f"{'/'.join(key)}: no query projection next to it to fold into")
  cfg["head_gates"] = False
  return cfg, traverse_util.unflatten_dict(flat)


def _bcast(g, scan: int, lead: int):
  """Gates [(L,) H] shaped to multiply a query weight [(L,) (E,) H, D]."""
  return g.reshape(g.shape[:scan] + (1,) * lead + g.shape[scan:] + (1,))
