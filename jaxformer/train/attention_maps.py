"""Attention maps of a fixed eval example at each eval: how heads go from uniform to focused.

The example is row 0 of the first eval batch (the same every eval). Every attention layer
sows its probabilities when the `attention_weights` collection is mutable (see
`layers.attention`); we plot one layer per eval — the last decoder cross-attention for
seq2seq (source/target alignment), else the last self-attention — and log the mean entropy
of each head of that layer (log Tk for uniform attention, 0 for one-hot).
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np

from jaxformer import paths, workdir_layout
from jaxformer.data.batching import VALID
from jaxformer.layers.attention import WEIGHTS_COLLECTION
from jaxformer.train import plots


def make_snapshot_fn(module, task, rows: int = 1):
  """jitted (params, batch) -> {layer path: weights [..., rows, H, Tq, Tk]} for the first
  `rows` rows of the batch (the 'heads' evaluator reads several)."""
  def snapshot(params, batch):
    row = {k: v[:rows] for k, v in batch.items() if k != VALID}
    args, kwargs = task.model_args(row)
    _, state = module.apply({"params": params}, *args, **kwargs, deterministic=True,
                            mutable=[WEIGHTS_COLLECTION])
    return {_layer_name(path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}
  return jax.jit(snapshot)


def _layer_name(path) -> str:
  """['attention_weights']['decoder']['layers_1']['block']['self_attention']['weights'][0]
  -> 'decoder/layers_1/self_attention'."""
  keys = [str(k.key) for k in path if hasattr(k, "key")]
  return "/".join(k for k in keys if k not in (WEIGHTS_COLLECTION, "block", "weights"))


def _natural(name: str):
  return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def pick_layer(weights: dict) -> tuple[str, np.ndarray]:
  """(name, [H, Tq, Tk]) of the layer to show (the last one in layer order; a scanned stack
  [L, 1, H, Tq, Tk] shows its last layer)."""
  names = sorted(weights, key=_natural)
  cross = [n for n in names if "cross" in n]
  name = (cross or [n for n in names if "decoder" in n] or names)[-1]
  w = np.asarray(weights[name], np.float32)
  if w.ndim == 5:
    w = w[-1]
  return name, w[0]


def write_attention_map(snapshot_fn, params, batch, *, step: int, workdir: str,
                        tokens: list[str] | None = None, images: bool = False):
  """Plot the chosen layer to <workdir>/attention/step_<step>.png; returns (png path,
  per-head entropies in nats). `images`: the keys are image patches (ViT, the captioner's
  cross-attention), named so on the axes. None when no layer records probabilities (every
  self-attention a `model.attention_variant` other than softmax, and no cross-attention)."""
  weights = jax.device_get(snapshot_fn(params, batch))
  if not weights:
    return None
  name, w = pick_layer(weights)
  paths.path(os.path.join(workdir, workdir_layout.ATTENTION)).mkdir(parents=True, exist_ok=True)
  path = os.path.join(workdir, workdir_layout.ATTENTION, f"step_{step:06d}.png")
  if tokens is not None and len(tokens) != w.shape[-1]:
    tokens = None
  cross = "cross" in name
  names = (("key patch" if images else "key"),
           ("query position" if cross else "query patch" if images else "query"))
  plots.plot_attention(w, tokens, path, title=f"step {step}: {name}", self_attention=not cross,
                       axis_names=names)
  return path, plots.attention_entropy(w)
