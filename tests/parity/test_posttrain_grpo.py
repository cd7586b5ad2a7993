"""The GRPO objective (jaxformer.posttrain.grpo) against trl's GRPOTrainer loss on the same
inputs (value and gradient with respect to the policy log-probabilities), against a float64
NumPy reference with rows the mask leaves empty, and its group advantages."""

import collections
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.posttrain import grpo


def _inputs(seed=0, n=6, t=5, empty=(2,)):
  rng = np.random.default_rng(seed)
  logps = -rng.uniform(0.1, 3.0, (n, t))
  old = logps + rng.normal(0, 0.4, (n, t))          # ratios well outside [0.8, 1.2] too
  ref = logps + rng.normal(0, 0.5, (n, t))
  adv = rng.normal(0, 1, n)
  mask = (rng.uniform(size=(n, t)) < 0.7).astype(np.float64)
  mask[:, 0] = 1
  for r in empty:                                   # completions with no token that counts
    mask[r] = 0
  return logps, old, ref, adv, mask


def _trl_loss(logps, old, ref, adv, mask, *, loss_type, beta, eps_low, eps_high,
              max_len, use_old=True):
  """trl's GRPOTrainer._compute_loss on a stub trainer whose per-token log-probabilities are
  `logps` (a leaf tensor): (loss, d loss / d logps)."""
  torch = pytest.importorskip("torch")
  trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
  leaf = torch.tensor(logps, dtype=torch.float64, requires_grad=True)
  n, t = logps.shape
  ident = lambda x: x
  stub = types.SimpleNamespace(
      _get_per_token_logps_and_entropies=lambda *a, **k: (leaf, torch.zeros_like(leaf), None),
      aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
      importance_sampling_level="token", beta=beta, loss_type=loss_type,
      epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
      model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
      max_completion_length=max_len, _entropy_bonus_enabled=False,
      args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None,
                                 steps_per_generation=1),
      accelerator=types.SimpleNamespace(num_processes=1, gather=ident, gather_for_metrics=ident,
                                        reduce=lambda x, reduction="sum": x),
      _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)})
  inputs = {"prompt_ids": torch.zeros((n, 3), dtype=torch.long),
            "prompt_mask": torch.ones((n, 3), dtype=torch.long),
            "completion_ids": torch.zeros((n, t), dtype=torch.long),
            "completion_mask": torch.tensor(mask, dtype=torch.float64),
            "advantages": torch.tensor(adv, dtype=torch.float64),
            "ref_per_token_logps": torch.tensor(ref, dtype=torch.float64),
            "num_items_in_batch": torch.tensor(mask.sum(), dtype=torch.float64)}
  if use_old:
    inputs["old_per_token_logps"] = torch.tensor(old, dtype=torch.float64)
  loss = trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)
  loss.backward()
  return loss.item(), leaf.grad.numpy(), stub._metrics["train"]


def _ours(logps, old, ref, adv, mask, *, loss_type, beta, eps_low, eps_high, max_len,
          use_old=True):
  def f(lp):
    o = old if use_old else jax.lax.stop_gradient(lp)
    return grpo.grpo_loss(lp, o, ref, adv, jnp.asarray(mask), loss_type=loss_type,
                          epsilon_low=eps_low, epsilon_high=eps_high, beta=beta,
                          max_completion_length=max_len)
  with jax.enable_x64(True):
    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logps))
    return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
@pytest.mark.parametrize("beta,eps_high,use_old", [(0.0, 0.2, True), (0.04, 0.28, True),
                                                   (0.1, 0.2, False)])
def test_grpo_loss_matches_trl(loss_type, beta, eps_high, use_old):
  x = _inputs()
  kw = dict(loss_type=loss_type, beta=beta, eps_low=0.2, eps_high=eps_high, max_len=7,
            use_old=use_old)
  trl_loss, trl_grad, trl_metrics = _trl_loss(*x, **kw)
  loss, grad, metrics = _ours(*x, **kw)
  assert abs(loss - trl_loss) < 1e-12
  np.testing.assert_allclose(grad, trl_grad, rtol=0, atol=1e-12)
  assert np.abs(trl_grad).max() > 1e-3                 # the gradient is not trivially zero
  for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean") + (
      ("kl",) if beta else ()):
    assert abs(float(metrics[name]) - trl_metrics[name][0]) < 1e-12, name
  if use_old:       # the clipping binds on these inputs: both sides, so the test can fail
    assert trl_metrics["clip_ratio/low_mean"][0] > 0 and trl_metrics["clip_ratio/high_mean"][0] > 0


