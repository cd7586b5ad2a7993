"""Gradient accumulation that reduces once (`optim.grad_reduce`, train/step.py): the same
gradient as the per-micro-batch path and as one device, on data-parallel, FSDP and tensor-
parallel meshes of the 8 CPU devices, with MoE aux losses and micro-batches whose weights
are all zero; and on compile-only TPU devices, gradient collective bytes that no longer grow
with `optim.grad_accum`."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from jaxformer.parallel import ShardingPlan
from jaxformer.state import train_state as state_lib
from jaxformer import tasks
from jaxformer.train import config_checks, run_builder, step as step_lib
from tests.sharded_gpt import tiny_gpt_config
from tests.user_errors import user_error

SEQ, ACCUM, ROWS = 16, 2, 16


def _config(moe: bool):
  model = dict(num_experts=4, experts_per_token=2, moe_dispatch="dropless",
               moe_load_balance_weight=0.5, moe_z_loss_weight=0.1) if moe else {}
  cfg = tiny_gpt_config(**model)
  cfg.model.dropout_rate = 0.0
  cfg.data.seq_len = SEQ
  cfg.optim.grad_accum = ACCUM
  cfg.train.batch_size = ROWS
  return cfg


def _batch(cfg, rows: int, shards: int):
  """Random tokens; the weights of micro-batch 0 (block 0 of each shard's rows) are all
  zero, the others random in [0, 1)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.model.vocab_size, (rows, SEQ + 1)).astype(np.int32)
  w = rng.random((shards, ACCUM, rows // (shards * ACCUM), SEQ)).astype(np.float32)
  w[:, 0] = 0.0
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": w.reshape(rows, SEQ)}


def _sgd_step(cfg, plan, batch, *, reduce: str | None = None, batch_shards=None):
  """One SGD(lr=1) step on `plan`'s mesh: (metrics, gradient) as host arrays. `reduce`: the
  optim.grad_reduce the trainer's own jit_train_step resolves; None: make_train_step with
  the per-micro-batch path and `batch_shards` blocks (the one-device reference)."""
  module, _, init = state_lib.train_state_fns(cfg)
  tx = optax.sgd(1.0)
  boxed = jax.eval_shape(init)
  params_sharding = plan.state_shardings(boxed)["params"]
  shardings = {"step": plan.replicated, "params": params_sharding,
               "opt_state": jax.tree.map(lambda _: plan.replicated,
                                         jax.eval_shape(lambda: tx.init(boxed["params"]))),
               "skipped": plan.replicated}
  params = jax.device_put(_params(cfg), params_sharding)
  state = {"step": np.int32(0), "params": params, "opt_state": tx.init(params),
           "skipped": np.int32(0)}
  state = jax.device_put(state, shardings)
  batch_sh = {k: plan.batch_sharding(v.ndim) for k, v in batch.items()}
  task = tasks.task_for(cfg.model)
  if reduce is not None:
    cfg.optim.grad_reduce = reduce
    step = run_builder.jit_train_step(config_checks.validate(cfg), plan, module, tx, task,
                                shardings, batch_sh)
  else:
    step = plan.jit(step_lib.make_train_step(module, tx, task, grad_accum=ACCUM,
                                             batch_shards=batch_shards),
                    in_shardings=(shardings, batch_sh, plan.replicated),
                    out_shardings=(shardings, plan.replicated))
  new, metrics = step(state, jax.device_put(batch, batch_sh), plan.replicate(jax.random.key(0)))
  grads = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), _params(cfg),
                       jax.device_get(new["params"]))
  return jax.device_get(metrics), grads


_PARAMS = {}


def _params(cfg):
  key = cfg.model.get("num_experts")
  if key not in _PARAMS:
    plan = ShardingPlan.from_config(dict(data=1, model=1, expert=1), jax.devices()[:1])
    _PARAMS[key] = jax.device_get(plan.init_state(state_lib.train_state_fns(cfg)[2])[0]
                                  )["params"]
  return _PARAMS[key]


def _assert_same(got, want):
  (gm, gg), (wm, wg) = got, want
  for k in ("loss", "total_loss", "accuracy", "grad_norm", "moe_load_balance_loss",
            "moe_z_loss", "moe_expert_load"):
    if k in wm:
      np.testing.assert_allclose(gm[k], wm[k], rtol=2e-5, atol=1e-7, err_msg=k)
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(gg)[0], jax.tree.leaves(wg)):
    scale = np.abs(b).max() + 1e-12
    np.testing.assert_allclose(a / scale, b / scale, atol=3e-5, err_msg=str(path))


# mesh, and the optim.grad_reduce compared with 'per_microbatch' and one device
MESHES = {"dp": (dict(data=8, model=1, fsdp=False), "once"),
          "fsdp": (dict(data=8, model=1, fsdp=True), "once"),
          "dp x tp": (dict(data=2, model=4, fsdp=False), "once"),
          # hybrid sharding: "auto" maps only 'replica' (FSDP's 'data' shards parameters)
          "replica x fsdp x tp": (dict(replica=2, data=2, model=2, fsdp=True), "auto")}


