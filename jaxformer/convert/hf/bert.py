"""family='bert' <-> BertForMaskedLM, BertForPreTraining, BertModel.

transformers' models/bert/modeling_bert.py: post-norm encoder layers of torch Linears. The MLM
decoder is tied to the word embeddings and `cls.predictions.bias` becomes `mlm_bias`. What a
checkpoint lacks (BertModel: the MLM head; BertForMaskedLM: the pooler) is freshly initialised
with a warning. BertForPreTraining loads with `model.nsp=True`: its next-sentence head
`cls.seq_relationship` becomes `nsp_head`, and a model with `nsp=True` saves as
BertForPreTraining (else BertForMaskedLM). `encoder_rules` / `mlm_head_rules` are shared with
RoBERTa's converter (`roberta.py`), whose tensors differ only in names.
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
# Settings Hugging Face's BERT has no option for (see core.FIXED).
FIXED = dict(num_kv_heads=None, head_dim=None, window=None, use_bias=True, qkv_bias=True,
             ffn="mlp", norm="layernorm", pre_norm=False, num_experts=0, pad_id=None)
KEEP = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias")


def unused(name: str, tensors: dict, config: dict) -> str | None:
  if name == "cls.predictions.decoder.weight":
    return tied(tensors, name, "bert.embeddings.word_embeddings.weight")
  if name == "cls.predictions.decoder.bias":
    return tied(tensors, name, "cls.predictions.bias")
  return None


def tied(tensors: dict, name: str, source: str) -> str | None:
  """'' (drop silently) if tensor `name` equals `source`, which a rule has read; else None."""
  value = tensors.get(source)
  if value is not None and value.shape == tensors[name].shape and np.array_equal(
      value, tensors[name]):
    return ""
  return None


def _normal_fill(std: float, seed: int):
  def fill(shape):
    return np.random.default_rng(seed).normal(0.0, std, shape).astype(np.float32)
  return fill


def _ones(shape):
  return np.ones(shape, np.float32)


def encoder_rules(c: dict, flags: dict, base: str) -> list[Rule]:
  """Embeddings, encoder layers and pooler of `{base}.*` (BertModel / RobertaModel)."""
  e, f, v = c["d_model"], c["mlp_dim"], c["vocab_size"]
  rules = [
      Rule("embed/embedding", (v, e), (f"{base}.embeddings.word_embeddings.weight",),
           **core.SAME),
      Rule("pos_embed/embedding", (c["max_len"], e),
           (f"{base}.embeddings.position_embeddings.weight",), **core.SAME),
      Rule("type_embed/embedding", (c["type_vocab_size"], e),
           (f"{base}.embeddings.token_type_embeddings.weight",), **core.SAME)]
  rules += core.norm_rules("embed_norm", f"{base}.embeddings.LayerNorm", e)
  for i in range(c["num_layers"]):
    p, t = f"encoder/layers_{i}/block", f"{base}.encoder.layer.{i}"
    attention, wi, wo = core.encoder_layer_rules(p, t, "attention.self", e=e,
                                                 h=c["num_heads"], f=f, qkv_bias=True)
    rules += attention
    rules += core.norm_rules(f"{p}/self_attention_norm", f"{t}.attention.output.LayerNorm", e)
    rules += wi + wo
    rules += core.norm_rules(f"{p}/ffn_norm", f"{t}.output.LayerNorm", e)
  rules += core.linear_rules("pooler", f"{base}.pooler.dense", e, e, hf_has=flags["pooler"],
                             fill=_normal_fill(flags["initializer_range"], 0))
  return rules


def mlm_head_rules(c: dict, flags: dict, dense: str, norm: str, bias: str) -> list[Rule]:
  """The MLM head (transform dense, LayerNorm, output bias; the decoder is tied)."""
  e, v = c["d_model"], c["vocab_size"]
  mlm = dict(hf_has=flags["mlm_head"])
  return core.linear_rules("mlm_transform", dense, e, e,
                           fill=_normal_fill(flags["initializer_range"], 0), **mlm) + [
      Rule("mlm_norm/scale", (e,), (f"{norm}.weight",), **core.SAME, fill=_ones, **mlm),
      Rule("mlm_norm/bias", (e,), (f"{norm}.bias",), **core.SAME, **mlm),
      Rule("mlm_bias", (v,), (bias,), **core.SAME, **mlm)]


def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  rules = encoder_rules(c, flags, "bert")
  rules += mlm_head_rules(c, flags, "cls.predictions.transform.dense",
                          "cls.predictions.transform.LayerNorm", "cls.predictions.bias")
  rules += core.linear_rules("nsp_head", "cls.seq_relationship", c["d_model"], 2,
                             hf_has=c["nsp"])
  return rules


def encoder_config(hc: dict, arch: str) -> dict:
  """The config fields BERT and RoBERTa read alike from config.json."""
  e, h = core.width_and_heads(arch, hc, "hidden_size", "num_attention_heads")
  return dict(vocab_size=hc.get("vocab_size", 30522), d_model=e,
              num_layers=hc.get("num_hidden_layers", 12), num_heads=h,
              mlp_dim=hc.get("intermediate_size", 3072),
              max_len=hc.get("max_position_embeddings", 512),
              type_vocab_size=hc.get("type_vocab_size", 2),
              norm_eps=float(hc.get("layer_norm_eps", 1e-12)),
              activation=core.act_from_hf(hc.get("hidden_act", "gelu"), "hidden_act"),
              dropout_rate=float(hc.get("hidden_dropout_prob", 0.1)),
              attention_dropout_rate=float(hc.get("attention_probs_dropout_prob", 0.1)))


def encoder_hf_config(c: dict) -> dict:
  """config.json fields BERT and RoBERTa write alike."""
  return dict(vocab_size=c["vocab_size"],
              hidden_size=c["d_model"], num_hidden_layers=c["num_layers"],
              num_attention_heads=c["num_heads"], intermediate_size=c["mlp_dim"],
              hidden_act=core.act_to_hf(c.get("activation", "gelu_exact")),
              max_position_embeddings=c["max_len"], type_vocab_size=c["type_vocab_size"],
              layer_norm_eps=c["norm_eps"], hidden_dropout_prob=c["dropout_rate"],
              attention_probs_dropout_prob=c["attention_dropout_rate"],
              position_embedding_type="absolute", tie_word_embeddings=True,
              torch_dtype="float32", dtype="float32")


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  core.require_values(arch, hc, (("position_embedding_type", "absolute"),
                                 ("is_decoder", False), ("add_cross_attention", False),
                                 ("tie_word_embeddings", True)))
  cfg = dict(encoder_config(hc, arch), nsp=arch == "BertForPreTraining")
  flags = dict(pooler="bert.pooler.dense.weight" in tensors,
               mlm_head=arch != "BertModel" or "cls.predictions.bias" in tensors,
               initializer_range=float(hc.get("initializer_range", 0.02)))
  return cfg, flags


def to_hf(c: dict) -> tuple[str, dict, dict]:
  arch = "BertForPreTraining" if c["nsp"] else "BertForMaskedLM"
  hc = dict(architectures=[arch], model_type="bert", **encoder_hf_config(c))
  return arch, hc, dict(pooler=c["with_pooler"], mlm_head=True, initializer_range=0.02)
