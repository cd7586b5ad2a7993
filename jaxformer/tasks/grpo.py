"""Group relative policy optimization with verifiable rewards (task "grpo",
`posttrain.method='grpo'`): RLVR, the step after SFT and DPO.

The pipeline gives prompts (`posttrain/data.py` GRPOPipeline). Before each train step the
task's `rollout` (host side, outside the jitted step; the loop calls it on every batch of a
task with `rolls_out`) samples `posttrain.num_generations` completions of every prompt from
the current policy with the KV cache (`inference.generate_ragged`, at `posttrain.temperature`,
at most `posttrain.max_new_tokens` tokens, a completion ending at its first eos or
`posttrain.stop` token, that token included), decodes them, scores each with the registered
reward `posttrain.reward` (`posttrain/rewards.py`, on the prompt's whole record) and turns the
rewards into group-relative advantages (`posttrain/grpo.py`). The step's batch is then
train.batch_size rows of prompt + completion ('inputs', 'targets', 'weights' = 1 on the
completion's tokens), with 'advantages', 'rewards', 'group_std' and 'completions' (1 per row;
0 on an eval batch's padding) per row.

The loss is `posttrain/grpo.py`'s with one optimization step per generation (old log-probs =
the policy's own under stop_gradient: the ratio is 1 and the gradient is the policy
gradient), the KL to the frozen reference (the train state's 'reference', this task's
`extra_state`: the starting (SFT) params, as DPO's) with weight `posttrain.beta`, aggregated
by `posttrain.loss_type` over the whole step's batch (the step divides the summed numerator by
`weight`). Logged per step: `loss` (the GRPO objective), `reward`, `reward_std` (the mean
within-group std), `frac_reward_zero_std`, `kl` (token mean of k3), `completion_length`,
`clip_ratio/*`; evals (k samples of each eval prompt at the same temperature) `eval_loss`,
`eval_reward`, `eval_kl`, `eval_completion_length`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import models
from jaxformer.data.batching import VALID
from jaxformer.inference.decode import generate_ragged
from jaxformer.posttrain import grpo, rewards
from jaxformer.tasks.base import LossContext, LossSums, Task
from jaxformer.tasks.sft import posttrain_pipeline, seq_len


def token_logps(logits, targets):
  """[N, T] float32 log p(target) at every position."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  return jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]


def stop_ids(tokenizer, stop: str | None) -> tuple[int, ...]:
  """The token ids that end a completion: the tokenizer's eos and the one token of `stop`."""
  ids = [] if tokenizer.eos_id is None else [int(tokenizer.eos_id)]
  if stop is not None:
    try:
      encoded = [int(i) for i in tokenizer.encode(stop)]
    except ValueError as e:
      raise ValueError(f"posttrain.stop={stop!r}: {e}") from None
    if len(encoded) != 1:
      raise ValueError(f"posttrain.stop={stop!r} is {len(encoded)} tokens with this tokenizer; "
                       "it must be the text of exactly one token (e.g. '\\n' for the char "
                       "tokenizer)")
    ids += encoded
  return tuple(ids)