def _numpy_loss(logps, old, ref, adv, mask, *, loss_type, beta, eps_low, eps_high, max_len):
  """float64 NumPy reference, written from the formulas of the module docstring."""
  ratio = np.exp(logps - old)
  a = adv[:, None]
  per = -np.minimum(ratio * a, np.clip(ratio, 1 - eps_low, 1 + eps_high) * a)
  per = per + beta * (np.exp(ref - logps) - (ref - logps) - 1)
  if loss_type == "grpo":
    lengths = mask.sum(1)
    return np.mean([(per[i] * mask[i]).sum() / max(lengths[i], 1) for i in range(len(per))])
  if loss_type in ("bnpo", "dapo"):
    return (per * mask).sum() / mask.sum()
  return (per * mask).sum() / (len(per) * max_len)


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
def test_grpo_loss_matches_numpy_with_empty_rows(loss_type):
  x = _inputs(seed=3, n=8, t=6, empty=(0, 5))
  kw = dict(loss_type=loss_type, beta=0.05, eps_low=0.2, eps_high=0.3, max_len=6)
  loss, grad, _ = _ours(*x, **kw)
  assert abs(loss - _numpy_loss(*x, **kw)) < 1e-12
  assert np.all(grad[[0, 5]] == 0)                  # an empty row gets no gradient
  assert np.all(grad[x[4] == 0] == 0)
  # padded rows (rows=0) leave every loss type's value unchanged
  with jax.enable_x64(True):
    _padded_rows_change_nothing(x, loss_type)


def _padded_rows_change_nothing(x, loss_type):
  per, _, _ = grpo.per_token_loss(x[0], x[1], x[2], x[3], epsilon_low=0.2, epsilon_high=0.3,
                                  beta=0.05)
  rows = np.ones(8)
  num, den = grpo.loss_sums(per, jnp.asarray(x[4]), loss_type=loss_type, max_completion_length=6,
                            rows=jnp.asarray(rows))
  padded = [np.concatenate([v, np.zeros((2,) + v.shape[1:])]) for v in (np.asarray(per), x[4])]
  num2, den2 = grpo.loss_sums(jnp.asarray(padded[0]), jnp.asarray(padded[1]),
                              loss_type=loss_type, max_completion_length=6,
                              rows=jnp.asarray(np.r_[rows, 0, 0]))
  assert abs(float(num / den) - float(num2 / den2)) < 1e-12


def test_group_advantages():
  r = np.array([1.0, 0, 0, 1, 1, 1, 1, 1, np.nan, 1, 0, np.nan, 0.5, 0.2, 0.9, 0.1])
  adv = grpo.group_advantages(r, 4)
  g = r.reshape(4, 4)
  for i, row in enumerate(g):
    ok = ~np.isnan(row)
    want = (row[ok] - row[ok].mean()) / (row[ok].std(ddof=1) + 1e-4)
    np.testing.assert_allclose(adv.reshape(4, 4)[i][ok], want, atol=1e-12)
    assert np.all(adv.reshape(4, 4)[i][~ok] == 0)
  assert np.all(adv[4:8] == 0)                      # all equal: no signal
  none = grpo.group_advantages(r, 4, scale_rewards="none").reshape(4, 4)
  np.testing.assert_allclose(none[3], g[3] - g[3].mean(), atol=1e-12)
  batch = grpo.group_advantages(r, 4, scale_rewards="batch").reshape(4, 4)
  np.testing.assert_allclose(batch[3], (g[3] - g[3].mean()) / (np.nanstd(r, ddof=1) + 1e-4),
                             atol=1e-12)
  with pytest.raises(ValueError, match="scale_rewards"):
    grpo.group_advantages(r, 4, scale_rewards="std")
  with pytest.raises(ValueError, match="groups of 3"):
    grpo.group_advantages(r, 3)


# ---------------------------------------------------------------- the grpo task, without a run

from ml_collections import ConfigDict  # noqa: E402

from jaxformer import models, run_settings  # noqa: E402
from jaxformer.data.tokenizers import CharTokenizer  # noqa: E402
from jaxformer.posttrain import data as pdata  # noqa: E402
from jaxformer.posttrain import rewards  # noqa: E402
from jaxformer.tasks import grpo as grpo_task  # noqa: E402
from jaxformer.tasks import registry  # noqa: E402
from tests.user_errors import user_error  # noqa: E402

TOK = CharTokenizer("\nabcdefghijklmnopqrstuvwxyz :")
MODEL = dict(family="decoder", vocab_size=TOK.vocab_size, d_model=16, num_layers=1, num_heads=2,
             mlp_dim=32, max_len=32)


def _settings(**post):
  values = dict(method="grpo", init_from="x", reward="first_line_exact", stop="\n",
                num_generations=4, max_new_tokens=5, beta=0.1, loss_type="grpo")
  return run_settings.PosttrainSettings(**{**values, **post})


