"""The planner's core: compile-only TPU devices (`plan.topology`), chip figures
(`accelerators`), and the HLO analysis (`plan.hlo`), checked on
programs whose collectives, loop counts and FLOPs are known by hand (compiled for v4 / v5e
topologies with libtpu, on a CPU machine)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxformer import accelerators as chips
from jaxformer.plan import hlo, topology
from tests.repo_root import REPO

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="compiling for a TPU needs libtpu "
                                         '(pip install "jaxformer[tpu]")')


@pytest.fixture(autouse=True, scope="module")
def _no_persistent_cache():
  """The suite's persistent compilation cache cannot serve compile-only TPU executables (JAX
  warns on every hit: "PjRtCompiler must be constructed with a Client"): off here."""
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", before)


def _mesh(name: str, shape, axes, *, slices: int = 1, order=None) -> Mesh:
  devices = topology.devices(name, slices)
  if order is not None:
    devices = [devices[i] for i in order]
  return Mesh(np.array(devices).reshape(shape), axes)


def _compile(f, mesh, in_specs, out_specs, *args):
  shard = lambda spec: NamedSharding(mesh, spec)
  structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=shard(s))
             for a, s in zip(args, in_specs)]
  return jax.jit(f, in_shardings=tuple(shard(s) for s in in_specs),
                 out_shardings=jax.tree.map(shard, out_specs)).lower(*structs).compile()


def _by_kind(stats, kind):
  return {tuple(r["axes"]): r for r in stats.collectives.values() if r["kind"] == kind}


# -- topology --------------------------------------------------------------------------------

@needs_libtpu
@pytest.mark.parametrize("name, slices, count", [
    ("v5e:2x2", 1, 4), ("v4:2x2x1", 1, 4), ("v5p:2x2x1", 1, 4), ("v5e:2x4", 1, 8),
    ("v5e:2x2", 2, 8), ("v5e:1x1", 1, 1), ("v5litepod-16", 1, 16), ("v5p-8", 1, 4)])
def test_devices_are_one_per_chip(name, slices, count):
  devices = topology.devices(name, slices)
  assert len(devices) == count
  assert {getattr(d, "slice_index", 0) for d in devices} == set(range(slices))
  assert chips.for_device_kind(devices[0].device_kind) is chips.CHIPS[topology.generation(name)]


@pytest.mark.parametrize("name, flag", [("v3:2x2", "--topology"), ("v5e:2x2x1", "--topology"),
                                        ("tpu", "--topology"), ("v5e-3", "--topology")])
def test_bad_topologies_are_one_line_errors(name, flag):
  with pytest.raises(ValueError, match=flag) as e:
    topology.devices(name)
  assert "\n" not in str(e.value) and "v5e:4x4" in str(e.value)


@needs_libtpu
def test_bad_shapes_and_slices_are_one_line_errors():
  with pytest.raises(ValueError, match=r"--topology=v5e:3x3.*multiple of the v5e host"):
    topology.devices("v5e:3x3")
  with pytest.raises(ValueError, match="--slices"):
    topology.devices("v5e:2x2", 0)


# -- the clock ---------------------------------------------------------------------------------

def _flops_per_cycle(name: str) -> float:
  mesh = _mesh(name, (1,), ("x",))
  n = 4096
  a = jnp.zeros((n, n), jnp.bfloat16)
  text = _compile(lambda x, y: x @ y, mesh, (P(), P()), P(), a, a).as_text()
  cycles = sum(int(c) for c in re.findall(r'"estimated_cycles":"(\d+)"', text))
  return 2 * n**3 / cycles


@needs_libtpu
@pytest.mark.parametrize("generation", [
    "v5e", pytest.param("v4", marks=pytest.mark.slow), pytest.param("v5p", marks=pytest.mark.slow),
    pytest.param("v6e", marks=pytest.mark.slow)])
def test_clock_is_peak_flops_over_the_mxu_flops_per_cycle(generation):
  """The compiler's flops per estimated cycle of a big matmul lie just under the MXU's peak
  per cycle (a power of two); clock = peak flops / that (chips.py's derivation)."""
  chip = chips.CHIPS[generation]
  one_chip = {"v4": "v4:1x1x1", "v5p": "v5p:1x1x1", "v5e": "v5e:1x1", "v6e": "v6e:1x1"}
  measured = _flops_per_cycle(one_chip[generation])
  assert 0.8 * chip.mxu_flops_per_cycle < measured <= chip.mxu_flops_per_cycle
  assert 2 ** math_ceil_log2(measured) == chip.mxu_flops_per_cycle
  assert chip.clock_hz == pytest.approx(chip.peak_flops / chip.mxu_flops_per_cycle)
  if generation == "v4":
    assert chip.clock_hz == pytest.approx(1050e6, rel=0.002)   # the v4 paper's clock


def math_ceil_log2(x: float) -> int:
  return int(np.ceil(np.log2(x)))


# -- replica groups -> mesh axes ---------------------------------------------------------------

@needs_libtpu
@pytest.mark.parametrize("axis", ["data", "model"])
def test_replica_group_ids_are_positions_in_the_mesh(axis):
  """A psum over one named axis of a 2x2 mesh whose devices are in a shuffled order is
  reported over that axis: group ids index mesh.devices.flat, not device ids."""
  mesh = _mesh("v5e:2x2", (2, 2), ("data", "model"), order=[3, 1, 0, 2])
  f = jax.shard_map(lambda x: jax.lax.psum(x, axis), mesh=mesh, in_specs=P("data", "model"),
                    out_specs=P("data", "model"))
  x = jnp.zeros((256, 256), jnp.float32)
  stats = hlo.analyse(_compile(f, mesh, (P("data", "model"),), P("data", "model"),
                               x).as_text(), mesh)
  (record,) = stats.collectives.values()
  assert record["kind"] == "all-reduce" and record["axes"] == (axis,)
  assert record["bytes"] == 128 * 128 * 4 and not record["dcn"]


@pytest.mark.parametrize("spec, first", [
    ("{{0,1},{2,3}}", [0, 1]), ("[2,2]<=[4]", [0, 1]), ("[2,2]<=[2,2]T(1,0)", [0, 2]),
    ("mesh['axis_0'=2,'axis_1'=2] {'axis_1'}", [0, 1]),
    ("mesh['axis_0'=2,'axis_1'=2] {'axis_0'}", [0, 2]),
    ("mesh['a'=6,'b'=6] {'a':(1)2}", [0, 18]), ("mesh['a'=6,'b'=6] {'a':(3)2}", [0, 6]),
    ("mesh['a'=6,'b'=6] {'b':(1)3}", [0, 2, 4]),
    ("mesh['a'=2,'b'=2], device_ids=(3,1,0,2) {'a'}", [3, 0]), ("{}", [0, 1, 2, 3])])
def test_every_replica_group_spelling(spec, first):
  n = 36 if "6" in spec else 4
  groups = hlo._materialize(spec, n)
  assert list(groups[0]) == first
  assert sorted(groups.reshape(-1)) == list(range(n))


# -- collectives of known programs -------------------------------------------------------------

def _grad_step(w, x):
  return jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)


