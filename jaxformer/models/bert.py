"""BERT (Devlin et al., 2019): post-norm encoder, token-type embeddings, pooler, MLM head."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, LayerNorm, LearnedPositionEmbedding
from jaxformer.layers.dense import dense
from jaxformer.layers.mlp import activation_fn
from jaxformer.layers.parametrization import scale_output
from jaxformer.layers.settings import BlockSettings
from jaxformer.models.family import Family, token_inputs
from jaxformer.models.stack import BlockStack


class Bert(nn.Module):
  vocab_size: int
  d_model: int
  num_layers: int
  block: BlockSettings                # post-norm, gelu_exact, dropout 0.1: see FAMILY
  max_len: int = 512
  type_vocab_size: int = 2
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    eps = self.block.norm_eps
    self.dropout = nn.Dropout(self.block.dropout_rate)
    self.embed = Embed(self.vocab_size, self.d_model, name="embed", **kw)
    self.pos_embed = LearnedPositionEmbedding(self.max_len, self.d_model, name="pos_embed", **kw)
    self.type_embed = Embed(self.type_vocab_size, self.d_model, name="type_embed", **kw)
    self.embed_norm = LayerNorm(eps, name="embed_norm", **kw)
    self.encoder = BlockStack(self.num_layers, self.block, kw, name="encoder")
    self.pooler = dense(self.d_model, ("embed", "mlp"), use_bias=True, name="pooler", **kw)
    self.mlm_transform = dense(self.d_model, ("embed", "mlp"), use_bias=True,
                               name="mlm_transform", **kw)
    self.mlm_norm = LayerNorm(eps, name="mlm_norm", **kw)
    self.mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(
        nn.initializers.zeros, ("vocab",)), (self.vocab_size,), self.param_dtype)

  def encode(self, tokens, *, token_type_ids=None, attention_mask=None,
             deterministic: bool = True):
    """-> (sequence output [B, T, E], pooled [B, E] = tanh(W h_[CLS] + b))."""
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, length]; got shape {tokens.shape}")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(tokens)
    x = (self.embed(tokens) + self.pos_embed(jnp.arange(tokens.shape[1])[None])
         + self.type_embed(token_type_ids))
    x = self.dropout(self.embed_norm(x), deterministic=deterministic)
    mask = None if attention_mask is None else attention_mask.astype(bool)[:, None, None, :]
    x = self.encoder(x, mask=mask, deterministic=deterministic)
    return x, jnp.tanh(self.pooler(x[:, 0]))

  def __call__(self, tokens, *, token_type_ids=None, attention_mask=None,
               deterministic: bool = True):
    """tokens [B, T]; attention_mask [B, T] (1 = real token) -> MLM logits [B, T, vocab]."""
    x, pooled = self.encode(tokens, token_type_ids=token_type_ids,
                            attention_mask=attention_mask, deterministic=deterministic)
    self.sow("intermediates", "pooled", pooled)
    h = self.mlm_norm(activation_fn(self.block.activation or "gelu_exact")(self.mlm_transform(x)))
    logits = scale_output(self.embed.attend(h), self.block, self.d_model) + self.mlm_bias
    return logits.astype(jnp.float32)


FAMILY = Family(
    name="bert", module=Bert, task="mlm", example_inputs=token_inputs(1),
    embeddings=("embed", "pos_embed", "type_embed"),
    heads=("mlm_transform", "mlm_norm", "mlm_bias"),   # the pooler is part of BertModel
    block_defaults=dict(pre_norm=False, qkv_bias=True, norm_eps=1e-12, activation="gelu_exact",
                        dropout_rate=0.1, attention_dropout_rate=0.1),
    embedding_lookups=1, hf_converter="jaxformer.convert.hf.bert")
