"""family='deberta' <-> DebertaV2ForMaskedLM, DebertaV2Model (model_type 'deberta-v2').

transformers' models/deberta_v2/modeling_deberta_v2.py: post-norm encoder layers of torch
Linears (query_proj / key_proj / value_proj), one relative table `encoder.rel_embeddings` with
its `encoder.LayerNorm`, the MLM head either legacy (`cls.predictions.transform.*`, the
decoder tied to the word embeddings, `cls.predictions.bias`; what `save` writes, legacy=True)
or not (`lm_predictions.lm_head.*`, as the released DeBERTa-v3 checkpoints store it); both
load to the same parameters. Padding: transformers' DeBERTa also hides every key from padded
queries (their rows average all values), jaxformer's attention returns zeros there; logits
agree at real tokens, which is all a masked-LM loss reads. The released checkpoints'
replaced-token-detection head
(`mask_predictions.*`) is dropped with a warning; a DebertaV2Model checkpoint gets a freshly
initialised MLM head (with a warning).

Supported: relative_attention=True with pos_att_type c2p + p2c and share_att_key=True (every
v2/v3 release), norm_rel_ebd 'layer_norm' or 'none', position_buckets (or none),
position_biased_input either way, any type_vocab_size. Refused by name: the v2-xlarge
convolution (conv_kernel_size > 0), embedding_size != hidden_size, separate position
projections (share_att_key=False), one of c2p / p2c alone, absolute-only attention.

The enhanced mask decoder (model.emd_layers > 0) has no counterpart in transformers, so
`save` refuses such a model by name rather than quietly drop its absolute position table
`emd_pos_embed`: the DebertaV2ForMaskedLM written would feed its MLM head the last layer's
output, not the decoder's the head was trained on, and predict differently. The encoder is
the same with or without the decoder, so to export it (fine-tuning) save with
model.emd_layers=0 and params without `emd_pos_embed` (the message says so); `load` gives
emd_layers=0 (config.json has no decoder).
"""

from __future__ import annotations

import numpy as np

from jaxformer.convert.hf import core
from jaxformer.convert.hf.core import Rule
from jaxformer.models.deberta import relative_span

ARCHITECTURES = {"DebertaV2ForMaskedLM": "deberta", "DebertaV2Model": "deberta"}
MODEL_TYPES = {"deberta-v2": "DebertaV2ForMaskedLM"}
PREFIXES = {"deberta": "deberta."}
# Heads outside core's known head prefixes get the base prefix first; put them back. The
# non-legacy MLM head is read under the legacy names (same tensors).
RENAMES = ((r"^deberta\.mask_predictions\.", "mask_predictions."),
           (r"^deberta\.lm_predictions\.lm_head\.dense\.", "cls.predictions.transform.dense."),
           (r"^deberta\.lm_predictions\.lm_head\.LayerNorm\.",
            "cls.predictions.transform.LayerNorm."),
           (r"^deberta\.lm_predictions\.lm_head\.bias$", "cls.predictions.bias"))
STACK = "encoder"
FIXED = dict(num_kv_heads=None, head_dim=None, window=None, use_bias=True, qkv_bias=True,
             ffn="mlp", norm="layernorm", pre_norm=False, num_experts=0)
KEEP = ("deberta.embeddings.word_embeddings.weight", "cls.predictions.bias")
_POS_ATT = {"c2p", "p2c"}


def unused(name: str, tensors: dict, config: dict) -> str | None:
  if name == "cls.predictions.decoder.weight":
    emb = tensors.get("deberta.embeddings.word_embeddings.weight")
    if emb is not None and emb.shape == tensors[name].shape and np.array_equal(
        emb, tensors[name]):
      return ""
    return None
  if name == "cls.predictions.decoder.bias":
    bias = tensors.get("cls.predictions.bias")
    return "" if bias is not None and np.array_equal(bias, tensors[name]) else None
  if name.startswith("mask_predictions."):
    return "the replaced-token-detection head is not part of jaxformer's Deberta (MLM)"
  return None


def _ones(shape):
  return np.ones(shape, np.float32)


def _normal_fill(std: float, seed: int):
  def fill(shape):
    return np.random.default_rng(seed).normal(0.0, std, shape).astype(np.float32)
  return fill


