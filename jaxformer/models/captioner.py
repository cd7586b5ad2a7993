"""Image captioning: an image encoder (ViT patches or a small CNN) and a caption decoder
(Transformer, or Show-Attend-Tell's LSTM/GRU with additive attention; Xu et al., 2015).

The encoder turns an image into a grid of feature vectors, the *memory* [B, N, d_model] with
N = rows x cols (`grid_shape`), 2-D sinusoidal positions added. The decoder reads it each
step: the Transformer by cross-attention in every layer, the RNN by additive attention with
its previous hidden state. `attention=False` is the no-attention baseline: the grid is
mean-pooled to one vector (then a dense layer), so the memory is [B, 1, d_model] and the
decoder's attention over its one key is the identity; nothing else changes, so the ablation
isolates what attending over the grid buys.

Each word's attention over the grid is sown as `intermediates/caption_attention` [B, T, N]
(apply with `mutable=['intermediates']`; `inference.captions.attention_maps` reshapes it to
the grid). The Transformer's map is the last decoder layer's cross-attention averaged over
heads, taken from the layers' own `attention_weights` collection (see `_decode_transformer`);
the RNN decoders also sow their additive weights into that collection, as one head named
`cross_attention`, so `train.attention_maps` plots every decoder.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.layers import Embed, LearnedPositionEmbedding, PatchEmbed
from jaxformer.layers import make_norm
from jaxformer.layers.attention import WEIGHTS_COLLECTION
from jaxformer.layers.dense import dense
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models.family import Family, head_dim, image_inputs, token_inputs
from jaxformer.models.rnn_seq2seq import DecoderStep
from jaxformer.models.stack import BlockStack
from jaxformer.ops import positions as pos_ops
from jaxformer.ops.cross_entropy import Readout

ENCODERS = ("vit", "cnn")
DECODERS = ("transformer", "lstm", "gru")


def grid_shape(cfg) -> tuple[int, int]:
  """(rows, cols) of the encoder's feature grid for a model config (dict or ConfigDict;
  missing keys at the family defaults): image_size / patch_size for "vit", image_size /
  2^len(cnn_features) for "cnn" (each CNN stage halves the resolution). With attention=False
  the memory is one pooled vector, but the grid it was pooled from has this shape."""
  c = _full(cfg)
  if c["encoder"] == "vit":
    rows = c["image_size"] // c["patch_size"]
  else:
    rows = c["image_size"] // 2 ** len(c["cnn_features"])
  return rows, rows


def _full(cfg) -> dict:
  from jaxformer.models.registry import config_as_dict, with_defaults
  return with_defaults(dict(config_as_dict(cfg), family="captioner"))


def memory_length(cfg) -> int:
  """N of the memory [B, N, d_model] the decoder attends over (1 with attention=False)."""
  c = _full(cfg)
  rows, cols = grid_shape(c)
  return rows * cols if c["attention"] else 1


def grid_positions(rows: int, cols: int, dim: int, dtype=jnp.float32):
  """2-D sinusoidal positions [rows * cols, dim]: the first dim/2 features encode the row,
  the rest the column (each as `ops.positions.sinusoidal`), row-major like the grid."""
  r = pos_ops.sinusoidal(jnp.arange(rows), dim // 2, dtype=dtype)
  c = pos_ops.sinusoidal(jnp.arange(cols), dim // 2, dtype=dtype)
  table = jnp.concatenate([jnp.broadcast_to(r[:, None], (rows, cols, dim // 2)),
                           jnp.broadcast_to(c[None, :], (rows, cols, dim // 2))], axis=-1)
  return table.reshape(rows * cols, dim)


class _CnnEncoder(nn.Module):
  """len(features) stages of [3x3 conv (SAME) + ReLU + 2x2 max-pool, stride 2]: 48x48 with
  the default three stages -> a 6x6 grid (two stages: 12x12); then a dense to d_model."""
  features: tuple[int, ...]
  d_model: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images):
    x = images.astype(self.dtype)
    for i, f in enumerate(tuple(self.features)):
      x = nn.Conv(f, (3, 3), padding="SAME", dtype=self.dtype, param_dtype=self.param_dtype,
                  kernel_init=nn.with_logical_partitioning(nn.initializers.he_normal(),
                                                           (None, None, None, "mlp")),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
                  name=f"conv_{i}")(x)
      x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
    b, rows, cols, f = x.shape
    return dense(self.d_model, ("mlp", "embed"), use_bias=True, name="proj", dtype=self.dtype,
                 param_dtype=self.param_dtype)(x.reshape(b, rows * cols, f))


class Captioner(nn.Module):
  """images [B, S, S, C] float32 and teacher-forced caption inputs [B, T] (BOS first) ->
  logits [B, T, vocab] float32. Config keys are the fields below plus the shared block
  settings (num_heads, mlp_dim, dropout_rate, ...), which configure the ViT encoder and the
  Transformer decoder; dropout_rate also drops the RNN decoder's embeddings and outputs."""
  block: BlockSettings                # pre-norm Transformer blocks: see FAMILY
  vocab_size: int = 16
  max_len: int = 17                   # caption length (decoder positions, beam-search steps)
  image_size: int = 48
  channels: int = 1
  encoder: str = "vit"                # "vit" | "cnn"
  decoder: str = "transformer"        # "transformer" | "lstm" | "gru"
  attention: bool = True              # False: the decoder sees one mean-pooled image vector
  d_model: int = 128                  # memory width (and the Transformer decoder's)
  encoder_layers: int = 2             # ViT blocks over the patches (the CNN has none)
  decoder_layers: int = 2             # Transformer decoder blocks (the RNN is one cell)
  patch_size: int = 8                 # vit: 48 / 8 -> a 6x6 grid
  cnn_features: tuple[int, ...] = (32, 64, 128)   # cnn: one stride-2 stage each: 48 -> 6x6
  embed_dim: int = 64                 # RNN decoder: word embedding
  hidden_dim: int = 256               # RNN decoder: cell state
  attention_dim: int | None = None    # RNN decoder: additive attention width (None: hidden_dim)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    b = self.block
    self.dropout = nn.Dropout(b.dropout_rate)
    if self.encoder == "vit":
      self.patch_embed = PatchEmbed(self.patch_size, self.d_model, name="patch_embed", **kw)
      self.encoder_blocks = BlockStack(self.encoder_layers, b, kw, name="encoder")
      self.encoder_norm = make_norm(b.norm, epsilon=b.norm_eps, name="encoder_norm", **kw)
    else:
      self.cnn = _CnnEncoder(tuple(self.cnn_features), self.d_model, name="cnn", **kw)
    if not self.attention:
      self.pool = dense(self.d_model, ("embed", "mlp"), use_bias=True, name="pool", **kw)
    if self.decoder == "transformer":
      self.embed = Embed(self.vocab_size, self.d_model, name="embed", **kw)
      self.pos_embed = LearnedPositionEmbedding(self.max_len, self.d_model, name="pos_embed",
                                                **kw)
      self.decoder_blocks = BlockStack(self.decoder_layers, b, self._decoder_wiring(),
                                       name="decoder")
      self.decoder_norm = make_norm(b.norm, epsilon=b.norm_eps, name="decoder_norm", **kw)
    else:
      self.embed = Embed(self.vocab_size, self.embed_dim, name="embed", **kw)
      self.init_h = dense(self.hidden_dim, ("embed", "mlp"), use_bias=True, name="init_h",
                          **kw)
      if self.decoder == "lstm":
        self.init_c = dense(self.hidden_dim, ("embed", "mlp"), use_bias=True, name="init_c",
                            **kw)
      # attention=False pools the memory to one key, so the step always attends
      step = nn.scan(DecoderStep, variable_broadcast="params", split_rngs={"params": False},
                     in_axes=(1, nn.broadcast, nn.broadcast, nn.broadcast), out_axes=1)
      self.rnn = step(self.hidden_dim, self.decoder, True,
                      self.attention_dim or self.hidden_dim, name="decoder", **kw)
    self.head = dense(self.vocab_size, ("embed", "vocab"), use_bias=True, name="head", **kw)

  def _decoder_wiring(self) -> dict:
    return dict(dtype=self.dtype, param_dtype=self.param_dtype, causal=True,
                cross_attention=True)

  def encode(self, images, *, deterministic: bool = True):
    """images [B, S, S, C] -> memory [B, N, d_model]: the feature grid (row-major, N = rows x
    cols of `grid_shape`) with 2-D positions; [B, 1, d_model] with attention=False."""
    want = (self.image_size, self.image_size, self.channels)
    if images.ndim != 4 or tuple(images.shape[1:]) != want:
      raise ValueError(f"images must be [batch, {want[0]}, {want[1]}, {want[2]}] "
                       "(model.image_size, model.channels); got shape "
                       f"{tuple(images.shape)}")
    if self.encoder == "vit":
      x = self.patch_embed(images.astype(self.dtype))
      rows = self.image_size // self.patch_size
    else:
      x = self.cnn(images)
      rows = self.image_size // 2 ** len(self.cnn_features)
    x = x + grid_positions(rows, rows, self.d_model, dtype=x.dtype)
    x = self.dropout(x, deterministic=deterministic)
    if self.encoder == "vit":
      x = self.encoder_blocks(x, deterministic=deterministic)
      if self.block.pre_norm:
        x = self.encoder_norm(x)
    if not self.attention:
      x = self.pool(x.mean(axis=1, keepdims=True))
    return x

  def decode(self, memory, tgt_tokens, *, deterministic: bool = True,
             return_hidden: bool = False):
    """memory [B, N, d_model] (from `encode`), caption inputs [B, T] (BOS first, T <=
    max_len) -> logits [B, T, vocab] float32; position t sees tokens[:, :t + 1] only. Sows
    the per-word attention over the memory, intermediates/caption_attention [B, T, N].
    `return_hidden` (the train step's chunked loss): the head's inputs [B, T, F] and the
    head as `ops.cross_entropy.Readout` instead of the logits."""
    if tgt_tokens.ndim != 2 or tgt_tokens.shape[0] != memory.shape[0]:
      raise ValueError(f"tgt_tokens must be [batch, length] with the memory's batch "
                       f"{memory.shape[0]}; got shape {tuple(tgt_tokens.shape)}")
    if tgt_tokens.shape[1] > self.max_len:
      raise ValueError(f"captions of {tgt_tokens.shape[1]} tokens exceed model.max_len="
                       f"{self.max_len}")
    if self.decoder == "transformer":
      x, weights = self._decode_transformer(memory, tgt_tokens, deterministic)
    else:
      x, weights = self._decode_rnn(memory, tgt_tokens, deterministic)
      if self.is_mutable_collection(WEIGHTS_COLLECTION):
        # as one head [B, 1, T, N], like MultiHeadAttention's, for train.attention_maps
        self.sow(WEIGHTS_COLLECTION, "cross_attention", weights[:, None])
    if weights is not None:
      self.sow("intermediates", "caption_attention", weights.astype(jnp.float32))
    if return_hidden:
      head = nn.unbox(self.variables["params"]["head"])
      return x, Readout(head["kernel"], head["bias"])
    return self.head(x).astype(jnp.float32)

  def __call__(self, images, tgt_tokens, *, deterministic: bool = True,
               return_hidden: bool = False):
    """images [B, S, S, C] float, caption inputs [B, T] int (teacher forcing) -> logits
    [B, T, vocab]: `decode(encode(images), tgt_tokens)` (`return_hidden`: see `decode`)."""
    return self.decode(self.encode(images, deterministic=deterministic), tgt_tokens,
                       deterministic=deterministic, return_hidden=return_hidden)

  def _decode_transformer(self, memory, tokens, deterministic):
    """(final hidden states, weights or None). The weights are only needed when the
    intermediates are kept, and MultiHeadAttention computes them only into its
    `attention_weights` collection: then the stack runs as its own `apply` on the same
    params with that collection mutable (the same computation, so the same outputs), and
    the last layer's cross-attention, averaged over heads, is the map."""
    t = tokens.shape[1]
    x = self.embed(tokens) + self.pos_embed(jnp.arange(t)[None])
    x = self.dropout(x, deterministic=deterministic)
    record = self.is_mutable_collection("intermediates") and not self.is_initializing()
    weights = None
    if not record:
      x = self.decoder_blocks(x, memory, deterministic=deterministic)
    elif self.is_mutable_collection(WEIGHTS_COLLECTION):
      x = self.decoder_blocks(x, memory, deterministic=deterministic)
      weights = _last_cross_attention(self.decoder_blocks.variables[WEIGHTS_COLLECTION],
                                      self.decoder_layers)
    else:
      stack = BlockStack(self.decoder_layers, self.block, self._decoder_wiring(), parent=None)
      dropout = not deterministic and (self.block.dropout_rate
                                       or self.block.attention_dropout_rate)
      rngs = {"dropout": self.make_rng("dropout")} if dropout else None
      x, state = stack.apply({"params": self.variables["params"]["decoder"]}, x, memory,
                             deterministic=deterministic, rngs=rngs,
                             mutable=[WEIGHTS_COLLECTION])
      weights = _last_cross_attention(state[WEIGHTS_COLLECTION], self.decoder_layers)
    if self.block.pre_norm:
      x = self.decoder_norm(x)
    return x, weights

  def _decode_rnn(self, memory, tokens, deterministic):
    """Show-Attend-Tell: h_0 (and c_0) = tanh(dense(mean memory)); output features
    [h_t, context_t, y_t] (the 'deep output'), dropped out before the head."""
    y = self.dropout(self.embed(tokens), deterministic=deterministic)
    mean = memory.mean(axis=1)
    h0 = jnp.tanh(self.init_h(mean))
    state = (jnp.tanh(self.init_c(mean)), h0) if self.decoder == "lstm" else h0
    _, (features, weights) = self.rnn(state, y, memory, None, None)
    return self.dropout(features, deterministic=deterministic), weights


