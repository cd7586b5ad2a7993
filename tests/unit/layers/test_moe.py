"""Mixture of experts: routing, both dispatch modes, aux losses and expert parallelism against
float64 NumPy references and the unsharded layer."""

import functools
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import configs
from configs import moe_gpt
from jaxformer import models, scaling
from jaxformer.layers import moe as moe_lib
from jaxformer.layers.moe import (MOE_COLLECTION, capacity_positions, collect_moe,
                                  expert_capacity)
from jaxformer.models.stack import stack_layers
from jaxformer.parallel import ShardingPlan
from jaxformer.parallel.rules import MESH_AXES, logical_axis_rules
from jaxformer.train import loop
from tests import accelerators, drawn, sharded_gpt
from tests.arrays import assert_close_f32, rand
from tests.gradcheck import numeric_grad
from tests.modules import make_moe
from tests.runs import tiny_run_config
from tests.user_errors import user_error

ACTS = {"silu": lambda h: h / (1 + np.exp(-h)), "relu": lambda h: np.maximum(h, 0)}
DECODER = dict(family="decoder", vocab_size=23, d_model=16, num_layers=2, num_heads=2,
               mlp_dim=12, num_experts=4, experts_per_token=2)


def np_route(x, p, k, renormalize):
  logits = x @ p["router"]["kernel"]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  experts = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
  gates = np.take_along_axis(probs, experts, -1)
  if renormalize:
    gates = gates / gates.sum(-1, keepdims=True)
  return logits, probs, gates, experts


def np_slots(experts, num_experts):
  """Slot of each assignment [G, T, k], filled top-1 of every token first, then top-2."""
  g, t, k = experts.shape
  slots = np.zeros_like(experts)
  for gi in range(g):
    filled = np.zeros(num_experts, int)
    for j in range(k):
      for ti in range(t):
        slots[gi, ti, j] = filled[experts[gi, ti, j]]
        filled[experts[gi, ti, j]] += 1
  return slots


def np_expert(v, p, e, act):
  if "wi_gate" in p:
    h = ACTS[act](v @ p["wi_gate"][e]) * (v @ p["wi_up"][e])
  else:
    h = ACTS[act](v @ p["wi"][e])
  return h @ p["wo"][e]


def np_moe(x, p, *, k, act, renormalize=True, capacity=None):
  """float64 reference on x [G, T, d]; capacity=None is dropless."""
  _, _, gates, experts = np_route(x, p, k, renormalize)
  slots = np_slots(experts, p["router"]["kernel"].shape[1])
  out = np.zeros_like(x)
  for g, t, j in np.ndindex(*experts.shape):
    if capacity is None or slots[g, t, j] < capacity:
      out[g, t] += gates[g, t, j] * np_expert(x[g, t], p, experts[g, t, j], act)
  return out


def init_moe(x, **fields):
  module = make_moe(**fields)
  params = drawn.params(module, x)
  return module, params, jax.tree.map(lambda a: np.asarray(a, np.float64), params)


def run(module, params, x, **kwargs):
  """module.apply jitted (one compile instead of one per op), with the sown MoE metrics."""
  fn = jax.jit(lambda p, x: module.apply({"params": p}, x, mutable=[MOE_COLLECTION], **kwargs))
  return fn(params, x)


# k: experts a token (3 for one dropless case: its sort and grouping are not only top-2's).
@pytest.mark.parametrize("fields", [
    dict(dispatch="dropless", gated=True, activation="silu", grouped_matmul="ragged"),
    dict(dispatch="dropless", gated=False, activation="relu", renormalize=False,
         grouped_matmul="blocked", k=3),
    dict(dispatch="dropless", gated=True, activation="silu", grouped_matmul="megablox"),
    dict(dispatch="capacity", gated=True, activation="silu", capacity_factor=0.6),
    dict(dispatch="capacity", gated=False, activation="relu", renormalize=False,
         capacity_factor=1.0),
])
def test_moe_matches_numpy_reference(fields):
  x = rand((3, 7, 10))
  fields = dict(fields)
  k = fields.pop("k", 2)
  module, params, p = init_moe(x, num_experts=5, experts_per_token=k, hidden_dim=6, **fields)
  capacity = (expert_capacity(7, 5, 2, fields["capacity_factor"])
              if fields["dispatch"] == "capacity" else None)
  want = np_moe(x.astype(np.float64), p, k=k, act=fields["activation"],
                renormalize=fields.get("renormalize", True), capacity=capacity)
  out, state = run(module, params, x)
  np.testing.assert_allclose(out, want, atol=2e-5)
  dropped = state[MOE_COLLECTION]["moe_dropped_fraction"][0]
  if capacity is None:
    assert dropped == 0
  else:
    slots = np_slots(np_route(x.astype(np.float64), p, 2, True)[3], 5)
    assert 0 < dropped == pytest.approx(np.mean(slots >= capacity))