def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  e, f, v, h = c["d_model"], c["mlp_dim"], c["vocab_size"], c["num_heads"]
  emb = "deberta.embeddings"
  rules = [Rule("embed/embedding", (v, e), (f"{emb}.word_embeddings.weight",), **core.SAME)]
  if c["position_biased_input"]:
    rules.append(Rule("pos_embed/embedding", (c["max_len"], e),
                      (f"{emb}.position_embeddings.weight",), **core.SAME))
  if c["type_vocab_size"]:
    rules.append(Rule("type_embed/embedding", (c["type_vocab_size"], e),
                      (f"{emb}.token_type_embeddings.weight",), **core.SAME))
  rules += core.norm_rules("embed_norm", f"{emb}.LayerNorm", e)
  rules.append(Rule("rel_embed/embedding", (2 * relative_span(c), e),
                    ("deberta.encoder.rel_embeddings.weight",), **core.SAME))
  if c["rel_embed_norm"]:
    rules += core.norm_rules("rel_norm", "deberta.encoder.LayerNorm", e)
  for i in range(c["num_layers"]):
    p, t = f"encoder/layers_{i}/block", f"deberta.encoder.layer.{i}"
    rules += core.attention_rules(
        f"{p}/self_attention", tuple(f"{t}.attention.self.{n}_proj" for n in
                                     ("query", "key", "value")) + (f"{t}.attention.output.dense",),
        e=e, h=h, hkv=h, d=e // h, qkv_bias=True, out_bias=True)
    rules += core.norm_rules(f"{p}/self_attention_norm", f"{t}.attention.output.LayerNorm", e)
    rules += core.linear_rules(f"{p}/ffn/wi", f"{t}.intermediate.dense", e, f)
    rules += core.linear_rules(f"{p}/ffn/wo", f"{t}.output.dense", f, e)
    rules += core.norm_rules(f"{p}/ffn_norm", f"{t}.output.LayerNorm", e)
  mlm = dict(hf_has=flags["mlm_head"])
  rules += core.linear_rules("mlm_transform", "cls.predictions.transform.dense", e, e,
                             fill=_normal_fill(flags["initializer_range"], 0), **mlm)
  rules += [Rule("mlm_norm/scale", (e,), ("cls.predictions.transform.LayerNorm.weight",),
                 **core.SAME, fill=_ones, **mlm),
            Rule("mlm_norm/bias", (e,), ("cls.predictions.transform.LayerNorm.bias",),
                 **core.SAME, **mlm),
            Rule("mlm_bias", (v,), ("cls.predictions.bias",), **core.SAME, **mlm)]
  return rules


def _pos_att_type(value) -> set:
  if isinstance(value, str):
    value = value.split("|")
  return {str(x).strip().lower() for x in value or ()}


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  core.require_values(arch, hc, (("conv_kernel_size", 0), ("is_decoder", False),
                                 ("tie_word_embeddings", True)))
  for key in ("relative_attention", "share_att_key"):    # transformers' default: False
    if not hc.get(key, False):
      core.unsupported(arch, key, hc.get(key, False))
  e, h = core.width_and_heads(arch, hc, "hidden_size", "num_attention_heads")
  if _pos_att_type(hc.get("pos_att_type")) != _POS_ATT:
    raise ValueError(f"{arch} config.json pos_att_type={hc.get('pos_att_type')!r}: only "
                     "disentangled attention with both c2p and p2c is supported")
  if hc.get("embedding_size", e) != e:
    raise ValueError(f"{arch} config.json embedding_size={hc.get('embedding_size')} != "
                     f"hidden_size={e}: a factorised embedding is not supported")
  if hc.get("attention_head_size", e // h) != e // h:
    raise ValueError(f"{arch} config.json attention_head_size={hc.get('attention_head_size')}"
                     f" != hidden_size / num_attention_heads: not supported")
  norm_rel = [x.strip() for x in str(hc.get("norm_rel_ebd", "none")).lower().split("|")]
  if set(norm_rel) - {"none", "layer_norm"}:
    raise ValueError(f"{arch} config.json norm_rel_ebd={hc.get('norm_rel_ebd')!r} is not "
                     "supported ('layer_norm' or 'none')")
  buckets = int(hc.get("position_buckets", -1))
  max_rel = int(hc.get("max_relative_positions", -1))
  types = int(hc.get("type_vocab_size", 0))
  cfg = dict(vocab_size=hc.get("vocab_size", 128100), d_model=e,
             num_layers=hc.get("num_hidden_layers", 24), num_heads=h,
             mlp_dim=hc.get("intermediate_size", 6144),
             max_len=hc.get("max_position_embeddings", 512),
             type_vocab_size=types if types > 0 else None,
             position_biased_input=bool(hc.get("position_biased_input", True)),
             position_buckets=buckets if buckets > 0 else None,
             max_relative_positions=max_rel if max_rel > 0 else None,
             rel_embed_norm="layer_norm" in norm_rel,
             norm_eps=float(hc.get("layer_norm_eps", 1e-7)),
             activation=core.act_from_hf(hc.get("hidden_act", "gelu"), "hidden_act"),
             dropout_rate=float(hc.get("hidden_dropout_prob", 0.1)),
             attention_dropout_rate=float(hc.get("attention_probs_dropout_prob", 0.1)))
  flags = dict(mlm_head=arch != "DebertaV2Model" or "cls.predictions.bias" in tensors,
               initializer_range=float(hc.get("initializer_range", 0.02)))
  return cfg, flags


def to_hf(c: dict) -> tuple[str, dict, dict]:
  if c["emd_layers"]:
    raise ValueError(f"model.emd_layers={c['emd_layers']}: DebertaV2ForMaskedLM has no "
                     "enhanced mask decoder, so its MLM head would read the last layer instead "
                     "and predict differently; to export the encoder (and head) for "
                     "fine-tuning, save with model.emd_layers=0 and params without 'emd_pos_embed' "
                     "(the decoder's absolute position table)")
  hc = dict(architectures=["DebertaV2ForMaskedLM"], model_type="deberta-v2",
            vocab_size=c["vocab_size"], hidden_size=c["d_model"],
            num_hidden_layers=c["num_layers"], num_attention_heads=c["num_heads"],
            intermediate_size=c["mlp_dim"],
            hidden_act=core.act_to_hf(c.get("activation") or "gelu_exact"),
            max_position_embeddings=c["max_len"], type_vocab_size=c["type_vocab_size"] or 0,
            layer_norm_eps=c["norm_eps"], hidden_dropout_prob=c["dropout_rate"],
            attention_probs_dropout_prob=c["attention_dropout_rate"],
            relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=True,
            position_buckets=c["position_buckets"] or -1,
            max_relative_positions=c["max_relative_positions"] or -1,
            position_biased_input=bool(c["position_biased_input"]),
            norm_rel_ebd="layer_norm" if c["rel_embed_norm"] else "none",
            legacy=True, tie_word_embeddings=True, torch_dtype="float32", dtype="float32")
  return "DebertaV2ForMaskedLM", hc, dict(mlm_head=True, initializer_range=0.02)
