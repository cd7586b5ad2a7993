"""Training: config checks, the run builder, steps, evaluation, metrics and the loop (`python -m
jaxformer.train`). The optimizer, checkpoints and train state (`optim`, `checkpoint`,
`state`) are shared with inference, which imports them and nothing else from here.

`train` is loaded on first use, so light modules (`jaxformer.train.metrics`, `.workdir`) can be
imported without loading JAX and the whole loop (the sweep driver reads metrics that way).
"""

__all__ = ["train"]


def __getattr__(name):
  if name == "train":
    from jaxformer.train.loop import train
    return train
  raise AttributeError(f"module 'jaxformer.train' has no attribute {name!r}")
