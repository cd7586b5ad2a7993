"""ELECTRA's replaced-token detection (Clark et al., 2020): task "rtd" (electra).

On the mlm task's batches ({'inputs' masked, 'targets' original, 'weights' 1 at the masked
positions}, `data/text.py`): the generator predicts the masked tokens (MLM cross-entropy
over the masked positions); replacements are sampled from its softmax with a key derived from
the step's key (`fold_in(key, 1)`, no gradient through the sample) and put at the masked
positions; the discriminator classifies every real token of the corrupted sequence as original
or replaced (sigmoid cross-entropy over the tokens, padding and padded eval rows excluded).

    loss = MLM mean over masked positions + λ * detection mean over tokens

with λ = `model.disc_weight` (the paper's 50). The train step divides its sums by the masked
count, so the detection sum enters scaled by (masked / tokens) of the (micro-)batch, which
makes the step's `loss` exactly the objective above for one batch (with `grad_accum` each
micro-batch's ratio is used). Train metrics: `loss` is that objective, `accuracy` the
detection accuracy, and `mlm_loss`, `mlm_accuracy`, `disc_loss`, `disc_accuracy`,
`disc_baseline` of the batch are logged with them. Eval (sampling with a fixed key, so an
eval is a function of the params): `eval_loss` (the objective), `eval_accuracy` (detection
accuracy over real tokens), `eval_disc_baseline` (the accuracy of calling every token original: the share not replaced),
`eval_disc_loss`, `eval_replaced_recall` (detection accuracy on the replaced tokens) and
`eval_replaced_precision` (the share of tokens called replaced that were: 0 when none are;
unlike the accuracy, this pair is not fooled by the ~86% of tokens that are original),
`eval_disc_prior_loss` (the detection loss of the best constant guess, the entropy of the
replaced share: `eval_disc_loss` below it is detection learned from the tokens),
`eval_mlm_loss`, `eval_mlm_accuracy` (the generator on the masked positions).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxformer.data.batching import VALID
from jaxformer.tasks.base import LossContext, LossSums
from jaxformer.tasks.mlm import MaskedLM

EVAL_KEY = 0          # the sampling key of every eval batch


def _valid_rows(batch, shape):
  if VALID not in batch:
    return jnp.ones(shape, jnp.float32)
  return jnp.broadcast_to(batch[VALID].astype(jnp.float32)[:, None], shape)


def _forward(module, params, batch, key, *, deterministic: bool, rngs=None):
  kwargs = {k: batch[k] for k in ("token_type_ids", "attention_mask") if k in batch}
  out = module.apply({"params": params}, batch["inputs"], batch["targets"], batch["weights"],
                     key, deterministic=deterministic, rngs=rngs, method="pretrain", **kwargs)
  rows = _valid_rows(batch, batch["targets"].shape)
  masked = batch["weights"].astype(jnp.float32) * rows
  tokens = rows
  if "attention_mask" in batch:
    tokens = tokens * batch["attention_mask"].astype(jnp.float32)
  return out, masked, tokens


def _sums(out, masked, tokens, targets) -> dict:
  logits = out["mlm_logits"]
  log_z = jax.nn.logsumexp(logits, axis=-1)
  mlm_nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  mlm_correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  replaced = out["replaced"].astype(jnp.float32)
  z = out["rtd_logits"]
  bce = jnp.maximum(z, 0) - z * replaced + jnp.log1p(jnp.exp(-jnp.abs(z)))  # stable BCE
  disc_correct = ((z > 0).astype(jnp.float32) == replaced).astype(jnp.float32)
  return {"mlm_nll": jnp.sum(mlm_nll * masked), "mlm_correct": jnp.sum(mlm_correct * masked),
          "mlm_count": jnp.sum(masked), "disc_bce": jnp.sum(bce * tokens),
          "disc_correct": jnp.sum(disc_correct * tokens), "disc_count": jnp.sum(tokens),
          "original": jnp.sum((1 - replaced) * tokens),
          "replaced_correct": jnp.sum(disc_correct * replaced * tokens),
          "replaced_count": jnp.sum(replaced * tokens),
          "flagged": jnp.sum((z > 0).astype(jnp.float32) * tokens)}


@dataclasses.dataclass(frozen=True)
class ReplacedTokenDetection(MaskedLM):
  """The mlm task's batches, ELECTRA's objective (its generator and discriminator run through
  the model's `pretrain` method)."""
  head_loss: bool = False
  row_sums: bool = False           # the detection sum enters scaled by the masked share

  def for_model(self, model_config):
    return self

  def loss(self, ctx: LossContext, batch: dict) -> LossSums:
    """Sums over one (micro-)batch in the train step's convention: each divided by the
    masked count gives the objective, and the detection accuracy."""
    module, rng = ctx.module, ctx.rng
    out, masked, tokens = _forward(module, ctx.params, batch, jax.random.fold_in(rng, 1),
                                   deterministic=False, rngs={"dropout": rng})
    s = _sums(out, masked, tokens, batch["targets"])
    scale = s["mlm_count"] / jnp.maximum(s["disc_count"], 1e-9)
    total = s["mlm_nll"] + module.disc_weight * s["disc_bce"] * scale
    mlm_count = jnp.maximum(s["mlm_count"], 1e-9)
    disc_count = jnp.maximum(s["disc_count"], 1e-9)
    metrics = {"mlm_loss": s["mlm_nll"] / mlm_count, "mlm_accuracy": s["mlm_correct"] / mlm_count,
               "disc_loss": s["disc_bce"] / disc_count,
               "disc_accuracy": s["disc_correct"] / disc_count,
               "disc_baseline": s["original"] / disc_count}
    return LossSums(total, total, s["disc_correct"] * scale, metrics)

  def eval_sums(self, module, params, batch, extra=None) -> dict:
    del extra
    out, masked, tokens = _forward(module, params, batch, jax.random.key(EVAL_KEY),
                                   deterministic=True)
    s = _sums(out, masked, tokens, batch["targets"])
    return {**s, "disc_weight": jnp.asarray(module.disc_weight, jnp.float32),
            "batches": jnp.ones((), jnp.float32)}

  def finalize(self, totals: dict) -> dict:
    t = {k: float(v) for k, v in totals.items()}
    per = lambda k, n: t[k] / max(t[n], 1e-9)
    weight = t["disc_weight"] / max(t["batches"], 1.0)
    mlm, disc = per("mlm_nll", "mlm_count"), per("disc_bce", "disc_count")
    p = min(max(per("replaced_count", "disc_count"), 1e-12), 1 - 1e-12)
    return {"eval_loss": mlm + weight * disc,
            "eval_accuracy": per("disc_correct", "disc_count"),
            "eval_disc_baseline": per("original", "disc_count"),
            "eval_disc_loss": disc,
            "eval_disc_prior_loss": -(p * math.log(p) + (1 - p) * math.log(1 - p)),
            "eval_replaced_recall": per("replaced_correct", "replaced_count"),
            "eval_replaced_precision": per("replaced_correct", "flagged"),
            "eval_mlm_loss": mlm, "eval_mlm_accuracy": per("mlm_correct", "mlm_count")}


TASKS = (ReplacedTokenDetection("rtd", kind="mlm", inputs=("inputs",),
                                optional=(("attention_mask", "attention_mask"),
                                          ("token_type_ids", "token_type_ids")),
                                counted="inputs", context=("inputs",), text=True),)
