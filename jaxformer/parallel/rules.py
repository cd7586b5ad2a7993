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
- hybrid sharding (`mesh.replica` > 1, a leading 'replica' mesh axis; across TPU slices it is
  laid over DCN): `batch` -> ('replica', 'data'[, 'expert']) and nothing else names
  'replica', so parameters (FSDP's `embed` -> 'data' included) are whole on each replica:
  parameter all-gathers stay inside a replica (a slice) and only gradients cross replicas.

Order is priority: flax assigns each mesh axis at most once per array, taking rules from the
top. `batch` comes before `embed`, so an activation [batch, length, embed] under FSDP keeps
batch on 'data' and leaves embed replicated (a parameter has no batch axis, so its embed
dim gets 'data').
"""

from __future__ import annotations

MESH_AXES = ("data", "model", "expert")
REPLICA_AXIS = "replica"        # the leading mesh axis of hybrid sharding (mesh.replica > 1)

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]


def mesh_axes_tuple(mesh_axes) -> tuple[str, ...]:
  """A PartitionSpec entry (None, an axis name, or a tuple of them) as a tuple of names."""
  if mesh_axes is None:
    return ()
  return (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)


def batch_axes(*, expert_parallel: bool = False, replica: bool = False
               ) -> str | tuple[str, ...]:
  """Mesh axes the batch dim is split over."""
  axes = ((REPLICA_AXIS,) if replica else ()) + ("data",) + (("expert",) if expert_parallel
                                                            else ())
  return axes[0] if len(axes) == 1 else axes


def logical_axis_rules(*, fsdp: bool = False, expert_parallel: bool = False,
                       replica: bool = False) -> Rules:
  """Rules for `nn.logical_axis_rules` (see the module docstring for the strategies);
  `replica`: the mesh has the hybrid-sharding 'replica' axis."""
  return (
      ("batch", batch_axes(expert_parallel=expert_parallel, replica=replica)),
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


def without_mesh_axes(rules: Rules, axes) -> Rules:
  """`rules` with the mesh `axes` taken out of every entry: the rules inside a function that
  `jax.vmap(..., spmd_axis_name=axes)` maps over the batch shards (train/step.py), where the
  mapped dim already holds those axes and a dim of one shard's rows may not name them again
  (under FSDP the activations' embed dim would otherwise take 'data')."""
  drop = set(mesh_axes_tuple(axes))

  def keep(entry):
    if entry is None:
      return None
    left = tuple(a for a in mesh_axes_tuple(entry) if a not in drop)
    return None if not left else left[0] if len(left) == 1 else left
  return tuple((name, keep(entry)) for name, entry in rules)
