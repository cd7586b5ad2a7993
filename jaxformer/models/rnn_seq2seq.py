"""RNN encoder-decoder (Cho et al., 2014) with optional Bahdanau attention (2015).

Without attention the decoder sees the source only through the encoder's final state (the
fixed-size bottleneck); with attention it re-reads every encoder state at every step.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import AdditiveAttention, Embed
from jaxformer.layers.dense import dense
from jaxformer.models.family import Family, token_inputs
from jaxformer.ops.cross_entropy import Readout

CELLS = {"gru": nn.GRUCell, "lstm": nn.OptimizedLSTMCell}


def _hidden(state, cell):
  return state[1] if cell == "lstm" else state     # LSTM carry is (c, h)


class DecoderStep(nn.Module):
  """One step of an RNN decoder that reads a memory: with `attention`, additive attention
  over `memory` [B, N, D] (mask [B, N] or None) queried with h_{t-1} (Bahdanau et al., 2015;
  Show, Attend and Tell's decoder, models/captioner.py); without, the `fixed_context`
  [B, D]. [y_t, context] goes into the cell. Returns (state, ([h_t, context, y_t], the
  attention weights [B, N], or None without attention))."""
  hidden_dim: int
  cell: str
  attention: bool
  attention_dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, state, y_embedded, memory, mask, fixed_context):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    weights = None
    if self.attention:
      context, weights = AdditiveAttention(self.attention_dim, name="attention", **kw)(
          _hidden(state, self.cell)[:, None].astype(self.dtype), memory,
          mask=None if mask is None else mask[:, None, :])
      context, weights = context[:, 0], weights[:, 0]
    else:
      context = fixed_context
    state, h = CELLS[self.cell](self.hidden_dim, name="cell", **kw)(
        state, jnp.concatenate([y_embedded, context], axis=-1))
    return state, (jnp.concatenate([h, context, y_embedded], axis=-1), weights)


class RnnSeq2Seq(nn.Module):
  vocab_size: int
  embed_dim: int
  hidden_dim: int
  attention: bool = True
  attention_dim: int | None = None    # default: hidden_dim
  cell: str = "gru"                   # "gru" | "lstm"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, src_tokens, tgt_tokens, *, src_mask=None, deterministic: bool = True,
               return_hidden: bool = False):
    """src [B, S], tgt [B, T] (teacher forcing), src_mask [B, S] (1 = real) -> [B, T, vocab]
    (`return_hidden`, the train step's chunked loss: the output layer's inputs and the layer
    as `ops.cross_entropy.Readout`)."""
    src_mask = (jnp.ones(src_tokens.shape, bool) if src_mask is None
                else src_mask.astype(bool))
    src = Embed(self.vocab_size, self.embed_dim, name="src_embed")(src_tokens)
    state, encoded = nn.RNN(CELLS[self.cell](self.hidden_dim), return_carry=True,
                            name="encoder")(src, seq_lengths=src_mask.sum(-1))
    tgt = Embed(self.vocab_size, self.embed_dim, name="tgt_embed")(tgt_tokens)
    step = nn.scan(DecoderStep, variable_broadcast="params", split_rngs={"params": False},
                   in_axes=(1, nn.broadcast, nn.broadcast, nn.broadcast), out_axes=1)
    _, (outputs, _) = step(self.hidden_dim, self.cell, self.attention,
                           self.attention_dim or self.hidden_dim, name="decoder")(
        state, tgt, encoded, src_mask, _hidden(state, self.cell))
    if return_hidden:
      out = nn.unbox(self.variables["params"]["out"])
      return outputs, Readout(out["kernel"], out["bias"])
    return dense(self.vocab_size, ("mlp", "vocab"), use_bias=True, name="out")(
        outputs).astype(jnp.float32)


def _validate(c: dict):
  if c["cell"] not in CELLS:
    raise ValueError(f"model.cell={c['cell']!r} is not one of {sorted(CELLS)}")


def _attention_flops(cfg: dict, seq_len: int) -> tuple[int, int, int]:
  """Additive attention: an (attention_dim) score per source state, then a weighted sum of
  the (hidden_dim) states: one "layer" of width attention_dim + hidden_dim."""
  if not cfg["attention"]:
    return 0, seq_len, 0
  return 1, seq_len, (cfg.get("attention_dim") or cfg["hidden_dim"]) + cfg["hidden_dim"]


FAMILY = Family(
    name="rnn_seq2seq", module=RnnSeq2Seq, task="seq2seq", example_inputs=token_inputs(2),
    embeddings=("src_embed", "tgt_embed", "out"), heads=("out",),
    attention_flops=_attention_flops, validate=_validate)