@needs_libtpu
def test_data_parallel_gradient_is_one_all_reduce_of_the_parameters_over_data():
  mesh = _mesh("v5e:2x4", (8,), ("data",))
  w, x = jnp.zeros((512, 256), jnp.float32), jnp.zeros((64, 512), jnp.float32)
  stats = hlo.analyse(_compile(_grad_step, mesh, (P(), P("data")), P(), w, x).as_text(), mesh)
  moved = sum(r["bytes"] for r in stats.collectives.values())
  assert set(stats.collectives) == {"all-reduce over data"}
  assert moved == w.size * 4                                   # the gradient, once
  assert stats.matmul_flops == pytest.approx(2 * (2 * 8 * 512 * 256))   # fwd + dW, per chip


@needs_libtpu
def test_fsdp_gathers_the_parameters_and_reduce_scatters_their_gradient():
  mesh = _mesh("v5e:2x2", (4,), ("fsdp",))
  w, x = jnp.zeros((512, 256), jnp.float32), jnp.zeros((64, 512), jnp.float32)
  stats = hlo.analyse(_compile(_grad_step, mesh, (P("fsdp"), P("fsdp")), P("fsdp"),
                               w, x).as_text(), mesh)
  gathered = _by_kind(stats, "all-gather")[("fsdp",)]
  scattered = _by_kind(stats, "reduce-scatter")[("fsdp",)]
  # the whole weight arrives on every chip, in bf16: XLA converts it before the gather, as
  # the default matmul precision on a TPU multiplies in bf16
  assert gathered["bytes"] == w.size * 2
  assert scattered["bytes"] == w.size * 4         # the whole gradient goes in
  assert all(r["axes"] == ("fsdp",) for r in stats.collectives.values())


