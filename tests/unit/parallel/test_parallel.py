"""Meshes, sharding rules and ShardingPlan on 8 CPU devices: sharded training equals one
device, arrays are really sharded, bad meshes fail before compiling, Orbax restores across
meshes, Slurm/env start-up parsing."""

from __future__ import annotations

import functools
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import AxisType, PartitionSpec as P

from configs import vit
from jaxformer import models
from jaxformer.parallel import (ShardingPlan, distributed, initialize, logical_axis_rules,
                                make_mesh, per_device_bytes)
from tests import sharded_gpt as worker

# Data only, FSDP only, model only, and data x model with and without FSDP: one mesh of each
# (the data x model split's other proportions run the same rules and collectives).
MESHES = [((8, 1, 1), False), ((8, 1, 1), True), ((4, 2, 1), True), ((2, 4, 1), False),
          ((1, 8, 1), False)]
SHARDED_INIT = ((4, 2, 1), True)     # initialised by plan.init_state straight into its shards
# Logical name -> mesh axis as the rules promise it for parameters (checked independently).
PARAM_AXES = {"heads": "model", "kv_heads": "model", "mlp": "model", "vocab": "model",
              "expert": "expert"}


def mesh_config(shape, fsdp=False):
  return dict(zip(("data", "model", "expert"), shape), fsdp=fsdp)


def plan_for(shape, fsdp=False):
  devices = jax.devices()[:math.prod(shape)]
  return ShardingPlan.from_config(mesh_config(shape, fsdp), devices)


@functools.cache
def gpt_initial_state():
  """The tiny GPT's initial train state on the host (initialised once, on one device)."""
  return worker.host_state(worker.tiny_gpt_config())


@functools.cache
def gpt_run(shape, fsdp):
  """(losses, state, step) of 3 AdamW steps of the tiny GPT on this mesh. The state starts
  from the shared host copy (one step compile per mesh); SHARDED_INIT uses `plan.init_state`."""
  config = worker.tiny_gpt_config()
  batches = [worker.token_batch(s, config.model.vocab_size) for s in range(3)]
  initial = None if (shape, fsdp) == SHARDED_INIT else gpt_initial_state()
  return worker.train(plan_for(shape, fsdp), config, batches, initial_state=initial)


def _assert_trees_close(got, want, atol):
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol, rtol=1e-5,
                               err_msg=jax.tree_util.keystr(path))


def _expected_param_bytes(shape, fsdp):
  """Per-device parameter bytes from the logical names, by the rules' promise."""
  sizes = dict(zip(("data", "model", "expert"), shape))
  axes = dict(PARAM_AXES, embed="data") if fsdp else PARAM_AXES
  module = models.build(worker.tiny_gpt_config().model)
  boxed = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  total = 0
  for box in jax.tree.leaves(boxed["params"], is_leaf=lambda x: isinstance(x, nn.Partitioned)):
    split = math.prod(sizes[axes[n]] for n in box.names if n in axes)
    total += box.value.size * 4 // split
  return total


# --- meshes and rules ------------------------------------------------------------------------

@pytest.mark.parametrize("requested, want", [((-1, 1, 1), (8, 1, 1)), ((2, -1, 1), (2, 4, 1)),
                                             ((1, 2, -1), (1, 2, 4)), ((4, 2, 1), (4, 2, 1))])
def test_make_mesh_fills_minus_one(requested, want):
  mesh = make_mesh(mesh_config(requested))
  assert tuple(mesh.shape.values()) == want
  assert mesh.axis_names == ("data", "model", "expert")
  assert all(t == AxisType.Auto for t in mesh.axis_types)
  assert [d.id for d in mesh.devices.flat] == sorted(d.id for d in jax.devices())


def test_make_mesh_on_a_device_subset():
  mesh = make_mesh(mesh_config((-1, 2, 1)), devices=jax.devices()[:4])
  assert tuple(mesh.shape.values()) == (2, 2, 1)


@pytest.mark.parametrize("requested, message", [
    ((4, 4, 1), "mesh data=4 x model=4 x expert=1 needs 16 devices; 8 available (cpu x8). "
                "Set --config.mesh.data=-1"),
    ((2, 2, 1), "needs 4 devices; 8 available"),
    ((-1, -1, 1), "at most one axis may be -1"),
    ((-1, 3, 1), "the fixed axes need a multiple of 3 devices; 8 available (cpu x8)"),
    ((0, 1, 1), "mesh.data=0 must be a positive int or -1"),
    ((1, "2", 1), "mesh.model='2' must be a positive int"),
])
def test_make_mesh_errors_name_fields_and_devices(requested, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                     .replace(".", r"\.")):
    make_mesh(mesh_config(requested))


