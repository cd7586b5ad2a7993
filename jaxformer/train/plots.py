"""Training curves from metrics.jsonl, attention heatmaps, and per-head attention entropy.

Figures are drawn on `matplotlib.figure.Figure` objects with the Agg canvas, never through
pyplot, so nothing touches the global backend, opens a window, or leaks figures in a long run.
matplotlib is imported when the first figure is drawn, not with this module: the train
command imports it on every start (~1 s), and a run refused by its config draws nothing.
`attention_entropy` is the number the loop logs to watch heads go from uniform (log Tk nats)
to focused (near 0).
"""

from __future__ import annotations

import io
import math
import os
from typing import Sequence

import numpy as np

from jaxformer import paths
from jaxformer.train.metrics import read


def _save(figure, out_png: str | os.PathLike) -> str:
  """The figure as a PNG at `out_png` (a local path or a URL), written whole."""
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png")
  paths.write_bytes(out_png, buffer.getvalue())
  return os.fspath(out_png)


def _new_figure(width_in: float, height_in: float, dpi: int):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  figure = Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")
  FigureCanvasAgg(figure)
  return figure


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
  return [s for s, _ in points], [v for _, v in points]


# metrics.jsonl's train `loss` is the mean over each log interval (train/step.py)
_CURVE_LABELS = {"loss": "train loss (mean over log interval)", "eval_loss": "eval loss",
                 "eval_accuracy": "eval accuracy"}


def plot_curves(metrics_jsonl_path: str | os.PathLike, out_png: str | os.PathLike, *,
                log_y: bool = False, dpi: int = 100) -> str:
  """Loss (train and eval) vs step, eval accuracy and learning rate on their own panels
  when the records have them. Returns `out_png`."""
  records = read(metrics_jsonl_path)
  panels = [("loss", ("loss", "eval_loss")), ("accuracy", ("eval_accuracy",)), ("lr", ("lr",))]
  panels = [(name, keys) for name, keys in panels if any(_series(records, k)[0] for k in keys)]
  if not panels:
    raise ValueError(f"{metrics_jsonl_path}: no 'loss', 'eval_loss', 'eval_accuracy' or 'lr' "
                     "records to plot; train for at least train.log_every steps first")
  figure = _new_figure(6.4, 2.4 * len(panels), dpi)
  axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
  for ax, (name, keys) in zip(axes, panels):
    for key in keys:
      steps, values = _series(records, key)
      if steps:
        ax.plot(steps, values, marker="o" if key.startswith("eval") else None, markersize=3,
                label=_CURVE_LABELS.get(key, key.replace("_", " ")))
    if log_y and name == "loss":
      ax.set_yscale("log")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
  axes[-1].set_xlabel("step")
  return _save(figure, out_png)


def _check_weights(weights) -> np.ndarray:
  array = np.asarray(weights, dtype=np.float64)
  if array.ndim < 3:
    raise ValueError(f"weights: expected [..., heads, Tq, Tk] attention probabilities, got "
                     f"shape {array.shape}; add a head axis with weights[None]")
  if not np.all(np.isfinite(array)) or np.any(array < 0):
    raise ValueError("weights must be finite and non-negative (softmax probabilities)")
  return array


def _label(token: str) -> str:
  """Whitespace made visible for character-level tokens."""
  return token.replace(" ", "\u2423").replace("\n", "\\n").replace("\t", "\\t")


_LABEL_POINTS = 6           # tick label font size
_AXIS_INCHES = 2.6          # side of one head's heatmap


def _tick_step(labels: Sequence[str], rotated: bool) -> int:
  """Every how many positions to label so that labels do not overlap along a 2.6-inch axis:
  an upright label takes its width (0.62 em per character), a rotated one its line height."""
  em = _LABEL_POINTS / 72
  size = 1.3 * em if rotated else max(len(t) for t in labels) * 0.62 * em + 0.4 * em
  fits = max(int(_AXIS_INCHES / size), 1)
  return max(math.ceil(len(labels) / fits), 1)


