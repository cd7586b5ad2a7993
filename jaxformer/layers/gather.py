"""A parameter gathered once per use: FSDP's all-gather and gradient reduce-scatter made
explicit.

Under FSDP (`mesh.fsdp=True`) every kernel's `embed` axis is sharded over 'data'
(`parallel/rules.py`). Left to itself, XLA's partitioner gathers such a kernel separately for
each matmul that reads it: in a rematerialised scanned layer once for the recomputed forward
(an all-gather) and again for the input gradient (a ring of collective-permutes in the TPU
compiler's schedule), and the weight gradient is reduced through another ring. `gathered`
instead casts the kernel to the compute dtype and constrains it whole along `embed` (its
other axes keep their rules: tensor-parallel heads/mlp stay split), so there is one
all-gather in the compute dtype per layer per pass, shared by every matmul of the pass, and
its transpose puts the gradient straight back on the parameter's sharding (one
reduce-scatter). The gathered copy is never kept for the backward pass
(`jax.checkpoint`, nothing saved): without remat it is gathered again there, as the
partitioner did, instead of holding every layer's whole kernels.

Outside a mesh's logical-axis rules, and for a kernel without an `embed` axis or with
`embed` unsharded, it is `kernel.astype(dtype)`: the same numbers everywhere.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _whole(w, sharded, whole):
  return nn.with_logical_constraint(w, whole)


def _whole_fwd(w, sharded, whole):
  return _whole(w, sharded, whole), None


def _whole_bwd(sharded, whole, _, ct):
  # the partial sums of every device's rows land on the parameter's own sharding: a
  # reduce-scatter (not an all-reduce to the whole kernel and a slice of it)
  return (nn.with_logical_constraint(ct, sharded),)


_whole.defvjp(_whole_fwd, _whole_bwd)


def gathered(kernel, axes: Sequence[str | None], dtype: Any):
  """`kernel` (logical axes `axes`) cast to `dtype` and, under rules that shard `embed`,
  whole along it (the module docstring)."""
  axes = tuple(axes)
  cast = kernel.astype(dtype)
  rules = nn.get_logical_axis_rules()
  if "embed" not in axes or not rules or dict(rules).get("embed") is None:
    return cast
  whole = tuple(None if a == "embed" else a for a in axes)
  gather = jax.checkpoint(lambda w: _whole(w, axes, whole),
                          policy=jax.checkpoint_policies.nothing_saveable)
  return gather(cast)
