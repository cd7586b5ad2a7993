"""family='bert' <-> BertForMaskedLM, BertForPreTraining, BertModel.

transformers' models/bert/modeling_bert.py: post-norm encoder layers of torch Linears. The MLM
decoder is tied to the word embeddings and `cls.predictions.bias` becomes `mlm_bias`. What a
checkpoint lacks (BertModel: the MLM head; BertForMaskedLM: the pooler) is freshly initialised
with a warning; the next-sentence head (BertForPreTraining) is dropped with a warning.
"""

from __future__ import annotations

import numpy as np

from jaxformer.convert.hf import core
from jaxformer.convert.hf.core import Rule

ARCHITECTURES = {"BertForMaskedLM": "bert", "BertForPreTraining": "bert", "BertModel": "bert"}
MODEL_TYPES = {"bert": "BertForMaskedLM"}
PREFIXES = {"bert": "bert."}
RENAMES = ((r"LayerNorm\.gamma$", "LayerNorm.weight"),      # TF-era names
           (r"LayerNorm\.beta$", "LayerNorm.bias"))
STACK = "encoder"
# Block settings Hugging Face's BERT has no option for (see core.FIXED).
FIXED = dict(num_kv_heads=None, head_dim=None, window=None, use_bias=True, qkv_bias=True,
             ffn="mlp", norm="layernorm", pre_norm=False, num_experts=0)
KEEP = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias")


def unused(name: str, tensors: dict, config: dict) -> str | None:
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
  return None


def _normal_fill(std: float, seed: int):
  def fill(shape):
    return np.random.default_rng(seed).normal(0.0, std, shape).astype(np.float32)
  return fill


def _ones(shape):
  return np.ones(shape, np.float32)


def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  e, f, v = c["d_model"], c["mlp_dim"], c["vocab_size"]
  init = _normal_fill(flags["initializer_range"], 0)
  rules = [
      Rule("embed/embedding", (v, e), ("bert.embeddings.word_embeddings.weight",), **core.SAME),
      Rule("pos_embed/embedding", (c["max_len"], e),
           ("bert.embeddings.position_embeddings.weight",), **core.SAME),
      Rule("type_embed/embedding", (c["type_vocab_size"], e),
           ("bert.embeddings.token_type_embeddings.weight",), **core.SAME)]
  rules += core.norm_rules("embed_norm", "bert.embeddings.LayerNorm", e)
  for i in range(c["num_layers"]):
    p, t = f"encoder/layers_{i}/block", f"bert.encoder.layer.{i}"
    attention, wi, wo = core.encoder_layer_rules(p, t, "attention.self", e=e,
                                                 h=c["num_heads"], f=f, qkv_bias=True)
    rules += attention
    rules += core.norm_rules(f"{p}/self_attention_norm", f"{t}.attention.output.LayerNorm", e)
    rules += wi + wo
    rules += core.norm_rules(f"{p}/ffn_norm", f"{t}.output.LayerNorm", e)
  rules += core.linear_rules("pooler", "bert.pooler.dense", e, e, hf_has=flags["pooler"],
                             fill=init)
  mlm = dict(hf_has=flags["mlm_head"])
  rules += core.linear_rules("mlm_transform", "cls.predictions.transform.dense", e, e,
                             fill=init, **mlm)
  rules += [Rule("mlm_norm/scale", (e,), ("cls.predictions.transform.LayerNorm.weight",),
                 **core.SAME, fill=_ones, **mlm),
            Rule("mlm_norm/bias", (e,), ("cls.predictions.transform.LayerNorm.bias",),
                 **core.SAME, **mlm),
            Rule("mlm_bias", (v,), ("cls.predictions.bias",), **core.SAME, **mlm)]
  return rules


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  core.require_values(arch, hc, (("position_embedding_type", "absolute"),
                                 ("is_decoder", False), ("add_cross_attention", False),
                                 ("tie_word_embeddings", True)))
  e, h = core.width_and_heads(arch, hc, "hidden_size", "num_attention_heads")
  cfg = dict(vocab_size=hc.get("vocab_size", 30522), d_model=e,
             num_layers=hc.get("num_hidden_layers", 12), num_heads=h,
             mlp_dim=hc.get("intermediate_size", 3072),
             max_len=hc.get("max_position_embeddings", 512),
             type_vocab_size=hc.get("type_vocab_size", 2),
             norm_eps=float(hc.get("layer_norm_eps", 1e-12)),
             activation=core.act_from_hf(hc.get("hidden_act", "gelu"), "hidden_act"),
             dropout_rate=float(hc.get("hidden_dropout_prob", 0.1)),
             attention_dropout_rate=float(hc.get("attention_probs_dropout_prob", 0.1)))
  flags = dict(pooler="bert.pooler.dense.weight" in tensors,
               mlm_head=arch != "BertModel" or "cls.predictions.bias" in tensors,
               initializer_range=float(hc.get("initializer_range", 0.02)))
  return cfg, flags


def to_hf(c: dict) -> tuple[str, dict, dict]:
  hc = dict(architectures=["BertForMaskedLM"], model_type="bert", vocab_size=c["vocab_size"],
            hidden_size=c["d_model"], num_hidden_layers=c["num_layers"],
            num_attention_heads=c["num_heads"], intermediate_size=c["mlp_dim"],
            hidden_act=core.act_to_hf(c.get("activation", "gelu_exact")),
            max_position_embeddings=c.get("max_len", 512),
            type_vocab_size=c.get("type_vocab_size", 2), layer_norm_eps=c.get("norm_eps", 1e-12),
            hidden_dropout_prob=c.get("dropout_rate", 0.1),
            attention_probs_dropout_prob=c.get("attention_dropout_rate", 0.1),
            position_embedding_type="absolute", tie_word_embeddings=True,
            torch_dtype="float32", dtype="float32")
  return "BertForMaskedLM", hc, dict(pooler=True, mlm_head=True, initializer_range=0.02)
