"""The chunked loss: cross-entropy of a linear readout that never holds [B, T, vocab] in
float32.

    objective, nll, correct = chunked_cross_entropy(hidden, readout, labels, chunk=512)

`hidden` [B, T, d] are the final hidden states (compute dtype), `readout` the output head
(`Readout`: the unembedding kernel [d, V], or the tied embedding [V, d] read in place with no
transpose copy, an optional bias [V] and output multiplier), `labels` [B, T] int. The result
is per position, float32 [B, T]: the objective with label smoothing and z-loss exactly as
`tasks.cross_entropy.cross_entropy` defines them, the nll, and 1.0 where the label is the
logits' argmax (first maximum, as jnp.argmax).

How: the sequence is cut into tiles of `chunk` positions (T padded to a multiple; padded
positions get no gradient) and a `lax.scan` over the tiles computes each tile's logits
[B, chunk, V] with a matmul in the compute dtype accumulating in float32
(`preferred_element_type`), its log-sum-exp in float32, and keeps per position only
log Z, the label's logit, the logits' mean and the argmax hit. The VJP (`jax.custom_vjp`)
saves log Z [B, T] and scans the tiles again: it recomputes each tile's logits, forms the
float32 gradient of the logits (p (1 + 2 z log Z) - (1 - s) onehot - s / V, times the
objective's cotangent, plus p - onehot times the nll's) and returns dh per tile and dW (and
db) accumulated over the tiles in float32. Memory: one [B, chunk, V] float32 tile (and its
gradient) instead of the dense path's float32 logits, their softmax and gradient; compute:
the tile's logits are computed twice (one more readout matmul than the dense path, whose
backward reuses stored logits).

Tiling the sequence, not the rows of a flattened [B*T] batch, keeps the batch axis whole in
every tile: a batch sharded over data-parallel devices stays sharded, each device computing
its rows of every tile.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

DEFAULT_CHUNK = 512


@functools.partial(jax.tree_util.register_dataclass, data_fields=["kernel", "bias"],
                   meta_fields=["vocab_major", "scale"])
@dataclasses.dataclass(frozen=True)
class Readout:
  """A model's output head as data: logits = (h @ kernel) * scale + bias.

  kernel: [d, V] (an untied lm_head), or [V, d] with `vocab_major=True` (a tied embedding
  table); bias: [V] or None; scale: a Python float (μP's readout multiplier) or None. The
  arrays are the parameters themselves (gradients flow into them); the matmul runs in the
  hidden states' dtype."""
  kernel: Any
  bias: Any = None
  vocab_major: bool = False
  scale: float | None = None

  @property
  def vocab_size(self) -> int:
    return self.kernel.shape[0 if self.vocab_major else 1]

  def logits(self, hidden):
    """The dense float32 logits [..., V] (for references and small heads)."""
    return _tile_logits(hidden, self.kernel.astype(hidden.dtype), self.bias,
                        self.vocab_major, self.scale)


def _tile_logits(x, kernel, bias, vocab_major, scale):
  """x [..., d] (compute dtype), kernel already in the compute dtype -> float32 [..., V]."""
  logits = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (1 if vocab_major else 0,)),
                                           ((), ())), preferred_element_type=jnp.float32)
  if scale is not None:
    logits = logits * scale
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  return logits


