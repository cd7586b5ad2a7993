"""Parameter counts and training FLOPs of the models built from `config.model`.

Counts come from `jax.eval_shape` of `models.build(model_config).init(...)`: shapes only, no
memory is allocated and nothing is compiled, so GPT-3 175B or Mixtral 8x7B count in about a
second on a laptop.

    from jaxformer.models import counting       # also `jaxformer.scaling.count_params` etc.
    counting.count_params(config.model)
    # {'total': ..., 'active': ..., 'non_embedding': ..., 'backbone': ...,
    #  'non_embedding_active': ...}
    counting.flops_per_token(config.model, seq_len=2048)                      # Kaplan
    counting.flops_per_token(config.model, seq_len=2048, method="hoffmann")   # Chinchilla
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax

from jaxformer import models
from jaxformer.layers.moe import EXPERT_PARAMS
from jaxformer.models.family import head_dim


def dummy_inputs(model_config: Any, batch: int = 1, length: int = 8) -> tuple:
  """Abstract (ShapeDtypeStruct) inputs of the right kind for `init` of this family."""
  cfg = models.with_defaults(model_config)
  return models.get(cfg["family"]).example_inputs(cfg, batch, length)


def param_shapes(model_config: Any) -> dict:
  """The unboxed 'params' tree of ShapeDtypeStructs (no memory allocated)."""
  module = models.build(model_config)
  variables = jax.eval_shape(module.init, jax.random.key(0), *dummy_inputs(model_config))
  return nn.meta.unbox(variables["params"])


def _size(leaf) -> int:
  return math.prod(int(d) for d in leaf.shape)


def _key(entry) -> str:
  return str(getattr(entry, "key", getattr(entry, "name", entry)))


def count_params(model_config: Any) -> dict[str, int]:
  """Parameter counts of the model `models.build(model_config)` (python ints).

  - 'total': every parameter.
  - 'active': parameters used per token: total minus the (E - k) / E fraction of the expert
    weights of each MoE FFN (E = num_experts, k = experts_per_token); the router counts as
    active. Equal to 'total' for dense models.
  - 'non_embedding': total minus token embeddings (`embed`), learned position tables
    (`pos_embed`), token-type embeddings (`type_embed`) and an untied output head
    (`lm_head`); see each family's `embeddings` (Kaplan et al., 2020 count N without them).
  - 'backbone': total minus task heads (ViT `head`, BERT's MLM head `mlm_transform`,
    `mlm_norm`, `mlm_bias`, an untied decoder `lm_head`); see each family's `heads`. BERT's
    backbone keeps the pooler (Hugging Face `BertModel`).
  - 'non_embedding_active': non_embedding minus the inactive expert weights (the N of
    `flops_per_token`).

  The count is layout-independent, so layers are traced scanned (`scan_layers=True`: one
  layer body instead of num_layers copies; GPT-3 175B counts in ~0.2 s), and results are
  cached per distinct config.
  """
  cfg = models.config_as_dict(model_config)
  try:
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in cfg.items()))
    hash(key)
  except TypeError:                      # unhashable field values: no caching
    return _count_params(cfg)
  return dict(_count_params_cached(key))


@functools.lru_cache(maxsize=256)
def _count_params_cached(key: tuple) -> dict[str, int]:
  return _count_params(dict(key))


def _count_params(cfg: dict) -> dict[str, int]:
  entry = models.get(cfg.get("family"))
  if "scan_layers" in models.config_fields(entry.name):
    cfg = dict(cfg, scan_layers=True)
  params = param_shapes(cfg)
  num_experts = int(cfg.get("num_experts") or 0)
  top_k = int(cfg.get("experts_per_token") or 0)
  total = embedding = head = expert = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [_key(p) for p in path]
    n = _size(leaf)
    total += n
    if keys[0] in entry.embeddings:
      embedding += n
    if keys[0] in entry.heads:
      head += n
    if num_experts and len(keys) >= 2 and keys[-2] == "ffn" and keys[-1] in EXPERT_PARAMS:
      expert += n
  inactive = expert // num_experts * (num_experts - top_k) if num_experts else 0
  return {"total": total, "active": total - inactive, "non_embedding": total - embedding,
          "backbone": total - head, "non_embedding_active": total - embedding - inactive}


def attention_layers(model_config: Any, seq_len: int) -> tuple[int, int, int]:
  """(number of attention layers, keys seen per query, attention width d_attn) for the
  FLOPs attention term; see `flops_per_token`."""
  cfg = models.with_defaults(model_config)
  entry = models.get(cfg["family"])
  if entry.attention_flops is not None:
    return entry.attention_flops(cfg, seq_len)
  keys = seq_len
  window = cfg.get("window")         # families without blocks have none
  if window is not None:
    left = window[0] if isinstance(window, (tuple, list)) else window
    if left is not None:
      keys = min(seq_len, left + 1)   # `left` keys to the left plus the query's own position
  return cfg["num_layers"], keys, cfg["num_heads"] * head_dim(cfg)


FLOPS_METHODS = ("kaplan", "hoffmann")


def flops_per_token(model_config: Any, seq_len: int, *, method: str = "kaplan",
                    attention: bool = True, readout: bool = False) -> int:
  """Training FLOPs per token at context length `seq_len` (backward = 2 x forward, so
  training = 3 x forward), counted one of two published ways:

  method="kaplan" (Kaplan et al. 2020, Table 1; the "6N" of Chinchilla's C = 6ND):

      6 * N + 6 * n_layer * n_ctx * d_attn

    N = non-embedding parameters (MoE: the *active* ones,
    `count_params(...)['non_embedding_active']`), n_layer attention layers, n_ctx keys a query
    sees, d_attn = num_heads * head_dim. Embeddings, norms, softmax and nonlinearities are
    not counted.

  method="hoffmann" (Hoffmann et al. 2022, Appendix F; for Transformer families):

      3 * (2 N + 2 V d * (token embeddings + 1 for the logits)
           + n_layer * (4 n_ctx d_attn + 3 num_heads n_ctx))

    which is their per-layer list divided by the sequence length: Q/K/V and output
    projections and the FFN are the 2 N matmul term (N as above; norms and biases, which they
    leave out, add < 0.5% at these widths), QK^T and the softmax-weighted sum of values are
    2 n_ctx d_attn each, the softmax 3 num_heads n_ctx, and the embedding lookup and the final
    logits are counted as matmuls with the vocabulary even when tied.

  `attention=False` drops the n_ctx terms (the "6N" of C = 6ND for kaplan). Neither count
  halves the attention terms for causal masking.

  `readout=True` (kaplan) adds the output head's matmul over the vocabulary, 6 V d per token,
  for families with token embeddings: Kaplan's N leaves it out (an untied head is an
  "embedding"), yet the chip computes it, and MaxText's `calculate_tflops_training_per_device`
  counts it (`embedding_flops` = 2 B T d V, x 3 for training), so the MFU and TFLOP/s that
  training and the planner report (`train.progress.flops_per_step`) count it, to compare with
  MaxText's published figures. Scaling-law fits keep the plain count. (hoffmann already has
  it in its vocabulary term.) Per-family details:
  - sliding window (Mistral): n_ctx = min(seq_len, window + 1);
  - seq2seq: per (source, target) token pair with both of length seq_len; n_layer counts
    encoder self-, decoder self- and decoder cross-attention layers;
  - ViT: pass seq_len = number of tokens (patches + cls); FLOPs per token (not per image);
  - rnn_seq2seq: kaplan only (6N plus the additive-attention term).
  """
  if seq_len <= 0:
    raise ValueError(f"seq_len={seq_len} must be > 0")
  if method not in FLOPS_METHODS:
    raise ValueError(f"method={method!r} must be one of {FLOPS_METHODS}")
  n = count_params(model_config)["non_embedding_active"]
  layers, keys, width = attention_layers(model_config, seq_len)
  if not attention:
    layers = 0
  cfg = models.config_as_dict(model_config)
  lookups = models.get(cfg.get("family")).embedding_lookups   # token tables, counted as matmuls
  if method == "kaplan":
    head = 6 * cfg["vocab_size"] * cfg["d_model"] if readout and lookups else 0
    return 6 * n + 6 * layers * keys * width + head
  if lookups is None:
    raise ValueError(f"method='hoffmann' counts Transformer layers; model.family="
                     f"{cfg.get('family')!r} has none: use method='kaplan'")
  vocab_terms = 0
  if lookups:
    vocab_terms = 2 * cfg["vocab_size"] * cfg["d_model"] * (lookups + 1)
  heads = cfg["num_heads"]
  return 3 * (2 * n + vocab_terms + layers * (4 * keys * width + 3 * heads * keys))
