"""T5 (Raffel et al., 2020): the text-to-text encoder-decoder, v1.0 and v1.1 layouts.

- Pre-norm blocks with RMS layer norm (scale only: no bias, no mean subtraction) and final
  norms per stack; no biases in any projection.
- No absolute positions: each stack adds a learned relative position bias to its
  self-attention logits, one table [num_buckets, heads] per stack, looked up once per
  forward pass and shared by all of the stack's layers (T5 keeps the table in the stack's
  first layer and hands its bias on). Buckets are log-spaced beyond num_buckets / 4
  (encoder, bidirectional) or num_buckets / 2 (decoder, causal) positions up to
  `relative_max_distance` (`ops.positions.relative_position_buckets`); cross-attention has
  no position bias. The bias enters as the `bias=` of the one `dot_product_attention`.
- Attention logits are not scaled by 1/sqrt(d_kv) (`attention_scale=1.0`); the query
  projection's init is divided by sqrt(d_kv) instead, as T5 initialises it. The head dim
  (`head_dim`, T5's d_kv) is independent of d_model / num_heads.
- v1.0: ReLU FFN (`ffn='mlp'`, `activation='relu'`), output head tied to the token embedding
  with the decoder output scaled by d_model^-1/2 (`tie_embeddings=True`).
  v1.1: gated-GELU FFN (`ffn='swiglu'`, `activation='gelu'`: gelu_new(x W_0) * (x W_1)),
  untied `lm_head`, no output scaling (`tie_embeddings=False`).
- Embeddings are not scaled; dropout on the embeddings, every residual branch, the attention
  probabilities and after each final norm (T5's dropout placement, except the one inside its
  FFN between the two projections).

The decoder is teacher-forced: `tgt_tokens` are the decoder inputs (the targets shifted right
behind T5's decoder start id, the pad id 0), see the span-corruption data
(`jaxformer.data.span_corruption`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, make_norm
from jaxformer.layers.dense import dense
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models import seq2seq
from jaxformer.models.family import Family, token_inputs
from jaxformer.models.stack import BlockStack
from jaxformer.ops import positions as pos_ops
from jaxformer.ops.cross_entropy import Readout


class RelativePositionBias(nn.Module):
  """T5's learned relative position bias: a table [num_buckets, num_heads] looked up at the
  bucket of each (query, key) pair -> float32 [1, H, Tq, Tk]."""
  num_buckets: int
  max_distance: int
  num_heads: int
  bidirectional: bool
  param_dtype: Any = jnp.float32
  embedding_init: Any = nn.initializers.normal(1.0)

  @nn.compact
  def __call__(self, q_len: int, k_len: int):
    table = self.param("embedding", nn.with_logical_partitioning(
        self.embedding_init, (None, "heads")), (self.num_buckets, self.num_heads),
        self.param_dtype)
    buckets = pos_ops.relative_position_buckets(
        jnp.arange(q_len), jnp.arange(k_len), bidirectional=self.bidirectional,
        num_buckets=self.num_buckets, max_distance=self.max_distance)
    bias = jnp.take(table.astype(jnp.float32), buckets, axis=0)      # [Tq, Tk, H]
    return jnp.transpose(bias, (2, 0, 1))[None]


class T5(nn.Module):
  vocab_size: int
  d_model: int
  num_encoder_layers: int
  num_decoder_layers: int
  block: BlockSettings                # pre-norm rmsnorm, no biases, scale 1: see FAMILY
  relative_buckets: int = 32          # T5's relative_attention_num_buckets
  relative_max_distance: int = 128    # T5's relative_attention_max_distance
  tie_embeddings: bool = True         # v1.0: tied head, output x d_model^-1/2; v1.1: False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    b = self.block
    self.dropout = nn.Dropout(b.dropout_rate)
    self.embed = Embed(self.vocab_size, self.d_model, name="embed",
                       embedding_init=nn.initializers.normal(1.0), **kw)
    bias = dict(num_buckets=self.relative_buckets, max_distance=self.relative_max_distance,
                num_heads=b.num_heads, param_dtype=self.param_dtype,
                embedding_init=nn.initializers.normal(self.d_model ** -0.5))
    self.encoder_relative_bias = RelativePositionBias(bidirectional=True, **bias)
    self.decoder_relative_bias = RelativePositionBias(bidirectional=False, **bias)
    self.encoder = BlockStack(self.num_encoder_layers, b, kw, name="encoder")
    self.decoder = BlockStack(self.num_decoder_layers, b,
                              dict(kw, causal=True, cross_attention=True), name="decoder")
    self.encoder_norm = make_norm(b.norm, epsilon=b.norm_eps, name="encoder_norm", **kw)
    self.decoder_norm = make_norm(b.norm, epsilon=b.norm_eps, name="decoder_norm", **kw)
    if not self.tie_embeddings:
      self.lm_head = dense(self.vocab_size, ("embed", "vocab"), name="lm_head", **kw)

  def encode(self, src_tokens, *, src_mask=None, deterministic: bool = True):
    mask = None if src_mask is None else src_mask.astype(bool)[:, None, None, :]
    t = src_tokens.shape[1]
    x = self.dropout(self.embed(src_tokens), deterministic=deterministic)
    x = self.encoder(x, mask=mask, bias=self.encoder_relative_bias(t, t),
                     deterministic=deterministic)
    return self.dropout(self.encoder_norm(x), deterministic=deterministic)

  def decode(self, encoded, tgt_tokens, *, src_mask=None, deterministic: bool = True,
             return_hidden: bool = False):
    context_mask = None if src_mask is None else src_mask.astype(bool)[:, None, None, :]
    t = tgt_tokens.shape[1]
    x = self.dropout(self.embed(tgt_tokens), deterministic=deterministic)
    x = self.decoder(x, encoded, context_mask=context_mask,
                     bias=self.decoder_relative_bias(t, t), deterministic=deterministic)
    x = self.dropout(self.decoder_norm(x), deterministic=deterministic)
    if return_hidden:
      if self.tie_embeddings:
        return x * self.d_model ** -0.5, Readout(self.embed.embedding, vocab_major=True)
      return x, Readout(nn.unbox(self.variables["params"]["lm_head"]["kernel"]))
    if self.tie_embeddings:
      return self.embed.attend(x * self.d_model ** -0.5).astype(jnp.float32)
    return self.lm_head(x).astype(jnp.float32)

  def __call__(self, src_tokens, tgt_tokens, *, src_mask=None, deterministic: bool = True,
               return_hidden: bool = False):
    """src [B, S], tgt [B, T] (decoder inputs, teacher forcing), src_mask [B, S] (1 = real)
    -> logits [B, T, vocab] (`return_hidden`: see `seq2seq.teacher_forced`)."""
    return seq2seq.teacher_forced(self, src_tokens, tgt_tokens, src_mask=src_mask,
                                  deterministic=deterministic, return_hidden=return_hidden)


def _validate(c: dict):
  if c["parametrization"] != "standard":
    raise ValueError(f"model.parametrization={c['parametrization']!r} is not available for the "
                     "t5 family: T5 fixes its attention scale to 1 (model.attention_scale) and "
                     "ties its readout to the unscaled input embedding, which μP's width rules "
                     "do not cover; use 'standard' (μP: the decoder, bert and vit families)")
  if not c["pre_norm"]:
    raise ValueError("model.pre_norm=False: T5 is pre-norm (its final norms sit after each "
                     "stack); set model.pre_norm=True")
  if c["relative_buckets"] < 4 or c["relative_max_distance"] <= c["relative_buckets"] // 2:
    raise ValueError(f"model.relative_buckets={c['relative_buckets']}, model."
                     f"relative_max_distance={c['relative_max_distance']}: need >= 4 buckets "
                     "and a max distance above relative_buckets / 2, the distances the "
                     "decoder buckets exactly (T5: 32 buckets, 128)")
  if not isinstance(c["tie_embeddings"], bool):
    raise ValueError(f"model.tie_embeddings={c['tie_embeddings']!r} must be True (v1.0: tied, "
                     "scaled output) or False (v1.1: lm_head)")


FAMILY = Family(
    name="t5", module=T5, task="span_corruption", example_inputs=token_inputs(2),
    # the relative position tables are position embeddings (Kaplan's N leaves them out)
    embeddings=("embed", "lm_head", "encoder_relative_bias", "decoder_relative_bias"),
    heads=("lm_head",),
    block_defaults=dict(pre_norm=True, use_bias=False, qkv_bias=False, norm="rmsnorm",
                        norm_eps=1e-6, ffn="mlp", activation="relu", dropout_rate=0.1,
                        attention_dropout_rate=0.1, attention_scale=1.0),
    embedding_lookups=2, attention_flops=seq2seq.attention_flops, validate=_validate,
    hf_converter="jaxformer.convert.hf.t5")
