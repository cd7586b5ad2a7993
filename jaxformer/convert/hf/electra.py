"""family='electra' <-> ElectraForPreTraining (role 'discriminator'), ElectraForMaskedLM
(role 'generator').

transformers' models/electra/modeling_electra.py: BERT's post-norm encoder layers over
embeddings of width `embedding_size`, projected to `hidden_size` by `embeddings_project`
when the two differ. The discriminator head `discriminator_predictions` (dense, hidden_act,
dense to one logit) becomes `disc_dense` / `disc_out`; the generator head
`generator_predictions` (dense to embedding_size, GELU, LayerNorm) becomes `gen_dense` /
`gen_norm`, and `generator_lm_head`, tied to the word embeddings, keeps only its bias
(`gen_bias`). A role='pretraining' model is two Hugging Face models: save each half of
`jaxformer.models.electra.split_pretraining(config, params)`.
"""

from __future__ import annotations

import numpy as np

from jaxformer.convert.hf import bert, core
from jaxformer.convert.hf.core import Rule

ARCHITECTURES = {"ElectraForPreTraining": "discriminator", "ElectraForMaskedLM": "generator"}
MODEL_TYPES = {"electra": "ElectraForPreTraining"}
PREFIXES = {"discriminator": "electra.", "generator": "electra."}
_HEADS = "discriminator_predictions|generator_predictions|generator_lm_head"
# The task heads sit outside the `electra.` base model: undo the prefix core gave them.
RENAMES = ((rf"^electra\.({_HEADS})\.", r"\1."),
           (r"LayerNorm\.gamma$", "LayerNorm.weight"), (r"LayerNorm\.beta$", "LayerNorm.bias"))
STACK = "encoder"
FIXED = dict(num_kv_heads=None, head_dim=None, window=None, use_bias=True, qkv_bias=True,
             ffn="mlp", norm="layernorm", pre_norm=False, num_experts=0)
KEEP = ("electra.embeddings.word_embeddings.weight",)
_WORDS = "electra.embeddings.word_embeddings.weight"


def unused(name: str, tensors: dict, config: dict) -> str | None:
  if name == "generator_lm_head.weight":          # tied to the word embeddings
    emb = tensors.get(_WORDS)
    if emb is not None and emb.shape == tensors[name].shape and np.array_equal(
        emb, tensors[name]):
      return ""
  return None


def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  d, f, v = c["d_model"], c["mlp_dim"], c["vocab_size"]
  e = c.get("embedding_size") or d
  rules = [
      Rule("embed/embedding", (v, e), (_WORDS,), **core.SAME),
      Rule("pos_embed/embedding", (c["max_len"], e),
           ("electra.embeddings.position_embeddings.weight",), **core.SAME),
      Rule("type_embed/embedding", (c["type_vocab_size"], e),
           ("electra.embeddings.token_type_embeddings.weight",), **core.SAME)]
  rules += core.norm_rules("embed_norm", "electra.embeddings.LayerNorm", e)
  if e != d:
    rules += core.linear_rules("embed_proj", "electra.embeddings_project", e, d)
  for i in range(c["num_layers"]):
    p, t = f"encoder/layers_{i}/block", f"electra.encoder.layer.{i}"
    attention, wi, wo = core.encoder_layer_rules(p, t, "attention.self", e=d,
                                                 h=c["num_heads"], f=f, qkv_bias=True)
    rules += attention
    rules += core.norm_rules(f"{p}/self_attention_norm", f"{t}.attention.output.LayerNorm", d)
    rules += wi + wo
    rules += core.norm_rules(f"{p}/ffn_norm", f"{t}.output.LayerNorm", d)
  if kind == "discriminator":
    rules += core.linear_rules("disc_dense", "discriminator_predictions.dense", d, d)
    rules += core.linear_rules("disc_out", "discriminator_predictions.dense_prediction", d, 1)
  else:
    rules += core.linear_rules("gen_dense", "generator_predictions.dense", d, e)
    rules += core.norm_rules("gen_norm", "generator_predictions.LayerNorm", e)
    rules.append(Rule("gen_bias", (v,), ("generator_lm_head.bias",), **core.SAME))
  return rules


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  core.require_values(arch, hc, (("position_embedding_type", "absolute"),
                                 ("is_decoder", False), ("add_cross_attention", False),
                                 ("tie_word_embeddings", True)))
  cfg = dict(bert.encoder_config(hc, arch), embedding_size=hc.get("embedding_size", 128),
             role=kind, mlp_dim=hc.get("intermediate_size", 1024))   # ElectraConfig's default
  return cfg, {}


def to_hf(c: dict) -> tuple[str, dict, dict]:
  role = c.get("role", "pretraining")
  if role not in ("discriminator", "generator"):
    raise ValueError(f"model.role={role!r} is a generator and a discriminator, two Hugging "
                     "Face models: save each half of jaxformer.models.electra."
                     "split_pretraining(config, params) (ElectraForPreTraining, "
                     "ElectraForMaskedLM)")
  arch = "ElectraForPreTraining" if role == "discriminator" else "ElectraForMaskedLM"
  hc = dict(architectures=[arch], model_type="electra", vocab_size=c["vocab_size"],
            embedding_size=c.get("embedding_size") or c["d_model"],
            hidden_size=c["d_model"], num_hidden_layers=c["num_layers"],
            num_attention_heads=c["num_heads"], intermediate_size=c["mlp_dim"],
            hidden_act=core.act_to_hf(c.get("activation", "gelu_exact")),
            max_position_embeddings=c.get("max_len", 512),
            type_vocab_size=c.get("type_vocab_size", 2), layer_norm_eps=c.get("norm_eps", 1e-12),
            hidden_dropout_prob=c.get("dropout_rate", 0.1),
            attention_probs_dropout_prob=c.get("attention_dropout_rate", 0.1),
            position_embedding_type="absolute", tie_word_embeddings=True,
            torch_dtype="float32", dtype="float32")
  return arch, hc, {}