@pytest.mark.slow                # ~2-3 s of CPU (sampler, init and loss compiles)
def test_rollout_builds_the_step_batch_and_the_task_loss_is_the_objective(tmp_path):
  """k completions per prompt sampled, cut at the stop (kept), scored by the registered
  reward on the decoded text and the record, group advantages; the weights mark exactly the
  completion's targets; the task's loss / weight is grpo_loss on those tokens."""
  path = tmp_path / "prompts.jsonl"
  path.write_text("".join(json.dumps({"prompt": p, "answer": "a"}) + "\n"
                          for p in ("say a:", "ab:", "say b please:")))
  data = ConfigDict(dict(source=str(path), eval_source=str(path), seq_len=20))
  pipe = pdata.GRPOPipeline(data, TOK, max_new_tokens=5, seed=0, global_batch_size=3,
                            eval_batch_size=3)
  seen = []
  rewards.register("test_count_a", lambda text, record: (seen.append((text, record)),
                                                         float(text.count("a")))[1])
  try:
    task = registry.get("grpo").for_posttrain(_settings(reward="test_count_a"))
    module = models.build(MODEL)
    params = jax.jit(module.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
    config = ConfigDict(dict(model=MODEL, train=dict(seed=0)))
    batch = task.rollout(config, pipe, params, params, pipe.train_batch(0), step=0, train=True)
  finally:
    rewards.unregister("test_count_a")
  n, t = 12, 20
  spec = task.batch_spec(None, types.SimpleNamespace(train=types.SimpleNamespace(batch_size=n),
                                                     data=types.SimpleNamespace(seq_len=t)), MODEL)
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {k: s for k, s in spec.items()}
  assert len(seen) == n
  lengths = np.repeat(pipe.train_batch(0)["prompt_len"], 4)
  for i, (text, record) in enumerate(seen):
    w = batch["weights"][i]
    start = lengths[i] - 1
    assert np.all(w[:start] == 0) and w[start] == 1          # the first completion token
    tokens = batch["targets"][i][w == 1]
    assert TOK.decode(tokens.tolist()) == text                # what the reward read
    assert "\n" not in text[:-1] and (text.endswith("\n") or len(text) == 5)
    assert batch["rewards"][i] == text.count("a") and record["answer"] == "a"
    np.testing.assert_array_equal(batch["inputs"][i, 1:], batch["targets"][i, :-1])
  np.testing.assert_allclose(batch["advantages"],
                             grpo.group_advantages(batch["rewards"], 4), atol=1e-6)
  # the task's loss (as the step divides it) is the objective on those tokens
  from jaxformer.tasks.base import LossContext

  @jax.jit                                 # one program (eager, each op compiles on its own)
  def losses(params, batch):
    sums = task.loss(LossContext(module, params, jax.random.key(1), extra=params), batch)
    logits = module.apply({"params": params}, batch["inputs"])
    lp = grpo_task.token_logps(logits, batch["targets"])
    want, _ = grpo.grpo_loss(lp, lp, lp, batch["advantages"], batch["weights"],
                             loss_type="grpo", beta=0.1)
    return sums.weighted / task.weight(batch), want, sums.metrics["reward"]

  got, want, reward = losses(params, batch)
  assert abs(float(got) - float(want)) < 1e-6
  assert float(reward) == pytest.approx(batch["rewards"].mean())


def test_completion_mask_keeps_the_first_stop_and_nothing_after():
  tokens = np.array([[1, 2, 0, 3, 0], [4, 4, 4, 4, 4], [0, 1, 1, 1, 1]])
  np.testing.assert_array_equal(grpo_task.completion_mask(tokens, (0,)),
                                [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
  assert grpo_task.completion_mask(tokens, ()).all()


def _grpo_config(**post):
  base = dict(method="grpo", init_from="x", reward="first_line_exact")
  return ConfigDict(dict(posttrain={**base, **post}, data=dict(source="p.jsonl", seq_len=64),
                         train=dict(steps=1, batch_size=8), optim=dict(lr=1e-5)))


@pytest.mark.parametrize("post,parts", [
    (dict(num_generations=1), ["posttrain.num_generations=1", "an int >= 2"]),
    (dict(loss_type="ppo"), ["posttrain.loss_type='ppo'", "'dr_grpo'"]),
    (dict(scale_rewards=True), ["posttrain.scale_rewards=True", "'none'"]),
    (dict(epsilon=1.5), ["posttrain.epsilon=1.5"]),
    (dict(temperature=0), ["posttrain.temperature=0"]),
    (dict(beta=-0.1), ["posttrain.beta=-0.1", ">= 0"]),
    (dict(reward=None), ["posttrain.reward is not set"]),
    (dict(num_generations=3), ["train.batch_size=8", "posttrain.num_generations=3"]),
    (dict(max_new_tokens=64), ["data.seq_len=64", "posttrain.max_new_tokens=64"]),
])
def test_bad_grpo_settings_are_one_line_errors(post, parts):
  text = user_error(lambda: run_settings.parse(_grpo_config(**post)), *parts)
  assert "\n" not in text


def test_an_unknown_reward_and_a_stop_of_several_tokens_are_refused():
  user_error(lambda: registry.get("grpo").for_posttrain(_settings(reward="nope")),
             "posttrain.reward='nope'", "first_line_exact")
  user_error(lambda: grpo_task.stop_ids(TOK, "\n\n"), "posttrain.stop", "exactly one token")
  assert registry.get("grpo").for_posttrain(_settings()).beta == 0.1
