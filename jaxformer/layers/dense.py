"""A logically partitioned `DenseGeneral`: every projection in the layers is built here."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def dense(features: int | Sequence[int], axes: Sequence[str | None], *, name: str,
          axis: int | Sequence[int] = -1, use_bias: bool = False, dtype: Any = jnp.float32,
          param_dtype: Any = jnp.float32, kernel_init: Callable = default_kernel_init
          ) -> nn.DenseGeneral:
  """DenseGeneral whose kernel has logical axis names `axes` (inputs then outputs); the bias
  takes the output names."""
  n_out = 1 if isinstance(features, int) else len(features)
  return nn.DenseGeneral(
      features=features, axis=axis, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
      kernel_init=nn.with_logical_partitioning(kernel_init, tuple(axes)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, tuple(axes[-n_out:])),
      name=name)
