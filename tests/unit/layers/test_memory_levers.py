"""The memory levers (issue #41 item 4): named remat policies that keep (or offload to host
memory) chosen activations, Adam's moments stored in bfloat16 (`optim.state_dtype`) and kept in
host memory between steps (`optim.offload_state`). Each off by default; where the semantics are
unchanged the CPU computes exactly what it computes without the lever."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import ConfigDict

from configs import llama
from jaxformer import models, run_settings
from jaxformer.layers.block_settings import ACTIVATION_NAMES, OFFLOADED_REMAT_POLICIES, REMAT_POLICIES
from jaxformer.parallel import offload
from jaxformer.state import optim
from tests.runs import on_one_device, tiny_run_config
from tests.user_errors import user_error

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="compile-only TPU devices need libtpu")


def _tiny_llama(policy: str, scan: bool = False):
  m = dict(llama.get_config("tiny").model)
  m.update(remat_policy=policy, scan_layers=scan)
  module = models.build(ConfigDict(m))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, m["vocab_size"])
  loss = lambda p: module.apply({"params": p}, tokens).astype(jnp.float32).std()
  return loss, _init(scan)


@functools.cache
def _init(scan: bool):
  """The tiny llama's initial params in one stack layout (the remat policy changes no param):
  its init jitted (one compile, not one per op) and run once per layout."""
  m = dict(llama.get_config("tiny").model)
  m.update(scan_layers=scan)
  module = models.build(ConfigDict(m))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, m["vocab_size"])
  return jax.jit(module.init)(jax.random.key(0), tokens)["params"]


def _residuals(policy: str) -> str:
  loss, params = _tiny_llama(policy)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(loss, params)
  return out.getvalue()


@pytest.mark.parametrize("policy, saved", [
    ("save_qkv", {"query_proj", "key_proj", "value_proj"}),
    ("save_attention", {"query_proj", "key_proj", "value_proj", "attention_context",
                        "attention_out"}),
    # mlp_out of a pre-norm block only feeds the residual sum the block returns: the
    # backward never needs it (post-norm blocks do)
    ("save_projections", set(ACTIVATION_NAMES) - {"layer_input", "mlp_out"}),
    ("full", set()),
])
def test_named_policies_keep_exactly_their_activations(policy, saved):
  """What the backward pass keeps of each block is the policy's named activations (the
  layers tag them with checkpoint_name); the rest is recomputed."""
  text = _residuals(policy)
  kept = {n for n in ACTIVATION_NAMES if f"named '{n}'" in text}
  assert kept == saved, text


def test_offloaded_policies_move_their_activations_to_host():
  """An offload_ policy keeps nothing of its names on the device: they leave through a
  device_put (to pinned_host), one per name and layer (2 layers)."""
  saved = _residuals("save_attention")
  offloaded = _residuals("offload_attention")
  assert saved.count("named '") == 2 * 5
  assert "named '" not in offloaded and offloaded.count("device_put") == 2 * 5


@pytest.mark.slow
def test_every_remat_policy_gives_the_gradient_of_none():
  """Rematerialising (and offloading, which the CPU can: it has pinned_host memory) changes
  where activations wait, not the gradient: equal to no remat, in both stack layouts."""
  for scan, policies in ((False, ("none", "offload_attention")),
                         (True, ("none", "offload_layer_input"))):
    reference = None                  # (the two layouts initialise differently)
    for policy in policies:
      loss, params = _tiny_llama(policy, scan)
      flat = np.concatenate([np.ravel(g) for g in jax.tree.leaves(
          jax.jit(jax.grad(loss))(params))])
      if reference is None:
        reference = flat
      np.testing.assert_allclose(flat, reference, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{policy} scan={scan}")


def _optim(**kw):
  return run_settings.parse_section("optim", {"lr": 1e-2, "warmup_steps": 2, **kw})


def test_bfloat16_state_is_optax_with_its_state_rounded_to_bfloat16():
  """optim.state_dtype='bfloat16': the moments are stored in bfloat16 and each update is
  float32 AdamW (optax, the same settings) from the stored moments, its new moments rounded to
  bfloat16: equal, step by step, to optax run with its state rounded after every update."""
  keys = jax.random.split(jax.random.key(0), 7)
  params = {"w": jax.random.normal(keys[0], (8, 4)), "b": jnp.zeros((4,))}
  grads = [jax.tree.map(lambda p, k=k: jax.random.normal(k, p.shape), params)
           for k in keys[1:]]
  ours = optim.make_optimizer(_optim(state_dtype="bfloat16"), 10)
  reference = optim.make_optimizer(_optim(), 10)       # float32 (the default)
  assert _optim().state_dtype == "float32"
  rounded = lambda t: jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
                                   if jnp.issubdtype(x.dtype, jnp.floating) else x, t)
  p_ours, s_ours = params, ours.init(params)
  p_ref, s_ref = params, reference.init(params)
  p_f32, s_f32 = params, reference.init(params)
  for g in grads:
    u, s_ours = ours.update(g, s_ours, p_ours)
    p_ours = optax.apply_updates(p_ours, u)
    u, s_ref = reference.update(g, s_ref, p_ref)
    p_ref, s_ref = optax.apply_updates(p_ref, u), rounded(s_ref)
    u, s_f32 = reference.update(g, s_f32, p_f32)
    p_f32 = optax.apply_updates(p_f32, u)
  floats = [x for x in jax.tree.leaves(s_ours) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and all(x.dtype == jnp.bfloat16 for x in floats)
  for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_ref)):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p_ours),
                                                       jax.tree.leaves(p_f32)))


def _steps(cfg, n: int):
  """`n` train steps of `cfg` on one CPU device, as the trainer jits them: (state, metrics)."""
  from jaxformer import parallel
  from jaxformer.state import train_state as state_lib
  from jaxformer import tasks
  from jaxformer.train import config_checks, run_builder
  settings = config_checks.validate(cfg)
  plan = parallel.ShardingPlan.from_config(settings.mesh, jax.devices()[:1])
  module, tx, init_boxed = state_lib.train_state_fns(cfg)
  abstract = jax.eval_shape(init_boxed)
  shardings = run_builder.offloaded(cfg, settings, plan, plan.state_shardings(abstract))
  state = jax.device_put(plan.init_state(init_boxed)[0], shardings)
  task = tasks.task_for_run(cfg)
  spec = task.batch_spec(cfg, settings, models.with_defaults(cfg.model))
  batch = {k: jax.random.randint(jax.random.key(i), shape, 0, 60).astype(dtype)
           for i, (k, (shape, dtype)) in enumerate(sorted(spec.items()))}
  step = run_builder.jit_train_step(settings, plan, module, tx, task, shardings,
                              {k: plan.batch_sharding(v.ndim) for k, v in batch.items()})
  key = plan.replicate(jax.random.key(3))
  for _ in range(n):
    state, metrics = step(state, plan.global_batch(batch), key)
  return state, metrics


def test_offloaded_optimizer_state_trains_exactly_as_on_the_device():
  """optim.offload_state=True on the CPU (which has pinned_host memory): the moments live in
  host memory between steps and the steps compute the same bits as without it."""
  plain, m_plain = _steps(tiny_run_config(), 2)
  cfg = tiny_run_config()
  cfg.optim.offload_state = True
  moved, m_moved = _steps(cfg, 2)
  kinds = {x.sharding.memory_kind for x in jax.tree.leaves(moved["opt_state"])}
  assert kinds == {offload.HOST}
  assert {x.sharding.memory_kind for x in jax.tree.leaves(moved["params"])} != {offload.HOST}
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(moved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(m_plain["loss"]) == float(m_moved["loss"])


@pytest.mark.parametrize("field, value, named", [
    ("optim.offload_state", True, "optim.offload_state=True"),
    ("model.remat_policy", "offload_layer_input", "model.remat_policy='offload_layer_input'"),
])
def test_host_memory_levers_are_refused_by_name_where_there_is_no_host_memory(
    monkeypatch, field, value, named):
  """On devices without pinned_host memory the lever is refused, naming its field, before
  anything compiles."""
  from jaxformer.train.program import build_program
  monkeypatch.setattr(offload, "has_host_memory", lambda devices: False)
  cfg = tiny_run_config()
  section, key = field.split(".")
  cfg[section][key] = value
  user_error(lambda: build_program(cfg, jax.devices()[:1]), named, "host memory")


def test_state_dtype_is_checked_by_name():
  user_error(lambda: _optim(state_dtype="float16"), "optim.state_dtype")


@needs_libtpu
@pytest.mark.slow
def test_an_offloaded_optimizer_state_fits_where_the_plain_step_does_not():
  """On v5e:2x2 (16 GiB per chip), a 0.9 B-parameter model (128 scanned layers 768 wide),
  data parallel: parameters, gradients and Adam's moments do not fit in HBM together; with
  the moments in host memory the step fits, and the plan counts them as host bytes. (As
  many parameters in 2 layers 6144 wide compile in ~2x the time: larger arrays.)"""
  from jaxformer.plan import estimate
  def config(**optim_fields):
    cfg = tiny_run_config()
    cfg.mesh.update(data=4, model=1, fsdp=False)
    cfg.model.update(scan_layers=True, num_layers=128, d_model=768, num_heads=8,
                     mlp_dim=4 * 768, remat_policy="full")
    cfg.data.seq_len, cfg.train.batch_size = 32, 4
    cfg.optim.update(optim_fields)
    return cfg
  plain = estimate.plan(config(), "v5e:2x2")
  moved = estimate.plan(config(offload_state=True), "v5e:2x2")
  assert not plain.fits and plain.refusal
  assert moved.fits and moved.refusal is None
  assert moved.per_chip_bytes["optimizer"] == 0
  assert moved.per_chip_bytes["host"] >= plain.per_chip_bytes["optimizer"]
  assert "host memory per chip" in estimate.table(moved)


@pytest.mark.slow
def test_a_run_with_offloaded_moments_checkpoints_resumes_and_equals_the_plain_run(
    tmp_path, monkeypatch):
  """Through the trainer: checkpoints of host-memory moments save and restore (a run stopped
  at step 4 and resumed), and the metrics equal the plain run's. On one device: the levers
  and the checkpoints are what is checked, not the mesh."""
  import json
  from jaxformer.train import loop
  on_one_device(monkeypatch)
  def config(offload_state: bool):
    cfg = tiny_run_config(steps=8, checkpoint_every=4, eval_every=8, log_every=4)
    cfg.optim.offload_state = offload_state
    return cfg
  loop.train(config(True), str(tmp_path / "moved"), stop_after=4)
  loop.train(config(True), str(tmp_path / "moved"))
  loop.train(config(False), str(tmp_path / "plain"))
  records = lambda name: [(r["step"], r.get("loss"), r.get("eval_loss")) for r in map(
      json.loads, open(tmp_path / name / "metrics.jsonl"))]
  assert records("moved") == records("plain") and len(records("plain")) == 3


@pytest.mark.parametrize("policy, names", [
    ("offload_layer_input_qkv", 4), ("offload_layer_input_qkv_out", 5)])
def test_maxtext_style_policies_offload_the_block_input_and_the_projections(policy, names):
  """The combined policies move each block's input and their projections to host memory (one
  device_put per name and layer, 2 layers) and keep nothing named on the device."""
  loss, params = _tiny_llama(policy)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(loss, params)
  text = out.getvalue()
  assert "named '" not in text and text.count("device_put") == 2 * names, text