def _last_cross_attention(tree, num_layers: int):
  """The last decoder layer's cross-attention [B, H, T, N] from a BlockStack's
  attention_weights collection (unscanned `layers_{L-1}` or scanned `layers` [L, ...]),
  averaged over heads -> [B, T, N]."""
  if "layers" in tree:
    w = tree["layers"]["block"]["cross_attention"]["weights"][-1][-1]
  else:
    w = tree[f"layers_{num_layers - 1}"]["block"]["cross_attention"]["weights"][-1]
  return w.astype(jnp.float32).mean(axis=1)


def _example_inputs(cfg: dict, batch: int, length: int) -> tuple:
  """(images [B, S, S, C] float32, caption tokens [B, max_len] int32)."""
  return image_inputs(cfg, batch, length) + token_inputs()(cfg, batch, cfg["max_len"])


def _validate(c: dict):
  if c["encoder"] not in ENCODERS:
    raise ValueError(f"model.encoder={c['encoder']!r} is not one of {list(ENCODERS)}")
  if c["decoder"] not in DECODERS:
    raise ValueError(f"model.decoder={c['decoder']!r} is not one of {list(DECODERS)}")
  if not isinstance(c["attention"], bool):
    raise ValueError(f"model.attention={c['attention']!r} must be True or False (False: the "
                     "no-attention baseline)")
  if c["d_model"] % 4:
    raise ValueError(f"model.d_model={c['d_model']} must be a multiple of 4 (the 2-D "
                     "sinusoidal positions give each grid axis d_model/2 sin/cos features)")
  if c["encoder"] == "vit" and c["image_size"] % c["patch_size"]:
    raise ValueError(f"model.patch_size={c['patch_size']} does not divide model.image_size="
                     f"{c['image_size']}: pick a divisor (e.g. 4, 8 or 16 for 48)")
  if c["encoder"] == "cnn":
    features = c["cnn_features"]
    if (not isinstance(features, (tuple, list)) or not features
        or not all(isinstance(f, int) and not isinstance(f, bool) and f > 0
                   for f in features)):
      raise ValueError(f"model.cnn_features={features!r} must be a non-empty list of conv "
                       "widths > 0, one stride-2 stage each (e.g. (32, 64, 128))")
    stride = 2 ** len(features)
    if c["image_size"] % stride:
      raise ValueError(f"model.cnn_features has {len(features)} stride-2 stages, which need "
                       f"model.image_size divisible by {stride}; got {c['image_size']}: "
                       "drop a stage or change the image size")
  if c["parametrization"] != "standard":
    raise ValueError(f"model.parametrization={c['parametrization']!r} is not available for "
                     "the captioner family (its CNN, pooling and RNN layers have no μP "
                     "rules); use 'standard'")


