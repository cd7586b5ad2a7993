"""Full models, the family registry and `build(config.model)` -> a linen Module.

Config keys are the family module's dataclass fields plus, for Transformer families, the
shared block settings (`jaxformer.layers.block_settings`), so a config key means exactly one
setting. Each family's facts (task, example inputs, embeddings/heads, block defaults, HF
converter) live in its `FAMILY` entry (`family.Family`), registered here; `build` validates
before anything compiles.
"""

from __future__ import annotations

from jaxformer.layers.block_settings import BlockSettings, MoESettings
from jaxformer.models import (bart, bert, captioner, deberta, electra, gpt, rnn_seq2seq,
                              roberta, seq2seq, t5, vit)
from jaxformer.models.bart import Bart
from jaxformer.models.bert import Bert
from jaxformer.models.captioner import Captioner
from jaxformer.models.deberta import Deberta
from jaxformer.models.electra import Electra
from jaxformer.models.family import Family, image_inputs, token_inputs
from jaxformer.models.gpt import DecoderLM
from jaxformer.models.registry import (ConfigField, build, config_as_dict, config_fields, get,
                                       names, register, unregister, validated,
                                       with_defaults)
from jaxformer.models.rnn_seq2seq import RnnSeq2Seq
from jaxformer.models.roberta import Roberta
from jaxformer.models.seq2seq import EncoderDecoder
from jaxformer.models.settings import ModelSettings, settings_class, settings_of
from jaxformer.models.settings import parse as parse_settings
from jaxformer.models.t5 import T5
from jaxformer.models.vit import ViT

for _module in (gpt, bert, roberta, seq2seq, vit, rnn_seq2seq, bart, t5, deberta, electra,
                captioner):
  register(_module.FAMILY)

__all__ = ["build", "config_as_dict", "config_fields", "with_defaults", "get", "names",
           "register", "unregister", "validated", "ModelSettings", "parse_settings",
           "settings_class", "settings_of",
           "Family", "ConfigField", "token_inputs", "image_inputs", "BlockSettings",
           "MoESettings", "DecoderLM", "Bert", "Roberta", "EncoderDecoder", "ViT", "RnnSeq2Seq",
           "Bart", "T5", "Deberta", "Electra", "Captioner"]