def _label_axis(ax, axis: str, labels: list[str] | None, length: int) -> None:
  """Token labels (single characters upright, longer ones rotated on the x axis), thinned to
  every n-th position when they would overlap; without labels, integer position ticks."""
  from matplotlib.ticker import MaxNLocator
  target = ax.xaxis if axis == "x" else ax.yaxis
  if labels is None:
    target.set_major_locator(MaxNLocator(integer=True, nbins=6))
    ax.tick_params(axis=axis, labelsize=_LABEL_POINTS)
    return
  rotated = axis == "x" and max(len(t) for t in labels) > 1
  step = _tick_step(labels, rotated)
  ticks = list(range(0, length, step))
  if axis == "x":
    ax.set_xticks(ticks, [labels[i] for i in ticks], rotation=90 if rotated else 0,
                  fontsize=_LABEL_POINTS)
  else:
    ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=_LABEL_POINTS)


def plot_attention(weights, tokens: Sequence[str] | None, out_png: str | os.PathLike,
                   title: str | None = None, *, dpi: int = 100, query_tokens=None,
                   self_attention: bool = True,
                   axis_names: tuple[str, str] = ("key", "query")) -> str:
  """A grid of heatmaps of `weights` [H, Tq, Tk], one per head (query rows, key columns),
  with axis titles (`axis_names`: e.g. ("key patch", "query patch") for ViT).

  `tokens` label the keys, and the queries of self-attention (aligned to the last keys as in
  causal decoding) unless `query_tokens` gives the queries' own labels (cross-attention,
  `self_attention=False`, has no query labels without them):
  single characters upright, longer tokens rotated, thinned to every n-th position where
  they would overlap. Without tokens (image patches) the ticks are integer positions.
  Returns `out_png`.
  """
  array = _check_weights(weights)
  if array.ndim != 3:
    raise ValueError(f"weights: expected [heads, Tq, Tk], got shape {array.shape}; "
                     "select one example, e.g. weights[0]")
  heads, q_len, k_len = array.shape
  if not heads * q_len * k_len:
    raise ValueError(f"weights: shape {array.shape} is empty")
  if tokens is not None and len(tokens) != k_len:
    raise ValueError(f"tokens has {len(tokens)} entries but weights has Tk={k_len} keys")
  if query_tokens is not None and len(query_tokens) != q_len:
    raise ValueError(f"query_tokens has {len(query_tokens)} entries but weights has "
                     f"Tq={q_len} queries")
  cols = math.ceil(math.sqrt(heads))
  rows = math.ceil(heads / cols)
  figure = _new_figure(_AXIS_INCHES * cols + 1.2, _AXIS_INCHES * rows + 0.6
                       + (0.4 if title else 0.0), dpi)
  axes = figure.subplots(rows, cols, squeeze=False).ravel()
  keys = [_label(t) for t in tokens] if tokens is not None else None
  if query_tokens is not None:
    queries = [_label(t) for t in query_tokens]
  elif keys is not None and self_attention and q_len <= k_len:
    queries = keys[k_len - q_len:]
  else:
    queries = None
  for head, ax in enumerate(axes):
    if head >= heads:
      ax.set_axis_off()
      continue
    image = ax.imshow(array[head], vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto",
                      interpolation="nearest")
    ax.set_title(f"head {head}", fontsize="small")
    _label_axis(ax, "x", keys, k_len)
    _label_axis(ax, "y", queries, q_len)
    if head % cols == 0:
      ax.set_ylabel(axis_names[1], fontsize="small")
    if head + cols >= heads:
      ax.set_xlabel(axis_names[0], fontsize="small")
  figure.colorbar(image, ax=list(axes[:heads]), shrink=0.8, label="attention weight")
  if title:
    figure.suptitle(title)
  return _save(figure, out_png)


def attention_entropy(weights) -> np.ndarray:
  """Per-head entropy (nats) of the attention rows, averaged over query rows: [H].

  `weights` [..., H, Tq, Tk] are probabilities over the last axis; 0 log 0 = 0, so masked keys
  count for nothing. Rows with no weight at all (fully masked queries) are left out of the
  mean; a head whose rows are all empty gets 0. Leading axes (batch) are averaged like rows.
  """
  array = _check_weights(weights)
  logs = np.log(np.where(array > 0, array, 1.0))
  row_entropy = -np.sum(array * logs, axis=-1)                       # [..., H, Tq]
  valid = np.sum(array, axis=-1) > 0
  heads = array.shape[-3]
  row_entropy = np.moveaxis(row_entropy, -2, 0).reshape(heads, -1)
  valid = np.moveaxis(valid, -2, 0).reshape(heads, -1)
  counts = valid.sum(axis=1)
  return np.where(valid, row_entropy, 0.0).sum(axis=1) / np.maximum(counts, 1)