@pytest.mark.parametrize("impl", ["ragged", "megablox", "blocked"])
def test_dropless_gradients_match_float64_reference(impl):
  # Every grouped matmul's VJP (megablox: gmm for the input gradient, tgmm for the weights',
  # interpreted on CPU) against central differences of the float64 reference.
  _check_dropless_gradients(impl, rand((2, 5, 6), seed=11), hidden_dim=5)


@pytest.mark.tpu
def test_megablox_compiled_for_the_tpu_matches_float64_reference():
  """megablox's gmm/tgmm as Mosaic kernels on a TPU (not interpreted), at MXU-sized widths
  (128: whole tiles), float32 at `highest`."""
  with accelerators.on_device("tpu"):
    _check_dropless_gradients("megablox", rand((1, 128, 128), seed=11), hidden_dim=128,
                              platform="tpu")


def _check_dropless_gradients(impl, x, *, hidden_dim, platform=None):
  """The gradients (params, input) of a dropless layer (4 experts, top-2) vs central
  differences of the float64 reference; `platform`: also check that the kernels were compiled
  for it."""
  module, params, p = init_moe(x, num_experts=4, experts_per_token=2, hidden_dim=hidden_dim,
                               grouped_matmul=impl)
  ct = rand(x.shape, seed=12)
  loss = lambda q, x: jnp.sum(module.apply({"params": q}, x) * ct)
  if platform is not None:
    accelerators.assert_kernel_compiled(platform, jax.grad(loss, (0, 1)), params, x)
  grads = jax.jit(jax.grad(loss, (0, 1)))(params, x)
  for name in ("wi_gate", "wi_up", "wo"):
    def f(w, name=name):
      return np.sum(np_moe(x.astype(np.float64), dict(p, **{name: w}), k=2, act="silu") * ct)
    idx, num = numeric_grad(f, p[name])
    np.testing.assert_allclose(np.ravel(grads[0][name])[idx], num, atol=1e-4, rtol=1e-3)
  idx, num = numeric_grad(lambda v: np.sum(np_moe(v, p, k=2, act="silu") * ct),
                          x.astype(np.float64))
  np.testing.assert_allclose(np.ravel(grads[1])[idx], num, atol=1e-4, rtol=1e-3)


@functools.cache
def mesh_case(**fields):
  """The layer (8 experts, top-2, 4 hidden units) the mesh tests split, its params, the input
  [8, 5, 6], a loss of its output and that loss's value and gradients on one device: shared
  by the tests of one layer on several meshes (one trace and compile of the reference)."""
  x = rand((8, 5, 6), seed=9)
  module, params, _ = init_moe(x, num_experts=8, experts_per_token=2, hidden_dim=4, **fields)
  loss = lambda p, x: jnp.sum(jnp.sin(module.apply({"params": p}, x)))
  return module, params, x, loss, jax.jit(jax.value_and_grad(loss, (0, 1)))(params, x)


@pytest.mark.parametrize("shape, exchange, impl", [
    ((4, 2, 1), None, "blocked"), ((2, 1, 4), "emulated", "blocked"),
    # the TPU program's combination (megablox in shard_map without vma checks, ragged
    # exchange, hidden units over 'model'), megablox interpreted: ~30 s of CPU
    pytest.param((2, 2, 2), "emulated", "megablox", marks=pytest.mark.slow)])
def test_dropless_per_device_matches_one_device(shape, exchange, impl, monkeypatch):
  # Dropless runs per device whenever the mesh splits the tokens (data: before, the sort
  # over all rows ran whole on every device) with the hidden units over 'model' (partial
  # outputs summed); with an expert axis the TPU/GPU exchange (ragged_all_to_all, not in
  # XLA:CPU) runs here through a padded emulation that checks its offsets.
  # (the exchange is only taken on a mesh with an expert axis: not by the one-device `want`)
  _, params, x, loss, want = mesh_case(dispatch="dropless", grouped_matmul=impl)
  if exchange:
    monkeypatch.setattr(moe_lib, "exchange_kind", lambda: exchange)
  mesh = jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(logical_axis_rules()):
    lowered = jax.jit(jax.value_and_grad(loss, (0, 1))).lower(params, x)
    got = lowered.compile()(params, x)
  text = lowered.as_text()
  assert "sdy.manual_computation" in text or "shard_map" in text
  assert ("psum" in text or "all_reduce" in text) if shape[1] > 1 else True
  assert_close_f32(got, want, 8 * 5 * 6 + 6 + 6 + 4 + 2)


