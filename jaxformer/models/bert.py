"""BERT (Devlin et al., 2019): post-norm encoder, token-type embeddings, pooler, MLM head;
optionally the next-sentence-prediction head (`nsp=True`) and RoBERTa's positions (`pad_id`).

`Bert` is also RoBERTa's module (`models.roberta`): the two differ only in configuration.
Options:
- `nsp=True`: BERT's pre-training heads (`BertForPreTraining`): a 2-way next-sentence
  classifier on the pooled [CLS] state; the call returns {'mlm': [B, T, vocab], 'nsp': [B, 2]}
  (the task 'mlm_nsp' trains it). With `nsp=False` (default) the call returns MLM logits.
- `pad_id`: RoBERTa's position ids (Hugging Face's `create_position_ids_from_input_ids`):
  tokens equal to `pad_id` take position `pad_id` and the others count up from `pad_id + 1`,
  so the learned table needs max_len >= seq_len + pad_id + 1 (514 for 512 tokens and
  pad_id=1). None (BERT): positions 0 .. T-1.
- `with_pooler=False`: no pooler (RoBERTa's / BERT's masked-LM models have none).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, LayerNorm, LearnedPositionEmbedding
from jaxformer.layers.dense import dense
from jaxformer.layers.mlp import activation_fn
from jaxformer.layers.parametrization import output_multiplier, scale_output
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models.family import Family, token_inputs
from jaxformer.models.stack import BlockStack
from jaxformer.ops.cross_entropy import Readout


def position_ids(tokens, pad_id: int | None):
  """[B, T] position ids of `tokens`: 0 .. T-1 (pad_id None), or RoBERTa's: tokens equal to
  pad_id sit at position pad_id, the others count up from pad_id + 1."""
  if pad_id is None:
    return jnp.arange(tokens.shape[1])[None]
  real = (tokens != pad_id).astype(jnp.int32)
  return jnp.cumsum(real, axis=1) * real + pad_id


class Bert(nn.Module):
  vocab_size: int
  d_model: int
  num_layers: int
  block: BlockSettings                # post-norm, gelu_exact, dropout 0.1: see FAMILY
  max_len: int = 512
  type_vocab_size: int = 2
  pad_id: int | None = None           # RoBERTa's position offset (see the module docstring)
  with_pooler: bool = True
  nsp: bool = False                   # next-sentence head: the call returns {'mlm', 'nsp'}
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    eps = self.block.norm_eps
    self.dropout = nn.Dropout(self.block.dropout_rate)
    self.embed = Embed(self.vocab_size, self.d_model, name="embed", **kw)
    self.pos_embed = LearnedPositionEmbedding(self.max_len, self.d_model, name="pos_embed", **kw)
    # (a table of 1-2 rows: not split over the "vocab" mesh axis, which need not divide it)
    self.type_embed = Embed(self.type_vocab_size, self.d_model, name="type_embed",
                            axes=(None, "embed"), **kw)
    self.embed_norm = LayerNorm(eps, name="embed_norm", **kw)
    self.encoder = BlockStack(self.num_layers, self.block, kw, name="encoder")
    if self.with_pooler:
      self.pooler = dense(self.d_model, ("embed", "mlp"), use_bias=True, name="pooler", **kw)
    if self.nsp:
      self.nsp_head = dense(2, ("embed", None), use_bias=True, name="nsp_head", **kw)
    self.mlm_transform = dense(self.d_model, ("embed", "mlp"), use_bias=True,
                               name="mlm_transform", **kw)
    self.mlm_norm = LayerNorm(eps, name="mlm_norm", **kw)
    self.mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(
        nn.initializers.zeros, ("vocab",)), (self.vocab_size,), self.param_dtype)

  def positions(self, tokens):
    """[B, T] position ids (`position_ids`), checked against the position table."""
    length = tokens.shape[1]
    if self.pad_id is not None and length + self.pad_id >= self.max_len:
      raise ValueError(f"sequence length {length} with model.pad_id={self.pad_id} needs "
                       f"model.max_len >= {length + self.pad_id + 1} (positions start at "
                       f"pad_id + 1); raise model.max_len or shorten the sequence")
    return position_ids(tokens, self.pad_id)

  def encode(self, tokens, *, token_type_ids=None, attention_mask=None,
             deterministic: bool = True):
    """-> (sequence output [B, T, E], pooled [B, E] = tanh(W h_[CLS] + b), or None without
    a pooler)."""
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, length]; got shape {tokens.shape}")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(tokens)
    x = (self.embed(tokens) + self.pos_embed(self.positions(tokens))
         + self.type_embed(token_type_ids))
    x = self.dropout(self.embed_norm(x), deterministic=deterministic)
    mask = None if attention_mask is None else attention_mask.astype(bool)[:, None, None, :]
    x = self.encoder(x, mask=mask, deterministic=deterministic)
    return x, (jnp.tanh(self.pooler(x[:, 0])) if self.with_pooler else None)

  def __call__(self, tokens, *, token_type_ids=None, attention_mask=None,
               deterministic: bool = True, return_hidden: bool = False):
    """tokens [B, T]; attention_mask [B, T] (1 = real token) -> MLM logits [B, T, vocab]
    (with `nsp`: {'mlm': those, 'nsp': next-sentence logits [B, 2]}). With `return_hidden`
    (the train step's chunked loss) the MLM head's hidden states [B, T, E] and its readout
    (`ops.cross_entropy.Readout`: tied embedding, bias, μP multiplier) replace the MLM
    logits."""
    x, pooled = self.encode(tokens, token_type_ids=token_type_ids,
                            attention_mask=attention_mask, deterministic=deterministic)
    if pooled is not None:
      self.sow("intermediates", "pooled", pooled)
    h = self.mlm_norm(activation_fn(self.block.activation or "gelu_exact")(self.mlm_transform(x)))
    if return_hidden:
      logits = (h, Readout(self.embed.embedding, self.mlm_bias, vocab_major=True,
                           scale=output_multiplier(self.block, self.d_model)))
    else:
      logits = scale_output(self.embed.attend(h), self.block, self.d_model) + self.mlm_bias
      logits = logits.astype(jnp.float32)
    if not self.nsp:
      return logits
    nsp = scale_output(self.nsp_head(pooled), self.block, self.d_model)
    return {"mlm": logits, "nsp": nsp.astype(jnp.float32)}


def _validate(c: dict):
  if c["nsp"] and not c["with_pooler"]:
    raise ValueError("model.nsp=True needs the pooler (the next-sentence head reads the "
                     "pooled [CLS] state): set model.with_pooler=True")
  if c["pad_id"] is not None and not 0 <= c["pad_id"] < c["vocab_size"]:
    raise ValueError(f"model.pad_id={c['pad_id']} must be a token id in [0, "
                     f"model.vocab_size={c['vocab_size']}), or None for positions 0..T-1")


FAMILY = Family(
    name="bert", module=Bert, task="mlm", example_inputs=token_inputs(1),
    embeddings=("embed", "pos_embed", "type_embed"),
    # the pooler is part of BertModel; nsp_head exists with model.nsp=True
    heads=("mlm_transform", "mlm_norm", "mlm_bias", "nsp_head"),
    block_defaults=dict(pre_norm=False, qkv_bias=True, norm_eps=1e-12, activation="gelu_exact",
                        dropout_rate=0.1, attention_dropout_rate=0.1),
    embedding_lookups=1, validate=_validate, hf_converter="jaxformer.convert.hf.bert")
