"""Decoder-only language models: GPT-2/GPT-3 and Llama/Mistral/Mixtral by configuration.

One code path; the families differ only in settings: positions ("learned" for GPT, "rope" for
Llama), and in `block` (layers/block_settings.py): norm ("layernorm" / "rmsnorm"), ffn ("mlp" + gelu
/ "swiglu"), biases, GQA (num_kv_heads), sliding window, and a mixture of experts
(`block.moe`, Mixtral) whose aux-loss weights the train step reads from there. The output
head is tied to the token embedding or not.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, LearnedPositionEmbedding, make_norm
from jaxformer.layers.dense import dense
from jaxformer.layers.parametrization import output_multiplier, scale_output
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models.family import Family, head_dim, token_inputs
from jaxformer.models.stack import BlockStack
from jaxformer.ops import positions as pos_ops
from jaxformer.ops.cross_entropy import Readout

POSITIONS = ("learned", "rope", "alibi", "sinusoidal", "none")


class DecoderLM(nn.Module):
  vocab_size: int
  d_model: int
  num_layers: int
  block: BlockSettings
  max_len: int = 1024                 # size of the learned position table
  positions: str = "learned"          # "learned" | "rope" | "alibi" | "sinusoidal" | "none"
  rope_theta: float = 10_000.0
  tie_embeddings: bool = True
  decode: bool = False
  # decode only, set at inference time (not a config key): a compressed KV cache policy
  # (layers/kv_cache.KVCachePolicy); None: the full cache
  kv_cache: Any = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens, *, segment_ids=None, positions=None, deterministic: bool = True,
               return_hidden: bool = False):
    """tokens [B, T] int -> logits [B, T, vocab] (float32); with `return_hidden` (the train
    step's chunked loss, after init) the final hidden states [B, T, E] and the output head
    (`ops.cross_entropy.Readout`) instead, never forming the logits."""
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, length]; got shape {tokens.shape}")
    embed = Embed(self.vocab_size, self.d_model, dtype=self.dtype,
                  param_dtype=self.param_dtype, name="embed")
    x = embed(tokens)
    if positions is None:
      positions = jnp.arange(tokens.shape[1])[None]
      if self.decode and self.positions in ("learned", "sinusoidal"):
        raise ValueError("decode=True with absolute positions needs explicit `positions`")
    if self.positions == "learned":
      x = x + LearnedPositionEmbedding(self.max_len, self.d_model, dtype=self.dtype,
                                       param_dtype=self.param_dtype, name="pos_embed")(positions)
    elif self.positions == "sinusoidal":
      x = x + pos_ops.sinusoidal(positions, self.d_model, dtype=self.dtype)
    x = nn.Dropout(self.block.dropout_rate)(x, deterministic=deterministic)
    wiring = dict(causal=True, positions=self.positions if self.positions in ("rope", "alibi")
                  else "none", rope_theta=self.rope_theta, decode=self.decode,
                  **({} if self.kv_cache is None else {"kv_cache": self.kv_cache}),
                  dtype=self.dtype, param_dtype=self.param_dtype)
    x = BlockStack(self.num_layers, self.block, wiring, name="decoder")(
        x, segment_ids=segment_ids, positions=positions, deterministic=deterministic)
    x = make_norm(self.block.norm, epsilon=self.block.norm_eps, dtype=self.dtype,
                  param_dtype=self.param_dtype, name="final_norm")(x)
    if return_hidden:
      multiplier = output_multiplier(self.block, self.d_model)     # μP's readout multiplier
      if self.tie_embeddings:
        return x, Readout(embed.embedding, vocab_major=True, scale=multiplier)
      kernel = nn.unbox(self.variables["params"]["lm_head"]["kernel"])
      return x, Readout(kernel, scale=multiplier)
    if self.tie_embeddings:
      logits = embed.attend(x)
    else:
      logits = dense(self.vocab_size, ("embed", "vocab"), name="lm_head", dtype=self.dtype,
                     param_dtype=self.param_dtype)(x)
    logits = scale_output(logits, self.block, self.d_model)     # μP's readout multiplier
    return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))



def _validate(c: dict):
  if c["positions"] not in POSITIONS:
    raise ValueError(f"model.positions={c['positions']!r} is not one of {sorted(POSITIONS)}")
  if c["positions"] == "rope" and head_dim(c) % 2:
    raise ValueError("model.positions='rope' needs an even head dim")


FAMILY = Family(
    name="decoder", module=DecoderLM, task="lm", example_inputs=token_inputs(1),
    # an untied lm_head is a vocabulary-sized projection: an embedding for Kaplan's N
    embeddings=("embed", "pos_embed", "lm_head"), heads=("lm_head",),
    embedding_lookups=1, validate=_validate, hf_converter="jaxformer.convert.hf.decoder")