def test_capacity_slots_and_drops_hand_checked():
  # Tokens' (top-1, top-2): (0, 1), (0, 2), (1, 0), (0, 1) over 3 experts. Top-1 choices fill
  # first in token order: e0 <- t0, t1, t3 (slots 0, 1, 2); e1 <- t2. Then top-2: e1 <- t0
  # (slot 1), e2 <- t1, e0 <- t2 (slot 3), e1 <- t3 (slot 2).
  experts = jnp.array([[[0, 1], [0, 2], [1, 0], [0, 1]]])
  np.testing.assert_array_equal(capacity_positions(experts, 3),
                                [[[0, 1], [1, 0], [0, 3], [2, 2]]])
  assert expert_capacity(4, 3, 2, 1.0) == 3            # ceil(8 / 3): drops t2's top-2 only
  assert expert_capacity(4, 3, 2, 0.75) == 2           # ceil(2.0): also t3's top-1 and top-2
  assert expert_capacity(4, 3, 2, 10.0) == 4           # never more than T
  np.testing.assert_array_equal(capacity_positions(experts, 3) < 2,
                                [[[1, 1], [1, 1], [1, 0], [0, 0]]])


def test_capacity_layer_zeroes_exactly_the_tokens_over_capacity():
  # A router that sends every token to expert 0 (top-1): capacity ceil(5 / 4) = 2 keeps
  # tokens 0 and 1 of each sequence; the later ones get zero output (residual pass-through).
  x = rand((2, 5, 6), seed=4)
  x[..., 0] = 3.0
  module, params, p = init_moe(x, num_experts=4, experts_per_token=1, hidden_dim=7,
                               dispatch="capacity", capacity_factor=1.0, renormalize=False)
  params["router"]["kernel"] = jnp.zeros((6, 4)).at[0, 0].set(2.0)
  p["router"]["kernel"] = np.asarray(params["router"]["kernel"], np.float64)
  out, state = run(module, params, x)
  gate = math.exp(6.0) / (math.exp(6.0) + 3)
  for g in range(2):
    for t in range(2):
      np.testing.assert_allclose(out[g, t], gate * np_expert(x[g, t].astype(np.float64), p, 0,
                                                             "silu"), atol=1e-5)
  assert np.all(np.asarray(out[:, 2:]) == 0)
  np.testing.assert_allclose(state[MOE_COLLECTION]["moe_dropped_fraction"][0], 3 / 5)


def test_aux_losses_match_numpy():
  x = rand((2, 11, 8), seed=5)
  module, params, p = init_moe(x, num_experts=5, experts_per_token=2, hidden_dim=4)
  _, state = run(module, params, x)
  aux, metrics = collect_moe(state, load_balance_weight=0.3, z_loss_weight=0.7)
  logits, probs, _, experts = np_route(x.astype(np.float64), p, 2, True)
  load = np.bincount(experts.ravel(), minlength=5) / experts.size
  balance = 5 * np.sum(load * probs.reshape(-1, 5).mean(0))
  z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
  np.testing.assert_allclose(metrics["moe_expert_load"], load, atol=1e-6)
  np.testing.assert_allclose(metrics["moe_load_balance_loss"], balance, rtol=1e-5)
  np.testing.assert_allclose(metrics["moe_z_loss"], z, rtol=1e-5)
  np.testing.assert_allclose(aux, 0.3 * balance + 0.7 * z, rtol=1e-5)
  assert collect_moe({}, load_balance_weight=1.0, z_loss_weight=1.0)[1] == {}


@pytest.mark.parametrize("dispatch", ["dropless", "capacity"])
def test_router_gradients_match_numeric(dispatch):
  x = rand((2, 4, 6), seed=6)
  module, params, p = init_moe(x, num_experts=3, experts_per_token=2, hidden_dim=5,
                               dispatch=dispatch, capacity_factor=0.8)
  capacity = expert_capacity(4, 3, 2, 0.8) if dispatch == "capacity" else None
  ct = rand(x.shape, seed=7)
  g = jax.jit(jax.grad(lambda r: jnp.sum(module.apply(
      {"params": dict(params, router={"kernel": r})}, x) * ct)))(params["router"]["kernel"])
  assert np.all(np.abs(g) > 0)

  def f(kernel):
    return np.sum(np_moe(x.astype(np.float64), dict(p, router={"kernel": kernel}), k=2,
                         act="silu", capacity=capacity) * ct)
  idx, num = numeric_grad(f, p["router"]["kernel"])
  np.testing.assert_allclose(np.ravel(g)[idx], num, atol=1e-4, rtol=1e-3)


