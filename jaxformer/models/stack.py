"""A stack of TransformerBlocks, optionally scanned (`nn.scan`) and rematerialised (`nn.remat`).

Every Transformer model builds its layers here, so scan/remat behave the same everywhere.
Unscanned params live under `layers_0 ... layers_{L-1}`; scanned ones under `layers` with a
leading layer axis (logical name "layers"). `stack_layers` / `unstack_layers` convert between
the two layouts, and the outputs are identical.

`repeat_last` (DeBERTa's enhanced mask decoder) runs the last layer again after the stack,
with the same params (no new ones), on a query stream that attends over the last layer's
input: one layer body applied to the `layers_{L-1}` params, or scanned to the last slice of
the stacked `layers` params (the scan carries the layer input along, so the last layer's
input comes out of the scan without stacking every layer's).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from flax.core import FrozenDict

from jaxformer.layers import TransformerBlock
from jaxformer.layers.block_settings import REMAT_POLICIES, BlockSettings



class _Layer(nn.Module):
  """One block in the scan-body form (carry, *broadcast inputs) -> (carry, None)."""
  settings: BlockSettings
  wiring: Any                                  # FrozenDict of the other TransformerBlock fields
  deterministic: bool = True
  keep_input: bool = False                     # carry (x, x before this layer)

  @nn.compact
  def __call__(self, x, context, mask, context_mask, segment_ids, positions, bias=None,
               rel_embeddings=None, kv_inputs=None):
    if self.keep_input:
      x = x[0]
    x = checkpoint_name(x, "layer_input")      # for remat_policy="offload_layer_input"
    y = TransformerBlock(self.settings, **self.wiring, name="block")(
        x, context, mask=mask, context_mask=context_mask, segment_ids=segment_ids,
        positions=positions, bias=bias, rel_embeddings=rel_embeddings, kv_inputs=kv_inputs,
        deterministic=self.deterministic)
    return ((y, x) if self.keep_input else y), None


class BlockStack(nn.Module):
  """`num_layers` TransformerBlocks of the same `settings` (which also say whether to scan
  and rematerialise); `wiring` holds the block's other fields (causal, cross_attention,
  positions, rope_theta, decode, dtype, param_dtype)."""
  num_layers: int
  settings: BlockSettings
  wiring: Any = None                           # dict of TransformerBlock wiring fields

  @nn.compact
  def __call__(self, x, context=None, *, mask=None, context_mask=None, segment_ids=None,
               positions=None, bias=None, rel_embeddings=None, deterministic: bool = True,
               repeat_last: int = 0, query_offset=None):
    """`bias` (float, broadcastable to [B, H, T, T]) is added to every layer's self-attention
    logits: one bias shared by the stack (T5's relative position bias); `rel_embeddings`:
    DeBERTa's relative table rows, shared by the stack's layers.

    repeat_last > 0 (DeBERTa's enhanced mask decoder): with h = the last layer's input (the
    second-to-last layer's output) and query q = h + query_offset ([B or 1, T, E]), apply
    the last layer `repeat_last` times as q = layer(q, kv_inputs=h) (queries and residual
    from q, keys and values from h, the same masks and relative positions), and return
    (the stack's output, q). The passes are not recorded in the intermediates /
    attention_weights collections (attention maps show the stack's own last layer)."""
    scan, remat_policy = self.settings.scan_layers, self.settings.remat_policy
    if repeat_last < 0 or (repeat_last and query_offset is None):
      raise ValueError(f"repeat_last={repeat_last} must be >= 0, and > 0 needs query_offset")
    layer = _Layer
    if remat_policy != "none":
      layer = nn.remat(layer, policy=REMAT_POLICIES[remat_policy].checkpoint, prevent_cse=not scan)
    kw = dict(settings=self.settings, wiring=FrozenDict(self.wiring or {}),
              deterministic=deterministic)
    inputs = (context, mask, context_mask, segment_ids, positions, bias, rel_embeddings)
    if scan:
      scanned = nn.scan(layer, variable_axes={"params": 0, "cache": 0, "intermediates": 0,
                                              "attention_weights": 0},
                        split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast,) * len(inputs), length=self.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      if not repeat_last:
        x, _ = scanned(**kw, name="layers")(x, *inputs)
        return x
      (x, hidden), _ = scanned(**kw, keep_input=True, name="layers")((x, x), *inputs)
      # the last slice of the stacked params (read, not copied: gradients flow into `layers`)
      last = jax.tree.map(lambda a: a[-1], nn.unbox(self.variables["params"]["layers"]))
    else:
      for i in range(self.num_layers):
        hidden = x
        x, _ = layer(**kw, name=f"layers_{i}")(x, *inputs)
      if not repeat_last:
        return x
      last = nn.unbox(self.variables["params"][f"layers_{self.num_layers - 1}"])
    # The passes apply one layer body to those params in both layouts (so neither records
    # them in the intermediates / attention_weights collections), a fresh dropout key each.
    body = layer(**kw, parent=None)
    dropout = not deterministic and (self.settings.dropout_rate
                                     or self.settings.attention_dropout_rate)
    q = hidden + query_offset
    for _ in range(repeat_last):
      rngs = {"dropout": self.make_rng("dropout")} if dropout else None
      q = body.apply({"params": last}, q, *inputs, kv_inputs=hidden, rngs=rngs)[0]
    return x, q


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
