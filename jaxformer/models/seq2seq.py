"""The original encoder-decoder Transformer (Vaswani et al., 2017).

Post-norm blocks, sinusoidal positions, one embedding shared by source, target and the
output softmax (embeddings scaled by sqrt(d_model)), causal decoder self-attention and
cross-attention to the encoder output.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, make_norm
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models.family import Family, head_dim, token_inputs
from jaxformer.models.stack import BlockStack
from jaxformer.ops import positions as pos_ops
from jaxformer.ops.cross_entropy import Readout


class EncoderDecoder(nn.Module):
  vocab_size: int
  d_model: int
  num_encoder_layers: int
  num_decoder_layers: int
  block: BlockSettings                # post-norm (pre_norm=True adds final norms), relu
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    b = self.block
    self.dropout = nn.Dropout(b.dropout_rate)
    self.embed = Embed(self.vocab_size, self.d_model, name="embed",
                       embedding_init=nn.initializers.normal(self.d_model ** -0.5), **kw)
    self.encoder = BlockStack(self.num_encoder_layers, b, kw, name="encoder")
    self.decoder = BlockStack(self.num_decoder_layers, b,
                              dict(kw, causal=True, cross_attention=True), name="decoder")
    if b.pre_norm:
      self.encoder_norm = make_norm(b.norm, epsilon=b.norm_eps, name="encoder_norm", **kw)
      self.decoder_norm = make_norm(b.norm, epsilon=b.norm_eps, name="decoder_norm", **kw)

  def _embed(self, tokens, deterministic):
    x = self.embed(tokens) * math.sqrt(self.d_model)
    x = x + pos_ops.sinusoidal(jnp.arange(tokens.shape[1]), self.d_model, dtype=x.dtype)
    return self.dropout(x, deterministic=deterministic)

  def encode(self, src_tokens, *, src_mask=None, deterministic: bool = True):
    mask = None if src_mask is None else src_mask.astype(bool)[:, None, None, :]
    x = self.encoder(self._embed(src_tokens, deterministic), mask=mask,
                     deterministic=deterministic)
    return self.encoder_norm(x) if self.block.pre_norm else x

  def decode(self, encoded, tgt_tokens, *, src_mask=None, deterministic: bool = True,
             return_hidden: bool = False):
    context_mask = None if src_mask is None else src_mask.astype(bool)[:, None, None, :]
    x = self.decoder(self._embed(tgt_tokens, deterministic), encoded,
                     context_mask=context_mask, deterministic=deterministic)
    if self.block.pre_norm:
      x = self.decoder_norm(x)
    if return_hidden:
      return x, Readout(self.embed.embedding, vocab_major=True)
    return self.embed.attend(x).astype(jnp.float32)

  def __call__(self, src_tokens, tgt_tokens, *, src_mask=None, deterministic: bool = True,
               return_hidden: bool = False):
    """src [B, S], tgt [B, T] (teacher forcing), src_mask [B, S] (1 = real) -> [B, T, vocab]
    (`return_hidden`: see `teacher_forced`)."""
    return teacher_forced(self, src_tokens, tgt_tokens, src_mask=src_mask,
                          deterministic=deterministic, return_hidden=return_hidden)


def teacher_forced(model, src_tokens, tgt_tokens, *, src_mask=None, deterministic=True,
                   return_hidden=False):
  """An encoder-decoder's forward pass (`model.encode`, then `model.decode` of the target
  inputs), the shapes checked first: what every encoder-decoder family's __call__ does.
  With `return_hidden` (the train step's chunked loss) the decoder's final hidden states
  [B, T, E] and its output head (`ops.cross_entropy.Readout`) instead of the logits."""
  for name, t in (("src_tokens", src_tokens), ("tgt_tokens", tgt_tokens)):
    if t.ndim != 2:
      raise ValueError(f"{name} must be [batch, length]; got shape {t.shape}")
  encoded = model.encode(src_tokens, src_mask=src_mask, deterministic=deterministic)
  extra = {"return_hidden": True} if return_hidden else {}
  return model.decode(encoded, tgt_tokens, src_mask=src_mask, deterministic=deterministic,
                      **extra)


def attention_flops(cfg: dict, seq_len: int) -> tuple[int, int, int]:
  """Encoder self-, decoder self- and decoder cross-attention, source and target of seq_len
  (every encoder-decoder family's `Family.attention_flops`)."""
  width = cfg["num_heads"] * head_dim(cfg)
  return cfg["num_encoder_layers"] + 2 * cfg["num_decoder_layers"], seq_len, width


def _validate(c: dict):
  if c["parametrization"] != "standard":
    raise ValueError(f"model.parametrization={c['parametrization']!r} is not available for the "
                     "encoder-decoder family: its one embedding is initialised with std "
                     "d_model^-1/2, scaled by sqrt(d_model) as input and shared with the "
                     "readout, which μP's width rules do not cover; use 'standard' (μP: the "
                     "decoder, bert and vit families)")


FAMILY = Family(
    name="seq2seq", module=EncoderDecoder, task="seq2seq", example_inputs=token_inputs(2),
    embeddings=("embed",), heads=(),           # the output head is tied to `embed`
    block_defaults=dict(pre_norm=False, qkv_bias=True, norm_eps=1e-6, activation="relu",
                        dropout_rate=0.1),
    embedding_lookups=2, attention_flops=attention_flops, validate=_validate)
