"""Direct preference optimization (Rafailov et al., 2023) as pure functions.

`dpo_loss` takes the summed log-probabilities of the chosen and rejected responses under the
policy and under the frozen reference (one float per pair) and returns the per-pair sigmoid
DPO loss

    loss = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))

(with `label_smoothing` eps: conservative DPO, -(1-eps) log s(z) - eps log s(-z), the formula
of trl's DPOTrainer loss_type="sigmoid") and the metrics trl reports: rewards
beta * (pi - ref) of chosen and rejected, their margin, the reward accuracy (chosen reward >
rejected reward) and an estimate of the KL from the reference, the mean of (pi - ref) over the
chosen and rejected responses (a sample-based estimate of KL(pi || ref) only where the
responses are drawn from pi; on offline preference data it is the usual log-ratio monitor).
Everything is computed in the dtype of the inputs (float32 in training; float64 in tests).
How training uses them (the batches, the frozen reference, the step's sums and eval
metrics) is the dpo task, `jaxformer/tasks/dpo.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sequence_logps(logits, targets, weights):
  """[B] sum over positions of weights * log p(target) (float32): the log-probability of the
  weighted (response) tokens of each row. logits [B, T, V], targets [B, T], weights [B, T]."""
  logits = logits.astype(jnp.float32)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]
  return jnp.sum(logp * weights.astype(jnp.float32), axis=-1)


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, beta: float,
             label_smoothing: float = 0.0):
  """(per-pair loss [N], metrics dict of [N] arrays): see the module docstring."""
  if beta <= 0:
    raise ValueError(f"posttrain.beta={beta} must be > 0 (DPO's KL weight, e.g. 0.1)")
  if not 0.0 <= label_smoothing < 0.5:
    raise ValueError(f"posttrain.label_smoothing={label_smoothing} must be in [0, 0.5)")
  chosen_ratio = policy_chosen - ref_chosen
  rejected_ratio = policy_rejected - ref_rejected
  z = beta * (chosen_ratio - rejected_ratio)
  loss = -jax.nn.log_sigmoid(z)
  if label_smoothing:
    loss = (1 - label_smoothing) * loss - label_smoothing * jax.nn.log_sigmoid(-z)
  chosen_reward = beta * jax.lax.stop_gradient(chosen_ratio)
  rejected_reward = beta * jax.lax.stop_gradient(rejected_ratio)
  metrics = {
      "rewards_chosen": chosen_reward,
      "rewards_rejected": rejected_reward,
      "rewards_margin": chosen_reward - rejected_reward,
      "rewards_accuracy": (chosen_reward > rejected_reward).astype(chosen_reward.dtype),
      "logratio": jax.lax.stop_gradient(0.5 * (chosen_ratio + rejected_ratio)),
      "logps_chosen": jax.lax.stop_gradient(policy_chosen),
      "logps_rejected": jax.lax.stop_gradient(policy_rejected),
  }
  return loss, metrics
