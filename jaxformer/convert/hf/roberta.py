"""family='roberta' <-> RobertaForMaskedLM, RobertaModel.

transformers' models/roberta/modeling_roberta.py: BERT's layers under `roberta.*` (the same
mapping, `bert.encoder_rules`), the MLM head `lm_head.{dense,layer_norm,bias}` with its decoder
tied to the word embeddings, `pad_token_id` -> `model.pad_id` (the position offset). The head's
GELU is fixed in transformers (not `hidden_act`), so only hidden_act='gelu' converts.
RobertaForMaskedLM has no pooler (`with_pooler=False`); RobertaModel loads with the pooler
and a freshly initialised MLM head (with a warning). A model with the pooler saves it next to
RobertaForMaskedLM's tensors (transformers ignores it there; `hf.load` reads it back).
"""

from __future__ import annotations

from jaxformer.convert.hf import bert, core
from jaxformer.convert.hf.core import Rule

ARCHITECTURES = {"RobertaForMaskedLM": "roberta", "RobertaModel": "roberta"}
MODEL_TYPES = {"roberta": "RobertaForMaskedLM"}
PREFIXES = {"roberta": "roberta."}
RENAMES = ()
STACK = "encoder"
FIXED = dict(bert.FIXED, activation="gelu_exact", nsp=False)
FIXED.pop("pad_id")
KEEP = ("roberta.embeddings.word_embeddings.weight", "lm_head.bias")
# config.json token ids that come from the model config, never from a tokenizer (core.save)
MODEL_TOKEN_IDS = ("pad_token_id",)     # model.pad_id, the offset of the position ids


def unused(name: str, tensors: dict, config: dict) -> str | None:
  if name == "lm_head.decoder.weight":
    return bert.tied(tensors, name, "roberta.embeddings.word_embeddings.weight")
  if name == "lm_head.decoder.bias":
    return bert.tied(tensors, name, "lm_head.bias")
  return None


def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  return bert.encoder_rules(c, flags, "roberta") + bert.mlm_head_rules(
      c, flags, "lm_head.dense", "lm_head.layer_norm", "lm_head.bias")


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  core.require_values(arch, hc, (("position_embedding_type", "absolute"),
                                 ("is_decoder", False), ("add_cross_attention", False),
                                 ("tie_word_embeddings", True), ("hidden_act", "gelu")))
  pooler = "roberta.pooler.dense.weight" in tensors
  cfg = dict(bert.encoder_config(hc, arch), pad_id=hc.get("pad_token_id", 1),
             with_pooler=pooler)
  flags = dict(pooler=pooler, mlm_head=arch != "RobertaModel" or "lm_head.bias" in tensors,
               initializer_range=float(hc.get("initializer_range", 0.02)))
  return cfg, flags


def to_hf(c: dict) -> tuple[str, dict, dict]:
  hc = dict(architectures=["RobertaForMaskedLM"], model_type="roberta",
            **bert.encoder_hf_config(c), pad_token_id=c["pad_id"])
  return "RobertaForMaskedLM", hc, dict(pooler=c["with_pooler"], mlm_head=True,
                                        initializer_range=0.02)