def _attention_flops(c: dict, seq_len: int) -> tuple[int, int, int]:
  """The attention term per caption token (seq_len = caption length) as one product
  (layers=1, keys=1, width=the term's layers x keys x width summed): decoder self-attention
  (seq_len keys per layer) and cross-attention over the memory (N keys, 1 without
  attention), or the RNN's additive attention over the memory (width attention_dim +
  hidden_dim, as rnn_seq2seq), plus the ViT encoder's self-attention over the N patches
  (N^2 per layer and image) spread over the caption's tokens. The 6N term charges every
  parameter once per caption token, which understates the encoder (it runs per grid cell or
  conv position, not per token): MFU of this family is a lower bound (at the defaults the
  per-image FLOPs are ~1.4x the count with the ViT encoder, ~3x with the CNN)."""
  rows, cols = grid_shape(c)
  n = rows * cols
  keys = n if c["attention"] else 1
  width = c["num_heads"] * head_dim(c)
  term = 0
  if c["encoder"] == "vit":
    term += c["encoder_layers"] * n * n * width / seq_len
  if c["decoder"] == "transformer":
    term += c["decoder_layers"] * (seq_len + keys) * width
  else:
    term += keys * ((c.get("attention_dim") or c["hidden_dim"]) + c["hidden_dim"])
  return 1, 1, int(round(term))


FAMILY = Family(
    name="captioner", module=Captioner, task="captioning", example_inputs=_example_inputs,
    embeddings=("embed", "pos_embed", "head"), heads=("head",),
    block_defaults=dict(num_heads=4, mlp_dim=256, dropout_rate=0.1, norm_eps=1e-6),
    attention_flops=_attention_flops, validate=_validate)
