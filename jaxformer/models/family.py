"""What the rest of jaxformer needs to know about a model family, in one entry.

A `Family` names the linen module, the training task (a name in the task registry,
`jaxformer.tasks`, which fixes the data pipeline, batch layout, loss and metrics), example
inputs for `init` and parameter counting, which top-level parameter subtrees are embeddings
and task heads (for the Kaplan/backbone counts), the family's defaults for the shared block
settings, and its Hugging Face converter. `models.build`, the tasks, `scaling` and
`convert.hf` all ask the registry (`jaxformer.models.registry`), so adding a family is one
module file plus one `register(Family(...))`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.layers import block_settings as settings_lib


def token_inputs(count: int = 1) -> Callable[[dict, int, int], tuple]:
  """example_inputs for models taking `count` int32 [batch, length] token arrays (length
  capped at the model's max_len, if it has one)."""
  def inputs(cfg: dict, batch: int, length: int) -> tuple:
    length = min(length, cfg.get("max_len") or length)
    return (jax.ShapeDtypeStruct((batch, length), jnp.int32),) * count
  return inputs


def image_inputs(cfg: dict, batch: int, length: int) -> tuple:
  """example_inputs for models taking float32 [batch, image_size, image_size, channels]."""
  del length
  size = cfg["image_size"]
  return (jax.ShapeDtypeStruct((batch, size, size, cfg["channels"]), jnp.float32),)


def head_dim(cfg: dict) -> int:
  """The attention head size of a flat Transformer config."""
  return cfg.get("head_dim") or cfg["d_model"] // cfg["num_heads"]


@dataclasses.dataclass(frozen=True)
class Family:
  """One registry entry; `__post_init__` names whatever is missing or malformed.

  - name: the `model.family` config value.
  - module: the linen Module class. Its dataclass fields are config keys; a field named
    `block` (a `BlockSettings`) makes every shared block key (`layers/block_settings.py`) a config
    key as well, with `block_defaults` over the settings' own defaults.
  - task: the name of its task in the task registry (`jaxformer.tasks`, which sits above
    the models and checks the name when a run asks for the family's task).
  - example_inputs: (config dict with defaults, batch, length) -> abstract positional inputs
    of `init`.
  - embeddings / heads: top-level parameter names that are embeddings (token, position,
    token-type tables, an untied vocabulary projection: Kaplan's N leaves them out) and
    task heads (what a backbone such as HF `*Model` leaves out).
  - embedding_lookups: token-embedding lookups per example that Hoffmann's FLOPs count as
    vocabulary matmuls; None if that count does not apply to the family.
  - tokens_per_example: (config dict) -> the tokens the model processes per example, for
    families whose inputs are not token sequences (ViT: patches + class token); None: the
    batch's sequence length. Training's FLOPs per step (the MFU estimate) count with it.
  - attention_flops: (config dict, seq_len) -> (attention layers, keys per query, attention
    width) for the FLOPs attention term; None: `num_layers` layers of num_heads * head_dim,
    keys limited by a sliding `window`.
  - validate: extra checks of the flat config (with defaults filled in) that need more than
    one field; raise ValueError naming `model.<key>`.
  - hf_converter: dotted name of the module in `jaxformer.convert.hf` that converts this
    family to and from Hugging Face checkpoints, or None.
  """
  name: str | None = None
  module: type | None = None
  task: str | None = None
  example_inputs: Callable[[dict, int, int], tuple] | None = None
  embeddings: tuple[str, ...] | None = None
  heads: tuple[str, ...] | None = None
  block_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  embedding_lookups: int | None = None
  tokens_per_example: Callable[[dict], int] | None = None
  attention_flops: Callable[[dict, int], tuple[int, int, int]] | None = None
  validate: Callable[[dict], None] | None = None
  hf_converter: str | None = None

  def __post_init__(self):
    who = f"model family {self.name!r}"
    if not isinstance(self.name, str) or not self.name.isidentifier():
      raise ValueError(f"{who}: name must be an identifier (the model.family config value)")
    if not (isinstance(self.module, type) and issubclass(self.module, nn.Module)):
      raise ValueError(f"{who}: module={self.module!r} must be a flax.linen.Module subclass")
    if not isinstance(self.task, str) or not self.task.isidentifier():
      raise ValueError(f"{who}: task={self.task!r} must be the name of a registered task "
                       "(jaxformer.tasks: it fixes the data pipeline, the loss and the eval "
                       "metrics)")
    if not callable(self.example_inputs):
      raise ValueError(f"{who}: example_inputs is missing: a function (config, batch, length) "
                       "-> the abstract inputs of init (see token_inputs, image_inputs)")
    for key in ("embeddings", "heads"):
      value = getattr(self, key)
      if not (isinstance(value, tuple) and all(isinstance(v, str) for v in value)):
        raise ValueError(f"{who}: {key}={value!r} must be a tuple of top-level parameter "
                         "names (an empty tuple if there are none)")
    for key in ("tokens_per_example", "attention_flops", "validate"):
      if getattr(self, key) is not None and not callable(getattr(self, key)):
        raise ValueError(f"{who}: {key} must be callable or None")
    unknown = set(self.block_defaults) - set(settings_lib.CONFIG_KEYS)
    if unknown:
      raise ValueError(f"{who}: block_defaults has unknown keys {sorted(unknown)}; the block "
                       f"settings are {list(settings_lib.CONFIG_KEYS)}")
    if self.block_defaults and not self.has_blocks:
      raise ValueError(f"{who}: block_defaults given but {self.module.__name__} has no "
                       "`block: BlockSettings` field")
    if self.hf_converter is not None and not isinstance(self.hf_converter, str):
      raise ValueError(f"{who}: hf_converter must be a dotted module name or None")

  @property
  def has_blocks(self) -> bool:
    return "block" in module_fields(self.module)


def module_fields(module: type) -> dict[str, dataclasses.Field]:
  """The dataclass fields a linen Module class is configured with."""
  return {f.name: f for f in dataclasses.fields(module) if f.name not in ("parent", "name")}
