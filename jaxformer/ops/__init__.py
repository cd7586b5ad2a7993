"""Pure functions (no parameters): attention, masks, position encodings."""

from jaxformer.ops.attention import dot_product_attention, dot_product_attention_weights
from jaxformer.ops.masks import masked_softmax

__all__ = ["dot_product_attention", "dot_product_attention_weights", "masked_softmax"]
