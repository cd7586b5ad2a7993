"""Routing discipline of attention heads on a fixed batch: collapse (entropy) and redundancy
(similarity of heads' attention maps), from the probabilities every attention layer sows into
the `attention_weights` collection (`layers.attention.WEIGHTS_COLLECTION`).

For one layer's weights p [B, H, Tq, Tk] and the keys each query row may see, `visible`
[B, Tq, Tk] (by default: the keys any head of the layer gives a non-zero probability, which is
the layer's mask: `ops.masks.masked_softmax` gives masked keys exactly 0; a key counts as
masked only if every head's probability for it underflows to 0):
- entropy of a row: -sum_k p log p in nats, 0 for one-hot, log n for uniform over n visible
  keys; `entropy` is its mean over rows with >= 1 visible key, `normalized_entropy` the mean
  of entropy / log n over rows with n >= 2 (so rows of different lengths compare: 1 uniform,
  0 one-hot; a row with one visible key has no choice and is left out of it);
- similarity of two heads: 1 - JS(p_a, p_b) / ln 2 per row (JS the Jensen-Shannon divergence
  in nats, at most ln 2), averaged over rows with n >= 2: 1 for identical maps, 0 for maps on
  disjoint keys. Within a layer [H, H]; across layers for every head of every layer of the
  same shape (the self-attention layers of a stack) [N, N], N = layers x heads.

`summarize` gives, per layer, a few scalars (mean and min normalised entropy over heads,
mean pairwise similarity within the layer, mean over heads of the similarity to the most
similar other head anywhere) and the full per-head arrays. Rows without any visible key
(padding) count nowhere. Two nearly uniform heads are similar by construction, so redundancy
reads with the entropy beside it.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np

LN2 = math.log(2.0)


def visible_keys(weights) -> jax.Array:
  """[B, Tq, Tk] bool: the keys any head gives a non-zero probability (weights [B, H, Tq, Tk])."""
  return jnp.any(jnp.asarray(weights) > 0, axis=1)


def _row_entropy(p):
  """-sum_k p log p over the last axis (0 log 0 = 0)."""
  return -jnp.sum(jax.scipy.special.xlogy(p, p), axis=-1)


def _masked(weights, visible):
  p = jnp.asarray(weights, jnp.float32)
  return jnp.where(visible[:, None], p, 0.0)


@jax.jit
def head_entropy(weights, visible):
  """(entropy [H] in nats over rows with a visible key, normalised entropy [H] over rows with
  2 or more): see the module docstring. weights [B, H, Tq, Tk], visible [B, Tq, Tk]."""
  p = _masked(weights, visible)
  n = jnp.sum(visible, axis=-1)                                   # [B, Tq]
  ent = _row_entropy(p)                                           # [B, H, Tq]
  some, several = (n >= 1)[:, None], (n >= 2)[:, None]
  nats = jnp.sum(jnp.where(some, ent, 0.0), axis=(0, 2)) / jnp.sum(n >= 1)
  log_n = jnp.log(jnp.maximum(n, 2))[:, None]
  norm = jnp.sum(jnp.where(several, ent / log_n, 0.0), axis=(0, 2)) / jnp.sum(n >= 2)
  return nats, norm


@jax.jit
def similarity_matrix(heads, visible):
  """[N, N] mean over rows with >= 2 visible keys of 1 - JS(p_a, p_b) / ln 2, for the maps
  `heads` [N, B, Tq, Tk] (any N heads of one shape) under the mask `visible` [B, Tq, Tk]."""
  p = jnp.where(visible[None], jnp.asarray(heads, jnp.float32), 0.0)
  several = jnp.sum(visible, axis=-1) >= 2                         # [B, Tq]
  count = jnp.sum(several)
  ent = _row_entropy(p)                                           # [N, B, Tq]

  def against(a):
    pa, ea = a
    js = _row_entropy((pa[None] + p) / 2) - (ea[None] + ent) / 2   # [N, B, Tq]
    js = jnp.clip(js, 0.0, LN2)
    return jnp.sum(jnp.where(several[None], 1.0 - js / LN2, 0.0), axis=(1, 2)) / count
  return jax.lax.map(against, (p, ent))


def _natural(name: str):
  return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def split_layers(weights: dict) -> dict[str, np.ndarray]:
  """{layer name: [B, H, Tq, Tk]} in layer order from the sown weights {name: [B, H, Tq, Tk]
  or a scanned stack [L, B, H, Tq, Tk]} (a stack's layers named '<name>/<i>')."""
  out = {}
  for name in sorted(weights, key=_natural):
    w = np.asarray(weights[name])
    if w.ndim == 5:
      out.update({f"{name}/{i}": w[i] for i in range(w.shape[0])})
    elif w.ndim == 4:
      out[name] = w
    else:
      raise ValueError(f"attention weights {name!r}: expected [B, H, Tq, Tk] or a scanned "
                       f"[L, B, H, Tq, Tk], got shape {w.shape}")
  return out


def summarize(weights: dict) -> dict:
  """Entropy and redundancy of every head of every layer (`split_layers` of `weights`): see the
  module docstring. Returns {"layers": [names], "scalars": {name: float}, "heads": per-layer
  per-head arrays as lists}, JSON-ready; the scalars are "entropy/<i>", "min_entropy/<i>",
  "redundancy/<i>", "partner/<i>" for layer i and "cross_layer_redundancy" (mean over heads
  of the similarity to the most similar head in another layer of the same shape)."""
  layers = split_layers(weights)
  if not layers:
    raise ValueError("no attention weights: the model has no attention layer that sows them")
  names = list(layers)
  per_layer, scalars = [], {}
  groups: dict[tuple, list[int]] = {}
  for i, name in enumerate(names):
    w = jnp.asarray(layers[name], jnp.float32)
    visible = visible_keys(w)
    nats, norm = jax.device_get(head_entropy(w, visible))
    within = np.asarray(similarity_matrix(jnp.moveaxis(w, 1, 0), visible), np.float64)
    h = within.shape[0]
    off = within[~np.eye(h, dtype=bool)]
    per_layer.append({"name": name, "entropy": nats.tolist(),
                      "normalized_entropy": norm.tolist(), "similarity": within.tolist()})
    scalars[f"entropy/{i}"] = float(np.mean(norm))
    scalars[f"min_entropy/{i}"] = float(np.min(norm))
    scalars[f"redundancy/{i}"] = float(np.mean(off)) if off.size else float("nan")
    groups.setdefault(w.shape[2:] + (w.shape[0],), []).append(i)
  cross_all = []
  for members in groups.values():
    stacked = jnp.concatenate([jnp.moveaxis(jnp.asarray(layers[names[i]], jnp.float32), 1, 0)
                               for i in members])                 # [N, B, Tq, Tk]
    visible = jnp.any(stacked > 0, axis=0)
    sim = np.asarray(similarity_matrix(stacked, visible), np.float64)
    owner = np.concatenate([[i] * len(per_layer[i]["entropy"]) for i in members])
    head = np.concatenate([np.arange(len(per_layer[i]["entropy"])) for i in members])
    if len(sim) < 2:                      # one head in all: no other head to compare with
      continue
    others = sim.copy()
    np.fill_diagonal(others, -np.inf)
    partner = np.argmax(others, axis=1)
    other_layer = np.where(owner[:, None] != owner[None, :], sim, -np.inf)
    for i in members:
      rows = np.flatnonzero(owner == i)
      per_layer[i]["partner"] = [[names[owner[j]], int(head[j])] for j in partner[rows]]
      per_layer[i]["partner_similarity"] = [float(others[r, partner[r]]) for r in rows]
      scalars[f"partner/{i}"] = float(np.mean(per_layer[i]["partner_similarity"]))
      if len(members) > 1:
        cross_all.extend(other_layer[rows].max(axis=1).tolist())
  if cross_all:
    scalars["cross_layer_redundancy"] = float(np.mean(cross_all))
  return {"layers": names, "scalars": scalars, "heads": per_layer}
