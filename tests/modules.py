"""Building layers from flat keyword arguments in tests, the way configs give them."""

from jaxformer.layers import TransformerBlock
from jaxformer.layers.moe import MoE
from jaxformer.layers.block_settings import BlockSettings, MoESettings

_WIRING = ("causal", "cross_attention", "positions", "rope_theta", "decode", "dtype",
           "param_dtype")
_MOE_LAYER = ("hidden_dim", "activation", "use_bias", "dtype", "param_dtype", "kernel_init")


def make_block(**kw) -> TransformerBlock:
  """TransformerBlock from flat kwargs: wiring fields go to the block, the rest to its
  BlockSettings (qkv_bias defaults to False, as the NumPy references assume)."""
  wiring = {k: kw.pop(k) for k in _WIRING if k in kw}
  kw.setdefault("qkv_bias", False)
  return TransformerBlock(BlockSettings(**kw), **wiring)


def make_moe(**kw) -> MoE:
  """MoE layer from flat kwargs (the MoESettings fields and the layer's own)."""
  layer = {k: kw.pop(k) for k in _MOE_LAYER if k in kw}
  return MoE(MoESettings(**kw), **layer)