@needs_libtpu
def test_tensor_parallel_mlp_reduces_over_model_only():
  mesh = _mesh("v5e:2x2", (2, 2), ("data", "model"))
  x = jnp.zeros((64, 256), jnp.bfloat16)
  w1, w2 = jnp.zeros((256, 1024), jnp.bfloat16), jnp.zeros((1024, 256), jnp.bfloat16)
  mlp = lambda x, w1, w2: jax.nn.relu(x @ w1) @ w2
  stats = hlo.analyse(_compile(mlp, mesh, (P("data"), P(None, "model"), P("model")),
                               P("data"), x, w1, w2).as_text(), mesh)
  assert stats.collectives and all(r["axes"] == ("model",) for r in stats.collectives.values())
  reduced = sum(r["bytes"] for r in stats.collectives.values())
  assert reduced == 32 * 256 * 2                  # the (batch/2, 256) bf16 partial sums
  assert stats.matmul_flops == pytest.approx(2 * 2 * 32 * 256 * 512)


@needs_libtpu
def test_a_loop_multiplies_cycles_flops_and_collectives_by_its_trip_count():
  mesh = _mesh("v5e:2x2", (4,), ("data",))
  w, x = jnp.zeros((256, 256), jnp.float32), jnp.zeros((128, 256), jnp.float32)

  def steps(n):
    def f(w, x):
      body = lambda i, w: w - 0.1 * _grad_step(w, x)
      return jax.lax.fori_loop(0, n, body, w)
    return _compile(f, mesh, (P(), P("data")), P(), w, x)

  compiled = {n: steps(n) for n in (5, 10, 15)}
  stats = {n: hlo.analyse(c.as_text(), mesh) for n, c in compiled.items()}
  assert [[trip for _, trip in s.loops] for s in stats.values()] == [[5], [10], [15]]
  per_step = 2 * 2 * 32 * 256 * 256                        # forward + dW, per chip
  assert [s.matmul_flops for s in stats.values()] == [5 * per_step, 10 * per_step,
                                                      15 * per_step]
  assert [s.collectives["all-reduce over data"]["count"] for s in stats.values()] == [5, 10, 15]
  cycles = [s.estimated_cycles for s in stats.values()]
  assert cycles[2] - cycles[1] == cycles[1] - cycles[0] > 0   # 5 more iterations, same cost
  # the overlap model's scopes: every cycle and every collective byte in exactly one scope
  # (an all-reduce's bytes twice: a ring crosses the links twice), loops multiplied out
  for n, s in stats.items():
    assert sum(scope[0] for scope in s.comm_scopes) == s.estimated_cycles
    assert sum(sum(scope[1:]) for scope in s.comm_scopes) == \
        2 * s.collectives["all-reduce over data"]["bytes"]
  # XLA's own cost analysis counts a loop body once, whatever the trip count
  flops = [c.cost_analysis()["flops"] for c in compiled.values()]
  assert flops[0] == flops[1] == flops[2] < stats[5].matmul_flops