def test_plan_rejects_non_bool_fsdp():
  with pytest.raises(ValueError, match="mesh.fsdp='yes'"):
    ShardingPlan.from_config(dict(data=-1, fsdp="yes"))


def test_rules_per_strategy():
  to_mesh = lambda names, **kw: tuple(nn.logical_to_mesh_axes(names, logical_axis_rules(**kw)))
  activation, kernel = ("batch", "length", "embed"), ("embed", "qkv", "heads", "kv")
  assert to_mesh(activation) == ("data", None, None)
  assert to_mesh(kernel) == (None, None, "model", None)
  # FSDP: parameters shard embed over data; activations keep batch there (data used once).
  assert to_mesh(kernel, fsdp=True) == ("data", None, "model", None)
  assert to_mesh(activation, fsdp=True) == ("data", None, None)
  assert to_mesh(("vocab", "embed"), fsdp=True) == ("model", "data")
  assert to_mesh(("layers", "embed", "mlp"), fsdp=True) == (None, "data", "model")
  # Expert parallelism: experts over 'expert', and the batch over data and expert.
  experts = ("expert", "embed", "mlp")
  assert to_mesh(experts, fsdp=True, expert_parallel=True) == ("expert", "data", "model")
  assert to_mesh(activation, expert_parallel=True) == (("data", "expert"), None, None)
  # Hybrid sharding: the batch also over 'replica', parameters never (FSDP within a replica).
  assert to_mesh(activation, fsdp=True, replica=True) == (("replica", "data"), None, None)
  assert to_mesh(kernel, fsdp=True, replica=True) == ("data", None, "model", None)
  assert to_mesh(activation, expert_parallel=True, replica=True) == (
      ("replica", "data", "expert"), None, None)


# --- sharded training == one device ----------------------------------------------------------

@pytest.mark.parametrize("shape, fsdp", MESHES)
def test_sharded_gpt_training_matches_one_device(shape, fsdp):
  want_losses, want_state, _ = want = gpt_run((1, 1, 1), False)
  _, state, step = got = gpt_run(shape, fsdp)
  worker.assert_runs_close(got, want, worker.tiny_gpt_config())
  assert want_losses[0] != want_losses[-1]            # the steps really trained
  assert len(step.compile_seconds) == 1

  qkv = state["params"]["decoder"]["layers_0"]["block"]["self_attention"]["qkv"]["kernel"]
  data_axis = "data" if fsdp and shape[0] > 1 else None
  assert qkv.sharding.spec == P(data_axis, None, "model", None)
  mu = state["opt_state"][1][0].mu["decoder"]["layers_0"]["block"]["self_attention"]["qkv"]
  assert mu["kernel"].sharding.spec == qkv.sharding.spec            # moments follow params
  assert state["step"].sharding.is_fully_replicated

  got = per_device_bytes(state["params"])
  assert got == sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state["params"]))
  assert got == _expected_param_bytes(shape, fsdp)
  single = per_device_bytes(want_state["params"])
  if fsdp and shape == (8, 1, 1):
    assert got * 8 == single                          # every parameter has an embed dim


def test_hybrid_replica_mesh_training_matches_one_device():
  """mesh.replica=2 (two data-parallel replicas of a data=2 x model=2 FSDP mesh): the batch
  is split 4 ways, parameters only within a replica, and training equals one device."""
  plan = ShardingPlan.from_config(dict(replica=2, data=2, model=2, fsdp=True))
  assert plan.mesh.axis_names == ("replica", "data", "model", "expert")
  assert dict(plan.mesh.shape) == dict(replica=2, data=2, model=2, expert=1)
  assert plan.batch_shards == 4 and plan.batch_sharding(2).spec == P(("replica", "data"), None)
  config = worker.tiny_gpt_config()
  batches = [worker.token_batch(s, config.model.vocab_size) for s in range(3)]
  got = worker.train(plan, config, batches, initial_state=gpt_initial_state())
  worker.assert_runs_close(got, gpt_run((1, 1, 1), False), config)
  qkv = got[1]["params"]["decoder"]["layers_0"]["block"]["self_attention"]["qkv"]["kernel"]
  assert qkv.sharding.spec == P("data", None, "model", None)
  assert per_device_bytes(got[1]["params"]) == _expected_param_bytes((2, 2, 1), True)
  with pytest.raises(ValueError, match="mesh.replica=3 does not divide the 8 devices"):
    ShardingPlan.from_config(dict(replica=3, data=-1))
  with pytest.raises(ValueError, match=r"mesh replica=2 x data=8 x model=1 x expert=1 needs 8 "
                                       r"devices; 4 available \(cpu x4 per replica\)"):
    ShardingPlan.from_config(dict(replica=2, data=8))


