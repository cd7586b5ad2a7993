"""Pallas kernels: fused attention that runs on GPU (Triton), TPU (Mosaic) and CPU (interpret)."""

from jaxformer.ops.pallas.attention import (default_block_sizes, key_block_bounds,
                                            pallas_attention, query_block_bounds,
                                            target_platform)

__all__ = ["default_block_sizes", "key_block_bounds", "pallas_attention", "query_block_bounds",
           "target_platform"]
