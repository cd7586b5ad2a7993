"""DeBERTa (He et al., 2021, arXiv 2006.03654) in the v2/v3 layout: a post-norm BERT-style
encoder whose self-attention is disentangled (content-to-content + content-to-position +
position-to-content scores, `ops.disentangled`).

- Relative positions: one table `rel_embed` [2 span, E] (span = position_buckets, or
  max_relative_positions without log buckets) with its LayerNorm `rel_norm`
  (norm_rel_ebd="layer_norm"), shared by every layer; each layer projects it with its own
  query and key projections (share_att_key) inside `MultiHeadAttention(positions=
  "disentangled")`, where c2p + p2c enter `dot_product_attention` as a bias and every term is
  scaled by 1/sqrt(3 d). The layers get the table's rows of the 2T - 1 relative positions
  of the sequence, so the scores are two products and a relative shift (no gather).
- Embeddings: token table, learned absolute positions only with position_biased_input=True
  (v3: False), token types only with type_vocab_size set (v3: none), LayerNorm, then padded
  positions zeroed (as the reference implementation does).
- MLM head as Hugging Face's DebertaV2ForMaskedLM: dense + activation + LayerNorm, decoder
  tied to the token embedding, plus a vocabulary bias. No pooler (DebertaV2Model has none).
- Enhanced mask decoder (`emd_layers` > 0; the paper's pre-training uses 2): as the
  reference's EnhancedMaskDecoder.emd_context_layer (microsoft/DeBERTa,
  apps/models/masked_language_model.py, the position_biased_input=False branch of v2/v3):
  with h = the last layer's input (the second-to-last layer's output) and z = the absolute
  position table `emd_pos_embed` at positions 0..T-1 (no norm, no dropout), the query q = z + h
  goes through the last encoder layer `emd_layers` times, q = layer(q) with queries and
  residual from q and keys / values from h (same weights, relative positions and padding
  mask: `BlockStack(repeat_last=...)`, `kv_inputs`), and the MLM head reads the final q
  instead of the last layer's output. Its only new parameter is `emd_pos_embed`
  [max_len, E] (the reference's `embeddings.position_embeddings`, which the reference adds
  to the input instead with position_biased_input=True, where its decoder is the plain
  head: that combination is refused). The table counts as an embedding (not in Kaplan's N)
  and as part of the pre-training head (not in `backbone`, which stays DebertaV2Model's).
  Off (0) is Hugging Face's DebertaV2ForMaskedLM; `encode` (fine-tuning) is the encoder
  output either way.

Not implemented: the v2-xlarge convolution after the first layer (conv_kernel_size); a
factorised embedding size (embedding_size != hidden_size); attention with only one of c2p /
p2c.
While training, dropout on the relative table is drawn once per forward pass and shared by the
layers (the reference draws it per layer); evaluation is unaffected.
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
from jaxformer.models.family import Family, head_dim, token_inputs
from jaxformer.models.stack import BlockStack
from jaxformer.ops import disentangled
from jaxformer.ops.cross_entropy import Readout


def relative_span(cfg: dict) -> int:
  """Half the rows of the relative table: position_buckets, or max_relative_positions
  (default max_len) without bucketing."""
  return cfg.get("position_buckets") or cfg.get("max_relative_positions") or cfg["max_len"]


class Deberta(nn.Module):
  vocab_size: int
  d_model: int
  num_layers: int
  block: BlockSettings                # post-norm, gelu_exact, eps 1e-7, dropout 0.1: see FAMILY
  max_len: int = 512                  # absolute table (position_biased_input); relative default
  type_vocab_size: int | None = None  # None: no token-type embeddings (v3; HF type_vocab_size=0)
  position_biased_input: bool = False  # add learned absolute positions to the input (v3: no)
  position_buckets: int | None = 256  # log-bucketed relative positions; None: no buckets
  max_relative_positions: int | None = None   # None: max_len
  rel_embed_norm: bool = True         # LayerNorm on the relative table (norm_rel_ebd)
  emd_layers: int = 0                 # enhanced mask decoder passes (paper: 2; 0 = HF's head)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    eps = self.block.norm_eps
    self.dropout = nn.Dropout(self.block.dropout_rate)
    self.embed = Embed(self.vocab_size, self.d_model, name="embed", **kw)
    if self.position_biased_input:
      self.pos_embed = LearnedPositionEmbedding(self.max_len, self.d_model, name="pos_embed",
                                                **kw)
    if self.emd_layers:
      self.emd_pos_embed = LearnedPositionEmbedding(self.max_len, self.d_model,
                                                    name="emd_pos_embed", **kw)
    if self.type_vocab_size:
      self.type_embed = Embed(self.type_vocab_size, self.d_model, name="type_embed", **kw)
    self.embed_norm = LayerNorm(eps, name="embed_norm", **kw)
    self.span = relative_span(dict(position_buckets=self.position_buckets,
                                   max_relative_positions=self.max_relative_positions,
                                   max_len=self.max_len))
    self.rel_embed = LearnedPositionEmbedding(2 * self.span, self.d_model, name="rel_embed",
                                              **kw)
    if self.rel_embed_norm:
      self.rel_norm = LayerNorm(eps, name="rel_norm", **kw)
    self.encoder = BlockStack(self.num_layers, self.block,
                              dict(positions="disentangled", **kw), name="encoder")
    self.mlm_transform = dense(self.d_model, ("embed", "mlp"), use_bias=True,
                               name="mlm_transform", **kw)
    self.mlm_norm = LayerNorm(eps, name="mlm_norm", **kw)
    self.mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(
        nn.initializers.zeros, ("vocab",)), (self.vocab_size,), self.param_dtype)

  def relative_embeddings(self, length: int, deterministic: bool = True):
    """[2 length - 1, E]: the (normalised) relative table's row of each relative position
    -(length - 1) .. length - 1, for the attention layers (`ops.disentangled.relative_rows`;
    a static gather of at most 2 length - 1 rows)."""
    rows = disentangled.relative_rows(
        length, span=self.span, buckets=self.position_buckets,
        max_position=self.max_relative_positions or self.max_len)
    table = self.rel_embed(jnp.arange(2 * self.span))
    if self.rel_embed_norm:
      table = self.rel_norm(table)
    return self.dropout(jnp.take(table, jnp.asarray(rows), axis=0),
                        deterministic=deterministic)

  def encode(self, tokens, *, token_type_ids=None, attention_mask=None,
             deterministic: bool = True):
    """-> the last layer's output [B, T, E]."""
    return self._encode(tokens, token_type_ids, attention_mask, deterministic, emd=False)

  def _encode(self, tokens, token_type_ids, attention_mask, deterministic, *, emd: bool):
    """The last layer's output, or with `emd` (emd_layers > 0) the pair (it, the enhanced
    mask decoder's output)."""
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, length]; got shape {tokens.shape}")
    length = tokens.shape[1]
    x = self.embed(tokens)
    if self.position_biased_input:
      x = x + self.pos_embed(jnp.arange(length)[None])
    if self.type_vocab_size:
      x = x + self.type_embed(jnp.zeros_like(tokens) if token_type_ids is None
                              else token_type_ids)
    x = self.embed_norm(x)
    mask = None
    if attention_mask is not None:
      x = x * attention_mask[..., None].astype(x.dtype)
      mask = attention_mask.astype(bool)[:, None, None, :]
    x = self.dropout(x, deterministic=deterministic)
    rel = self.relative_embeddings(length, deterministic)
    if not emd:
      return self.encoder(x, mask=mask, rel_embeddings=rel, deterministic=deterministic)
    z = self.emd_pos_embed(jnp.arange(length)[None])      # absolute positions [1, T, E]
    return self.encoder(x, mask=mask, rel_embeddings=rel, deterministic=deterministic,
                        repeat_last=self.emd_layers, query_offset=z)

  def __call__(self, tokens, *, token_type_ids=None, attention_mask=None,
               deterministic: bool = True, return_hidden: bool = False):
    """tokens [B, T]; attention_mask [B, T] (1 = real token); token_type_ids [B, T] (ignored
    without type embeddings, as in the reference) -> MLM logits [B, T, vocab] (float32),
    read from the enhanced mask decoder's output when emd_layers > 0. With `return_hidden`
    (the train step's chunked loss): the MLM head's hidden states [B, T, E] and its readout
    (`ops.cross_entropy.Readout`) instead."""
    x = self._encode(tokens, token_type_ids, attention_mask, deterministic,
                     emd=self.emd_layers > 0)
    if self.emd_layers:
      x = x[1]
    h = self.mlm_norm(activation_fn(self.block.activation or "gelu_exact")(self.mlm_transform(x)))
    if return_hidden:
      return h, Readout(self.embed.embedding, self.mlm_bias, vocab_major=True,
                        scale=output_multiplier(self.block, self.d_model))
    logits = scale_output(self.embed.attend(h), self.block, self.d_model) + self.mlm_bias
    return logits.astype(jnp.float32)


