"""Training: optimizer, steps, checkpoints, metrics and the loop (`python -m jaxformer.train`)."""

from jaxformer.train.loop import train

__all__ = ["train"]
