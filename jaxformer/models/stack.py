"""A stack of TransformerBlocks, optionally scanned (`nn.scan`) and rematerialised (`nn.remat`).

Every Transformer model builds its layers here, so scan/remat behave the same everywhere.
Unscanned params live under `layers_0 ... layers_{L-1}`; scanned ones under `layers` with a
leading layer axis (logical name "layers"). `stack_layers` / `unstack_layers` convert between
the two layouts, and the outputs are identical.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.core import FrozenDict

from jaxformer.layers import TransformerBlock
from jaxformer.layers.settings import REMAT_POLICIES, BlockSettings



class _Layer(nn.Module):
  """One block in the scan-body form (carry, *broadcast inputs) -> (carry, None)."""
  settings: BlockSettings
  wiring: Any                                  # FrozenDict of the other TransformerBlock fields
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, context, mask, context_mask, segment_ids, positions, bias=None,
               rel_embeddings=None):
    x = TransformerBlock(self.settings, **self.wiring, name="block")(
        x, context, mask=mask, context_mask=context_mask, segment_ids=segment_ids,
        positions=positions, bias=bias, rel_embeddings=rel_embeddings,
        deterministic=self.deterministic)
    return x, None


class BlockStack(nn.Module):
  """`num_layers` TransformerBlocks of the same `settings` (which also say whether to scan
  and rematerialise); `wiring` holds the block's other fields (causal, cross_attention,
  positions, rope_theta, decode, dtype, param_dtype)."""
  num_layers: int
  settings: BlockSettings
  wiring: Any = None                           # dict of TransformerBlock wiring fields

  @nn.compact
  def __call__(self, x, context=None, *, mask=None, context_mask=None, segment_ids=None,
               positions=None, bias=None, rel_embeddings=None, deterministic: bool = True):
    """`bias` (float, broadcastable to [B, H, T, T]) is added to every layer's self-attention
    logits: one bias shared by the stack (T5's relative position bias); `rel_embeddings`:
    DeBERTa's relative table rows, shared by the stack's layers."""
    scan, remat_policy = self.settings.scan_layers, self.settings.remat_policy
    layer = _Layer
    if remat_policy != "none":
      layer = nn.remat(layer, policy=REMAT_POLICIES[remat_policy], prevent_cse=not scan)
    kw = dict(settings=self.settings, wiring=FrozenDict(self.wiring or {}),
              deterministic=deterministic)
    inputs = (context, mask, context_mask, segment_ids, positions, bias, rel_embeddings)
    if scan:
      layer = nn.scan(layer, variable_axes={"params": 0, "cache": 0, "intermediates": 0,
                                                  "attention_weights": 0},
                      split_rngs={"params": True, "dropout": True},
                      in_axes=(nn.broadcast,) * len(inputs), length=self.num_layers,
                      metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = layer(**kw, name="layers")(x, *inputs)
      return x
    for i in range(self.num_layers):
      x, _ = layer(**kw, name=f"layers_{i}")(x, *inputs)
    return x


def stack_layers(tree: dict, num_layers: int) -> dict:
  """{'layers_0': t, ..., 'layers_{L-1}': t} -> {'layers': stacked t} (scanned layout)."""
  tree = dict(tree)
  layers = [tree.pop(f"layers_{i}") for i in range(num_layers)]
  tree["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  return tree


def unstack_layers(tree: dict, num_layers: int) -> dict:
  """Inverse of `stack_layers`."""
  tree = dict(tree)
  stacked = tree.pop("layers")
  for i in range(num_layers):
    tree[f"layers_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return tree
