"""Flax linen modules; every parameter carries logical axis names (see parallel/rules.py)."""

from jaxformer.layers.attention import AdditiveAttention, MultiHeadAttention
from jaxformer.layers.block import TransformerBlock
from jaxformer.layers.embeddings import Embed, LearnedPositionEmbedding, PatchEmbed
from jaxformer.layers.mlp import Mlp, SwiGLU
from jaxformer.layers.norms import LayerNorm, RMSNorm, make_norm

__all__ = ["AdditiveAttention", "MultiHeadAttention", "TransformerBlock", "Embed",
           "LearnedPositionEmbedding", "PatchEmbed", "Mlp", "SwiGLU", "LayerNorm", "RMSNorm",
           "make_norm"]
