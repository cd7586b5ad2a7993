"""Hugging Face transformers checkpoints <-> jaxformer params.

```python
from jaxformer import models
from jaxformer.convert import hf

model_config, params = hf.load("path/to/checkpoint_dir")   # config.json + weights
logits = models.build(model_config).apply({"params": params}, tokens)
hf.save(model_config, params, "out_dir")   # transformers' from_pretrained(out_dir) loads it
```

Supported architectures (the `architectures` entry of config.json, or its `model_type`):

| Hugging Face | jaxformer |
|---|---|
| GPT2LMHeadModel | `family='decoder'`, positions='learned', norm='layernorm', ffn='mlp' |
| LlamaForCausalLM | `family='decoder'`, positions='rope', norm='rmsnorm', ffn='swiglu' |
| MistralForCausalLM | as Llama, plus `window = sliding_window - 1` |
| MixtralForCausalLM | as Mistral, plus `num_experts`, `experts_per_token` |
| BertForMaskedLM, BertForPreTraining, BertModel | `family='bert'` |
| ViTForImageClassification, ViTModel | `family='vit'` (pool='cls') |

Weights are read from `model.safetensors`, sharded `*.safetensors` with
`model.safetensors.index.json` (safetensors + NumPy only; bfloat16/float8 tensors are decoded
with ml_dtypes), or `pytorch_model.bin` (+ index), which needs PyTorch. Everything is returned
as NumPy float32 in the unscanned layout (`layers_0 ... layers_{L-1}`; use
`jaxformer.models.stack.stack_layers` for `scan_layers=True`).

Layouts (HF -> ours): torch Linear weights are [out, in] and are transposed to our [in, out]
kernels; GPT-2's Conv1D weights are already [in, out]. Attention projections are split into
heads: fused `qkv` [E, 3, H, D] when num_kv_heads == num_heads, else `query` [E, H, D] +
`kv` [E, 2, Hkv, D]; the output projection is [H, D, E]. Mixtral experts w1 (gate), w3 (up),
w2 (down) are stacked into `wi_gate`/`wi_up` [X, E, F] and `wo` [X, F, E]; the router
`gate` becomes `router/kernel` [E, X]. ViT's patch conv [E, C, ph, pw] becomes [ph, pw, C, E].
RoPE: Hugging Face Llama-family checkpoints already store q/k for the rotate-half convention
that `jaxformer.ops.positions.apply_rope` uses, so no permutation of q/k rows is applied.

Every tensor a model needs must be in the checkpoint (else ValueError naming it) and every
tensor in the checkpoint must be used, except known buffers (attn.bias / masked_bias,
rotary inv_freq, position_ids) and a few heads jaxformer has no place for, which are dropped
with a warning (BERT's next-sentence head, ViTModel's pooler). Parameters ours has and the
checkpoint legitimately lacks are filled: absent biases with zeros (e.g. Llama with
mlp_bias=True but attention_bias=False), BERT's pooler / MLM head (BertModel /
BertForMaskedLM checkpoints) and ViTModel's classifier with a fresh init (with a warning).
When saving, a parameter the target architecture has no tensor for must be all zeros.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from jaxformer import models
from jaxformer.models.stack import unstack_layers
from jaxformer.optional import require

__all__ = ["load", "save", "ARCHITECTURES"]

# architecture -> (jaxformer family, kind); kind selects the config + tensor mapping.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "GPT2LMHeadModel": ("decoder", "gpt2"),
    "LlamaForCausalLM": ("decoder", "llama"),
    "MistralForCausalLM": ("decoder", "mistral"),
    "MixtralForCausalLM": ("decoder", "mixtral"),
    "BertForMaskedLM": ("bert", "bert"),
    "BertForPreTraining": ("bert", "bert"),
    "BertModel": ("bert", "bert"),
    "ViTForImageClassification": ("vit", "vit"),
    "ViTModel": ("vit", "vit"),
}
_MODEL_TYPES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
                "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
                "bert": "BertForMaskedLM", "vit": "ViTForImageClassification"}
# Prefix of the base model's tensors inside the task model (`GPT2Model` inside
# `GPT2LMHeadModel` ...). Checkpoints of the base model alone have no prefix; keys are
# normalised to the prefixed form.
_PREFIX = {"gpt2": "transformer.", "llama": "model.", "mistral": "model.", "mixtral": "model.",
           "bert": "bert.", "vit": "vit."}
_HEADS = ("lm_head.", "cls.", "classifier.")
# Buffers that are not parameters.
_IGNORED = (re.compile(r"\.attn\.(masked_)?bias$"), re.compile(r"rotary_emb\.inv_freq$"),
            re.compile(r"(^|\.)position_ids$"))

_ACT_FROM_HF = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
                "gelu": "gelu_exact", "relu": "relu", "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu"}

_SAFE, _SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
_BIN, _BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


# ----------------------------------------------------------------------------------------
# Reading and writing tensors
# ----------------------------------------------------------------------------------------

def _to_float32(x: np.ndarray) -> np.ndarray:
  """Floating tensors (ml_dtypes' bfloat16/float8 have kind 'V') -> float32; others as is."""
  return x.astype(np.float32) if x.dtype.kind in "fV" else x


def _ml_dtypes() -> dict:
  """safetensors dtype names NumPy lacks -> ml_dtypes types (one byte per element or more;
  the sub-byte packed types F4/F6 are not listed and are refused by name)."""
  import ml_dtypes
  return {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
          "F8_E5M2": ml_dtypes.float8_e5m2, "F8_E8M0": ml_dtypes.float8_e8m0fnu}


def _read_safetensors_raw(file: str, names) -> dict[str, np.ndarray]:
  """Tensors whose dtype NumPy lacks (bfloat16, float8), decoded with ml_dtypes."""
  dtypes = _ml_dtypes()
  out = {}
  with open(file, "rb") as fh:
    n = int.from_bytes(fh.read(8), "little")
    header = json.loads(fh.read(n))
    for name in names:
      info = header[name]
      if info["dtype"] not in dtypes:
        raise ValueError(f"{file}: tensor {name!r} has dtype {info['dtype']}, which jaxformer "
                         f"cannot read (readable: NumPy's and {sorted(dtypes)}); convert the "
                         "checkpoint to bfloat16 or float32 first")
      start, end = info["data_offsets"]
      fh.seek(8 + n + start)
      out[name] = np.frombuffer(fh.read(end - start), dtypes[info["dtype"]]).reshape(
          info["shape"])
  return out


def _safetensors():
  require("safetensors.numpy", extra="hf", needed_for="Hugging Face conversion")
  import safetensors
  return safetensors


def _read_safetensors(file: str) -> dict[str, np.ndarray]:
  safe_open = _safetensors().safe_open
  out, raw = {}, []
  try:
    with safe_open(file, framework="np") as f:
      for name in f.keys():
        try:
          out[name] = f.get_tensor(name)
        except (TypeError, AttributeError):     # "data type 'bfloat16' not understood", or
          raw.append(name)                      # "numpy has no attribute 'float8_e4m3fn'"
  except Exception as e:  # noqa: BLE001  (safetensors' own error type is not importable)
    if type(e).__name__ != "SafetensorError":
      raise
    raise ValueError(f"{file} is not a readable safetensors file ({e}); it may be truncated: "
                     "download or save it again") from e
  out.update(_read_safetensors_raw(file, raw))
  return {k: _to_float32(v) for k, v in out.items()}


def _read_torch(file: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError as e:
    raise ImportError(f"reading {file} needs PyTorch (`pip install torch`); or convert the "
                      "checkpoint to safetensors, which needs only `safetensors`") from e
  state = torch.load(file, map_location="cpu", weights_only=True)
  out = {}
  for name, t in state.items():
    t = t.detach()
    out[name] = (t.to(torch.float32) if t.is_floating_point() else t).numpy()
  return out


def _read_tensors(path: str) -> dict[str, np.ndarray]:
  def shards(index_name):
    with open(os.path.join(path, index_name)) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    for file in files:
      if not os.path.exists(os.path.join(path, file)):
        raise ValueError(f"{path}: shard {file} named in {index_name} does not exist")
    return [os.path.join(path, file) for file in files]

  if os.path.exists(os.path.join(path, _SAFE)):
    files, reader = [os.path.join(path, _SAFE)], _read_safetensors
  elif os.path.exists(os.path.join(path, _SAFE_INDEX)):
    files, reader = shards(_SAFE_INDEX), _read_safetensors
  elif os.path.exists(os.path.join(path, _BIN)):
    files, reader = [os.path.join(path, _BIN)], _read_torch
  elif os.path.exists(os.path.join(path, _BIN_INDEX)):
    files, reader = shards(_BIN_INDEX), _read_torch
  else:
    raise ValueError(f"{path} holds none of {_SAFE}, {_SAFE_INDEX}, {_BIN}, {_BIN_INDEX}")
  tensors = {}
  for file in files:
    tensors.update(reader(file))
  return tensors


# ----------------------------------------------------------------------------------------
# Tensor mapping rules (one table per architecture, used in both directions)
# ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Rule:
  ours: str                                   # "/"-joined path in our params
  shape: tuple[int, ...]                      # our shape
  hf: tuple[str, ...]                         # Hugging Face tensor names (prefixed form)
  to_ours: Callable[..., np.ndarray]          # (shape, *hf tensors) -> ours
  to_hf: Callable[[Any], tuple]               # ours -> hf tensors (numpy or jax arrays)
  hf_has: bool = True                         # the HF model has these tensors
  fill: Callable[[tuple], np.ndarray] | None = None   # ours when the checkpoint lacks it


# Conversions. `s` is our shape.
_SAME = dict(to_ours=lambda s, w: w.reshape(s), to_hf=lambda k: (k,))
_LINEAR = dict(to_ours=lambda s, w: w.T, to_hf=lambda k: (k.T,))         # torch [out, in]
# torch Linear [H*D, E] -> [E, H, D]
_HEADS_IN = dict(to_ours=lambda s, w: w.T.reshape(s),
                 to_hf=lambda k: (k.reshape(k.shape[0], -1).T,))
_HEADS_BIAS = dict(to_ours=lambda s, b: b.reshape(s), to_hf=lambda k: (k.reshape(-1),))
# n torch Linears [Hn*D, E] -> [E, n, Hn, D] (fused qkv, or kv)
_FUSED_IN = dict(
    to_ours=lambda s, *ws: np.stack([w.T.reshape((s[0],) + tuple(s[2:])) for w in ws], 1),
    to_hf=lambda k: tuple(k[:, i].reshape(k.shape[0], -1).T for i in range(k.shape[1])))
_FUSED_BIAS = dict(to_ours=lambda s, *bs: np.stack([b.reshape(s[1:]) for b in bs], 0),
                   to_hf=lambda k: tuple(k[i].reshape(-1) for i in range(k.shape[0])))
# torch Linear [E, H*D] -> [H, D, E]
_HEADS_OUT = dict(to_ours=lambda s, w: w.T.reshape(s),
                  to_hf=lambda k: (k.reshape(-1, k.shape[-1]).T,))
# GPT-2 Conv1D [E, 3*H*D] -> [E, 3, H, D]; bias [3*H*D] -> [3, H, D]; c_proj [H*D, E] -> [H, D, E]
_CONV_QKV = dict(to_ours=lambda s, w: w.reshape(s), to_hf=lambda k: (k.reshape(k.shape[0], -1),))
_CONV_OUT = dict(to_ours=lambda s, w: w.reshape(s), to_hf=lambda k: (k.reshape(-1, k.shape[-1]),))
# X torch Linears [out, in] -> [X, in, out]
_EXPERTS = dict(to_ours=lambda s, *ws: np.stack([w.T for w in ws]),
                to_hf=lambda k: tuple(k[i].T for i in range(k.shape[0])))
# torch conv [E, C, ph, pw] -> flax [ph, pw, C, E]
_CONV2D = dict(to_ours=lambda s, w: w.transpose(2, 3, 1, 0),
               to_hf=lambda k: (k.transpose(3, 2, 0, 1),))
_ADD_BATCH = dict(to_ours=lambda s, w: w.reshape(s), to_hf=lambda k: (k[None],))


def _normal_fill(std: float, seed: int):
  def fill(shape):
    return np.random.default_rng(seed).normal(0.0, std, shape).astype(np.float32)
  return fill


def _ones(shape):
  return np.ones(shape, np.float32)


def _norm_rules(ours: str, hf: str, e: int, *, hf_bias: bool = True, scale: str = "weight",
                bias: str = "bias", **kw) -> list[_Rule]:
  rules = [_Rule(f"{ours}/scale", (e,), (f"{hf}.{scale}",), **_SAME, **kw)]
  if hf_bias:
    rules.append(_Rule(f"{ours}/bias", (e,), (f"{hf}.{bias}",), **_SAME, **kw))
  return rules


def _linear_rules(ours: str, hf: str, n_in: int, n_out: int, *, bias: bool = True,
                  **kw) -> list[_Rule]:
  rules = [_Rule(f"{ours}/kernel", (n_in, n_out), (f"{hf}.weight",), **_LINEAR, **kw)]
  rules.append(_Rule(f"{ours}/bias", (n_out,), (f"{hf}.bias",), **_SAME,
                     hf_has=bias and kw.get("hf_has", True)))   # absent biases are zeros
  return rules


def _attention_rules(p: str, names: tuple[str, str, str, str], *, e: int, h: int, hkv: int,
                     d: int, qkv_bias: bool, out_bias: bool) -> list[_Rule]:
  """torch-Linear q, k, v, o (`names` without .weight/.bias) -> our MultiHeadAttention."""
  q, k, v, o = names
  w = lambda n: f"{n}.weight"
  b = lambda n: f"{n}.bias"
  if h == hkv:
    rules = [_Rule(f"{p}/qkv/kernel", (e, 3, h, d), (w(q), w(k), w(v)), **_FUSED_IN),
             _Rule(f"{p}/qkv/bias", (3, h, d), (b(q), b(k), b(v)), **_FUSED_BIAS,
                   hf_has=qkv_bias)]
  else:
    rules = [_Rule(f"{p}/query/kernel", (e, h, d), (w(q),), **_HEADS_IN),
             _Rule(f"{p}/query/bias", (h, d), (b(q),), **_HEADS_BIAS, hf_has=qkv_bias),
             _Rule(f"{p}/kv/kernel", (e, 2, hkv, d), (w(k), w(v)), **_FUSED_IN),
             _Rule(f"{p}/kv/bias", (2, hkv, d), (b(k), b(v)), **_FUSED_BIAS, hf_has=qkv_bias)]
  return rules + [_Rule(f"{p}/out/kernel", (h, d, e), (w(o),), **_HEADS_OUT),
                  _Rule(f"{p}/out/bias", (e,), (b(o),), **_SAME, hf_has=out_bias)]


def _gpt2_rules(c: dict, flags: dict) -> list[_Rule]:
  e, h, f, v = c["d_model"], c["num_heads"], c["mlp_dim"], c["vocab_size"]
  d = e // h
  rules = [_Rule("embed/embedding", (v, e), ("transformer.wte.weight",), **_SAME),
           _Rule("pos_embed/embedding", (c["max_len"], e), ("transformer.wpe.weight",), **_SAME)]
  for i in range(c["num_layers"]):
    p, t = f"decoder/layers_{i}/block", f"transformer.h.{i}"
    rules += _norm_rules(f"{p}/self_attention_norm", f"{t}.ln_1", e)
    rules += [
        _Rule(f"{p}/self_attention/qkv/kernel", (e, 3, h, d), (f"{t}.attn.c_attn.weight",),
              **_CONV_QKV),
        _Rule(f"{p}/self_attention/qkv/bias", (3, h, d), (f"{t}.attn.c_attn.bias",),
              **_HEADS_BIAS),
        _Rule(f"{p}/self_attention/out/kernel", (h, d, e), (f"{t}.attn.c_proj.weight",),
              **_CONV_OUT),
        _Rule(f"{p}/self_attention/out/bias", (e,), (f"{t}.attn.c_proj.bias",), **_SAME)]
    rules += _norm_rules(f"{p}/ffn_norm", f"{t}.ln_2", e)
    for ours, theirs, shape in (("wi", "c_fc", (e, f)), ("wo", "c_proj", (f, e))):
      rules += [_Rule(f"{p}/ffn/{ours}/kernel", shape, (f"{t}.mlp.{theirs}.weight",), **_SAME),
                _Rule(f"{p}/ffn/{ours}/bias", shape[1:], (f"{t}.mlp.{theirs}.bias",), **_SAME)]
  rules += _norm_rules("final_norm", "transformer.ln_f", e)
  rules.append(_Rule("lm_head/kernel", (e, v), ("lm_head.weight",), **_LINEAR,
                     hf_has=not c["tie_embeddings"]))
  return rules


def _llama_rules(c: dict, flags: dict) -> list[_Rule]:
  e, h, f, v = c["d_model"], c["num_heads"], c["mlp_dim"], c["vocab_size"]
  hkv, d, x = c["num_kv_heads"] or h, c["head_dim"] or e // h, c["num_experts"]
  rules = [_Rule("embed/embedding", (v, e), ("model.embed_tokens.weight",), **_SAME)]
  for i in range(c["num_layers"]):
    p, t = f"decoder/layers_{i}/block", f"model.layers.{i}"
    rules += _norm_rules(f"{p}/self_attention_norm", f"{t}.input_layernorm", e, hf_bias=False)
    rules += _attention_rules(f"{p}/self_attention",
                              tuple(f"{t}.self_attn.{n}_proj" for n in "qkvo"), e=e, h=h,
                              hkv=hkv, d=d, qkv_bias=flags["attention_bias"],
                              out_bias=flags["attention_bias"])
    rules += _norm_rules(f"{p}/ffn_norm", f"{t}.post_attention_layernorm", e, hf_bias=False)
    if x:
      m = f"{t}.block_sparse_moe"
      rules.append(_Rule(f"{p}/ffn/router/kernel", (e, x), (f"{m}.gate.weight",), **_LINEAR))
      for ours, theirs, shape in (("wi_gate", "w1", (x, e, f)), ("wi_up", "w3", (x, e, f)),
                                  ("wo", "w2", (x, f, e))):
        rules.append(_Rule(f"{p}/ffn/{ours}", shape,
                           tuple(f"{m}.experts.{j}.{theirs}.weight" for j in range(x)),
                           **_EXPERTS))
    else:
      for ours, theirs, (n_in, n_out) in (("wi_gate", "gate_proj", (e, f)),
                                          ("wi_up", "up_proj", (e, f)),
                                          ("wo", "down_proj", (f, e))):
        rules += _linear_rules(f"{p}/ffn/{ours}", f"{t}.mlp.{theirs}", n_in, n_out,
                               bias=flags["mlp_bias"])
  rules += _norm_rules("final_norm", "model.norm", e, hf_bias=False)
  rules.append(_Rule("lm_head/kernel", (e, v), ("lm_head.weight",), **_LINEAR,
                     hf_has=not c["tie_embeddings"]))
  return rules


def _bert_rules(c: dict, flags: dict) -> list[_Rule]:
  e, h, f, v = c["d_model"], c["num_heads"], c["mlp_dim"], c["vocab_size"]
  init = _normal_fill(flags["initializer_range"], 0)
  rules = [
      _Rule("embed/embedding", (v, e), ("bert.embeddings.word_embeddings.weight",), **_SAME),
      _Rule("pos_embed/embedding", (c["max_len"], e),
            ("bert.embeddings.position_embeddings.weight",), **_SAME),
      _Rule("type_embed/embedding", (c["type_vocab_size"], e),
            ("bert.embeddings.token_type_embeddings.weight",), **_SAME)]
  rules += _norm_rules("embed_norm", "bert.embeddings.LayerNorm", e)
  for i in range(c["num_layers"]):
    p, t = f"encoder/layers_{i}/block", f"bert.encoder.layer.{i}"
    rules += _attention_rules(
        f"{p}/self_attention", tuple(f"{t}.attention.self.{n}" for n in ("query", "key", "value"))
        + (f"{t}.attention.output.dense",), e=e, h=h, hkv=h, d=e // h, qkv_bias=True,
        out_bias=True)
    rules += _norm_rules(f"{p}/self_attention_norm", f"{t}.attention.output.LayerNorm", e)
    rules += _linear_rules(f"{p}/ffn/wi", f"{t}.intermediate.dense", e, f)
    rules += _linear_rules(f"{p}/ffn/wo", f"{t}.output.dense", f, e)
    rules += _norm_rules(f"{p}/ffn_norm", f"{t}.output.LayerNorm", e)
  rules += _linear_rules("pooler", "bert.pooler.dense", e, e, hf_has=flags["pooler"],
                         fill=init)
  mlm = dict(hf_has=flags["mlm_head"])
  rules += _linear_rules("mlm_transform", "cls.predictions.transform.dense", e, e, fill=init,
                         **mlm)
  rules += [_Rule("mlm_norm/scale", (e,), ("cls.predictions.transform.LayerNorm.weight",),
                  **_SAME, fill=_ones, **mlm),
            _Rule("mlm_norm/bias", (e,), ("cls.predictions.transform.LayerNorm.bias",), **_SAME,
                  **mlm),
            _Rule("mlm_bias", (v,), ("cls.predictions.bias",), **_SAME, **mlm)]
  return rules


def _vit_rules(c: dict, flags: dict) -> list[_Rule]:
  e, h, f, p_ = c["d_model"], c["num_heads"], c["mlp_dim"], c["patch_size"]
  n = (c["image_size"] // p_) ** 2 + 1
  emb = "vit.embeddings"
  rules = [_Rule("cls", (1, 1, e), (f"{emb}.cls_token",), **_SAME),
           _Rule("pos_embed/embedding", (n, e), (f"{emb}.position_embeddings",), **_ADD_BATCH),
           _Rule("patch_embed/proj/kernel", (p_, p_, c["channels"], e),
                 (f"{emb}.patch_embeddings.projection.weight",), **_CONV2D),
           _Rule("patch_embed/proj/bias", (e,), (f"{emb}.patch_embeddings.projection.bias",),
                 **_SAME)]
  for i in range(c["num_layers"]):
    p, t = f"encoder/layers_{i}/block", f"vit.encoder.layer.{i}"
    rules += _norm_rules(f"{p}/self_attention_norm", f"{t}.layernorm_before", e)
    rules += _attention_rules(
        f"{p}/self_attention",
        tuple(f"{t}.attention.attention.{n}" for n in ("query", "key", "value"))
        + (f"{t}.attention.output.dense",), e=e, h=h, hkv=h, d=e // h,
        qkv_bias=flags["qkv_bias"], out_bias=True)
    rules += _norm_rules(f"{p}/ffn_norm", f"{t}.layernorm_after", e)
    rules += _linear_rules(f"{p}/ffn/wi", f"{t}.intermediate.dense", e, f)
    rules += _linear_rules(f"{p}/ffn/wo", f"{t}.output.dense", f, e)
  rules += _norm_rules("final_norm", "vit.layernorm", e)
  rules += _linear_rules("head", "classifier", e, c["num_classes"], hf_has=flags["classifier"])
  return rules


_RULES = {"gpt2": _gpt2_rules, "llama": _llama_rules, "mistral": _llama_rules,
          "mixtral": _llama_rules, "bert": _bert_rules, "vit": _vit_rules}


# ----------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------

def _act_from_hf(name, key: str) -> str:
  if name not in _ACT_FROM_HF:
    raise ValueError(f"config.json {key}={name!r} is not supported; supported: "
                     f"{sorted(_ACT_FROM_HF)}")
  return _ACT_FROM_HF[name]


def _act_to_hf(name: str) -> str:
  if name not in _ACT_TO_HF:
    raise ValueError(f"model.activation={name!r} has no Hugging Face equivalent")
  return _ACT_TO_HF[name]


def _unsupported(arch: str, key: str, value, why: str = ""):
  raise ValueError(f"{arch}: config.json {key}={value!r} is not supported{why}")


def _rope_theta(arch: str, hc: dict, default: float) -> float:
  params = hc.get("rope_parameters")
  for key in ("rope_parameters", "rope_scaling"):
    p = hc.get(key)
    if p is None:
      continue
    if not isinstance(p, dict) or any(isinstance(val, dict) for val in p.values()):
      _unsupported(arch, key, p, " (per-layer RoPE parameters)")
    kind = p.get("rope_type", p.get("type", "default"))
    if kind != "default":
      _unsupported(arch, key, p, f": RoPE scaling {kind!r}; only plain RoPE "
                   "(rope_type='default') is implemented")
  factor = (params or {}).get("partial_rotary_factor", hc.get("partial_rotary_factor"))
  if factor not in (None, 1.0):
    _unsupported(arch, "partial_rotary_factor", factor,
                 "; only full rotary embeddings are implemented")
  return float((params or {}).get("rope_theta", hc.get("rope_theta") or default))


def _decoder_from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  if kind == "gpt2":
    for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
      if hc.get(key, want) != want:
        _unsupported(arch, key, hc.get(key))
    e, h = hc.get("n_embd", 768), hc.get("n_head", 12)
    if e % h:
      raise ValueError(f"{arch}: n_head={h} does not divide n_embd={e}")
    cfg = dict(vocab_size=hc.get("vocab_size", 50257), d_model=e,
               num_layers=hc.get("n_layer", 12), num_heads=h, num_kv_heads=h, head_dim=None,
               mlp_dim=hc.get("n_inner") or 4 * e, max_len=hc.get("n_positions", 1024),
               positions="learned", rope_theta=10_000.0, norm="layernorm",
               norm_eps=float(hc.get("layer_norm_epsilon", 1e-5)), ffn="mlp",
               activation=_act_from_hf(hc.get("activation_function", "gelu_new"),
                                       "activation_function"),
               use_bias=True, qkv_bias=True,
               tie_embeddings=bool(hc.get("tie_word_embeddings", True)), window=None,
               num_experts=0, experts_per_token=2,
               dropout_rate=float(hc.get("resid_pdrop", 0.1)),
               attention_dropout_rate=float(hc.get("attn_pdrop", 0.1)))
    return cfg, {}
  defaults = {"llama": dict(intermediate_size=11008, max_position_embeddings=2048,
                            rms_norm_eps=1e-6, rope_theta=10_000.0, sliding_window=None),
              "mistral": dict(intermediate_size=14336, max_position_embeddings=131072,
                              rms_norm_eps=1e-6, rope_theta=10_000.0, sliding_window=4096,
                              num_key_value_heads=8),
              "mixtral": dict(intermediate_size=14336, max_position_embeddings=131072,
                              rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None,
                              num_key_value_heads=8)}[kind]
  get = lambda key, default=None: hc.get(key, defaults.get(key, default))
  e, h = get("hidden_size", 4096), get("num_attention_heads", 32)
  hkv = get("num_key_value_heads") or h
  d = hc.get("head_dim") or e // h
  if not hc.get("head_dim") and e % h:
    raise ValueError(f"{arch}: num_attention_heads={h} does not divide hidden_size={e} "
                     "and config.json has no head_dim")
  window = None
  if kind != "llama":                # LlamaForCausalLM ignores sliding_window
    sw = get("sliding_window")
    if sw is not None:
      if not isinstance(sw, int) or sw < 1:
        _unsupported(arch, "sliding_window", sw)
      window = sw - 1                # HF: key j visible from i iff i - sliding_window < j <= i
  attention_bias = bool(hc.get("attention_bias", False))
  mlp_bias = bool(hc.get("mlp_bias", False))
  if kind != "llama":
    for key in ("attention_bias", "mlp_bias"):
      if hc.get(key):
        _unsupported(arch, key, hc[key])
  num_experts = hc.get("num_local_experts", 8) if kind == "mixtral" else 0
  cfg = dict(vocab_size=get("vocab_size", 32000), d_model=e,
             num_layers=get("num_hidden_layers", 32), num_heads=h, num_kv_heads=hkv,
             head_dim=None if (e % h == 0 and d == e // h) else d,
             mlp_dim=get("intermediate_size"), max_len=get("max_position_embeddings"),
             positions="rope", rope_theta=_rope_theta(arch, hc, defaults["rope_theta"]),
             norm="rmsnorm", norm_eps=float(get("rms_norm_eps")), ffn="swiglu",
             activation=_act_from_hf(get("hidden_act", "silu"), "hidden_act"),
             use_bias=attention_bias or mlp_bias, qkv_bias=attention_bias,
             tie_embeddings=bool(hc.get("tie_word_embeddings", False)), window=window,
             num_experts=num_experts,
             experts_per_token=hc.get("num_experts_per_tok", 2) if num_experts else 2,
             dropout_rate=0.0, attention_dropout_rate=float(get("attention_dropout", 0.0)))
  return cfg, dict(attention_bias=attention_bias, mlp_bias=mlp_bias)


def _bert_from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  for key, want in (("position_embedding_type", "absolute"), ("is_decoder", False),
                    ("add_cross_attention", False), ("tie_word_embeddings", True)):
    if hc.get(key, want) != want:
      _unsupported(arch, key, hc.get(key))
  e, h = hc.get("hidden_size", 768), hc.get("num_attention_heads", 12)
  if e % h:
    raise ValueError(f"{arch}: num_attention_heads={h} does not divide hidden_size={e}")
  cfg = dict(vocab_size=hc.get("vocab_size", 30522), d_model=e,
             num_layers=hc.get("num_hidden_layers", 12), num_heads=h,
             mlp_dim=hc.get("intermediate_size", 3072),
             max_len=hc.get("max_position_embeddings", 512),
             type_vocab_size=hc.get("type_vocab_size", 2),
             norm_eps=float(hc.get("layer_norm_eps", 1e-12)),
             activation=_act_from_hf(hc.get("hidden_act", "gelu"), "hidden_act"),
             dropout_rate=float(hc.get("hidden_dropout_prob", 0.1)),
             attention_dropout_rate=float(hc.get("attention_probs_dropout_prob", 0.1)))
  flags = dict(pooler="bert.pooler.dense.weight" in tensors,
               mlm_head=arch != "BertModel" or "cls.predictions.bias" in tensors,
               initializer_range=float(hc.get("initializer_range", 0.02)))
  return cfg, flags


def _vit_from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  image, patch = hc.get("image_size", 224), hc.get("patch_size", 16)
  for key, value in (("image_size", image), ("patch_size", patch)):
    if isinstance(value, (list, tuple)):
      if len(value) != 2 or value[0] != value[1]:
        _unsupported(arch, key, value, " (only square images and patches)")
  image = image[0] if isinstance(image, (list, tuple)) else image
  patch = patch[0] if isinstance(patch, (list, tuple)) else patch
  e, h = hc.get("hidden_size", 768), hc.get("num_attention_heads", 12)
  if e % h:
    raise ValueError(f"{arch}: num_attention_heads={h} does not divide hidden_size={e}")
  labels = hc.get("id2label")
  num_classes = len(labels) if labels else hc.get("num_labels", 2)
  cfg = dict(num_classes=num_classes, patch_size=patch, image_size=image, d_model=e,
             num_layers=hc.get("num_hidden_layers", 12), num_heads=h,
             mlp_dim=hc.get("intermediate_size", 3072), channels=hc.get("num_channels", 3),
             pool="cls", norm_eps=float(hc.get("layer_norm_eps", 1e-12)),
             activation=_act_from_hf(hc.get("hidden_act", "gelu"), "hidden_act"),
             dropout_rate=float(hc.get("hidden_dropout_prob", 0.0)),
             attention_dropout_rate=float(hc.get("attention_probs_dropout_prob", 0.0)))
  return cfg, dict(qkv_bias=bool(hc.get("qkv_bias", True)),
                   classifier=arch == "ViTForImageClassification")


_FROM_HF = {"decoder": _decoder_from_hf, "bert": _bert_from_hf, "vit": _vit_from_hf}


def _decoder_to_hf(c: dict) -> tuple[str, dict, dict]:
  e, h = c["d_model"], c["num_heads"]
  hkv, d = c.get("num_kv_heads") or h, c.get("head_dim") or e // h
  use_bias = c.get("use_bias", True)
  qkv_bias = use_bias if c.get("qkv_bias") is None else c["qkv_bias"]
  tie = c.get("tie_embeddings", True)
  positions, norm = c.get("positions", "learned"), c.get("norm", "layernorm")
  ffn, experts = c.get("ffn", "mlp"), c.get("num_experts", 0)
  window = c.get("window")
  base = dict(vocab_size=c["vocab_size"], tie_word_embeddings=tie, torch_dtype="float32",
              dtype="float32")
  if positions == "learned" and norm == "layernorm":
    why = ("GPT2LMHeadModel (positions='learned', norm='layernorm') has no "
           "{}; got model.{}={!r}")
    for key, ok in (("num_kv_heads", hkv == h), ("head_dim", d * h == e),
                    ("window", window is None), ("num_experts", not experts),
                    ("ffn", ffn == "mlp")):
      if not ok:
        raise ValueError(why.format({"num_kv_heads": "grouped-query attention",
                                     "head_dim": "head_dim != d_model / num_heads",
                                     "window": "sliding window", "num_experts": "experts",
                                     "ffn": "gated FFN"}[key], key, c.get(key)))
    hc = dict(base, architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=e, n_head=h,
              n_layer=c["num_layers"], n_inner=c["mlp_dim"], n_positions=c.get("max_len", 1024),
              activation_function=_act_to_hf(c.get("activation") or "gelu"),
              layer_norm_epsilon=c.get("norm_eps", 1e-5),
              resid_pdrop=c.get("dropout_rate", 0.0), embd_pdrop=c.get("dropout_rate", 0.0),
              attn_pdrop=c.get("attention_dropout_rate", 0.0))
    return "GPT2LMHeadModel", hc, {}
  if positions == "rope" and norm == "rmsnorm" and (ffn == "swiglu" or experts):
    sliding_window = None
    if window is not None:
      left, right = (window, 0) if isinstance(window, int) else tuple(window)
      if right != 0 or left is None:
        raise ValueError(f"model.window={window!r}: Hugging Face sliding windows are causal "
                         "(left, 0) windows with a finite left")
      sliding_window = left + 1
    arch = ("MixtralForCausalLM" if experts else "MistralForCausalLM" if window is not None
            else "LlamaForCausalLM")
    theta = float(c.get("rope_theta", 10_000.0))
    hc = dict(base, architectures=[arch], model_type=arch[:-len("ForCausalLM")].lower(),
              hidden_size=e, intermediate_size=c["mlp_dim"],
              num_hidden_layers=c["num_layers"], num_attention_heads=h,
              num_key_value_heads=hkv, head_dim=d,
              hidden_act=_act_to_hf(c.get("activation") or "silu"),
              max_position_embeddings=c.get("max_len", 1024),
              rms_norm_eps=c.get("norm_eps", 1e-5), rope_theta=theta,
              rope_parameters={"rope_type": "default", "rope_theta": theta},
              attention_dropout=c.get("attention_dropout_rate", 0.0))
    flags = dict(attention_bias=False, mlp_bias=False)
    if arch == "LlamaForCausalLM":
      flags = dict(attention_bias=bool(qkv_bias or use_bias), mlp_bias=bool(use_bias))
      hc.update(flags)
    else:
      hc["sliding_window"] = sliding_window
    if experts:
      hc.update(num_local_experts=experts, num_experts_per_tok=c.get("experts_per_token", 2))
    return arch, hc, flags
  raise ValueError(
      f"a decoder with model.positions={positions!r}, model.norm={norm!r}, model.ffn={ffn!r} "
      "has no Hugging Face equivalent: GPT-2 needs positions='learned', norm='layernorm', "
      "ffn='mlp'; Llama/Mistral/Mixtral need positions='rope', norm='rmsnorm', ffn='swiglu' "
      "(or num_experts > 0)")


def _bert_to_hf(c: dict) -> tuple[str, dict, dict]:
  hc = dict(architectures=["BertForMaskedLM"], model_type="bert", vocab_size=c["vocab_size"],
            hidden_size=c["d_model"], num_hidden_layers=c["num_layers"],
            num_attention_heads=c["num_heads"], intermediate_size=c["mlp_dim"],
            hidden_act=_act_to_hf(c.get("activation", "gelu_exact")),
            max_position_embeddings=c.get("max_len", 512),
            type_vocab_size=c.get("type_vocab_size", 2), layer_norm_eps=c.get("norm_eps", 1e-12),
            hidden_dropout_prob=c.get("dropout_rate", 0.1),
            attention_probs_dropout_prob=c.get("attention_dropout_rate", 0.1),
            position_embedding_type="absolute", tie_word_embeddings=True,
            torch_dtype="float32", dtype="float32")
  return "BertForMaskedLM", hc, dict(pooler=True, mlm_head=True, initializer_range=0.02)


def _vit_to_hf(c: dict) -> tuple[str, dict, dict]:
  if c.get("pool", "cls") != "cls":
    raise ValueError(f"model.pool={c.get('pool')!r}: Hugging Face ViT classifies the [CLS] "
                     "token; only pool='cls' can be saved")
  k = c["num_classes"]
  hc = dict(architectures=["ViTForImageClassification"], model_type="vit",
            hidden_size=c["d_model"], num_hidden_layers=c["num_layers"],
            num_attention_heads=c["num_heads"], intermediate_size=c["mlp_dim"],
            hidden_act=_act_to_hf(c.get("activation", "gelu_exact")),
            layer_norm_eps=c.get("norm_eps", 1e-6), image_size=c["image_size"],
            patch_size=c["patch_size"], num_channels=c.get("channels", 3), qkv_bias=True,
            hidden_dropout_prob=c.get("dropout_rate", 0.0),
            attention_probs_dropout_prob=c.get("attention_dropout_rate", 0.0),
            id2label={str(i): f"LABEL_{i}" for i in range(k)},
            label2id={f"LABEL_{i}": i for i in range(k)}, torch_dtype="float32",
            dtype="float32")
  return "ViTForImageClassification", hc, dict(qkv_bias=True, classifier=True)


_TO_HF = {"decoder": _decoder_to_hf, "bert": _bert_to_hf, "vit": _vit_to_hf}


# ----------------------------------------------------------------------------------------
# Our side
# ----------------------------------------------------------------------------------------

def _expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
  """path -> shape of the params `models.build(cfg).init` creates (unscanned; no compute)."""

  cfg = dict(cfg, scan_layers=False)
  if cfg["family"] == "decoder":
    cfg["decode"] = False
  module = models.build(cfg)
  if cfg["family"] == "vit":
    x = jnp.zeros((1, cfg["image_size"], cfg["image_size"], cfg.get("channels", 3)))
  else:
    x = jnp.zeros((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), x))["params"]
  flat = traverse_util.flatten_dict(nn.unbox(shapes), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()}


def _config_dict(model_config) -> dict:
  """The config as a dict with every model field (defaults filled in from the model class)."""
  cfg = models.config_as_dict(model_config)
  if cfg.get("family") not in _TO_HF:
    raise ValueError(f"model.family={cfg.get('family')!r}: Hugging Face conversion supports "
                     f"{sorted(_TO_HF)}")
  for name, field in models.model_fields(cfg["family"]).items():
    if (name not in cfg and field.default is not dataclasses.MISSING
        and name not in ("dtype", "param_dtype")):
      cfg[name] = field.default
  return cfg


def _check_rules(rules: list[_Rule], expected: dict, where: str):
  """Internal consistency: the rules cover exactly our params, with the same shapes."""
  covered = {r.ours: r for r in rules}
  for path, shape in expected.items():
    if path not in covered:
      raise ValueError(f"internal error ({where}): no Hugging Face mapping for param {path}")
    if tuple(covered[path].shape) != shape:
      raise ValueError(f"internal error ({where}): param {path} is {shape} in the model but "
                       f"{covered[path].shape} in the mapping")


# ----------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------

def _architecture(hc: dict, path: str) -> str:
  archs = hc.get("architectures") or []
  if not archs:
    model_type = hc.get("model_type")
    if model_type not in _MODEL_TYPES:
      raise ValueError(f"{path}/config.json: model_type={model_type!r} (and no "
                       f"'architectures') is not supported; supported: "
                       f"{sorted(ARCHITECTURES)}")
    archs = [_MODEL_TYPES[model_type]]
  if len(archs) != 1 or archs[0] not in ARCHITECTURES:
    raise ValueError(f"{path}/config.json: architecture {archs!r} is not supported; "
                     f"supported: {sorted(ARCHITECTURES)}")
  return archs[0]


def load(path: str | os.PathLike):
  """Read a local transformers checkpoint directory.

  Returns (model_config, params): an `ml_collections.ConfigDict` for `models.build` (family
  plus the model's fields) and a nested dict of NumPy float32 arrays in the unscanned layout,
  usable as `module.apply({'params': params}, ...)`. Raises ValueError for an unsupported
  architecture or option (naming it), a missing tensor, a tensor of the wrong shape, or an
  unexpected tensor.
  """
  path = os.fspath(path)
  config_file = os.path.join(path, "config.json")
  if not os.path.exists(config_file):
    raise ValueError(f"{path} has no config.json (expected a transformers checkpoint "
                     "directory)")
  try:
    with open(config_file) as f:
      hc = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{config_file} is not valid JSON ({e}); restore the checkpoint's "
                     "config.json") from e
  arch = _architecture(hc, path)
  family, kind = ARCHITECTURES[arch]
  tensors = _normalise_names(_read_tensors(path), kind)
  cfg, flags = _FROM_HF[family](arch, kind, hc, tensors)
  cfg = dict(family=family, **cfg)
  expected = _expected_shapes(cfg)
  rules = _RULES[kind](cfg, flags)
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
                       + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    arrays = [tensors[n] for n in rule.hf]
    used.update(rule.hf)
    want = jax.eval_shape(rule.to_hf, jax.ShapeDtypeStruct(rule.shape, jnp.float32))
    for name, a, w in zip(rule.hf, arrays, want):
      if tuple(a.shape) != tuple(w.shape):
        raise ValueError(f"{arch} checkpoint {path}: tensor {name!r} has shape "
                         f"{tuple(a.shape)}, expected {tuple(w.shape)} from config.json")
    if ours_has:
      flat[rule.ours] = np.ascontiguousarray(rule.to_ours(rule.shape, *arrays), np.float32)
    elif any(np.any(a != 0) for a in arrays):
      raise ValueError(f"{arch} checkpoint {path}: tensor {rule.hf[0]!r} is not zero but "
                       f"jaxformer's {family} model has no such parameter (not supported)")
    del arrays
    for name in rule.hf:                # free memory; _dropped only needs these two
      if name not in ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias"):
        tensors[name] = None

  unexpected = []
  for name in sorted(set(tensors) - used):
    if any(p.search(name) for p in _IGNORED):
      continue
    dropped = _dropped(name, tensors, cfg)
    if dropped is None:
      unexpected.append(name)
    elif dropped:
      warnings.warn(f"{arch} checkpoint {path}: dropping {name} ({dropped})")
  if unexpected:
    raise ValueError(f"{arch} checkpoint {path} has tensors jaxformer does not use: "
                     f"{unexpected[:8]}" + (" ..." if len(unexpected) > 8 else ""))
  params = traverse_util.unflatten_dict(flat, sep="/")
  return ml_collections.ConfigDict(cfg), params


def _normalise_names(tensors: dict, kind: str) -> dict:
  prefix = _PREFIX[kind]
  out = {}
  for name, value in tensors.items():
    if not name.startswith(prefix) and not name.startswith(_HEADS):
      name = prefix + name
    if kind == "bert":                  # TF-era names
      name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
      name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    out[name] = value
  return out


def _dropped(name: str, tensors: dict, cfg: dict) -> str | None:
  """Why a known unused tensor can be dropped ('' = silently), or None if it is unexpected."""
  if name == "lm_head.weight" and cfg.get("tie_embeddings"):
    return ""                           # tied: transformers uses the embedding, as we do
  if name == "cls.predictions.decoder.weight":
    emb = tensors.get("bert.embeddings.word_embeddings.weight")
    if emb is not None and emb.shape == tensors[name].shape and np.array_equal(
        emb, tensors[name]):
      return ""
    return None
  if name == "cls.predictions.decoder.bias":
    bias = tensors.get("cls.predictions.bias")
    return "" if bias is not None and np.array_equal(bias, tensors[name]) else None
  if name.startswith("cls.seq_relationship."):
    return "BERT's next-sentence-prediction head is not part of jaxformer's Bert"
  if name.startswith("vit.pooler."):
    return "jaxformer's ViT has no pooler; its head reads the final-norm [CLS] token"
  return None


def save(model_config, params, out_dir: str | os.PathLike) -> str:
  """Write `config.json` + `model.safetensors` loadable by transformers' `from_pretrained`.

  A decoder becomes GPT2LMHeadModel (positions='learned', norm='layernorm'), else
  LlamaForCausalLM, MistralForCausalLM (window set) or MixtralForCausalLM (num_experts > 0);
  bert -> BertForMaskedLM (the pooler is written too); vit -> ViTForImageClassification.
  `params` may be scanned (a `layers` subtree), boxed, or wrapped as {'params': ...}.
  Returns out_dir.
  """
  save_file = _safetensors().numpy.save_file
  cfg = _config_dict(model_config)
  family = cfg["family"]
  if cfg.get("num_experts") and (cfg.get("moe_dispatch", "dropless") != "dropless"
                                 or not cfg.get("moe_renormalize", True)
                                 or not cfg.get("moe_gated", True)):
    raise ValueError("hf.save writes Mixtral checkpoints, whose routing is dropless top-k "
                     "with renormalised gates and SwiGLU experts; this model has "
                     f"moe_dispatch={cfg.get('moe_dispatch')!r}, moe_renormalize="
                     f"{cfg.get('moe_renormalize')}, moe_gated={cfg.get('moe_gated')}")
  arch, hc, flags = _TO_HF[family](cfg)
  kind = ARCHITECTURES[arch][1]
  expected = _expected_shapes(cfg)
  rules = _RULES[kind](cfg, flags)
  _check_rules(rules, expected, arch)

  params = nn.unbox(params)
  if isinstance(params, Mapping) and set(params) == {"params"}:
    params = params["params"]
  params = {k: v for k, v in params.items()}
  stack = "decoder" if family == "decoder" else "encoder"
  if isinstance(params.get(stack), Mapping) and "layers" in params[stack]:
    params[stack] = unstack_layers(dict(params[stack]), cfg["num_layers"])
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
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hc, f, indent=2, sort_keys=True)
  save_file(out, os.path.join(out_dir, _SAFE), metadata={"format": "pt"})
  return out_dir
