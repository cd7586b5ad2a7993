"""jaxformer: attention and Transformers in JAX/Flax, from a laptop CPU to a TPU pod."""

__version__ = "0.1.0"
