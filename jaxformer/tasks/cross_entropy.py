"""Weighted cross-entropy of the model's output head: the loss and eval sums the token and
image tasks share (`CrossEntropyTask`).

`labels` and `weights` say which predictions count, so padding, packed-document boundaries,
unmasked MLM positions and padded eval rows drop out the same way. The train loss is
sum(w x objective) / sum(w) over the global batch. Where the step takes the chunked loss
(`ctx.chunk` > 0, `train.loss_chunk`) the model returns its final hidden states and readout
(`return_hidden=True`) and `ops.cross_entropy.chunked_cross_entropy` computes the logits a
tile of positions at a time, never holding the float32 [batch, length, vocab] logits.
"""

from __future__ import annotations

import dataclasses
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.data.batching import VALID
from jaxformer.ops.cross_entropy import chunked_cross_entropy
from jaxformer.tasks.base import LossContext, LossSums, Task


def cross_entropy(logits, labels, *, label_smoothing: float = 0.0, z_loss: float = 0.0):
  """Per-prediction float32 (objective, nll): objective adds label smoothing
  ((1-s) * nll + s * mean over classes of -log p) and z-loss (z * log(Z)^2, PaLM), which keeps
  the softmax normaliser near 1."""
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  nll = log_z - jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  objective = nll
  if label_smoothing:
    objective = (1 - label_smoothing) * nll + label_smoothing * (log_z - logits.mean(-1))
  if z_loss:
    objective = objective + z_loss * jnp.square(log_z)
  return objective, nll


def gathered_head(readout):
  """The readout with its kernel constrained to be whole along its embed axis (split only
  over `vocab`): under FSDP the head is all-gathered once, before the chunked loss's tile
  loop, and its gradient reduced once after it. Without it XLA gathered the kernel and
  reduced dW in every tile (v5e:2x2 plan, 1-layer d=512 V=32000 FSDP: all-gather 38 -> 257
  MiB, reduce-scatter 62.5 -> 250 MiB per chip; with it, the dense loss's 38 and 62.5). Cost:
  the whole float32 kernel (and on some plans an all-reduced float32 dW) is live at once;
  docs/design/memory.md (the chunked loss) has the figures. A no-op outside a mesh's
  logical-axis rules."""
  axes = ("vocab", None) if readout.vocab_major else (None, "vocab")
  return dataclasses.replace(readout, kernel=nn.with_logical_constraint(readout.kernel, axes))


def returns_hidden(module) -> bool:
  """Whether the model's __call__ can return (final hidden states, readout) in place of its
  logits (`return_hidden=True`): what the chunked loss needs."""
  return "return_hidden" in inspect.signature(type(module).__call__).parameters


def head_sums(output, labels, w, ctx: LossContext):
  """(sum of objective x w, sum of nll x w, sum of correct x w) of the model's head `output`
  against `labels`: the logits, or with `ctx.chunk` (hidden states, readout) for the chunked
  loss."""
  if ctx.chunk:
    hidden_states, readout = output
    objective, nll, correct = chunked_cross_entropy(
        hidden_states, gathered_head(readout), labels, chunk=ctx.chunk,
        label_smoothing=ctx.label_smoothing, z_loss=ctx.z_loss)
  else:
    objective, nll = cross_entropy(output, labels, label_smoothing=ctx.label_smoothing,
                                   z_loss=ctx.z_loss)
    correct = (jnp.argmax(output, -1) == labels).astype(jnp.float32)
  return jnp.sum(objective * w), jnp.sum(nll * w), jnp.sum(correct * w)


@dataclasses.dataclass(frozen=True)
class CrossEntropyTask(Task):
  """A task whose loss is the weighted cross-entropy of the model's output against
  `labels`; subclasses state the data (`make_pipeline`, `batch_spec`)."""
  head_loss: bool = True
  sequence_accuracy: bool = False  # evals also count the sequences right in every token

  def loss(self, ctx: LossContext, batch: dict) -> LossSums:
    args, kwargs = self.model_args(batch)
    out = ctx.forward(*args, **kwargs)
    return LossSums(*head_sums(out, batch[self.labels], self.weights(batch), ctx), {})

  def eval_sums(self, module, params, batch: dict, extra=None) -> dict:
    del extra
    args, kwargs = self.model_args(batch)
    logits = module.apply({"params": params}, *args, **kwargs, deterministic=True)
    return self.logit_sums(logits, batch)

  def logit_sums(self, logits, batch: dict) -> dict:
    """The eval sums of the model's output `logits` on `batch`."""
    labels, w = batch[self.labels], self.weights(batch)
    _, nll = cross_entropy(logits, labels)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    sums = {"nll": jnp.sum(nll * w), "correct": jnp.sum(correct * w), "count": jnp.sum(w)}
    if self.sequence_accuracy:     # a sequence is right when all its weighted tokens are
      row_ok = jnp.all((correct > 0) | (w == 0), axis=-1).astype(jnp.float32)
      rows = batch[VALID] if VALID in batch else jnp.ones(row_ok.shape, jnp.float32)
      sums.update(seq_correct=jnp.sum(row_ok * rows), seq_count=jnp.sum(rows))
    return sums

  def finalize(self, totals: dict) -> dict:
    count = max(float(totals["count"]), 1e-9)
    loss = float(totals["nll"]) / count
    out = {"eval_loss": loss, "eval_accuracy": float(totals["correct"]) / count}
    if self.text:
      out["eval_perplexity"] = float(np.exp(min(loss, 80.0)))
    if "seq_count" in totals:
      out["eval_sequence_accuracy"] = float(totals["seq_correct"]) / max(
          float(totals["seq_count"]), 1e-9)
    return out