def test_router_jitter_uses_the_dropout_stream_only_in_training():
  x = rand((1, 6, 8), seed=8)
  module, params, _ = init_moe(x, num_experts=4, experts_per_token=1, hidden_dim=4,
                               router_jitter=0.5, renormalize=False)
  clean = run(module, params, x)[0]
  train = jax.jit(lambda p, x, key: module.apply({"params": p}, x, deterministic=False,
                                                 rngs={"dropout": key}))
  noisy = [train(params, x, jax.random.key(s)) for s in (0, 1)]
  assert not np.allclose(noisy[0], clean) and not np.allclose(noisy[0], noisy[1])


@pytest.mark.slow
@pytest.mark.parametrize("dispatch", ["dropless", "capacity"])
def test_expert_parallel_matches_single_device(dispatch):
  assert jax.device_count() == 8, "conftest must provide 8 CPU devices"
  # dropless: "blocked", what grouped_matmul="auto" takes on the CPU (the TPU's megablox has
  # its own mesh test above)
  _, params, x, loss, want = mesh_case(
      dispatch=dispatch, **(dict(grouped_matmul="blocked") if dispatch == "dropless" else
                            dict(capacity_factor=0.9)))
  for experts in (2, 4, 8):
    mesh = jax.make_mesh((8 // experts, 1, experts), MESH_AXES,
                         axis_types=(AxisType.Auto,) * 3)
    with jax.set_mesh(mesh), nn.logical_axis_rules(logical_axis_rules()):
      lowered = jax.jit(jax.value_and_grad(loss, (0, 1))).lower(params, x)
      got = lowered.compile()(params, x)
    assert "all_to_all" in lowered.as_text()
    # the loss sums 8 x 5 x 6 outputs; an output: router 6, expert 6 and 4, 2 experts a token
    assert_close_f32(got, want, 8 * 5 * 6 + 6 + 6 + 4 + 2)


def test_expert_axis_must_divide_num_experts():
  x = rand((4, 3, 6))
  module, params, _ = init_moe(x, num_experts=6, experts_per_token=2, hidden_dim=4)
  mesh = jax.make_mesh((2, 1, 4), MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  with jax.set_mesh(mesh), pytest.raises(ValueError, match="model.num_experts=6.*mesh.expert=4"):
    jax.jit(module.apply)({"params": params}, x)


# A tiny MoE decoder trained a few steps through the library's train state and step:
# 4 experts (so mesh.expert 2 and 4 both divide them), top-2, dropless.
EP_STEPS = 3
EP_MODEL = dict(num_experts=4, experts_per_token=2, moe_dispatch="dropless", num_heads=4)


@functools.cache
def ep_run(shape, fsdp=False):
  """(losses, state) of EP_STEPS steps of the tiny MoE decoder on a (data, model, expert)
  mesh, initialised by `plan.init_state` on that mesh (as the trainer does)."""
  config = sharded_gpt.tiny_gpt_config(**EP_MODEL)
  batches = [sharded_gpt.token_batch(s, config.model.vocab_size) for s in range(EP_STEPS)]
  plan = ShardingPlan.from_config(dict(zip(MESH_AXES, shape), fsdp=fsdp),
                                  jax.devices()[:math.prod(shape)])
  losses, state, _ = sharded_gpt.train(plan, config, batches)
  return losses, state


@pytest.mark.parametrize("shape, fsdp", [((2, 2, 2), True), ((2, 1, 4), False)])
def test_expert_parallel_training_matches_replicated_experts(shape, fsdp):
  # Before: plan.init_state traced module.init's 1-row example under the mesh, where the
  # experts' all-to-all needs the batch split over data * expert ("batch size 1 must be a
  # multiple of it"). Each of a step's N = batch * length per-token losses is computed the
  # same way on every mesh; only the order of the sums differs (per-shard partial sums, then
  # the all-reduce; likewise the gradients). A float32 sum of N positive terms in another
  # order moves by at most (N - 1) * 2**-24 relative (Higham), and each step's update can
  # carry at most that again into the next loss: rtol = EP_STEPS * (N - 1) * 2**-24 (2.3e-5;
  # measured 1.1e-7, one ulp).
  want, _ = ep_run((1, 1, 1))
  losses, state = ep_run(shape, fsdp)
  n = sharded_gpt.GLOBAL_BATCH * sharded_gpt.SEQ_LEN
  np.testing.assert_allclose(losses, want, rtol=EP_STEPS * (n - 1) * 2.0**-24)
  assert want[0] != want[-1]                               # the steps really trained
  wo = state["params"]["decoder"]["layers_0"]["block"]["ffn"]["wo"]
  assert wo.sharding.spec[0] == "expert"                   # [experts, mlp, embed]
  assert wo.addressable_shards[0].data.shape[0] == 4 // shape[2]


@pytest.mark.parametrize("overrides, parts", [
    (dict(optim=dict(grad_accum=2)),
     ["optim.grad_accum=2", "train.batch_size=8", "mesh.data*mesh.expert=8", "multiple of 16"]),
    (dict(train=dict(batch_size=12)), ["train.batch_size=12", "mesh.data*mesh.expert=8"]),
    (dict(mesh=dict(expert=8)), ["mesh.expert=8", "model.num_experts"]),
])
def test_expert_parallel_config_the_trainer_cannot_run_is_refused_before_compiling(
    tmp_path, overrides, parts):
  cfg = tiny_run_config()
  cfg.model.update(EP_MODEL)
  cfg.mesh.expert = 2                                       # data=-1 -> 4
  for section, fields in overrides.items():
    cfg[section].update(fields)
  workdir = tmp_path / "run"
  user_error(lambda: loop.train(cfg, str(workdir)), *parts)
  assert not os.path.exists(workdir / "config.json")        # nothing written, no step compiled


@pytest.mark.parametrize("fields, match", [
    (dict(experts_per_token=5), "model.experts_per_token=5"),
    (dict(moe_dispatch="topk"), "model.moe_dispatch='topk'"),
    (dict(moe_capacity_factor=0.0), "model.moe_capacity_factor=0.0 must be > 0"),
    (dict(moe_router_jitter=1.5), "model.moe_router_jitter=1.5"),
    (dict(moe_load_balance_weight=-1.0), "model.moe_load_balance_weight=-1.0"),
])
def test_bad_moe_config_raises_naming_the_field(fields, match):
  with pytest.raises(ValueError, match=match):
    models.build(dict(DECODER, **fields))


@pytest.mark.slow
@pytest.mark.parametrize("dispatch", ["dropless", "capacity"])
def test_scanned_remat_model_returns_stacked_metrics(dispatch):
  cfg = dict(DECODER, moe_dispatch=dispatch, moe_capacity_factor=0.5)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 23, (2, 8)), jnp.int32)
  plain = models.build(cfg)
  params = drawn.params(plain, tokens)
  scanned = models.build(dict(cfg, scan_layers=True, remat_policy="full"))
  scanned_params = dict(params, decoder=stack_layers(params["decoder"], 2))
  results = []
  for module, p in ((plain, params), (scanned, scanned_params)):
    logits, state = run(module, p, tokens)
    results.append((logits,) + collect_moe(state, load_balance_weight=0.01,
                                           z_loss_weight=0.001))
  ffn = state[MOE_COLLECTION]["decoder"]["layers"]["block"]["ffn"]
  assert ffn["moe_expert_load"][0].shape == (2, 4)          # [layers, experts]
  assert ffn["moe_z_loss"][0].shape == (2,)
  (want_logits, want_aux, want), (got_logits, got_aux, got) = results
  np.testing.assert_allclose(got_logits, want_logits, atol=1e-5)
  np.testing.assert_allclose(got_aux, want_aux, rtol=1e-5)
  assert set(got) == set(want) == {"moe_load_balance_loss", "moe_z_loss",
                                   "moe_dropped_fraction", "moe_expert_load"}
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), got, want)
  assert (got["moe_dropped_fraction"] > 0) == (dispatch == "capacity")


def test_moe_gpt_configs_share_active_params_and_mixtral_counts_hold():
  counts = {n: scaling.count_params(moe_gpt.get_config(n).model) for n in ("dense", "switch",
                                                                           "mixtral")}
  router = 4 * 128 * 8
  assert counts["switch"]["active"] == counts["mixtral"]["active"] == (
      counts["dense"]["active"] + router)
  assert counts["switch"]["total"] > counts["mixtral"]["total"] > counts["dense"]["total"]
  assert moe_gpt.get_config().model.num_experts == 4           # arg=None -> tiny
  mixtral = scaling.count_params(configs.get_config("mixtral", "8x7b").model)
  assert mixtral["total"] == 46_702_792_704 and abs(mixtral["active"] / 12.88e9 - 1) < 0.005
