"""Group relative policy optimization (GRPO; Shao et al., 2024, DeepSeekMath) as pure functions.

A prompt gets k sampled completions (a group); each is scored by a verifiable reward
(`posttrain/rewards.py`). `group_advantages` turns the rewards into advantages relative to the
group: A_i = (r_i - mean(group)) / (std(group) + 1e-4), the standard deviation the unbiased one
(ddof 1) as trl computes it; `scale_rewards='none'` does not divide (Dr. GRPO), `'batch'`
divides by the standard deviation of the whole batch. NaN rewards (unscorable) are left out of
the group statistics and get advantage 0.

`per_token_loss` is the clipped surrogate per completion token t of completion i:

    ratio = exp(logp - old_logp)
    l = -min(ratio * A_i, clip(ratio, 1 - eps_low, 1 + eps_high) * A_i) + beta * kl
    kl = exp(ref - logp) - (ref - logp) - 1          (Schulman's k3 estimator of KL(pi || ref))

With one optimization step per generation (trl's num_iterations = 1, what the grpo task does)
old_logp is logp under stop_gradient: the ratio is 1, its gradient that of logp, and clipping
never binds. `loss_sums` aggregates it over the completion mask as trl's `loss_type` does,
returned as (numerator, denominator) so a training step can add them over micro-batches:

    grpo     mean over completions of (sum_t l * m / max(sum_t m, 1))  (per-sequence length norm)
    bnpo     sum l * m / sum m over the batch                          (per-token mean)
    dapo     the same sums, normalised over the whole (accumulated, global) batch: trl's default
    dr_grpo  sum l * m / (completions * max_completion_length)         (a constant: no length bias)

(`length_normalized`: grpo normalises each completion by its own length; the others do not.)
trl's other loss types (cispo, sapo, luspo, vespo) and sequence-level importance sampling are
not built. Everything is computed in the dtype of the inputs (float32 in training, float64 in
tests). How training uses them: the grpo task, `jaxformer/tasks/grpo.py`.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
STD_EPS = 1e-4          # trl's: advantages / (std + 1e-4)


def _nanstd(x, axis=None, keepdims=False):
  """Unbiased (ddof 1) standard deviation ignoring NaNs, as trl's `nanstd`; NaN where fewer
  than 2 values (call it with NumPy's empty-slice warnings silenced)."""
  count = np.sum(~np.isnan(x), axis=axis, keepdims=True)
  mean = np.nanmean(x, axis=axis, keepdims=True)
  var = np.nanmean((x - mean) ** 2, axis=axis, keepdims=True)
  var = np.where(count > 1, var * count / np.maximum(count - 1, 1), np.nan)
  return np.sqrt(var) if keepdims else np.sqrt(var).reshape(np.shape(np.sum(x, axis=axis)))


def group_advantages(rewards, num_generations: int, *, scale_rewards: str = "group"):
  """float64 [N] advantages of N = groups x num_generations rewards laid out group by group
  (the k completions of a prompt consecutive); see the module docstring. NumPy (host side:
  rewards come from Python reward functions)."""
  if scale_rewards not in SCALE_REWARDS:
    raise ValueError(f"posttrain.scale_rewards={scale_rewards!r} must be one of "
                     + ", ".join(repr(s) for s in SCALE_REWARDS))
  r = np.asarray(rewards, np.float64).reshape(-1)
  if num_generations < 1 or r.size % num_generations:
    raise ValueError(f"{r.size} rewards do not split into groups of {num_generations}")
  grouped = r.reshape(-1, num_generations)
  with warnings.catch_warnings():           # an all-NaN group: 'mean of empty slice'
    warnings.simplefilter("ignore", RuntimeWarning)
    mean = np.nanmean(grouped, axis=1, keepdims=True)
    if scale_rewards == "batch":
      std = (_nanstd(r) if r.size > 1 else np.zeros(())) * np.ones_like(grouped)
    elif num_generations > 1:
      std = _nanstd(grouped, axis=1, keepdims=True) * np.ones_like(grouped)
    else:
      std = np.zeros_like(grouped)
  adv = grouped - mean
  if scale_rewards != "none":
    adv = adv / (std + STD_EPS)
  return np.nan_to_num(adv, nan=0.0).reshape(-1)


def per_token_loss(logps, old_logps, ref_logps, advantages, *, epsilon_low: float = 0.2,
                   epsilon_high: float | None = None, beta: float = 0.0, delta=None):
  """(per-token loss [N, T], per-token k3 KL [N, T] (zeros where beta == 0), the
  importance ratio [N, T]). logps, old_logps, ref_logps [N, T] log-probabilities of the
  completion tokens under the policy, the sampling policy and the reference; advantages [N]
  (or [N, T]). `delta`: INTELLECT-2's upper bound on the unclipped ratio (None: off)."""
  epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
  advantages = jnp.asarray(advantages)
  if advantages.ndim == 1:
    advantages = advantages[:, None]
  ratio = jnp.exp(logps - old_logps)
  clipped = jnp.clip(ratio, 1 - epsilon_low, 1 + epsilon_high)
  unclipped = ratio if delta is None else jnp.minimum(ratio, delta)
  loss = -jnp.minimum(unclipped * advantages, clipped * advantages)
  if beta != 0.0:
    diff = ref_logps - logps
    kl = jnp.exp(diff) - diff - 1
    loss = loss + beta * kl
  else:
    kl = jnp.zeros_like(loss)
  return loss, kl, ratio


def loss_sums(per_token, mask, *, loss_type: str, max_completion_length: int | None = None,
              rows=None):
  """(numerator, denominator) of the aggregated loss over completions [N, T] with the
  completion mask [N, T] (0/1). A completion whose mask is all zeros adds 0 to the numerator;
  under grpo it still counts in the denominator (trl's mean over completions) unless `rows`
  [N] (0/1: padded rows 0) says it does not."""
  if loss_type not in LOSS_TYPES:
    raise ValueError(f"posttrain.loss_type={loss_type!r} must be one of "
                     + ", ".join(repr(t) for t in LOSS_TYPES))
  mask = mask.astype(per_token.dtype)
  rows = (jnp.ones(per_token.shape[:1], per_token.dtype) if rows is None
          else rows.astype(per_token.dtype))
  token_sum = jnp.sum(per_token * mask)
  if loss_type == "grpo":
    per_seq = jnp.sum(per_token * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0)
    return jnp.sum(per_seq * rows), jnp.sum(rows)
  if loss_type in ("bnpo", "dapo"):
    return token_sum, jnp.sum(mask)
  if max_completion_length is None:
    raise ValueError("loss_type='dr_grpo' needs max_completion_length (posttrain.max_new_tokens)")
  return token_sum, jnp.sum(rows) * max_completion_length


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, *, loss_type: str = "dapo",
              epsilon_low: float = 0.2, epsilon_high: float | None = None, beta: float = 0.0,
              max_completion_length: int | None = None, delta=None):
  """(the scalar loss of one batch, metrics): `per_token_loss` aggregated by `loss_sums`
  (bnpo and dapo then agree: one batch, one process). Metrics as trl logs them: `kl` (the
  token mean of k3), the clip ratios (`clip_ratio/low_mean`, `/high_mean`, `/region_mean`:
  token means of the ratio leaving the trust region on the side its advantage acts)."""
  per_token, kl, ratio = per_token_loss(logps, old_logps, ref_logps, advantages,
                                        epsilon_low=epsilon_low, epsilon_high=epsilon_high,
                                        beta=beta, delta=delta)
  num, den = loss_sums(per_token, mask, loss_type=loss_type,
                       max_completion_length=max_completion_length)
  loss = num / jnp.maximum(den, 1.0)
  return loss, clip_metrics(ratio, kl, advantages, mask, epsilon_low=epsilon_low,
                            epsilon_high=epsilon_high, sums=False)


def clip_metrics(ratio, kl, advantages, mask, *, epsilon_low: float, epsilon_high=None,
                 sums: bool = True) -> dict:
  """Masked token sums (or means: `sums=False`) of the k3 KL and the clipped-ratio indicators."""
  epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
  advantages = jnp.asarray(advantages)
  if advantages.ndim == 1:
    advantages = advantages[:, None]
  mask = mask.astype(ratio.dtype)
  low = ((ratio < 1 - epsilon_low) & (advantages < 0)).astype(ratio.dtype)
  high = ((ratio > 1 + epsilon_high) & (advantages > 0)).astype(ratio.dtype)
  out = {"kl": jnp.sum(kl * mask), "clip_ratio/low_mean": jnp.sum(low * mask),
         "clip_ratio/high_mean": jnp.sum(high * mask),
         "clip_ratio/region_mean": jnp.sum(jnp.maximum(low, high) * mask)}
  if sums:
    return out
  count = jnp.maximum(jnp.sum(mask), 1.0)
  return {k: v / count for k, v in out.items()}
