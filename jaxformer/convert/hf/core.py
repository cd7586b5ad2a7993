"""What every Hugging Face conversion shares: mapping rules, checks, and the load/save drivers.

Each model family names its converter module (`decoder.py`, `bert.py`, `vit.py`) in its
registry entry (`models.get(family).hf_converter`), found only through `converters()`. A converter module is
self-contained (importable by dotted name) and defines, under these names:

  ARCHITECTURES: dict[str, str]    HF architecture -> kind (selects config + tensor mapping)
  MODEL_TYPES: dict[str, str]      config.json model_type -> architecture, for a config.json
                                   without `architectures`
  PREFIXES: dict[str, str]         kind -> prefix of the base model's tensors inside the task
                                   model (`GPT2Model` inside `GPT2LMHeadModel` ...); checkpoints
                                   of the base model alone lack it and are normalised to it
  RENAMES: tuple[tuple[str, str], ...]   (regex, replacement) for legacy tensor names
  STACK: str | dict[str, str]      our params subtree holding the layers, or subtree -> the
                                   config key of its layer count (encoder-decoders)
  KEEP: tuple[str, ...]            tensors `unused` reads after a rule has converted them
  FIXED: dict[str, Any]            block settings (`model.*` keys) the HF architecture cannot
                                   vary, with the one value it has; `save` refuses others
  from_hf(arch, kind, hf_config, tensors) -> (config, flags)  config.json -> our fields
  to_hf(config) -> (arch, hf_config, flags)                   our config -> config.json
  rules(kind, config, flags) -> list[Rule]                    the tensor mapping
  unused(name, tensors, config) -> str | None   why a tensor no rule reads can be dropped
                                   ('' = silently), or None if it is unexpected
  MODEL_TOKEN_IDS: tuple[str, ...]  (optional) config.json token ids the model config fixes,
                                   which `save(..., token_ids=)` leaves alone (RoBERTa's
                                   pad_token_id is its position offset)

`flags` carry what the config does not say (which optional HF tensors exist) to `rules`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import warnings
from types import ModuleType
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from jaxformer import models, paths, workdir_layout
from jaxformer.models import counting
from jaxformer.convert.hf.io import (checkpoint_files, read_config, read_tensors,
                                     require_safetensors, write)
from jaxformer.models.stack import unstack_layers

# Task heads transformers keeps outside the base model's prefix.
_HEADS = ("lm_head.", "cls.", "classifier.")
# Buffers that are not parameters.
_IGNORED = (re.compile(r"\.attn\.(masked_)?bias$"), re.compile(r"rotary_emb\.inv_freq$"),
            re.compile(r"(^|\.)position_ids$"))


# ----------------------------------------------------------------------------------------
# Converters
# ----------------------------------------------------------------------------------------

def converters() -> dict[str, ModuleType]:
  """family -> converter module, from the model-family registry: the one place that finds
  them (all other lookups, by family or by HF architecture, go through here)."""
  return {family: importlib.import_module(models.get(family).hf_converter)
          for family in models.names() if models.get(family).hf_converter}


def architectures() -> dict[str, tuple[str, ModuleType]]:
  """HF architecture -> (family, converter module)."""
  return {arch: (family, conv) for family, conv in converters().items()
          for arch in conv.ARCHITECTURES}


def _architecture(hc: dict, path: str) -> str:
  supported = architectures()
  archs = hc.get("architectures") or []
  if not archs:
    model_types = {t: arch for conv in converters().values()
                   for t, arch in conv.MODEL_TYPES.items()}
    model_type = hc.get("model_type")
    if model_type not in model_types:
      raise ValueError(f"{path}/config.json: model_type={model_type!r} (and no "
                       f"'architectures') is not supported; supported: "
                       f"{sorted(supported)}")
    archs = [model_types[model_type]]
  if len(archs) != 1 or archs[0] not in supported:
    raise ValueError(f"{path}/config.json: architecture {archs!r} is not supported; "
                     f"supported: {sorted(supported)}")
  return archs[0]


# ----------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------

_ACT_FROM_HF = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
                "gelu": "gelu_exact", "relu": "relu", "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu"}


def act_from_hf(name, key: str) -> str:
  if name not in _ACT_FROM_HF:
    raise ValueError(f"config.json {key}={name!r} is not supported; supported: "
                     f"{sorted(_ACT_FROM_HF)}")
  return _ACT_FROM_HF[name]


def act_to_hf(name: str) -> str:
  if name not in _ACT_TO_HF:
    raise ValueError(f"model.activation={name!r} has no Hugging Face equivalent")
  return _ACT_TO_HF[name]


def unsupported(arch: str, key: str, value, why: str = ""):
  raise ValueError(f"{arch}: config.json {key}={value!r} is not supported{why}")


def require_values(arch: str, hc: dict, wants: tuple[tuple[str, Any], ...]):
  """config.json options our model has no equivalent for must keep their default."""
  for key, want in wants:
    if hc.get(key, want) != want:
      unsupported(arch, key, hc.get(key))


def width_and_heads(arch: str, hc: dict, width: str, heads: str) -> tuple[int, int]:
  """(d_model, num_heads) from config.json (transformers' defaults 768, 12), heads dividing."""
  e, h = hc.get(width, 768), hc.get(heads, 12)
  if e % h:
    raise ValueError(f"{arch}: {heads}={h} does not divide {width}={e}")
  return e, h


# ----------------------------------------------------------------------------------------
# Tensor mapping rules (one table per architecture, used in both directions)
# ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Rule:
  ours: str                                   # "/"-joined path in our params
  shape: tuple[int, ...]                      # our shape
  hf: tuple[str, ...]                         # Hugging Face tensor names (prefixed form)
  to_ours: Callable[..., np.ndarray]          # (shape, *hf tensors) -> ours
  to_hf: Callable[[Any], tuple]               # ours -> hf tensors (numpy or jax arrays)
  hf_has: bool = True                         # the HF model has these tensors
  fill: Callable[[tuple], np.ndarray] | None = None   # ours when the checkpoint lacks it


# Conversions shared by several families. `s` is our shape.
SAME = dict(to_ours=lambda s, w: w.reshape(s), to_hf=lambda k: (k,))
LINEAR = dict(to_ours=lambda s, w: w.T, to_hf=lambda k: (k.T,))          # torch [out, in]
# torch Linear [H*D, E] -> [E, H, D]
HEADS_IN = dict(to_ours=lambda s, w: w.T.reshape(s),
                to_hf=lambda k: (k.reshape(k.shape[0], -1).T,))
HEADS_BIAS = dict(to_ours=lambda s, b: b.reshape(s), to_hf=lambda k: (k.reshape(-1),))
# n torch Linears [Hn*D, E] -> [E, n, Hn, D] (fused qkv, or kv)
FUSED_IN = dict(
    to_ours=lambda s, *ws: np.stack([w.T.reshape((s[0],) + tuple(s[2:])) for w in ws], 1),
    to_hf=lambda k: tuple(k[:, i].reshape(k.shape[0], -1).T for i in range(k.shape[1])))
FUSED_BIAS = dict(to_ours=lambda s, *bs: np.stack([b.reshape(s[1:]) for b in bs], 0),
                  to_hf=lambda k: tuple(k[i].reshape(-1) for i in range(k.shape[0])))
# torch Linear [E, H*D] -> [H, D, E]
HEADS_OUT = dict(to_ours=lambda s, w: w.T.reshape(s),
                 to_hf=lambda k: (k.reshape(-1, k.shape[-1]).T,))


def norm_rules(ours: str, hf: str, e: int, *, hf_bias: bool = True, scale: str = "weight",
               bias: str = "bias", **kw) -> list[Rule]:
  rules = [Rule(f"{ours}/scale", (e,), (f"{hf}.{scale}",), **SAME, **kw)]
  if hf_bias:
    rules.append(Rule(f"{ours}/bias", (e,), (f"{hf}.{bias}",), **SAME, **kw))
  return rules


def linear_rules(ours: str, hf: str, n_in: int, n_out: int, *, bias: bool = True,
                 **kw) -> list[Rule]:
  rules = [Rule(f"{ours}/kernel", (n_in, n_out), (f"{hf}.weight",), **LINEAR, **kw)]
  rules.append(Rule(f"{ours}/bias", (n_out,), (f"{hf}.bias",), **SAME,
                    hf_has=bias and kw.get("hf_has", True)))   # absent biases are zeros
  return rules


def attention_rules(p: str, names: tuple[str, str, str, str], *, e: int, h: int, hkv: int,
                    d: int, qkv_bias: bool, out_bias: bool) -> list[Rule]:
  """torch-Linear q, k, v, o (`names` without .weight/.bias) -> our MultiHeadAttention."""
  q, k, v, o = names
  w = lambda n: f"{n}.weight"
  b = lambda n: f"{n}.bias"
  if h == hkv:
    rules = [Rule(f"{p}/qkv/kernel", (e, 3, h, d), (w(q), w(k), w(v)), **FUSED_IN),
             Rule(f"{p}/qkv/bias", (3, h, d), (b(q), b(k), b(v)), **FUSED_BIAS,
                  hf_has=qkv_bias)]
  else:
    rules = [Rule(f"{p}/query/kernel", (e, h, d), (w(q),), **HEADS_IN),
             Rule(f"{p}/query/bias", (h, d), (b(q),), **HEADS_BIAS, hf_has=qkv_bias),
             Rule(f"{p}/kv/kernel", (e, 2, hkv, d), (w(k), w(v)), **FUSED_IN),
             Rule(f"{p}/kv/bias", (2, hkv, d), (b(k), b(v)), **FUSED_BIAS, hf_has=qkv_bias)]
  return rules + [Rule(f"{p}/out/kernel", (h, d, e), (w(o),), **HEADS_OUT),
                  Rule(f"{p}/out/bias", (e,), (b(o),), **SAME, hf_has=out_bias)]


def encoder_layer_rules(p: str, t: str, attention: str, *, e: int, h: int, f: int,
                        qkv_bias: bool) -> tuple[list[Rule], list[Rule], list[Rule]]:
  """(attention, wi, wo) of a BERT/ViT encoder layer, whose norms sit at different places:
  `{t}.{attention}.{query,key,value}` + `{t}.attention.output.dense`, `{t}.intermediate.dense`,
  `{t}.output.dense`."""
  return (attention_rules(f"{p}/self_attention",
                          tuple(f"{t}.{attention}.{n}" for n in ("query", "key", "value"))
                          + (f"{t}.attention.output.dense",), e=e, h=h, hkv=h, d=e // h,
                          qkv_bias=qkv_bias, out_bias=True),
          linear_rules(f"{p}/ffn/wi", f"{t}.intermediate.dense", e, f),
          linear_rules(f"{p}/ffn/wo", f"{t}.output.dense", f, e))


# ----------------------------------------------------------------------------------------
# Our side
# ----------------------------------------------------------------------------------------

def _expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
  """path -> shape of the params `models.build(cfg).init` creates (unscanned; no compute)."""
  flat = traverse_util.flatten_dict(counting.param_shapes(dict(cfg, scan_layers=False)), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()}


def _config_dict(model_config) -> dict:
  """The config as a dict with every config key (the family's defaults filled in), checked
  against the settings the HF architecture cannot vary (the converter's FIXED)."""
  cfg = models.config_as_dict(model_config)
  families = converters()
  if cfg.get("family") not in families:
    raise ValueError(f"model.family={cfg.get('family')!r}: Hugging Face conversion supports "
                     f"{sorted(families)}")
  cfg = models.with_defaults(cfg)
  for key, want in families[cfg["family"]].FIXED.items():
    if cfg[key] != want:
      raise ValueError(f"model.{key}={cfg[key]!r}: the Hugging Face {cfg['family']} "
                       f"architecture has {key}={want!r} only, so this model cannot be saved "
                       "in its format")
  if cfg.get("head_gates"):
    raise ValueError("model.head_gates=True: Hugging Face architectures have no per-head logit "
                     "gates; fold them into the query projection first (the same function): "
                     "model_config, params = jaxformer.models.heads.fold_gates(model_config, "
                     "params)")
  if cfg.get("attention_variant", "softmax") != "softmax":
    raise ValueError(f"model.attention_variant={cfg['attention_variant']!r}: Hugging Face "
                     "architectures compute softmax attention over the sequence only, so this "
                     "model cannot be saved in their format")
  if cfg.get("parametrization") == "mup" and cfg["d_model"] != cfg["mup_base_width"]:
    raise ValueError(f"model.parametrization='mup' at d_model={cfg['d_model']} (base "
                     f"{cfg['mup_base_width']}) multiplies its logits and attention scores in "
                     "ways Hugging Face architectures do not, so the saved model would compute "
                     "something else; convert standard models (or μP at its base width)")
  return cfg


def _check_rules(rules: list[Rule], expected: dict, where: str):
  """Internal consistency: the rules cover exactly our params, with the same shapes."""
  covered = {r.ours: r for r in rules}
  for path, shape in expected.items():
    if path not in covered:
      raise ValueError(f"internal error ({where}): no Hugging Face mapping for param {path}")
    if tuple(covered[path].shape) != shape:
      raise ValueError(f"internal error ({where}): param {path} is {shape} in the model but "
                       f"{covered[path].shape} in the mapping")


# ----------------------------------------------------------------------------------------
# Load and save
# ----------------------------------------------------------------------------------------

def load(path: str | os.PathLike):
  """Read a local transformers checkpoint directory.

  Returns (model_config, params): an `ml_collections.ConfigDict` for `models.build` (family
  plus the model's fields) and a nested dict of NumPy float32 arrays in the unscanned layout,
  usable as `module.apply({'params': params}, ...)`. Raises ValueError for an unsupported
  architecture or option (naming it), a missing tensor, a tensor of the wrong shape, or an
  unexpected tensor.
  """
  path = os.fspath(path)
  hc = read_config(path)
  arch = _architecture(hc, path)
  family, conv = architectures()[arch]
  kind = conv.ARCHITECTURES[arch]
  tensors = _normalise_names(read_tensors(path), conv, kind)
  cfg, flags = conv.from_hf(arch, kind, hc, tensors)
  cfg = dict(family=family, **cfg)
  expected = _expected_shapes(cfg)
  rules = conv.rules(kind, cfg, flags)
  _check_rules(rules, expected, arch)

  flat, used = {}, set()
  for rule in rules:
    ours_has = rule.ours in expected
    if not rule.hf_has:
      if ours_has:
        flat[rule.ours] = (rule.fill or (lambda s: np.zeros(s, np.float32)))(rule.shape)
        if rule.fill is not None:
          warnings.warn(f"{arch} checkpoint {path} has no {rule.hf[0]}; param {rule.ours} "
                        "is freshly initialised")
      continue
    missing = [n for n in rule.hf if n not in tensors]
    if missing:
      raise ValueError(f"{arch} checkpoint {path} is missing tensor {missing[0]!r}"
                       + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                       + hc.defaults_note())
    arrays = [tensors[n] for n in rule.hf]
    used.update(rule.hf)
    want = jax.eval_shape(rule.to_hf, jax.ShapeDtypeStruct(rule.shape, jnp.float32))
    for name, a, w in zip(rule.hf, arrays, want):
      if tuple(a.shape) != tuple(w.shape):
        raise ValueError(f"{arch} checkpoint {path}: tensor {name!r} has shape "
                         f"{tuple(a.shape)}, expected {tuple(w.shape)} from config.json"
                         + hc.defaults_note())
    if ours_has:
      flat[rule.ours] = np.ascontiguousarray(rule.to_ours(rule.shape, *arrays), np.float32)
    elif any(np.any(a != 0) for a in arrays):
      raise ValueError(f"{arch} checkpoint {path}: tensor {rule.hf[0]!r} is not zero but "
                       f"jaxformer's {family} model has no such parameter (not supported)")
    del arrays
    for name in rule.hf:                # free memory; `unused` only needs conv.KEEP
      if name not in conv.KEEP:
        tensors[name] = None

  unexpected = []
  for name in sorted(set(tensors) - used):
    if any(p.search(name) for p in _IGNORED):
      continue
    dropped = conv.unused(name, tensors, cfg)
    if dropped is None:
      unexpected.append(name)
    elif dropped:
      warnings.warn(f"{arch} checkpoint {path}: dropping {name} ({dropped})")
  if unexpected:
    raise ValueError(f"{arch} checkpoint {path} has tensors jaxformer does not use: "
                     f"{unexpected[:8]}" + (" ..." if len(unexpected) > 8 else "")
                     + hc.defaults_note())
  params = traverse_util.unflatten_dict(flat, sep="/")
  return ml_collections.ConfigDict(cfg), params


def _normalise_names(tensors: dict, conv: ModuleType, kind: str) -> dict:
  """Checkpoint names -> the prefixed, current form the rules use."""
  prefix = conv.PREFIXES[kind]
  out = {}
  for name, value in tensors.items():
    if not name.startswith(prefix) and not name.startswith(_HEADS):
      name = prefix + name
    for pattern, replacement in conv.RENAMES:
      name = re.sub(pattern, replacement, name)
    out[name] = value
  return out


# What marks a jaxformer training workdir: its config.json is the run's, which an HF
# config.json must never replace.
_RUN_MARKERS = (workdir_layout.CHECKPOINTS, workdir_layout.BEST, workdir_layout.METRICS)


def _training_run_files(out_dir: str) -> list[str]:
  """What in out_dir shows a training run lives there (empty if none)."""
  directory = paths.path(out_dir, "out_dir")
  found = [n + "/" * (directory / n).is_dir() for n in _RUN_MARKERS if (directory / n).exists()]
  try:
    config = json.loads((directory / workdir_layout.CONFIG).read_bytes())
  except (OSError, ValueError):         # absent or not JSON: not a training config
    config = None
  if isinstance(config, dict) and {"model", "train"} <= set(config):
    found.append("a training config.json")
  return found


def check_out_dir(out_dir: str | os.PathLike, *, overwrite: bool = False, name: str = "",
                  overwrite_flag: str = "overwrite=True", files: tuple[str, ...] = ()):
  """out_dir may be new, empty, or hold files other than a checkpoint's; an earlier
  Hugging Face save there (or one of `files`) is replaced only with overwrite; a training run
  never. What `save` checks before writing, for callers that check before their own work:
  `name` is how the errors name the directory (default 'hf.save: <out_dir>') and
  `overwrite_flag` the option that allows replacing."""
  out_dir = os.fspath(out_dir)
  name = name or f"hf.save: {out_dir}"
  if paths.path(out_dir, "out_dir").is_file():
    raise ValueError(f"{name} is a file, not a directory; give a directory path")
  run = _training_run_files(out_dir)
  if run:
    raise ValueError(f"{name} holds a training run ({', '.join(run)}); writing a "
                     "Hugging Face checkpoint there would replace the run's config.json: save "
                     f"to another directory, e.g. {os.path.join(out_dir, 'hf')}")
  directory = paths.path(out_dir, "out_dir")
  existing = checkpoint_files(out_dir) + [n for n in files if (directory / n).exists()]
  if existing and not overwrite:
    raise ValueError(f"{name} already holds {', '.join(existing[:4])}"
                     + (f" (and {len(existing) - 4} more)" if len(existing) > 4 else "")
                     + f"; pass {overwrite_flag} to replace that checkpoint, or save to another "
                     "directory")


# config.json's token ids that `save(..., token_ids=)` sets (None: the model has no such token).
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
                 "forced_eos_token_id")


