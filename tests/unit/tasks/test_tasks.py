"""Task losses and eval sums, a new task added through the registry alone, gradient
accumulation, best-checkpoint retention."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer import models
from jaxformer.state import checkpoint, train_state
from jaxformer import tasks
from jaxformer.tasks.lm import NextToken
from jaxformer.train.metrics import read
from jaxformer.train.step import log_interval, make_eval_step, make_train_step
from tests.arrays import EPS32, adam_tol, sum_tol
from tests.runs import on_one_device, tiny_run_config

TINY_LM = dict(family="decoder", vocab_size=11, d_model=16, num_layers=1, num_heads=2,
               mlp_dim=32, max_len=16, dropout_rate=0.0)
# lm_setup's batch: ~36 weighted tokens of 9; the loss's chain of float32 reductions (the
# tokens, q/k/v and out over d_model, 9 keys, the MLP, the logits) for tests/arrays.sum_tol
TOKENS, CHAIN = 36, 36 + 4 * 16 + 9 + 32 + 16 + 11


def _nll64(logits, labels):
  x = np.asarray(logits, np.float64)
  m = x.max(-1, keepdims=True)
  log_z = np.log(np.exp(x - m).sum(-1)) + m[..., 0]
  return log_z - np.take_along_axis(x, labels[..., None], -1)[..., 0]


def test_eval_sums_weight_tokens_and_drop_padded_rows():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
  labels = rng.integers(0, 7, size=(3, 5))
  weights = (rng.random((3, 5)) < 0.6).astype(np.float32)
  valid = np.array([1, 1, 0], np.float32)          # the last row is padding
  batch = {"targets": labels, "weights": weights, "valid": valid}
  sums = tasks.get("lm").logit_sums(jnp.asarray(logits), batch)
  w = weights * valid[:, None]
  np.testing.assert_allclose(sums["nll"], (_nll64(logits, labels) * w).sum(), rtol=1e-5)
  np.testing.assert_allclose(sums["correct"], ((logits.argmax(-1) == labels) * w).sum())
  assert float(sums["count"]) == w.sum()
  out = tasks.get("lm").finalize(jax.device_get(sums))
  np.testing.assert_allclose(out["eval_perplexity"], np.exp(out["eval_loss"]), rtol=1e-6)


def test_seq2seq_sequence_accuracy_counts_whole_rows():
  # row 0: both weighted tokens right; row 1: one wrong; row 2: padding row
  logits = np.full((3, 3, 4), -5.0, np.float32)
  labels = np.array([[1, 2, 0], [1, 2, 0], [3, 3, 3]])
  for r, row in enumerate([[1, 2, 3], [1, 0, 0], [3, 3, 3]]):
    for t, k in enumerate(row):
      logits[r, t, k] = 5.0
  batch = {"tgt_out": labels, "weights": np.array([[1, 1, 0]] * 3, np.float32),
           "valid": np.array([1, 1, 0], np.float32)}
  task = tasks.get("seq2seq")
  out = task.finalize(jax.device_get(task.logit_sums(jnp.asarray(logits), batch)))
  assert out["eval_sequence_accuracy"] == 0.5 and out["eval_accuracy"] == 0.75


def test_classification_task_uses_images_and_labels():
  task = tasks.task_for({"family": "vit"})
  batch = {"images": np.zeros((4, 8, 8, 1)), "labels": np.arange(4)}
  args, kwargs = task.model_args(batch)
  assert args[0] is batch["images"] and kwargs == {}
  assert task.units_per_batch(batch) == 4 and task.unit == "images"
  with pytest.raises(ValueError, match="model.family='nope'"):
    tasks.task_for({"family": "nope"})


@pytest.fixture(scope="module")
def lm_setup():
  module = models.build(TINY_LM)
  params = jax.jit(module.init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
  params = jax.tree.map(lambda x: getattr(x, "value", x), params,
                        is_leaf=lambda x: hasattr(x, "value"))
  rng = np.random.default_rng(1)
  batch = {"inputs": rng.integers(0, 11, (4, 9)).astype(np.int32),
           "targets": rng.integers(0, 11, (4, 9)).astype(np.int32),
           "weights": (rng.random((4, 9)) < 0.7).astype(np.float32)}
  return module, params, batch


def test_grad_accumulation_equals_full_batch_gradient(lm_setup):
  module, params, batch = lm_setup
  tx = optax.sgd(1.0)
  task = tasks.get("lm")
  state = lambda: {"step": jnp.zeros((), jnp.int32), "params": params,
                   "opt_state": tx.init(params), "skipped": jnp.zeros((), jnp.int32)}
  steps = [make_train_step(module, tx, task, grad_accum=n) for n in (1, 4)]
  # both steps in one program: one compile instead of two
  (full, m1), (accumulated, m4) = jax.jit(lambda *args: [step(*args) for step in steps])(
      state(), batch, jax.random.key(0))
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=sum_tol(CHAIN))
  # SGD at lr 1: the parameters differ by the gradients' rounding (terms' magnitudes <= 1)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=EPS32, atol=sum_tol(CHAIN)),
               accumulated["params"], full["params"])
  # the train loss is the weighted mean nll: equals the eval sums' ratio
  sums = jax.jit(make_eval_step(module, task))(params, batch)
  np.testing.assert_allclose(m1["loss"], sums["nll"] / sums["count"], rtol=sum_tol(CHAIN))
  with pytest.raises(ValueError, match="optim.grad_accum=3"):
    jax.eval_shape(make_train_step(module, tx, task, grad_accum=3), state(), batch,
                   jax.random.key(0))


def test_a_non_finite_step_leaves_params_and_optimizer_untouched(lm_setup):
  """A good step applies AdamW (equal to optax's own update); a step whose loss is not
  finite returns the donated params and moments bit for bit, counts as skipped, and the
  next good step resets the count."""
  module, params, batch = lm_setup
  params = jax.tree.map(jnp.array, params)          # our own buffers: the step donates them
  # eps well above float noise: the key bias has an exactly-zero true gradient, and Adam
  # would blow its rounding-level gradient up to +-lr either way
  tx = optax.adamw(1e-2, eps=1e-3)
  step = jax.jit(make_train_step(module, tx, tasks.get("lm")), donate_argnums=(0,))
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
           "skipped": jnp.zeros((), jnp.int32)}
  copy = lambda tree: jax.tree.map(lambda x: np.array(x, copy=True), tree)
  before = copy(state)
  state, m = step(state, batch, jax.random.key(0))
  assert bool(m["finite"]) and int(state["skipped"]) == 0 and int(state["step"]) == 1

  @jax.jit
  def reference(params, opt_state):
    grads = jax.grad(lambda p: jnp.sum(tasks.cross_entropy(
        module.apply({"params": p}, batch["inputs"]), batch["targets"])[0]
        * batch["weights"]) / jnp.sum(batch["weights"]))(params)
    return optax.apply_updates(params, tx.update(grads, opt_state, params)[0])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=EPS32, atol=adam_tol(1, 1e-2, 1e-3, TOKENS)),
      state["params"], reference(before["params"], before["opt_state"]))

  good = copy(state)
  bad = dict(batch, weights=np.full_like(batch["weights"], np.nan))
  for n in (1, 2):
    state, m = step(state, bad, jax.random.key(0))
    assert not bool(m["finite"]) and int(state["skipped"]) == n and int(state["step"]) == 1 + n
    jax.tree.map(np.testing.assert_array_equal, copy(state["params"]), good["params"])
    jax.tree.map(np.testing.assert_array_equal, copy(state["opt_state"]), good["opt_state"])
  state, m = step(state, batch, jax.random.key(0))
  assert bool(m["finite"]) and int(state["skipped"]) == 0


def test_the_step_reports_the_mean_over_the_log_intervals_finite_steps(lm_setup, tmp_path):
  """interval_loss / interval_accuracy (`log_interval`, after the step): the means of the
  finite steps since the last multiple of log_every (a skipped step left out), from sums kept
  in the state (the train step passes them through); a checkpoint written
  without those sums (before they existed) restores with zeros."""
  module, params, batch = lm_setup
  tx = optax.sgd(1e-1)
  train = jax.jit(make_train_step(module, tx, tasks.get("lm")))
  def step(state, b, log_every=3):
    done = int(state["step"])
    state, m = train(state, b, jax.random.key(0))
    sums, interval = log_interval(state[train_state.LOG_SUMS], done, m, log_every)
    return {**state, train_state.LOG_SUMS: sums}, {**m, **interval}
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
           "skipped": jnp.zeros((), jnp.int32), train_state.LOG_SUMS: train_state.zero_log_sums()}
  bad = dict(batch, weights=np.full_like(batch["weights"], np.nan))
  losses, accuracies, means = [], [], []
  for b in (batch, bad, batch, batch, batch):         # steps 1..5; intervals 1-3, 4-6
    state, m = step(state, b)
    losses.append(float(m["loss"]) if bool(m["finite"]) else None)
    accuracies.append(float(m["accuracy"]))
    means.append((float(m["interval_loss"]), float(m["interval_accuracy"])))
  assert losses[1] is None and losses[0] != losses[2]
  np.testing.assert_allclose([x for x, _ in means], [
      losses[0], losses[0], (losses[0] + losses[2]) / 2, losses[3],
      (losses[3] + losses[4]) / 2], rtol=EPS32)
  np.testing.assert_allclose(means[2][1], (accuracies[0] + accuracies[2]) / 2, rtol=EPS32)
  assert int(state[train_state.LOG_SUMS]["steps"]) == 2
  all_bad = step(state, bad, log_every=1)[1]
  assert np.isnan(float(all_bad["interval_loss"]))       # no finite step in the interval

  ckpts = checkpoint.Checkpoints(tmp_path / "checkpoints")
  old = {k: v for k, v in state.items() if k != train_state.LOG_SUMS}
  ckpts.save(5, old)
  ckpts.close()
  ckpts = checkpoint.Checkpoints(tmp_path / "checkpoints", read_only=True)
  step_, restored = ckpts.restore_latest(checkpoint.abstract(state))
  ckpts.close()
  assert step_ == 5 and int(restored["step"]) == 5
  assert {k: float(v) for k, v in restored[train_state.LOG_SUMS].items()} == {
      "loss": 0.0, "accuracy": 0.0, "steps": 0.0}


# --- a new task through the registry alone (docs/design/tasks.md shows it as a module) ------

@dataclasses.dataclass(frozen=True)
class PrefixLM(NextToken):      # the lm task's pipeline and batch layout
  """Next-token prediction scored on the second half of each row only: the first half is
  context (a prefix) the loss and the eval leave out."""

  def weights(self, batch):     # what the loss, the step's divisor and the eval count
    w = super().weights(batch)
    return w * (jnp.arange(w.shape[-1]) >= w.shape[-1] // 2)

  def loss(self, ctx, batch):   # logged as `scored_share` in every train record
    sums = super().loss(ctx, batch)
    return sums._replace(metrics={**sums.metrics,
                                  "scored_share": jnp.mean(self.weights(batch))})


PREFIX_LM = PrefixLM("prefix_lm", inputs=("inputs",),
                     optional=(("segment_ids", "segment_ids"), ("positions", "positions")),
                     counted="inputs", context=("inputs",), text=True)


@pytest.fixture
def prefix_lm():
  """The task, and a decoder family that names it (registered for the test only)."""
  tasks.register(PREFIX_LM)
  models.register(dataclasses.replace(models.get("decoder"), name="prefix_decoder",
                                      task="prefix_lm"))
  yield PREFIX_LM
  models.unregister("prefix_decoder")
  tasks.unregister("prefix_lm")


def test_a_task_added_through_the_registry_alone_trains(prefix_lm, lm_setup, tmp_path,
                                                        monkeypatch):
  """No trainer code knows `prefix_lm`: the step's loss is the mean nll over the second
  halves only, and the loop trains it and logs its own metric."""
  module, params, batch = lm_setup
  assert tasks.task_for({"family": "prefix_decoder"}) is prefix_lm
  tx = optax.sgd(1.0)
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
           "skipped": jnp.zeros((), jnp.int32)}
  _, m = jax.jit(make_train_step(module, tx, prefix_lm))(state, batch, jax.random.key(0))
  w = batch["weights"] * (np.arange(9) >= 4)
  nll = _nll64(jax.jit(module.apply)({"params": params}, batch["inputs"]), batch["targets"])
  np.testing.assert_allclose(m["loss"], (nll * w).sum() / w.sum(), rtol=sum_tol(CHAIN))
  np.testing.assert_allclose(m["scored_share"], w.mean(), rtol=1e-6)

  from jaxformer.train import loop
  on_one_device(monkeypatch)
  cfg = tiny_run_config(steps=6, log_every=3, eval_every=6, checkpoint_every=6,
                        eval_batches=1)
  cfg.model.family = "prefix_decoder"
  loop.train(cfg, str(tmp_path))
  records = read(os.path.join(tmp_path, "metrics.jsonl"))
  steps = [r for r in records if "scored_share" in r]
  assert [r["step"] for r in steps] == [3, 6]
  assert all(r["scored_share"] == 0.5 and np.isfinite(r["loss"]) for r in steps)
  assert np.isfinite(records[-1]["eval_loss"])


def test_a_family_naming_an_unregistered_task_is_refused():
  models.register(dataclasses.replace(models.get("decoder"), name="orphan", task="no_such"))
  try:
    with pytest.raises(ValueError, match="model family 'orphan' names task 'no_such'"):
      tasks.task_for({"family": "orphan"})
  finally:
    models.unregister("orphan")


def test_best_checkpoints_keep_the_best_and_forget_redone_steps(tmp_path):
  params = {"w": np.zeros(3, np.float32)}
  best = checkpoint.BestCheckpoints(tmp_path / "best", metric="eval_loss", keep=2)
  saved = [best.maybe_save(s, {"w": np.full(3, s, np.float32)}, {"eval_loss": v})
           for s, v in ((10, 3.0), (20, 2.0), (30, 2.5), (40, 2.8), (50, 1.0))]
  assert saved == [True, True, True, False, True]
  best.manager.wait_until_finished()
  assert sorted(best.manager.all_steps()) == [20, 50] and best.best_step() == 50
  np.testing.assert_array_equal(best.restore(params)["w"], np.full(3, 50.0))
  best.forget_after(30)
  assert best.manager.all_steps() == [20]
  best.close()
  acc = checkpoint.BestCheckpoints(tmp_path / "acc", metric="eval_accuracy", keep=1)
  assert [acc.maybe_save(s, params, {"eval_accuracy": v})
          for s, v in ((1, 0.5), (2, 0.4), (3, 0.9))] == [True, False, True]
  acc.close()