def _tiles(x, chunk):
  """[B, T', ...] -> [T' / chunk, B, chunk, ...] (T' a multiple of chunk)."""
  b, t = x.shape[:2]
  return jnp.moveaxis(x.reshape((b, t // chunk, chunk) + x.shape[2:]), 1, 0)


def _untile(x):
  """Inverse of `_tiles`."""
  n, b, c = x.shape[:3]
  return jnp.moveaxis(x, 0, 1).reshape((b, n * c) + x.shape[3:])


def _forward(h, kernel, bias, labels, *, vocab_major, scale, chunk, label_smoothing, z_loss):
  w = kernel.astype(h.dtype)

  def tile(_, xs):
    x, lab = xs
    logits = _tile_logits(x, w, bias, vocab_major, scale)          # [B, chunk, V] f32
    log_z = jax.nn.logsumexp(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, lab[..., None], axis=-1)[..., 0]
    correct = (jnp.argmax(logits, -1) == lab).astype(jnp.float32)
    mean = logits.mean(-1) if label_smoothing else jnp.zeros_like(log_z)
    return None, (log_z, label_logit, mean, correct)

  _, outs = jax.lax.scan(tile, None, (_tiles(h, chunk), _tiles(labels, chunk)))
  log_z, label_logit, mean, correct = (_untile(o) for o in outs)
  nll = log_z - label_logit
  objective = nll
  if label_smoothing:
    objective = (1 - label_smoothing) * nll + label_smoothing * (log_z - mean)
  if z_loss:
    objective = objective + z_loss * jnp.square(log_z)
  return (objective, nll, correct), log_z


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _chunked(h, kernel, bias, labels, vocab_major, scale, chunk, label_smoothing, z_loss):
  return _forward(h, kernel, bias, labels, vocab_major=vocab_major, scale=scale, chunk=chunk,
                  label_smoothing=label_smoothing, z_loss=z_loss)[0]


def _chunked_fwd(h, kernel, bias, labels, vocab_major, scale, chunk, label_smoothing, z_loss):
  out, log_z = _forward(h, kernel, bias, labels, vocab_major=vocab_major, scale=scale,
                        chunk=chunk, label_smoothing=label_smoothing, z_loss=z_loss)
  return out, (h, kernel, bias, labels, log_z)


def _chunked_bwd(vocab_major, scale, chunk, label_smoothing, z_loss, residuals, cotangents):
  h, kernel, bias, labels, log_z = residuals
  g_obj, g_nll, _ = cotangents                       # `correct` has no gradient
  w = kernel.astype(h.dtype)
  vocab = kernel.shape[0 if vocab_major else 1]
  s = label_smoothing
  # d objective / d logits = p (1 + 2 z log Z) - (1 - s) onehot - s / V; d nll = p - onehot
  p_coef = g_obj * (1 + 2 * z_loss * log_z) + g_nll
  onehot_coef = g_obj * (1 - s) + g_nll
  uniform_coef = g_obj * (s / vocab)
  x_dims = (0, 1)                                    # the tile's (batch, position) axes

  def tile(carry, xs):
    dw, db = carry
    x, lab, lz, pc, oc, uc = xs
    logits = _tile_logits(x, w, bias, vocab_major, scale)
    grad = pc[..., None] * jnp.exp(logits - lz[..., None]) - uc[..., None]
    grad = grad - jnp.where(jnp.arange(vocab) == lab[..., None], oc[..., None], 0.0)
    if db is not None:
      db = db + grad.sum(x_dims)
    if scale is not None:
      grad = grad * scale
    g = grad.astype(h.dtype)
    dx = jax.lax.dot_general(g, w, (((2,), (0 if vocab_major else 1,)), ((), ())),
                             preferred_element_type=jnp.float32).astype(h.dtype)
    if vocab_major:       # dW [V, d] = g^T x
      dw = dw + jax.lax.dot_general(g, x, ((x_dims, x_dims), ((), ())),
                                    preferred_element_type=jnp.float32)
    else:                 # dW [d, V] = x^T g
      dw = dw + jax.lax.dot_general(x, g, ((x_dims, x_dims), ((), ())),
                                    preferred_element_type=jnp.float32)
    return (dw, db), dx

  init = (jnp.zeros(kernel.shape, jnp.float32),
          None if bias is None else jnp.zeros(bias.shape, jnp.float32))
  xs = tuple(_tiles(a, chunk) for a in (h, labels, log_z, p_coef, onehot_coef, uniform_coef))
  (dw, db), dx = jax.lax.scan(tile, init, xs)
  return (_untile(dx), dw.astype(kernel.dtype),
          None if bias is None else db.astype(bias.dtype), None)


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def chunked_cross_entropy(hidden, readout: Readout, labels, *, chunk: int = DEFAULT_CHUNK,
                          label_smoothing: float = 0.0, z_loss: float = 0.0):
  """Per-position float32 (objective, nll, correct) [..., T] of the readout's logits of
  `hidden` [..., T, d] against `labels` [..., T] (see the module docstring); only one
  [rows, chunk, V] float32 tile of logits exists at a time. Leading axes are flattened
  into one batch axis; T need not be a multiple of `chunk`."""
  if not (isinstance(chunk, int) and chunk >= 1):
    raise ValueError(f"chunk={chunk!r} must be an int >= 1 (positions per tile)")
  if hidden.ndim < 2 or labels.shape != hidden.shape[:-1]:
    raise ValueError(f"hidden {hidden.shape} must be [..., T, d] and labels {labels.shape} "
                     "[..., T]")
  d = hidden.shape[-1]
  if readout.kernel.shape[1 if readout.vocab_major else 0] != d:
    raise ValueError(f"readout kernel {readout.kernel.shape} (vocab_major="
                     f"{readout.vocab_major}) does not match hidden width {d}")
  lead, t = labels.shape[:-1], labels.shape[-1]
  h = hidden.reshape((-1, t, d))
  lab = labels.reshape((-1, t)).astype(jnp.int32)
  chunk = min(chunk, t)
  pad = -t % chunk
  if pad:
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    lab = jnp.pad(lab, ((0, 0), (0, pad)))
  scale = None if readout.scale is None else float(readout.scale)
  out = _chunked(h, readout.kernel, readout.bias, lab, bool(readout.vocab_major), scale,
                 chunk, float(label_smoothing), float(z_loss))
  return tuple(o[:, :t].reshape(lead + (t,)) for o in out)