def _validate(c: dict):
  buckets, max_rel = c["position_buckets"], c["max_relative_positions"] or c["max_len"]
  if buckets is not None and not (buckets >= 2 and max_rel - 1 > buckets // 2):
    raise ValueError(f"model.position_buckets={buckets} needs model.max_relative_positions "
                     f"(default model.max_len) - 1 > position_buckets // 2 (got {max_rel}): "
                     "raise max_relative_positions or lower position_buckets")
  if c["emd_layers"] and c["position_biased_input"]:
    raise ValueError(f"model.emd_layers={c['emd_layers']} with model.position_biased_input="
                     "True: as in the reference, the enhanced mask decoder is for models "
                     "without absolute positions in the input (with them the reference's "
                     "decoder is the plain head); set one of the two off")
  if c.get("num_kv_heads") not in (None, c["num_heads"]):
    raise ValueError(f"model.num_kv_heads={c['num_kv_heads']}: DeBERTa's disentangled "
                     "attention projects the relative table with the fused query/key "
                     "projection; set model.num_kv_heads=None")


def _attention_flops(cfg: dict, seq_len: int) -> tuple[int, int, int]:
  """c2p and p2c are two more products per query, each over the 2T - 1 relative positions, on
  top of QK^T and AV over T keys: keys = T + 2T - 1 in the two-product count. The enhanced
  mask decoder's passes are attention layers too (their projections and FFN reuse the last
  layer's weights, which 6N does not count again: it undercounts by emd_layers / num_layers
  of the layers' matmul FLOPs)."""
  return (cfg["num_layers"] + cfg["emd_layers"], 3 * seq_len - 1,
          cfg["num_heads"] * head_dim(cfg))


FAMILY = Family(
    name="deberta", module=Deberta, task="mlm", example_inputs=token_inputs(1),
    embeddings=("embed", "pos_embed", "type_embed", "rel_embed", "emd_pos_embed"),
    heads=("mlm_transform", "mlm_norm", "mlm_bias", "emd_pos_embed"),
    block_defaults=dict(pre_norm=False, qkv_bias=True, norm_eps=1e-7, activation="gelu_exact",
                        dropout_rate=0.1, attention_dropout_rate=0.1),
    embedding_lookups=1, attention_flops=_attention_flops, validate=_validate,
    hf_converter="jaxformer.convert.hf.deberta")