# the fast loop keeps the hybrid replica x FSDP x TP mesh (FSDP and TP together, 'auto');
# data parallel, FSDP alone and data x TP ('once') run in the full suite
@pytest.mark.parametrize("mesh", [m if m == "replica x fsdp x tp" else
                                  pytest.param(m, marks=pytest.mark.slow) for m in MESHES])
def test_reduce_once_is_the_per_microbatch_and_the_one_device_gradient(mesh):
  """A MoE GPT (dropless top-2, load-balance and router z-loss weighted in), micro-batch 0
  with zero weights, 2 micro-batches: the same metrics and SGD gradient three ways."""
  cfg = _config(moe=True)
  mesh_config, reduce = MESHES[mesh]
  plan = ShardingPlan.from_config(dict(mesh_config, expert=1), jax.devices())
  shards = plan.batch_shards
  batch = _batch(cfg, rows=ROWS, shards=shards)
  once = _sgd_step(cfg, plan, batch, reduce=reduce)
  per_micro = _sgd_step(cfg, plan, batch, reduce="per_microbatch")
  one = ShardingPlan.from_config(dict(data=1, model=1, expert=1), jax.devices()[:1])
  reference = _sgd_step(cfg, one, batch, batch_shards=shards)
  assert once[0]["loss"] > 0 and np.abs(jax.tree.leaves(once[1])[0]).max() > 0
  assert once[0]["moe_load_balance_loss"] > 0
  _assert_same(once, reference)
  _assert_same(per_micro, reference)


def test_grad_reduce_policy():
  kw = dict(grad_accum=2, batch_size=16, batch_axes={"data": 4}, param_axes={"model"},
            expert_parallel=False, row_sums=True)
  axes = step_lib.grad_reduce_axes
  assert axes("auto", **kw) == axes("once", **kw) == ("data",)
  assert axes("per_microbatch", **kw) == ()
  fsdp = {**kw, "param_axes": {"data", "model"}}
  assert axes("auto", **fsdp) == () and axes("once", **fsdp) == ("data",)   # FSDP: memory
  hybrid = {**fsdp, "batch_axes": {"replica": 2, "data": 2}}
  assert axes("auto", **hybrid) == ("replica",) and axes("once", **hybrid) == ("replica", "data")
  assert axes("auto", **{**kw, "grad_accum": 1}) == ()
  assert axes("once", **{**kw, "batch_axes": {"data": 1}}) == ()
  for bad, field in ((dict(expert_parallel=True), "mesh.expert"),
                     (dict(row_sums=False), "not a sum over rows"),
                     (dict(batch_size=12), "train.batch_size=12")):
    assert axes("auto", **{**kw, **bad}) == ()
    user_error(lambda: axes("once", **{**kw, **bad}), "optim.grad_reduce='once'", field)
  user_error(lambda: config_checks.validate(_with(grad_reduce="never")), "optim.grad_reduce")


def _with(**optim):
  cfg = _config(False)
  cfg.optim.update(optim)
  return cfg


# --- on compile-only TPU devices: gradient traffic per step ----------------------------------

def _reduced_bytes(plan) -> tuple[int, float]:
  """(count, bytes per chip) of the all-reduces and reduce-scatters over 'data'."""
  recs = [r for r in plan.collectives.values()
          if r["kind"] in ("all-reduce", "reduce-scatter") and "data" in r["axes"]]
  return sum(r["count"] for r in recs), sum(r["bytes"] for r in recs)


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("libtpu") is None,
                    reason="libtpu is not installed: no compile-only TPU devices")
def test_gradient_reduction_bytes_do_not_grow_with_grad_accum():
  """gpt2:tiny data-parallel on v5e:2x2, 4 micro-batches: reducing once moves one float32
  gradient per step (the parameters' bytes: as at grad_accum=1, whatever optim.grad_accum
  is); reducing per micro-batch moves one per micro-batch."""
  from jaxformer import scaling
  from jaxformer.plan import estimate
  from tests.tpu_compile.test_plan import _tiny
  plans = {}
  for reduce in ("auto", "per_microbatch"):
    cfg = _tiny(batch=16)
    cfg.mesh.update(data=4, model=1, fsdp=False)
    cfg.optim.update(grad_accum=4, grad_reduce=reduce)
    plans[reduce] = _reduced_bytes(estimate.plan(cfg, "v5e:2x2"))
  n = scaling.count_params(_tiny().model)["total"]
  count, moved = plans["auto"]
  assert count <= 2 and 4 * n <= moved < 4 * n * 1.01          # the f32 gradient, once
  per_micro = plans["per_microbatch"][1]
  assert per_micro > 4 * 0.9 * 2 * n                             # >= 4 bf16 gradients