@needs_libtpu
def test_multi_slice_data_parallel_traffic_is_marked_dcn():
  """data = 4 over 2 slices of 2x2 (2 per slice), model = 2; the devices of each slice in a
  shuffled order. The gradient of a weight sharded over model is reduce-scattered over data
  inside each slice (ICI), all-reduced across the slices (DCN) and all-gathered back."""
  order = [2, 0, 3, 1, 5, 7, 4, 6]                        # slice 0 first, each shuffled
  mesh = _mesh("v5e:2x2", (4, 2), ("data", "model"), slices=2, order=order)
  assert [d.slice_index for d in mesh.devices[:, 0]] == [0, 0, 1, 1]
  w, x = jnp.zeros((512, 256), jnp.float32), jnp.zeros((64, 512), jnp.float32)
  stats = hlo.analyse(_compile(_grad_step, mesh, (P(None, "model"), P("data")),
                               P(None, "model"), w, x).as_text(), mesh)
  shard = w.size * 4 // 2                                  # a chip's half of the gradient
  assert stats.collectives["reduce-scatter over data"]["bytes"] == shard
  assert stats.collectives["all-gather over data"]["bytes"] == shard
  assert stats.collectives["all-reduce over data (dcn)"] == {
      "kind": "all-reduce", "axes": ("data",), "dcn": True, "count": 1, "bytes": shard // 2}
  assert [r["dcn"] for r in stats.collectives.values()] == [False, True, False]


@needs_libtpu
def test_pure_data_parallel_across_slices_is_one_dcn_all_reduce():
  mesh = _mesh("v5e:2x2", (2, 4), ("data", "model"), slices=2)     # one data row per slice
  w, x = jnp.zeros((512, 256), jnp.float32), jnp.zeros((64, 512), jnp.float32)
  stats = hlo.analyse(_compile(_grad_step, mesh, (P(None, "model"), P("data")),
                               P(None, "model"), w, x).as_text(), mesh)
  assert list(stats.collectives) == ["all-reduce over data (dcn)"]
  assert stats.collectives["all-reduce over data (dcn)"]["bytes"] == w.size * 4 // 4


# -- text-only -------------------------------------------------------------------------------

_LOOP = """HloModule m

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%fused (a: f32[8], b: f32[8,8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %b = f32[8,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[8]{0} dot(%a, %b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}

%body (q: (s32[], f32[8])) -> (s32[], f32[8]) {
  %q = (s32[], f32[8]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %one = s32[] constant(1)
  %k = s32[] add(%j, %one)
  %v = f32[8]{0} get-tuple-element(%q), index=1
  %m = f32[8,8]{1,0} constant({...})
  %f = f32[8]{0} fusion(%v, %m), calls=%fused, backend_config={"estimated_cycles":"100"}
  %ar = f32[8]{0} all-reduce(%f), channel_id=1, replica_groups=[1,4]<=[4], to_apply=%cond
  ROOT %t = (s32[], f32[8]{0}) tuple(%k, %ar)
}

ENTRY %main (x: f32[8]) -> (s32[], f32[8]) {
  %x = f32[8]{0} parameter(0)
  %zero = s32[] constant(2)
  %c = s32[] copy(%zero)
  %init = (s32[], f32[8]{0}) tuple(%c, %x)
  ROOT %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body
}
"""


def test_trip_count_is_inferred_from_the_condition_and_the_counter_start():
  mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
  stats = hlo.analyse(_LOOP, mesh)
  assert stats.loops == [("w", 5)]                       # 2, 3, 4, 5, 6 < 7
  assert stats.estimated_cycles == 5 * 100
  assert stats.matmul_flops == 5 * 2 * 8 * 8
  assert stats.collectives["all-reduce over data"] == {
      "kind": "all-reduce", "axes": ("data",), "dcn": False, "count": 5, "bytes": 5 * 32}


@needs_libtpu
def test_permute_all_to_all_and_the_costlier_branch_of_a_cond_on_v4():
  """On a v4 (megacore: 4 chips, 4 devices): a ring shift and an all-to-all of one (64, 128)
  f32 block over 'x', then `lax.cond` between a matmul and nothing: the matmul is counted."""
  mesh = _mesh("v4:2x2x1", (4,), ("x",))

  def block(x, w):
    x = jax.lax.ppermute(x, "x", [(i, (i + 1) % 4) for i in range(4)])
    x = jax.lax.all_to_all(x, "x", 0, 0, tiled=True)
    return jax.lax.cond(x.sum() > 0, lambda: x @ w, lambda: x)

  f = jax.shard_map(block, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
  x, w = jnp.zeros((256, 128), jnp.float32), jnp.zeros((128, 128), jnp.float32)
  stats = hlo.analyse(_compile(f, mesh, (P("x"), P()), P("x"), x, w).as_text(), mesh)
  assert stats.collectives["collective-permute over x"]["bytes"] == 64 * 128 * 4
  assert stats.collectives["all-to-all over x"]["bytes"] == 64 * 128 * 4
  assert stats.matmul_flops == 2 * 64 * 128 * 128


def test_a_missing_libtpu_names_the_extra(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "libtpu" else real(name, *a))
  with pytest.raises(ValueError, match=r'--topology=v6e:16x16: .*pip install "jaxformer\[tpu\]"'):
    topology.devices("v6e:16x16")


@needs_libtpu
def test_libtpu_says_nothing_on_a_machine_without_tpus():
  env = {k: v for k, v in os.environ.items()
         if k not in ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "ALLOW_MULTIPLE_LIBTPU_LOAD")}
  code = "from jaxformer.plan import topology; print(len(topology.devices('v5e:2x2')))"
  done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        cwd=REPO, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "4" and done.stderr == ""


@needs_libtpu
def test_hbm_bytes_read_a_scanned_stack_of_weights_once():
  """An elementwise op reads and writes its array once; a scan over 16 stacked weights reads
  each layer's slice once per iteration (not the whole stack 16 times)."""
  mesh = _mesh("v5e:1x1", (1,), ("x",))
  x = jnp.zeros((4096, 4096), jnp.float32)
  stats = hlo.analyse(_compile(lambda x: x * 2 + 1, mesh, (P(),), P(), x).as_text(), mesh)
  assert stats.hbm_bytes == 2 * x.size * 4
  w, h = jnp.zeros((16, 1024, 1024), jnp.bfloat16), jnp.zeros((8, 1024), jnp.bfloat16)
  scan = lambda w, h: jax.lax.scan(lambda h, wi: (h @ wi, None), h, w)[0]
  stats = hlo.analyse(_compile(scan, mesh, (P(), P()), P(), w, h).as_text(), mesh)
  assert [trip for _, trip in stats.loops] == [16]
  assert w.size * 2 <= stats.hbm_bytes < 1.01 * w.size * 2
  assert stats.matmul_flops == 16 * 2 * 8 * 1024 * 1024


@needs_libtpu
def test_a_pallas_kernels_cost_estimate_is_counted_per_execution():
  """A Mosaic kernel carries no estimated_cycles and its work is no HLO dot: its
  `cost_estimate` counts instead, times the trip count of the loop around it (6), in the
  FLOPs and HBM bytes; a kernel with no cost_estimate is reported uncosted."""
  from jax.experimental import pallas as pl
  mesh = _mesh("v5e:1x1", (1,), ("x",))

  def double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  def kernel(name, cost=None):
    return pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          cost_estimate=cost, name=name)

  costed = kernel("costed", pl.CostEstimate(flops=1000, transcendentals=7,
                                            bytes_accessed=5000))
  f = lambda x: kernel("uncosted")(jax.lax.fori_loop(0, 6, lambda i, x: costed(x), x))
  x = jnp.zeros((8, 128), jnp.float32)
  stats = hlo.analyse(_compile(f, mesh, (P(),), P(), x).as_text(), mesh)
  assert [trip for _, trip in stats.loops] == [6]
  (name, record), = stats.kernels.items()
  assert name.startswith("costed") and record == {
      "target": "tpu_custom_call", "executions": 6, "flops": 1000, "bytes": 5000,
      "transcendentals": 7}
  assert (stats.kernel_flops, stats.kernel_bytes, stats.kernel_transcendentals) == (
      6000, 30000, 42)
  assert stats.matmul_flops == 6000 and stats.hbm_bytes >= 30000
  assert stats.uncosted_kernels == 1
