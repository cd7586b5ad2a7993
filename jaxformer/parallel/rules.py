"""The one table from logical axis names (used by layers) to mesh axes.

Layers never name mesh axes; they name what a dimension *is* and this table decides where it
lives. Logical names: batch, length, embed, heads, kv_heads, kv (head_dim), qkv (the stacked
q/k/v projections), mlp, vocab, expert, layers (the leading axis of scanned layer stacks).

Strategies (mesh axes ('data', 'model', 'expert'); any of them can be combined):
- data parallel: `batch` -> 'data'. With expert parallelism (mesh.expert > 1) the batch is
  split over ('data', 'expert') as in MaxText, so devices along 'expert' also carry distinct
  rows and dense layers are not computed redundantly there.
- FSDP (`fsdp=True`, ZeRO-3 style): parameters' `embed` dim -> 'data'. Every matrix in jaxformer
  (embeddings, projections, expert weights) has an embed axis, so this shards all large
  parameters and their optimizer moments; XLA all-gathers them per layer.
- tensor parallel: heads, kv_heads, mlp, vocab -> 'model' (Megatron column/row split).
- expert parallel: expert -> 'expert'.

Order is priority: flax assigns each mesh axis at most once per array, taking rules from the
top. `batch` comes before `embed`, so an activation [batch, length, embed] under FSDP keeps
batch on 'data' and leaves embed replicated (a parameter has no batch axis, so its embed
dim gets 'data').
"""

from __future__ import annotations

MESH_AXES = ("data", "model", "expert")

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]


def mesh_axes_tuple(mesh_axes) -> tuple[str, ...]:
  """A PartitionSpec entry (None, an axis name, or a tuple of them) as a tuple of names."""
  if mesh_axes is None:
    return ()
  return (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)


def batch_axes(*, expert_parallel: bool = False) -> str | tuple[str, ...]:
  """Mesh axes the batch dim is split over."""
  return ("data", "expert") if expert_parallel else "data"


def logical_axis_rules(*, fsdp: bool = False, expert_parallel: bool = False) -> Rules:
  """Rules for `nn.logical_axis_rules` (see the module docstring for the strategies)."""
  return (
      ("batch", batch_axes(expert_parallel=expert_parallel)),
      ("length", None),
      ("layers", None),
      ("heads", "model"),
      ("kv_heads", "model"),
      ("mlp", "model"),
      ("vocab", "model"),
      ("expert", "expert"),
      ("embed", "data" if fsdp else None),
      ("kv", None),
      ("qkv", None),
  )