def completion_mask(tokens: np.ndarray, stops: tuple[int, ...]) -> np.ndarray:
  """float32 [N, M]: 1 up to and including each row's first stop token (all 1 without one)."""
  if not stops:
    return np.ones(tokens.shape, np.float32)
  is_stop = np.isin(tokens, stops)
  before = np.cumsum(is_stop, axis=1) - is_stop       # stops strictly before each position
  return (before == 0).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class GroupRelative(Task):
  data_kind: str = "posttrain_records"
  num_generations: int = 4
  max_new_tokens: int = 32
  temperature: float = 1.0
  reward: str | None = None
  stop: str | None = None
  loss_type: str = "dapo"
  scale_rewards: str = "group"
  epsilon: float = 0.2
  epsilon_high: float | None = None
  beta: float = 0.0

  def for_posttrain(self, settings):
    rewards.get(settings.reward)             # a name no reward has: one line, before any work
    return dataclasses.replace(
        self, num_generations=settings.num_generations, max_new_tokens=settings.max_new_tokens,
        temperature=float(settings.temperature), reward=settings.reward, stop=settings.stop,
        loss_type=settings.loss_type, scale_rewards=settings.scale_rewards,
        epsilon=float(settings.epsilon),
        epsilon_high=None if settings.epsilon_high is None else float(settings.epsilon_high),
        beta=float(settings.beta))

  def make_pipeline(self, config, settings, **kw):
    pipeline = posttrain_pipeline(config, settings, "grpo", self.data_settings(config, settings),
                                  **kw)
    stop_ids(pipeline.tokenizer, self.stop)  # a stop that is not one token: refused here
    return pipeline

  def batch_spec(self, config, settings, model):
    n, t = settings.train.batch_size, seq_len(settings)
    tokens, weights = ((n, t), np.dtype(np.int32)), ((n, t), np.dtype(np.float32))
    row = ((n,), np.dtype(np.float32))
    return {"inputs": tokens, "targets": tokens, "weights": weights, "advantages": row,
            "rewards": row, "group_std": row, "completions": row}

  # --- the rollout: host side, before the step ---------------------------------------------

  def rollout(self, config, pipeline, params, extra, batch, *, step: int, train: bool):
    """The step's batch from a batch of prompts: k completions of each sampled from `params`,
    scored and given group-relative advantages (module docstring). Deterministic in
    (train.seed, step, train/eval): a resumed run samples what an uninterrupted one did."""
    del extra
    k, m = self.num_generations, self.max_new_tokens
    prompt = np.asarray(batch["prompt"])
    lengths = np.repeat(np.maximum(np.asarray(batch["prompt_len"]), 1), k)
    index = np.repeat(np.asarray(batch["index"]), k)
    valid = np.repeat(np.asarray(batch.get(VALID, np.ones(len(prompt), np.float32)),
                                 np.float32), k)
    prompts = np.repeat(prompt, k, axis=0)
    n, width = prompts.shape
    tokenizer = pipeline.tokenizer
    model = models.settings_of(config)
    vocab = int(model.vocab_size)
    seed = int(np.random.SeedSequence([pipeline.seed, step, int(train)]).generate_state(1)[0])
    new = generate_ragged(model, params, prompts, lengths, max_new_tokens=m,
                          temperature=self.temperature, seed=seed,
                          vocab_limit=min(tokenizer.vocab_size, vocab))
    mask = completion_mask(new, stop_ids(tokenizer, self.stop))
    records = pipeline.records_of(train)
    score = rewards.get(self.reward)
    r = np.full(n, np.nan)
    for i in range(n):
      if valid[i]:
        text = tokenizer.decode(new[i, :int(mask[i].sum())].tolist())
        value = score(text, records[int(index[i])])
        r[i] = np.nan if value is None else float(value)
    adv = grpo.group_advantages(r, k, scale_rewards=self.scale_rewards)
    with np.errstate(invalid="ignore"):
      std = np.repeat(np.nan_to_num(np.nanstd(r.reshape(-1, k), axis=1, ddof=1)), k)
    seq = np.zeros((n, width + m), np.int32)
    weights = np.zeros((n, width + m - 1), np.float32)
    for i in range(n):
      length = int(lengths[i])
      seq[i, :length] = prompts[i, :length]
      seq[i, length:length + m] = new[i]
      weights[i, length - 1:length - 1 + m] = mask[i]      # targets length .. length + m - 1
    out = {"inputs": seq[:, :-1], "targets": seq[:, 1:], "weights": weights * valid[:, None],
           "advantages": adv.astype(np.float32),
           "rewards": np.nan_to_num(r).astype(np.float32), "group_std": std.astype(np.float32),
           "completions": valid}
    if VALID in batch:
      out[VALID] = valid
    return out

  # --- the loss ------------------------------------------------------------------------------

  def weight(self, batch):
    rows = batch["completions"].astype(jnp.float32)
    if self.loss_type == "grpo":
      return jnp.sum(rows)
    if self.loss_type == "dr_grpo":
      return jnp.sum(rows) * self.max_new_tokens
    return jnp.sum(batch["weights"].astype(jnp.float32) * rows[:, None])

  def _sums(self, logits, ref_logits, batch):
    logps = token_logps(logits, batch["targets"])
    ref = jax.lax.stop_gradient(token_logps(ref_logits, batch["targets"]))
    rows = batch["completions"].astype(jnp.float32)
    mask = batch["weights"].astype(jnp.float32) * rows[:, None]
    per_token, kl, ratio = grpo.per_token_loss(
        logps, jax.lax.stop_gradient(logps), ref, batch["advantages"],
        epsilon_low=self.epsilon, epsilon_high=self.epsilon_high, beta=self.beta)
    if not self.beta:             # logged anyway: how far the policy moved
      diff = ref - jax.lax.stop_gradient(logps)
      kl = jnp.exp(diff) - diff - 1
    num, _ = grpo.loss_sums(per_token, mask, loss_type=self.loss_type,
                            max_completion_length=self.max_new_tokens, rows=rows)
    sums = grpo.clip_metrics(ratio, kl, batch["advantages"], mask, epsilon_low=self.epsilon,
                             epsilon_high=self.epsilon_high)
    sums.update(reward=jnp.sum(batch["rewards"] * rows),
                reward_std=jnp.sum(batch["group_std"] * rows),
                frac_reward_zero_std=jnp.sum((batch["group_std"] == 0) * rows),
                completion_length=jnp.sum(mask))
    return num, sums, jnp.sum(rows), jnp.sum(mask)

  def loss(self, ctx: LossContext, batch: dict) -> LossSums:
    logits = ctx.forward(batch["inputs"])
    ref_logits = ctx.module.apply({"params": jax.lax.stop_gradient(ctx.extra)}, batch["inputs"],
                                  deterministic=True)
    num, sums, rows, tokens = self._sums(logits, ref_logits, batch)
    per_row = ("reward", "reward_std", "frac_reward_zero_std", "completion_length")
    metrics = {k: v / jnp.maximum(rows if k in per_row else tokens, 1e-9)
               for k, v in sums.items()}
    return LossSums(num, num, jnp.zeros(()), metrics)

  def eval_sums(self, module, params, batch, extra=None) -> dict:
    logits = module.apply({"params": params}, batch["inputs"], deterministic=True)
    ref_logits = module.apply({"params": extra}, batch["inputs"], deterministic=True)
    num, sums, rows, tokens = self._sums(logits, ref_logits, batch)
    return {"loss": num, "weight": self.weight(batch), "rows": rows, "tokens": tokens,
            "reward": sums["reward"], "kl": sums["kl"],
            "completion_length": sums["completion_length"]}

  def finalize(self, totals: dict) -> dict:
    t = {k: float(v) for k, v in totals.items()}
    rows, tokens = max(t["rows"], 1e-9), max(t["tokens"], 1e-9)
    return {"eval_loss": t["loss"] / max(t["weight"], 1e-9), "eval_reward": t["reward"] / rows,
            "eval_kl": t["kl"] / tokens, "eval_completion_length": t["completion_length"] / rows}


# flops_scale: the policy's forward and backward and the reference's forward on every row
# (4/3 of a training pass); the sampling before the step is not counted
TASKS = (GroupRelative("grpo", unit="completions", inputs=("inputs",), labels="completions",
                       counted="inputs", context=("inputs",), flops_scale=4 / 3, text=True,
                       samples=True, extra_state="reference", rolls_out=True),)
