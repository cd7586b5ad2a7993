"""Captions from a trained captioner: beam-search decoding, per-word attention maps and
caption metrics (exact match, token accuracy, corpus BLEU-4).

    tokens, scores = caption_images(config.model, params, images, beam_size=3)
    maps = attention_maps(config.model, params, images, tokens)     # [B, T, rows, cols]
    draw_attention(images, words, maps, "attention.png")          # the figure, one row each
    caption_metrics(hyp_words, ref_words, by=num_digits)            # {group: metrics}

Token ids follow the captioning task's vocabulary: PAD=0, BOS=1, EOS=2 (the defaults here).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import models
from jaxformer.data.images.captions import BOS as BOS_ID, EOS as EOS_ID, PAD as PAD_ID
from jaxformer.inference import beam
from jaxformer.models import captioner
from jaxformer.extras import require


def _config_key(model_config) -> tuple[str, dict]:
  """(a hashable key of the model config with defaults, the config)."""
  cfg = models.with_defaults(model_config)
  if cfg["family"] != "captioner":
    raise ValueError(f"model.family={cfg['family']!r}: captions need the 'captioner' family")
  for k in ("dtype", "param_dtype"):       # by name (a jnp dtype object is not JSON)
    cfg[k] = jnp.dtype(cfg[k]).name
  return json.dumps(cfg, sort_keys=True), cfg


def caption_images(model_config: Any, params, images, *, beam_size: int = 1,
                   max_len: int | None = None, length_penalty: float = 0.0,
                   bos_id: int = BOS_ID, eos_id: int = EOS_ID, pad_id: int = PAD_ID):
  """Caption images [B, S, S, C]: (token ids [B, max_len] int32 without BOS, PAD after EOS;
  scores [B] float32: the best beam's log-prob sum, or its GNMT-penalised score), best beam
  of `beam.beam_search` (beam_size=1: greedy).

  The image is encoded once; each step re-runs the decoder on the whole padded prefix of
  every beam (no KV cache): max_len decoder passes over max_len positions, i.e. O(max_len^2)
  decoder work per beam instead of O(max_len), which is cheap at caption lengths (~17). PAD
  and BOS are never generated (their log-probs are masked). max_len defaults to the model's
  and cannot exceed it. The jitted search is cached per (config, search settings): one
  compilation per batch shape.
  """
  key, cfg = _config_key(model_config)
  max_len = cfg["max_len"] if max_len is None else max_len
  if not 1 <= max_len <= cfg["max_len"]:
    raise ValueError(f"max_len={max_len} must be in [1, model.max_len={cfg['max_len']}]")
  fn = _caption_fn(key, beam_size, max_len, float(length_penalty), bos_id, eos_id, pad_id)
  return fn(params, jnp.asarray(images, jnp.float32))


@functools.lru_cache(maxsize=32)
def _caption_fn(key: str, beam_size: int, max_len: int, length_penalty: float, bos_id: int,
                eos_id: int, pad_id: int):
  module = models.build(json.loads(key))

  def run(params, images):
    variables = {"params": params}
    memory = module.apply(variables, images, method=captioner.Captioner.encode)
    memory = jnp.repeat(memory, beam_size, axis=0)              # row b * K + k

    def log_prob_fn(tokens, t):
      logits = module.apply(variables, memory, tokens, method=captioner.Captioner.decode)
      logp = jax.nn.log_softmax(jax.lax.dynamic_index_in_dim(logits, t - 1, 1, False), -1)
      return logp.at[:, jnp.array([pad_id, bos_id])].set(-jnp.inf)

    tokens, scores = beam.beam_search(log_prob_fn, images.shape[0], beam_size=beam_size,
                                      max_len=max_len, bos_id=bos_id, eos_id=eos_id,
                                      pad_id=pad_id, length_penalty=length_penalty)
    return tokens[:, 0], scores[:, 0]

  return jax.jit(run)


def attention_maps(model_config: Any, params, images, tokens, *, bos_id: int = BOS_ID):
  """Where each word looked: [B, T, rows, cols] float32 for images [B, S, S, C] and caption
  tokens [B, T] (as `caption_images` returns them, no BOS). Row t is the attention used to
  predict tokens[:, t] (decoder input BOS + tokens[:, :t]); each map sums to 1 over the grid.
  Transformer: the last decoder layer's cross-attention averaged over heads; LSTM/GRU: the
  additive attention weights (the intermediates/caption_attention the model sows).

  With attention=False the decoder has one key, the mean of the grid (before the pooling
  dense), so every word sees every cell with the same weight: its maps are uniform,
  1 / (rows x cols), not word-specific. They are returned as such so that every model is
  plotted on the same grid.
  """
  key, cfg = _config_key(model_config)
  tokens = jnp.asarray(tokens, jnp.int32)
  inputs = jnp.concatenate([jnp.full((tokens.shape[0], 1), bos_id, jnp.int32),
                            tokens[:, :-1]], axis=1)
  weights = _maps_fn(key)(params, jnp.asarray(images, jnp.float32), inputs)   # [B, T, N]
  rows, cols = captioner.grid_shape(cfg)
  if not cfg["attention"]:
    weights = jnp.broadcast_to(weights / (rows * cols), weights.shape[:2] + (rows * cols,))
  return weights.reshape(weights.shape[:2] + (rows, cols))


@functools.lru_cache(maxsize=32)
def _maps_fn(key: str):
  module = models.build(json.loads(key))

  def run(params, images, inputs):
    _, state = module.apply({"params": params}, images, inputs, mutable=["intermediates"])
    return state["intermediates"]["caption_attention"][-1]
  return jax.jit(run)


def draw_attention(images, words: Sequence[Sequence[str]], maps, path: str, *,
                   title: str = "") -> str:
  """The Show, Attend and Tell figure as a PNG at `path` (a local path or a URL): one row per
  image [B, S, S, C] (values in [0, 1]), the image, then each word of its caption (`words`,
  plus "<eos>") over the image with its attention map (`maps` [B, T, rows, cols], as
  `attention_maps` returns them) as a heatmap. Returns `path`."""
  import io
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  from jaxformer import paths
  images, maps = np.asarray(images, np.float32), np.asarray(maps, np.float32)
  cols = 1 + min(max(len(w) + 1 for w in words), maps.shape[1])
  fig = Figure(figsize=(1.3 * cols, 1.45 * len(images)), dpi=110, layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(len(images), cols, squeeze=False)
  size = images.shape[1]
  for row, (image, caption_words, amap) in enumerate(zip(images, words, maps)):
    for ax in axes[row]:
      ax.axis("off")
    gray = image.mean(-1)
    axes[row, 0].imshow(gray, cmap="gray", vmin=0, vmax=1)
    axes[row, 0].set_title("input", fontsize=7)
    for t, word in enumerate((list(caption_words) + ["<eos>"])[:amap.shape[0]]):
      heat = np.kron(amap[t], np.ones((size // amap.shape[1], size // amap.shape[2])))
      ax = axes[row, t + 1]
      ax.imshow(gray, cmap="gray", vmin=0, vmax=1)
      ax.imshow(heat, cmap="jet", alpha=0.45, extent=(-0.5, heat.shape[1] - 0.5,
                                                     heat.shape[0] - 0.5, -0.5))
      ax.set_title(word, fontsize=7)
  if title:
    fig.suptitle(title, fontsize=9)
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png")
  paths.write_bytes(path, buffer.getvalue())
  return path


def caption_metrics(hyps: Sequence[Sequence], refs: Sequence[Sequence],
                    by: Sequence[Hashable] | None = None) -> dict:
  """Metrics of hypothesis captions against one reference each, both lists of word lists
  (words: strings or ints, no BOS/EOS/PAD):

  - exact: fraction of captions equal to their reference;
  - token_accuracy: position-aligned, over the reference plus its EOS: of all reference
    positions (len(ref) + 1 per caption), the fraction where the hypothesis (plus its EOS)
    has the same word, so a missing or extra word is an error at the EOS position;
  - bleu: corpus BLEU-4 (0-100) of `sacrebleu.corpus_bleu` on the space-joined words with
    tokenize='none' (the words are already the tokens), default exponential smoothing;
    captions of fewer than 4 words contribute no 4-grams;
  - count: the number of captions.

  by: one hashable key per caption (e.g. the number of digits): returns {key: metrics} for
  every key (sorted), else the metrics of all captions.
  """
  if len(hyps) != len(refs):
    raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
  if by is None:
    return _metrics(hyps, refs)
  if len(by) != len(refs):
    raise ValueError(f"by has {len(by)} keys for {len(refs)} captions")
  groups: dict = {}
  for i, key in enumerate(by):
    groups.setdefault(key, []).append(i)
  return {key: _metrics([hyps[i] for i in groups[key]], [refs[i] for i in groups[key]])
          for key in sorted(groups)}


_EOS = object()          # the end marker of token accuracy: equal to itself only


def _metrics(hyps, refs) -> dict:
  sacrebleu = require("sacrebleu", extra="vision", needed_for="caption BLEU")
  hyps = [[str(w) for w in h] for h in hyps]
  refs = [[str(w) for w in r] for r in refs]
  exact = sum(h == r for h, r in zip(hyps, refs))
  correct = total = 0
  for h, r in zip(hyps, refs):
    h, r = h + [_EOS], r + [_EOS]
    correct += sum(i < len(h) and h[i] == w for i, w in enumerate(r))
    total += len(r)
  n = len(refs)
  bleu = sacrebleu.corpus_bleu([" ".join(h) for h in hyps], [[" ".join(r) for r in refs]],
                               tokenize="none").score if n else 0.0
  return {"exact": exact / n if n else 0.0, "token_accuracy": correct / total if total else 0.0,
          "bleu": float(bleu), "count": n}


__all__ = ["caption_images", "attention_maps", "draw_attention", "caption_metrics", "PAD_ID", "BOS_ID",
           "EOS_ID"]
