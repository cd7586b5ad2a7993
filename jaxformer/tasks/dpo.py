"""Direct preference optimization (task "dpo", `posttrain.method='dpo'`): rows of (chosen,
rejected) completions of a prompt (`posttrain/data.py`), the sigmoid DPO loss of
`posttrain/dpo.py` against a frozen reference.

The policy's params are trained; the reference's (the train state's 'reference', this task's
`extra_state`: a copy of the SFT params made at initialization) only give log-probabilities,
computed on the fly under stop_gradient in the same step. The loss is over pairs ('pairs' is 1
per pair, so the step's weighted sums are per-pair means); the step logs trl's metrics as
`dpo_*`. `beta` and `label_smoothing` come from the config's posttrain section
(`for_posttrain`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.data.batching import VALID
from jaxformer.posttrain.dpo import dpo_loss, sequence_logps
from jaxformer.tasks.base import LossContext, LossSums, Task
from jaxformer.tasks.sft import posttrain_pipeline, seq_len


def _forward_logps(module, params, batch, *, deterministic: bool, rngs=None):
  """([B] chosen, [B] rejected) summed response log-probs: one forward over both halves."""
  inputs = jnp.concatenate([batch["chosen_inputs"], batch["rejected_inputs"]])
  targets = jnp.concatenate([batch["chosen_targets"], batch["rejected_targets"]])
  weights = jnp.concatenate([batch["chosen_weights"], batch["rejected_weights"]])
  logits = module.apply({"params": params}, inputs, deterministic=deterministic, rngs=rngs)
  logps = sequence_logps(logits, targets, weights)
  n = batch["chosen_inputs"].shape[0]
  return logps[:n], logps[n:]


def _rows(batch):
  rows = batch["pairs"].astype(jnp.float32)
  return rows * batch[VALID] if VALID in batch else rows


@dataclasses.dataclass(frozen=True)
class DirectPreference(Task):
  beta: float = 0.1
  label_smoothing: float = 0.0
  data_kind: str = "posttrain_records"

  def for_posttrain(self, settings):
    return dataclasses.replace(self, beta=float(settings.beta),
                               label_smoothing=float(settings.label_smoothing))

  def make_pipeline(self, config, settings, **kw):
    return posttrain_pipeline(config, settings, "dpo", self.data_settings(config, settings),
                              **kw)

  def batch_spec(self, config, settings, model):
    b, t = settings.train.batch_size, seq_len(settings)
    tokens, weights = ((b, t), np.dtype(np.int32)), ((b, t), np.dtype(np.float32))
    return {"pairs": ((b,), np.dtype(np.float32)),
            **{f"{side}_{k}": (weights if k == "weights" else tokens)
               for side in ("chosen", "rejected") for k in ("inputs", "targets", "weights")}}

  def _sums(self, policy, reference, rows):
    loss, m = dpo_loss(*policy, *reference, beta=self.beta,
                       label_smoothing=self.label_smoothing)
    sums = {k: jnp.sum(v * rows) for k, v in m.items()}
    return jnp.sum(loss * rows), sums

  def loss(self, ctx: LossContext, batch: dict) -> LossSums:
    module = ctx.module
    policy = _forward_logps(module, ctx.params, batch, deterministic=False,
                            rngs={"dropout": ctx.rng})
    reference = _forward_logps(module, jax.lax.stop_gradient(ctx.extra), batch,
                               deterministic=True)
    reference = jax.tree.map(jax.lax.stop_gradient, reference)
    rows = _rows(batch)
    total, sums = self._sums(policy, reference, rows)
    count = jnp.maximum(jnp.sum(rows), 1e-9)
    metrics = {f"dpo_{k}": v / count for k, v in sums.items() if k != "rewards_accuracy"}
    return LossSums(total, total, sums["rewards_accuracy"], metrics)

  def eval_sums(self, module, params, batch, extra=None) -> dict:
    policy = _forward_logps(module, params, batch, deterministic=True)
    reference = _forward_logps(module, extra, batch, deterministic=True)
    rows = _rows(batch)
    total, sums = self._sums(policy, reference, rows)
    return {"loss": total, "count": jnp.sum(rows), **sums}

  def finalize(self, totals: dict) -> dict:
    t = {k: float(v) for k, v in totals.items()}
    n = max(t["count"], 1e-9)
    out = {"eval_loss": t["loss"] / n, "eval_accuracy": t["rewards_accuracy"] / n}
    out.update({f"eval_{k}": t[k] / n for k in t if k not in ("loss", "count",
                                                               "rewards_accuracy")})
    return out


TASKS = (DirectPreference("dpo", unit="pairs", inputs=("chosen_inputs",), labels="pairs",
                          counted="chosen_inputs", context=("chosen_inputs",),
                          flops_scale=8 / 3, text=True, samples=True,
                          extra_state="reference", row_sums=False),)
