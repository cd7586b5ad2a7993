"""How a Transformer's initialisation, learning rates and multipliers scale with its width.

`model.parametrization="standard"` (the default) is what every layer does on its own: LeCun
fan-in init of projections, N(0, 0.02) embeddings, one AdamW learning rate, attention logits
times 1/sqrt(d_head), logits = the readout's output.

`model.parametrization="mup"` is the maximal-update parametrization (Yang et al. 2022, "Tensor
Programs V", arXiv 2203.03466, Table 3 in the form of the `mup` package, Table 8), relative to
a base model of width `model.mup_base_width`. With m = d_model / mup_base_width:

  parameter group (by its logical axes)    init          AdamW LR      forward multiplier
  input: token/position/type embeddings,   unchanged     lr            -
    patch projection (one width axis)
  hidden: >= 2 width axes (qkv, out,       var 1/fan_in  lr / m        -
    FFN / expert kernels, BERT pooler)     (unchanged)
  output: readout (tied embedding or       unchanged     lr            logits x 1/m
    lm_head, ViT head, MoE router)
  vectors: norm gains, biases              unchanged     lr            -
  attention logits                                                     sqrt(d_head,base)/d_head

- "Width axes" are the logical axes that grow with the model: "embed", "mlp" and the
  attention width ("heads" x "kv" counts once). A kernel with two of them is a hidden
  matrix; with one it is an input or output weight (or a vector). The rule reads the names
  every parameter already carries for sharding, so new layers are classified without a list.
- One multiplier m for every hidden matrix: μP assumes the model grows as a whole, mlp_dim
  and the attention width in proportion to d_model (what `scaling.with_width` builds).
- Attention: with `head_dim` unset, heads are fixed and d_head grows with width, so the
  logits get 1/d_head (q.k grows like d_head once q and k align in training), normalised to
  1/sqrt(d_head) at the base width. With `head_dim` set, heads are what grows and d_head is
  constant: the base head dim is d_head and the scale stays 1/sqrt(d_head).
- Tied embeddings (the README model): the one matrix keeps the input role's init and LR and
  the readout gets the output multiplier 1/m, as the `mup` package's shared readout does.
  Why: the embedding's coordinates must stay O(1) as an input (so no width-dependent init or
  LR), while the logits x.E grow like width once x and E align; dividing the logits, not the
  matrix, fixes the output without changing the input.
- At width = base every multiplier is 1 and μP is the standard parametrization bit for bit,
  so an LR tuned under standard at the base width is the μP LR at every width.

Sweeps may keep `mup_base_width` set under `standard` (ignored there), so one override list
serves both arms of a comparison.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax

PARAMETRIZATIONS = ("standard", "mup")
# Logical axes that grow with width; the attention axes together count as one.
_WIDTH_AXES = {"embed": "embed", "mlp": "mlp", "heads": "attention", "kv_heads": "attention",
               "kv": "attention"}


def width_multiplier(settings, d_model: int) -> float:
  """m = d_model / mup_base_width under μP, else 1."""
  if settings.parametrization != "mup":
    return 1.0
  return d_model / settings.mup_base_width


def attention_scale(settings, d_model: int) -> float | None:
  """The attention logit multiplier, or None for the default 1/sqrt(d_head)."""
  if width_multiplier(settings, d_model) == 1.0:
    return None
  d = settings.head_dim or d_model / settings.num_heads
  base = settings.head_dim or settings.mup_base_width / settings.num_heads
  return math.sqrt(base) / d


def output_multiplier(settings, d_model: int) -> float | None:
  """The multiplier of an output (readout) layer's result, or None for none: 1/m."""
  m = width_multiplier(settings, d_model)
  return None if m == 1.0 else 1.0 / m


def scale_output(x, settings, d_model: int):
  """x times the output multiplier (x itself, untouched, when there is none)."""
  multiplier = output_multiplier(settings, d_model)
  return x if multiplier is None else x * multiplier


def width_axes(names) -> int:
  """How many distinct width axes a parameter with these logical axis names has."""
  return len({_WIDTH_AXES[n] for n in names if n in _WIDTH_AXES})


def learning_rate_multipliers(abstract_params, settings, d_model: int):
  """Per-parameter LR multipliers (a pytree of floats shaped like the unboxed params) from
  the boxed abstract params (their logical axis names): 1/m for hidden matrices (>= 2 width
  axes), 1 for everything else (all 1 under standard)."""
  m = width_multiplier(settings, d_model)
  is_box = lambda x: isinstance(x, nn.Partitioned)

  def multiplier(leaf):
    names = leaf.names if is_box(leaf) else ()
    return 1.0 / m if width_axes(names) >= 2 else 1.0
  return jax.tree.map(multiplier, abstract_params, is_leaf=is_box)