@pytest.mark.slow
def test_vit_sharded_training_matches_one_device():
  config = worker.constant_lr(vit.get_config("tiny"))
  config.model.num_layers = 1
  rng = np.random.default_rng(0)
  batches = [{"images": rng.normal(size=(8, 8, 8, 1)).astype(np.float32),
              "labels": rng.integers(0, 10, 8).astype(np.int32)} for _ in range(3)]
  initial = worker.host_state(config)
  runs = [worker.train(plan_for(shape, fsdp), config, batches, initial)
          for shape, fsdp in [((1, 1, 1), False), ((2, 4, 1), True)]]
  worker.assert_runs_close(runs[1], runs[0], config, seq=(8 // 2) ** 2 + 1)   # patches + cls
  state = runs[1][1]
  wi = state["params"]["encoder"]["layers_0"]["block"]["ffn"]["wi"]["kernel"]
  assert wi.sharding.spec == P("data", "model")


def test_pallas_attention_runs_per_device_under_sharded_training():
  """impl='pallas' (a custom call the partitioner cannot split) runs in shard_map over batch
  and heads (2 of 8 per model shard) with FSDP on a 2x4 mesh, equals the xla path on one
  device, and the traced step really holds the kernel inside a shard_map. (GQA and biases
  under shard_map: the per_device_attention test below.)"""
  pallas = worker.tiny_gpt_config(attention_impl="pallas", attention_block_sizes=(8, 8))
  batches = [worker.token_batch(s, pallas.model.vocab_size) for s in range(3)]
  plan = plan_for((2, 4, 1), fsdp=True)
  _, state, _ = got = worker.train(plan, pallas, batches, initial_state=gpt_initial_state())
  worker.assert_runs_close(got, gpt_run((1, 1, 1), False), pallas)   # kernel != xla sums

  module = models.build(pallas.model)
  with plan.scope():
    jaxpr = str(jax.make_jaxpr(lambda p, x: module.apply({"params": p}, x))(
        state["params"], batches[0]["inputs"]))
  inside = jaxpr[jaxpr.index("shard_map"):]
  assert "pallas_call" in inside and "in_specs=(P('data', None, 'model')" in inside


def test_per_device_attention_with_bias_mask_and_segments_matches_one_device():
  """shard_map over batch ('data') and heads ('model') with a head-broadcast bias (its
  gradient is summed over the batch shards), a per-row mask and segment ids."""
  from jaxformer.layers.attention import per_device_attention
  from jaxformer.ops.attention import dot_product_attention
  from tests import attention_reference as ref
  q, k, v, d_out = ref.random_inputs(4, 12, 12, 4, 2, 8, seed=5)
  rng = np.random.default_rng(6)
  bias = rng.normal(size=(1, 4, 12, 12)).astype(np.float32)
  kw = dict(mask=rng.random((4, 1, 12, 12)) > 0.3, segment_ids=ref.sorted_segments(4, 12, 2, 7),
            causal=True)

  def grads(attention):
    def loss(q, k, v, bias):
      return jnp.sum(attention(q, k, v, bias=bias, **kw) * d_out)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)

  want = grads(functools.partial(dot_product_attention, impl="xla"))
  plan = plan_for((4, 2, 1))
  with plan.scope():
    got = grads(functools.partial(per_device_attention, impl="pallas"))
    jaxpr = str(jax.make_jaxpr(lambda *a: per_device_attention(*a[:3], bias=a[3],
                                                               impl="pallas", **kw))(
        q, k, v, bias))
  assert "shard_map" in jaxpr
  _assert_trees_close(got, want, atol=2e-5)


# --- errors before compilation ---------------------------------------------------------------

@pytest.mark.parametrize("overrides, shape, message", [
    (dict(d_model=48, num_heads=6), (2, 4, 1),
     "params/decoder/layers_0/block/self_attention/out/kernel dim 0 (heads=6) is not divisible "
     "by mesh.model=4; choose a mesh.model that divides it"),
    (dict(vocab_size=65), (4, 2, 1),
     "params/embed/embedding dim 0 (vocab=65) is not divisible by mesh.model=2; pad "
     "model.vocab_size to a multiple of 2 (66)"),
])
def test_indivisible_parameter_fails_before_compiling(overrides, shape, message, monkeypatch):
  init = worker.init_boxed(worker.tiny_gpt_config(**overrides))
  plan = plan_for(shape)
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled before validating"))
  with pytest.raises(ValueError) as error:
    plan.init_state(init)
  assert str(error.value).startswith(message)


def test_fsdp_embed_divisibility_names_the_fix():
  abstract = jax.eval_shape(worker.init_boxed(worker.tiny_gpt_config()))
  plan = ShardingPlan.from_config(mesh_config((8, 1, 1), fsdp=True))
  plan.check_divisible(abstract)
  wide = worker.tiny_gpt_config(d_model=36, num_heads=4)
  abstract = jax.eval_shape(worker.init_boxed(wide))
  with pytest.raises(ValueError, match=r"\(embed=36\) is not divisible by mesh.data=8; choose "
                                       r"a mesh.data that divides model.d_model"):
    plan.check_divisible(abstract)


# --- batches and compiled steps --------------------------------------------------------------

def test_global_batch_is_sharded_over_batch_axes():
  plan = plan_for((4, 2, 1))
  local = worker.token_batch(0, 64)
  batch = plan.global_batch(local)
  assert batch["inputs"].sharding.spec == P("data", None)
  assert batch["inputs"].addressable_shards[0].data.shape == (2, worker.SEQ_LEN)
  np.testing.assert_array_equal(np.asarray(batch["targets"]), local["targets"])
  with pytest.raises(ValueError, match="train.batch_size=6 is not divisible by mesh.data=4"):
    plan.check_batch_size(6)
  experts = plan_for((2, 1, 4))
  assert experts.batch_sharding(2).spec == P(("data", "expert"), None)
  assert experts.batch_shards == 8


def test_replicate_puts_host_values_and_keys_on_every_device():
  plan = plan_for((4, 2, 1))
  out = plan.replicate({"key": jax.random.key(3), "lr": np.float32(0.5)})
  assert out["lr"].sharding.is_fully_replicated and len(out["lr"].sharding.device_set) == 8
  assert float(out["lr"]) == 0.5
  np.testing.assert_array_equal(jax.random.key_data(out["key"]),
                                jax.random.key_data(jax.random.key(3)))


def test_compiled_step_compiles_once_per_shape():
  plan = plan_for((8, 1, 1))
  double = plan.jit(lambda x: 2 * x, in_shardings=plan.batch_sharding(2),
                    out_shardings=plan.batch_sharding(2))
  for rows in (8, 8, 16):
    x = plan.global_batch({"x": np.ones((rows, 3), np.float32)})["x"]
    np.testing.assert_array_equal(np.asarray(double(x)), 2 * np.ones((rows, 3)))
  assert len(double.compile_seconds) == 2


def test_sharded_init_and_checkpoint_restore_onto_a_different_mesh(tmp_path):
  _, state, _ = got = gpt_run(*SHARDED_INIT)
  worker.assert_runs_close(got, gpt_run((1, 1, 1), False), worker.tiny_gpt_config())
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "ckpt", state["params"])
  module = models.build(worker.tiny_gpt_config().model)
  boxed = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  one = plan_for((1, 1, 1))
  with ocp.StandardCheckpointer() as ckpt:
    restored = ckpt.restore(tmp_path / "ckpt", one.restore_target(boxed["params"]))
  _assert_trees_close(restored, state["params"], atol=0)
  for leaf in jax.tree.leaves(restored):
    assert leaf.sharding.device_set == {jax.devices()[0]}


