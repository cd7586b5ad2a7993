"""The one table from logical axis names (used by layers) to mesh axes.

Logical names: batch, length, embed, heads, kv_heads, kv (head_dim), qkv (the stacked q/k/v
projections), mlp, vocab, expert. Layers never name mesh axes; they only use these names.
"""

from __future__ import annotations

MESH_AXES = ("data", "model", "expert")


def logical_axis_rules(*, fsdp: bool = False) -> tuple[tuple[str, str | None], ...]:
  """Rules for `nn.logical_axis_rules`: data parallel over 'data', tensor parallel (heads,
  MLP, vocab) over 'model', experts over 'expert'; with fsdp the embed dim of parameters is
  also sharded over 'data'."""
  return (
      ("batch", "data"),
      ("length", None),
      ("embed", "data" if fsdp else None),
      ("heads", "model"),
      ("kv_heads", "model"),
      ("kv", None),
      ("qkv", None),
      ("mlp", "model"),
      ("vocab", "model"),
      ("expert", "expert"),
  )