def architecture(model_config) -> str:
  """The Hugging Face architecture `save` writes `model_config` as (a ValueError naming the
  setting when it has none), without touching any params."""
  cfg = _config_dict(model_config)
  return converters()[cfg["family"]].to_hf(cfg)[0]


def _set_token_ids(hc: dict, token_ids, conv: ModuleType, cfg: dict) -> None:
  """config.json's token ids from `token_ids`, except those the architecture derives from the
  model config (the converter's MODEL_TOKEN_IDS: RoBERTa's pad_token_id is its position
  offset, model.pad_id)."""
  vocab_size = cfg.get("vocab_size")
  if vocab_size is None:
    raise ValueError(f"hf.save: token_ids given, but a model.family={cfg['family']!r} model "
                     "has no token vocabulary")
  for key, value in token_ids.items():
    if key not in TOKEN_ID_KEYS:
      raise ValueError(f"hf.save: token_ids key {key!r} is not one of {TOKEN_ID_KEYS}")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value < vocab_size):
      raise ValueError(f"hf.save: token_ids[{key!r}]={value!r} must be None or a token id in "
                       f"[0, {vocab_size})")
    if key not in getattr(conv, "MODEL_TOKEN_IDS", ()):
      hc[key] = value


def save(model_config, params, out_dir: str | os.PathLike, *, overwrite: bool = False,
         token_ids: Mapping[str, int | None] | None = None) -> str:
  """Write `config.json` + `model.safetensors` loadable by transformers' `from_pretrained`.

  A decoder becomes GPT2LMHeadModel (positions='learned', norm='layernorm'), else
  LlamaForCausalLM, MistralForCausalLM (window set) or MixtralForCausalLM (num_experts > 0);
  bert -> BertForMaskedLM (the pooler is written too), BertForPreTraining with nsp=True;
  roberta -> RobertaForMaskedLM; vit -> ViTForImageClassification;
  bart -> BartForConditionalGeneration.
  `params` may be scanned (a `layers` subtree), boxed, or wrapped as {'params': ...}.

  out_dir must not hold a training run (its config.json would be lost). A checkpoint already
  there (config.json, weights, shards) is refused unless `overwrite=True`, which replaces it
  and removes the old one's other weight files (shards, indexes, .bin), which would otherwise
  sit beside the new model.safetensors; other files are left alone. Returns out_dir.

  token_ids: config.json's `bos_token_id`, `eos_token_id`, `pad_token_id`,
  `decoder_start_token_id`, `forced_eos_token_id` (`TOKEN_ID_KEYS`), each an id in the
  vocabulary or None (no such token), which replace the architecture's defaults (e.g.
  GPT-2's 50256); `jaxformer.export` gives them from the run's tokenizer.
  """
  require_safetensors()                 # before any work: the missing extra is the first fix
  out_dir = os.fspath(out_dir)
  check_out_dir(out_dir, overwrite=overwrite)
  cfg = _config_dict(model_config)
  conv = converters()[cfg["family"]]
  arch, hc, flags = conv.to_hf(cfg)
  if token_ids:
    _set_token_ids(hc, token_ids, conv, cfg)
  kind = conv.ARCHITECTURES[arch]
  expected = _expected_shapes(cfg)
  rules = conv.rules(kind, cfg, flags)
  _check_rules(rules, expected, arch)

  params = nn.unbox(params)
  if isinstance(params, Mapping) and set(params) == {"params"}:
    params = params["params"]
  params = {k: v for k, v in params.items()}
  # STACK: one subtree (num_layers layers), or {subtree: its layer-count key} (two stacks)
  stacks = conv.STACK if isinstance(conv.STACK, Mapping) else {conv.STACK: "num_layers"}
  for stack, count in stacks.items():
    if isinstance(params.get(stack), Mapping) and "layers" in params[stack]:
      params[stack] = unstack_layers(dict(params[stack]), cfg[count])
  flat = {k: np.asarray(jax.device_get(v), np.float32)
          for k, v in traverse_util.flatten_dict(params, sep="/").items()}
  for path, shape in expected.items():
    if path not in flat:
      raise ValueError(f"params lack {path} (shape {shape}) that the model config needs")
    if flat[path].shape != shape:
      raise ValueError(f"param {path} has shape {flat[path].shape}; the model config gives "
                       f"{shape}")
  extra = sorted(set(flat) - set(expected))
  if extra:
    raise ValueError(f"params have entries the model config does not create: {extra[:8]}")

  out = {}
  for rule in rules:
    ours_has = rule.ours in expected
    value = flat[rule.ours] if ours_has else np.zeros(rule.shape, np.float32)
    if rule.hf_has:
      for name, tensor in zip(rule.hf, rule.to_hf(value)):
        out[name] = np.ascontiguousarray(tensor, np.float32)
    elif ours_has and np.any(value != 0):
      raise ValueError(f"{arch} has no tensor for param {rule.ours} and it is not zero, so "
                       f"this model cannot be saved as {arch}")
  return write(out_dir, hc, out)
