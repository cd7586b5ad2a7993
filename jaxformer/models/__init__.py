"""Full models and the registry: `build(config.model)` -> a linen Module.

Config fields are the model's dataclass fields (plus `family` and an optional `name`), so a
config key means exactly one module attribute. `build` validates before anything compiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers.block import FFNS
from jaxformer.layers.mlp import ACTIVATIONS
from jaxformer.layers.norms import NORMS
from jaxformer.models.bert import Bert
from jaxformer.models.gpt import DecoderLM
from jaxformer.models.rnn_seq2seq import CELLS, RnnSeq2Seq
from jaxformer.models.seq2seq import EncoderDecoder
from jaxformer.models.stack import REMAT_POLICIES
from jaxformer.models.vit import ViT
from jaxformer.ops.attention import IMPLS, check_block_sizes

FAMILIES: dict[str, type[nn.Module]] = {
    "decoder": DecoderLM,        # GPT-2/3, Llama, Mistral, Mixtral
    "bert": Bert,
    "seq2seq": EncoderDecoder,   # the original Transformer
    "vit": ViT,
    "rnn_seq2seq": RnnSeq2Seq,
}
DECODER_POSITIONS = ("learned", "rope", "alibi", "sinusoidal", "none")
_DTYPES = ("float32", "bfloat16", "float16")


def model_fields(family: str) -> dict[str, dataclasses.Field]:
  cls = FAMILIES[family]
  return {f.name: f for f in dataclasses.fields(cls) if f.name not in ("parent", "name")}


def config_as_dict(model_config: Any) -> dict:
  """A model config (ConfigDict or mapping) as a plain dict; a `window` list (as JSON and
  ConfigDict give back) becomes the tuple the layers expect."""
  if hasattr(model_config, "to_dict"):
    model_config = model_config.to_dict()
  if not isinstance(model_config, Mapping):
    raise ValueError(f"model_config must be a dict or ConfigDict; got {type(model_config)}")
  cfg = dict(model_config)
  if isinstance(cfg.get("window"), list):
    cfg["window"] = tuple(cfg["window"])
  return cfg


def build(model_config: Any) -> nn.Module:
  """The linen Module described by `model_config` (a ConfigDict or dict with `family`)."""
  cfg = config_as_dict(model_config)
  family = cfg.pop("family", None)
  cfg.pop("name", None)
  if family not in FAMILIES:
    raise ValueError(f"model.family={family!r} is not one of {sorted(FAMILIES)}")
  fields = model_fields(family)
  for key in cfg:
    if key not in fields:
      raise ValueError(f"model.{key} is not a field of the {family!r} model; known fields: "
                       f"{sorted(fields)}")
  missing = [k for k, f in fields.items() if k not in cfg and f.default is dataclasses.MISSING]
  if missing:
    raise ValueError(f"model.{missing[0]} is required for model.family={family!r}")
  for key in ("dtype", "param_dtype"):
    if key in cfg:
      if str(cfg[key]) not in _DTYPES:
        raise ValueError(f"model.{key}={cfg[key]!r} is not one of {_DTYPES}")
      cfg[key] = jnp.dtype(str(cfg[key]))
  _validate(family, cfg)
  return FAMILIES[family](**cfg)


def _check(ok: bool, message: str):
  if not ok:
    raise ValueError(message)


def _validate(family: str, c: dict):
  """Field-level checks with messages that name the field and the fix."""
  for key, value in c.items():
    if key in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_dim", "hidden_dim",
               "embed_dim", "num_encoder_layers", "num_decoder_layers", "num_classes",
               "patch_size", "image_size", "max_len", "type_vocab_size", "channels"):
      _check(isinstance(value, int) and value > 0, f"model.{key}={value!r} must be an int > 0")
    if key in ("attention_dim", "head_dim", "num_kv_heads") and value is not None:
      _check(isinstance(value, int) and value > 0,
             f"model.{key}={value!r} must be an int > 0 (or None for the default)")
  for key, value in c.items():
    if key.endswith("dropout_rate"):
      _check(0.0 <= value < 1.0, f"model.{key}={value} must be in [0, 1)")
  if "num_heads" in c and c.get("head_dim") is None:
    _check(c["d_model"] % c["num_heads"] == 0,
           f"model.num_heads={c['num_heads']} does not divide model.d_model={c['d_model']} "
           "(set model.head_dim, or pick a divisor)")
  if c.get("num_kv_heads") is not None:
    _check(c["num_heads"] % c["num_kv_heads"] == 0,
           f"model.num_kv_heads={c['num_kv_heads']} must divide model.num_heads="
           f"{c['num_heads']}")
  if c.get("positions") == "rope":
    _check((c.get("head_dim") or c["d_model"] // c["num_heads"]) % 2 == 0,
           "model.positions='rope' needs an even head dim")
  choices = {"positions": DECODER_POSITIONS, "norm": tuple(NORMS), "ffn": tuple(FFNS),
             "attention_impl": IMPLS, "remat_policy": tuple(REMAT_POLICIES),
             "cell": tuple(CELLS), "pool": ("cls", "gap")}
  for key, allowed in choices.items():
    if key in c:
      _check(c[key] in allowed, f"model.{key}={c[key]!r} is not one of {sorted(allowed)}")
  if c.get("activation") is not None:
    _check(c["activation"] in ACTIVATIONS,
           f"model.activation={c['activation']!r} is not one of {sorted(ACTIVATIONS)}")
  if c.get("window") is not None:
    w = c["window"]
    _check((isinstance(w, int) and w >= 0) or (isinstance(w, tuple) and len(w) == 2),
           f"model.window={w!r} must be an int >= 0 (keys to the left) or a (left, right) pair")
  if c.get("attention_block_sizes") is not None:
    # a tuple: JSON/YAML configs give lists, and module fields must hash
    sizes = c["attention_block_sizes"] = check_block_sizes(
        c["attention_block_sizes"], name="model.attention_block_sizes")
    if c.get("attention_impl") == "pallas":
      _check(all(b & (b - 1) == 0 for b in sizes),
             f"model.attention_block_sizes={sizes} must be powers of two for "
             "attention_impl='pallas' (e.g. (128, 64))")
  if c.get("num_experts"):
    _check(0 < c.get("experts_per_token", 2) <= c["num_experts"],
           f"model.experts_per_token={c.get('experts_per_token', 2)} must be in "
           f"[1, model.num_experts={c['num_experts']}]")
  if family == "vit":
    _check(c["image_size"] % c["patch_size"] == 0,
           f"model.patch_size={c['patch_size']} does not divide model.image_size="
           f"{c['image_size']}")


__all__ = ["build", "config_as_dict", "FAMILIES", "DecoderLM", "Bert", "EncoderDecoder", "ViT",
           "RnnSeq2Seq"]
