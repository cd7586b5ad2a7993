"""BART (Lewis et al., 2020): a denoising encoder-decoder, as Hugging Face's
BartForConditionalGeneration computes it.

- One token embedding shared by the encoder, the decoder and the output projection (tied),
  optionally multiplied by sqrt(d_model) (`scale_embedding`; False for bart-base/large).
- Learned positions with BART's offset: each stack has its own table of max_len + 2 rows and
  position p reads row p + 2 (fairseq reserved the first two rows for padding; they are
  parameters all the same, and counted).
- A LayerNorm on the summed embeddings of each stack (`layernorm_embedding`), then post-LN
  blocks (x = norm(x + sublayer(x))) with biases everywhere and exact (erf) GELU; decoder
  blocks are causal and cross-attend to the encoder output. With post-LN, BART has no norm
  after either stack: the last block's norm is the final one.
- `pre_norm=True` is the mBART-style layout: pre-LN blocks and a final LayerNorm after each
  stack (`encoder_norm`, `decoder_norm`), the embedding LayerNorm kept.
- `logits_bias=True` adds a learned [vocab] bias to the logits (HF's `final_logits_bias`).
  Hugging Face keeps that vector as a buffer (zeros in every published BART checkpoint) and
  `num_parameters()` does not count it, so by default (`logits_bias=False`) it is absent and
  `count_params` equals `num_parameters()`; `hf.load` turns it on only for a checkpoint whose
  buffer is not zero.

Apply: `(src_tokens [B, S], tgt_tokens [B, T], *, src_mask=None, deterministic=True)` ->
logits [B, T, vocab]; `tgt_tokens` are the decoder inputs (teacher forcing: the targets
shifted right behind a start token, as BART's decoder_start_token_id).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, LayerNorm, LearnedPositionEmbedding
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models import seq2seq
from jaxformer.models.family import Family, token_inputs
from jaxformer.models.stack import BlockStack
from jaxformer.ops.cross_entropy import Readout

POSITION_OFFSET = 2            # BART's learned positions start at row 2


class Bart(nn.Module):
  vocab_size: int
  d_model: int
  num_encoder_layers: int
  num_decoder_layers: int
  block: BlockSettings                # post-LN, gelu_exact, biases: see FAMILY
  max_len: int = 1024                 # positions per stack (tables have max_len + 2 rows)
  scale_embedding: bool = False       # token embeddings * sqrt(d_model)
  logits_bias: bool = False           # a learned [vocab] bias on the logits (final_logits_bias)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    b = self.block
    norm = lambda name: LayerNorm(b.norm_eps, use_bias=b.use_bias, name=name, **kw)
    self.dropout = nn.Dropout(b.dropout_rate)
    self.embed = Embed(self.vocab_size, self.d_model, name="embed", **kw)
    rows = self.max_len + POSITION_OFFSET
    self.encoder_pos_embed = LearnedPositionEmbedding(rows, self.d_model,
                                                      name="encoder_pos_embed", **kw)
    self.decoder_pos_embed = LearnedPositionEmbedding(rows, self.d_model,
                                                      name="decoder_pos_embed", **kw)
    self.encoder_embed_norm = norm("encoder_embed_norm")
    self.decoder_embed_norm = norm("decoder_embed_norm")
    self.encoder = BlockStack(self.num_encoder_layers, b, kw, name="encoder")
    self.decoder = BlockStack(self.num_decoder_layers, b,
                              dict(kw, causal=True, cross_attention=True), name="decoder")
    if b.pre_norm:
      self.encoder_norm = norm("encoder_norm")
      self.decoder_norm = norm("decoder_norm")
    if self.logits_bias:
      self.final_logits_bias = self.param("final_logits_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("vocab",)), (self.vocab_size,), self.param_dtype)

  def _embed(self, tokens, pos_embed, embed_norm, deterministic):
    if tokens.shape[1] > self.max_len:
      raise ValueError(f"sequence length {tokens.shape[1]} exceeds model.max_len="
                       f"{self.max_len} (BART's learned positions); raise model.max_len or "
                       "shorten the input")
    x = self.embed(tokens)
    if self.scale_embedding:
      x = x * math.sqrt(self.d_model)
    x = x + pos_embed(jnp.arange(tokens.shape[1])[None] + POSITION_OFFSET)
    return self.dropout(embed_norm(x), deterministic=deterministic)

  def encode(self, src_tokens, *, src_mask=None, deterministic: bool = True):
    """src [B, S], src_mask [B, S] (1 = real token) -> encoder output [B, S, E]."""
    mask = None if src_mask is None else src_mask.astype(bool)[:, None, None, :]
    x = self._embed(src_tokens, self.encoder_pos_embed, self.encoder_embed_norm, deterministic)
    x = self.encoder(x, mask=mask, deterministic=deterministic)
    return self.encoder_norm(x) if self.block.pre_norm else x

  def decode(self, encoded, tgt_tokens, *, src_mask=None, deterministic: bool = True,
             return_hidden: bool = False):
    """encoder output [B, S, E], decoder inputs [B, T] -> logits [B, T, vocab] (float32)
    (`return_hidden`: the hidden states and `ops.cross_entropy.Readout` instead)."""
    context_mask = None if src_mask is None else src_mask.astype(bool)[:, None, None, :]
    x = self._embed(tgt_tokens, self.decoder_pos_embed, self.decoder_embed_norm, deterministic)
    x = self.decoder(x, encoded, context_mask=context_mask, deterministic=deterministic)
    if self.block.pre_norm:
      x = self.decoder_norm(x)
    if return_hidden:
      return x, Readout(self.embed.embedding,
                        self.final_logits_bias if self.logits_bias else None, vocab_major=True)
    logits = self.embed.attend(x).astype(jnp.float32)
    if self.logits_bias:
      logits = logits + self.final_logits_bias.astype(jnp.float32)
    return logits

  def __call__(self, src_tokens, tgt_tokens, *, src_mask=None, deterministic: bool = True,
               return_hidden: bool = False):
    """src [B, S], tgt [B, T] (teacher forcing), src_mask [B, S] (1 = real) -> [B, T, vocab]
    (`return_hidden`: see `seq2seq.teacher_forced`)."""
    return seq2seq.teacher_forced(self, src_tokens, tgt_tokens, src_mask=src_mask,
                                  deterministic=deterministic, return_hidden=return_hidden)


def _validate(c: dict):
  if c["parametrization"] != "standard":
    raise ValueError(f"model.parametrization={c['parametrization']!r} is not available for the "
                     "bart family: its one token embedding is both the input of two stacks "
                     "and the tied readout, which μP's width rules (separate input and output "
                     "multipliers) do not cover; use 'standard' (μP: the decoder, bert and vit "
                     "families)")
  if c["norm"] != "layernorm":
    raise ValueError(f"model.norm={c['norm']!r}: BART's embedding and block norms are "
                     "LayerNorms; use norm='layernorm'")


FAMILY = Family(
    name="bart", module=Bart, task="bart_denoising", example_inputs=token_inputs(2),
    embeddings=("embed", "encoder_pos_embed", "decoder_pos_embed"),
    heads=("final_logits_bias",),           # the output projection is tied to `embed`
    block_defaults=dict(pre_norm=False, use_bias=True, qkv_bias=True, norm_eps=1e-5,
                        activation="gelu_exact", dropout_rate=0.1, attention_dropout_rate=0.0),
    embedding_lookups=2, attention_flops=seq2seq.attention_flops, validate=_validate,
    hf_converter="jaxformer.convert.hf.bart")
