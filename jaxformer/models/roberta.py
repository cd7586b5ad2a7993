"""RoBERTa (Liu et al., 2019): BERT's architecture (`models.bert.Bert`) with RoBERTa's
defaults: position ids offset past the padding id (`pad_id=1`: tokens start at position 2,
padding sits at position 1, so `max_len` = 512 + 2 = 514), one token type, LayerNorm eps
1e-5, no pooler in the masked-LM model (`with_pooler=True` adds `RobertaModel`'s) and no
next-sentence prediction. It trains with the 'mlm' task, whose masks are re-drawn for every
batch as a function of (seed, step, row) (RoBERTa's dynamic masking; `data/text.py`).
"""

from __future__ import annotations

from jaxformer.models.bert import Bert
from jaxformer.models.family import Family, token_inputs


class Roberta(Bert):
  """`Bert` with RoBERTa's defaults (see the module docstring)."""
  max_len: int = 514
  type_vocab_size: int = 1
  pad_id: int | None = 1
  with_pooler: bool = False


def _validate(c: dict):
  if c["nsp"]:
    raise ValueError("model.nsp=True: RoBERTa has no next-sentence prediction (it was "
                     "dropped from BERT's recipe); use model.family='bert' with model.nsp=True")
  if c["pad_id"] is None:
    raise ValueError("model.pad_id=None: RoBERTa's positions are offset past the padding id; "
                     "set model.pad_id (1 in RoBERTa's vocabulary), or use model.family='bert'")
  if not 0 <= c["pad_id"] < c["vocab_size"]:
    raise ValueError(f"model.pad_id={c['pad_id']} must be a token id in [0, "
                     f"model.vocab_size={c['vocab_size']})")


FAMILY = Family(
    name="roberta", module=Roberta, task="mlm", example_inputs=token_inputs(1),
    embeddings=("embed", "pos_embed", "type_embed"),
    heads=("mlm_transform", "mlm_norm", "mlm_bias"),   # the pooler is part of RobertaModel
    block_defaults=dict(pre_norm=False, qkv_bias=True, norm_eps=1e-5, activation="gelu_exact",
                        dropout_rate=0.1, attention_dropout_rate=0.1),
    embedding_lookups=1, validate=_validate, hf_converter="jaxformer.convert.hf.roberta")