# --- multi-process start-up ------------------------------------------------------------------

_SLURM_STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[003-004]",
               "SLURM_NODEID": "1"}

# (layout, environment of one task on the second node, GPU ids that task must get)
SLURM_LAYOUTS = [
    ("one task per node, 8 GPUs", dict(SLURM_NTASKS="2", SLURM_PROCID="1", SLURM_LOCALID="0",
                                       SLURM_STEP_TASKS_PER_NODE="1(x2)",
                                       SLURM_GPUS_ON_NODE="8",
                                       CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"),
     list(range(8))),
    ("one task per GPU, all visible", dict(SLURM_NTASKS="16", SLURM_PROCID="11",
                                           SLURM_LOCALID="3", SLURM_STEP_TASKS_PER_NODE="8(x2)",
                                           SLURM_GPUS_ON_NODE="8",
                                           CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"),
     [3]),
    ("one task per GPU, bound by Slurm", dict(SLURM_NTASKS="16", SLURM_PROCID="11",
                                              SLURM_LOCALID="3",
                                              SLURM_STEP_TASKS_PER_NODE="8(x2)",
                                              SLURM_GPUS_ON_NODE="8", SLURM_GPUS_PER_TASK="1",
                                              CUDA_VISIBLE_DEVICES="3"),
     [0]),
    ("4 tasks per node, 2 GPUs each", dict(SLURM_NTASKS="8", SLURM_PROCID="5", SLURM_LOCALID="1",
                                           SLURM_STEP_TASKS_PER_NODE="4(x2)",
                                           SLURM_GPUS_ON_NODE="8"),
     [2, 3]),
    ("2 tasks per node, 2 bound GPUs each", dict(SLURM_NTASKS="4", SLURM_PROCID="3",
                                                 SLURM_LOCALID="1",
                                                 SLURM_STEP_TASKS_PER_NODE="2(x2)",
                                                 SLURM_GPUS_ON_NODE="4",
                                                 CUDA_VISIBLE_DEVICES="2,3"),
     [0, 1]),
]


@pytest.mark.parametrize("layout, env, want", SLURM_LAYOUTS, ids=[l[0] for l in SLURM_LAYOUTS])
def test_slurm_layouts_give_each_process_its_gpus(monkeypatch, layout, env, want):
  """What jax.distributed.initialize receives in each Slurm layout, and what it makes of it with
  its own Slurm detection (coordinator, process count and id from the SLURM_* variables)."""
  for key in [k for k in os.environ if k.startswith(("SLURM_", "JAXFORMER_"))]:
    monkeypatch.delenv(key)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  for key, value in {**_SLURM_STEP, **env}.items():
    monkeypatch.setenv(key, value)
  calls = []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(distributed, "_orbax_barriers_without_collectives", lambda: None)
  monkeypatch.setattr(jax.config, "update", lambda *a: None)
  initialize()
  assert calls == [dict(local_device_ids=want)]
  cluster = pytest.importorskip("jax._src.clusters")
  detected = cluster.ClusterEnv.auto_detect_unset_distributed_params(
      None, None, None, calls[0]["local_device_ids"], None, None)
  assert detected[0].startswith("gpu003:")
  assert detected[1:] == (int(env["SLURM_NTASKS"]), int(env["SLURM_PROCID"]), want)


def test_slurm_device_ids_edge_cases():
  ids = distributed.slurm_local_device_ids
  assert ids({"SLURM_STEP_TASKS_PER_NODE": "1", "CUDA_VISIBLE_DEVICES": ""}) is None   # CPU
  assert ids({"SLURM_TASKS_PER_NODE": "2,1", "SLURM_NODEID": "1",
              "SLURM_GPUS_ON_NODE": "4"}) == [0, 1, 2, 3]       # the node's per-node count
  with pytest.raises(ValueError, match="at most one task per GPU"):
    ids({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_GPUS_ON_NODE": "4"})
  with pytest.raises(ValueError, match="malformed Slurm per-node count"):
    ids({"SLURM_STEP_TASKS_PER_NODE": "4(x", "SLURM_GPUS_ON_NODE": "4"})
  assert distributed.slurm_topology({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None


def test_initialize_single_process_is_a_noop_and_checks_flags(monkeypatch):
  for key in ("JAXFORMER_COORDINATOR", "JAXFORMER_NUM_PROCESSES", "JAXFORMER_PROCESS_ID",
              "SLURM_PROCID", "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(key, raising=False)
  assert initialize() == (0, 1)
  assert initialize(num_processes=1) == (0, 1)
  with pytest.raises(ValueError, match="needs a coordinator address"):
    initialize(num_processes=2, process_id=0)
  monkeypatch.setenv("JAXFORMER_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAXFORMER_COORDINATOR", "localhost:1234")
  monkeypatch.setenv("JAXFORMER_PROCESS_ID", "2")
  with pytest.raises(ValueError, match=r"process_id=2 \(or \$JAXFORMER_PROCESS_ID\)"):
    initialize()
  monkeypatch.setenv("JAXFORMER_NUM_PROCESSES", "two")
  with pytest.raises(ValueError, match="JAXFORMER_NUM_PROCESSES='two' is not a valid int"):
    initialize()


def test_initialize_switches_orbax_to_collective_free_barriers(monkeypatch):
  """Multi-process runs use the distributed client's barrier in Orbax (async saves must not
  issue device collectives concurrently with the training step's)."""
  from absl import flags
  calls = []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda *a: None)     # keep this process's gloo
  flag = flags.FLAGS[distributed.ORBAX_BARRIER_FLAG]
  monkeypatch.setattr(flag, "value", False)
  initialize("localhost:1234", 2, 1)
  assert calls == [dict(coordinator_address="localhost:1234", num_processes=2, process_id=1,
                        local_device_ids=None)]
  assert flag.value is True
