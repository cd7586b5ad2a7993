"""Pallas flash attention compiled through Mosaic for TPU on this CPU host (issue #29).

`jax.experimental.topologies` gives compile-only TPU v5e devices (libtpu, nothing runs): the
GPT forward and its full train step are built through `ShardingPlan` on a data x model mesh of
them and compiled, and the HLO must hold the Mosaic kernels (`tpu_custom_call`) at per-shard
shapes, i.e. the kernel ran per device inside the layer's `shard_map`, not interpreted (the
default backend here is still CPU: the kernel follows the mesh's devices).
"""

from __future__ import annotations

import importlib.util
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxformer.ops.attention import dot_product_attention
from jaxformer.ops.pallas import attention as pallas_ops
from jaxformer.parallel import ShardingPlan
from jaxformer.state import train_state as state_lib
from jaxformer import tasks
from jaxformer.train import step as step_lib
from tests import sharded_gpt

if importlib.util.find_spec("libtpu") is None:
  pytest.skip("libtpu is not installed (pip install 'jax[tpu]'): no compile-only TPU devices "
              "to compile the Mosaic kernels for", allow_module_level=True)

# libtpu reads these when the first topology is built; without them it probes the host for a
# TPU VM's metadata and logs warnings, and a second process (pytest-xdist workers) finds
# /tmp/libtpu_lockfile taken. Set only for that call (see `tpu_devices`).
_QUIET_LIBTPU = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_WORKER_HOSTNAMES": "localhost",
                 "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
# a kernel's HLO instruction: %<name stack>jaxformer_flash_<kind><suffix> = <shape> custom-call
_KERNEL = re.compile(r"%[\w.]*?(jaxformer_flash_(?:forward|dq|dkdv))[\w.]* = (.+?) "
                     r'custom-call\(.*?custom_call_target="([^"]+)"')
B, T, HEADS, HEAD_DIM = 8, 256, 4, 64


def tpu_devices(topology: str):
  """The compile-only devices of a TPU topology such as "v5e:2x2" (skips if unavailable)."""
  from jax.experimental import topologies
  with pytest.MonkeyPatch.context() as env:
    for key, value in _QUIET_LIBTPU.items():
      env.setenv(key, value)
    try:
      return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    except Exception as e:          # noqa: BLE001 (libtpu present but unusable here)
      pytest.skip(f"no compile-only TPU topology {topology!r}: {e}")


@pytest.fixture(scope="module", autouse=True)
def no_persistent_cache():
  """The persistent compilation cache (conftest) off while this module compiles: a
  compile-only executable cannot be read back (libtpu has no client to load it into) and JAX
  warns on every hit. Back on (and re-initialised) afterwards."""
  from jax.experimental.compilation_cache import compilation_cache
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  yield
  jax.config.update("jax_enable_compilation_cache", enabled)
  compilation_cache.reset_cache()


# v5e:2x2 only: v5e:2x4 (model=4) took the same per-shard path as model=2 (14 s of CPU for
# nothing the 2x2 mesh does not check)
@pytest.fixture(scope="module")
def plan():
  devices = tpu_devices("v5e:2x2")
  return ShardingPlan.from_config(dict(data=2, model=len(devices) // 2, expert=1), devices)


def gpt_config():
  """A small bf16 GPT on the pallas path: head_dim 64, 256 positions (two 128-blocks)."""
  return sharded_gpt.tiny_gpt_config(attention_impl="pallas", dtype="bfloat16",
                                     d_model=HEADS * HEAD_DIM, num_heads=HEADS, mlp_dim=512,
                                     vocab_size=128, max_len=T, num_layers=1)


def abstract_batch(plan):
  return {k: jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=plan.batch_sharding(2))
          for k in ("inputs", "targets")}


def kernels(compiled_text: str) -> dict[str, tuple[str, str]]:
  """{kernel name: (result shape text, custom call target)} of the compiled HLO."""
  return {name: (shape, target) for name, shape, target in _KERNEL.findall(compiled_text)}


def per_shard(plan) -> tuple[int, int]:
  return B // plan.mesh.shape["data"], HEADS // plan.mesh.shape["model"]


def test_target_platform_follows_the_mesh_not_the_default_backend(plan):
  assert jax.default_backend() == "cpu"
  assert pallas_ops.target_platform() == "cpu"
  with plan.scope():
    assert pallas_ops.target_platform() == "tpu"
  seen = []
  sharded = NamedSharding(plan.mesh, P("data"))
  jax.jit(lambda x: seen.append(pallas_ops.target_platform(x)) or x).trace(
      jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=sharded))
  assert seen == ["tpu"]            # a jit's in_shardings alone (no mesh in context)


def test_gpt_forward_compiles_mosaic_kernels_per_shard(plan):
  module, _, init = state_lib.train_state_fns(gpt_config())
  params = plan.restore_target(jax.eval_shape(init))["params"]
  batch = abstract_batch(plan)
  param_shardings = jax.tree.map(lambda x: x.sharding, params)
  forward = plan.jit(lambda p, x: module.apply({"params": p}, x["inputs"]),
                     in_shardings=(param_shardings, {k: plan.batch_sharding(2) for k in batch}),
                     out_shardings=plan.batch_sharding(3))
  start = time.perf_counter()
  text = forward.lower(params, batch).compile().as_text()
  print(f"forward compiled for {plan.describe()} in {time.perf_counter() - start:.1f}s")
  _shapes_match(text, {"jaxformer_flash_forward"}, *per_shard(plan))


def _shapes_match(text: str, names: set[str], b: int, h: int) -> None:
  """The kernels in `text` are `names`, each a Mosaic call whose results are [b, h, T, .]
  per-shard blocks."""
  found = kernels(text)
  assert set(found) == names, found
  for name, (shape, target) in found.items():
    assert target == "tpu_custom_call", (name, target)
    dims = re.findall(r"(?:bf16|f32)\[(\d+),(\d+),(\d+),\d+\]", shape)
    assert dims and all((int(x), int(y), int(t)) == (b, h, T) for x, y, t in dims), (name, shape)


# slow (14 s of CPU): the fast subset keeps the per-shard forward above and a v5e:2x2 train
# step with the three kernels (test_plan's test_pallas_attention_kernels_are_costed_...)
@pytest.mark.slow
def test_gpt_train_step_compiles_mosaic_forward_and_backward_per_shard(plan):
  config = gpt_config()
  module, tx, init = state_lib.train_state_fns(config)
  state = plan.restore_target(jax.eval_shape(init))
  shardings = jax.tree.map(lambda x: x.sharding, state)
  batch = abstract_batch(plan)
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=plan.replicated)
  step = plan.jit(step_lib.make_train_step(module, tx, tasks.task_for(config.model)),
                  in_shardings=(shardings, {k: plan.batch_sharding(2) for k in batch},
                                plan.replicated),
                  out_shardings=(shardings, plan.replicated), donate_argnums=(0,))
  start = time.perf_counter()
  text = step.lower(state, batch, key).compile().as_text()
  print(f"train step compiled for {plan.describe()} in {time.perf_counter() - start:.1f}s")
  b, h = per_shard(plan)
  _shapes_match(text, {"jaxformer_flash_forward", "jaxformer_flash_dq", "jaxformer_flash_dkdv"},
                b, h)
  # the q operand of every kernel is the per-shard [B/data, H/model, T, D] block
  for line in text.splitlines():
    if 'custom_call_target="tpu_custom_call"' in line:
      operands = re.search(r"operand_layout_constraints=\{(\w+)\[([\d,]+)\]", line)
      assert operands.group(2) == f"{b},{h},{T},{HEAD_DIM}", line[:200]


def test_a_batch_no_mesh_axis_divides_still_runs_per_device():
  """One sequence (sampling) on a 4-way data-parallel mesh: nothing splits, every device runs
  the whole attention, still inside shard_map (outside it Mosaic would not compile)."""
  plan = ShardingPlan.from_config(dict(data=4, model=1, expert=1), tpu_devices("v5e:2x2"))
  module, _, init = state_lib.train_state_fns(gpt_config())
  params = plan.restore_target(jax.eval_shape(init))["params"]
  tokens = jax.ShapeDtypeStruct((1, T), jnp.int32, sharding=plan.replicated)
  forward = plan.jit(lambda p, x: module.apply({"params": p}, x),
                     in_shardings=(jax.tree.map(lambda x: x.sharding, params), plan.replicated),
                     out_shardings=plan.replicated)
  _shapes_match(forward.lower(params, tokens).compile().as_text(), {"jaxformer_flash_forward"},
                1, HEADS)


def test_without_shard_map_the_mosaic_kernel_cannot_be_partitioned():
  """Why `per_device_attention` wraps the kernel: jit's automatic partitioning of a Mosaic
  call over a multi-chip mesh is refused when it is lowered."""
  mesh = Mesh(np.asarray(tpu_devices("v5e:2x2")).reshape(2, 2), ("data", "model"))
  sharding = NamedSharding(mesh, P("data", None, "model"))
  q = jax.ShapeDtypeStruct((B, T, HEADS, HEAD_DIM), jnp.bfloat16, sharding=sharding)
  attention = jax.jit(lambda q, k, v: pallas_ops.pallas_attention(q, k, v, causal=True,
                                                                  scale=0.125),
                      in_shardings=(sharding,) * 3, out_shardings=sharding)
  with pytest.raises(NotImplementedError, match="cannot be automatically partitioned"):
    attention.lower(q, q, q)


def one_tpu():
  return NamedSharding(Mesh(np.asarray(tpu_devices("v5e:2x2")[:1]), ("x",)), P())


def compile_attention_grad(b, t, h, hkv, d, dtype, **kw) -> str:
  """Compiled HLO of the gradient of `dot_product_attention(impl="pallas")` on one v5e."""
  sharding = one_tpu()
  q = jax.ShapeDtypeStruct((b, t, h, d), dtype, sharding=sharding)
  kv = jax.ShapeDtypeStruct((b, t, hkv, d), dtype, sharding=sharding)
  loss = lambda q, k, v: jnp.sum(dot_product_attention(q, k, v, impl="pallas", **kw)
                                 .astype(jnp.float32))
  return jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, kv, kv).compile().as_text()


SHAPES = [  # (b, t, h, hkv, d, dtype, kwargs)
    (1, 1024, 4, 4, 64, jnp.bfloat16, dict(causal=True)),
    pytest.param(1, 2048, 4, 2, 128, jnp.bfloat16, dict(causal=True, window=(512, None)),
                 marks=pytest.mark.slow),
    (1, 1024, 4, 1, 128, jnp.float32, dict(causal=True, block_sizes=(256, 128))),
    (1, 300, 2, 2, 80, jnp.bfloat16, {}),           # padded to 384 rows and head_dim 128
]


@pytest.mark.parametrize("b, t, h, hkv, d, dtype, kw", SHAPES,
                         ids=lambda x: getattr(x, "__name__", None))
def test_realistic_shapes_compile_forward_and_backward(b, t, h, hkv, d, dtype, kw):
  found = kernels(compile_attention_grad(b, t, h, hkv, d, dtype, **kw))
  assert found.keys() == {"jaxformer_flash_forward", "jaxformer_flash_dq", "jaxformer_flash_dkdv"}
  assert {target for _, target in found.values()} == {"tpu_custom_call"}


@pytest.mark.parametrize("dtype, kw, match", [
    (jnp.float16, {}, r"on TPU \(Mosaic\) takes float32 or bfloat16 q/k/v; got float16"),
    (jnp.bfloat16, dict(block_sizes=(64, 128)),
     r"block_q=64 is below 128.*model.attention_block_sizes\[0\]"),
    (jnp.bfloat16, dict(block_sizes=(128, 96)), r"block_k=96 must be a power of two"),
])
def test_shapes_mosaic_cannot_take_are_refused_before_compiling(dtype, kw, match):
  with pytest.raises(ValueError, match=match):
    compile_attention_grad(1, 256, 2, 2, 64, dtype, **kw)


def test_kernels_whose_blocks_exceed_the_default_vmem_limit_ask_for_more():
  """bf16, head_dim 128, 4 query heads per kv head at T=8192: dk/dv holds ~97 MiB of
  (double-buffered) blocks, above Mosaic's default scoped VMEM limit (16 MiB), so it asks for
  that +25% (v5e has 128 MiB per core); forward and dq fit the default."""
  sharding = one_tpu()
  q = jax.ShapeDtypeStruct((1, 8192, 8, 128), jnp.bfloat16, sharding=sharding)
  kv = jax.ShapeDtypeStruct((1, 8192, 2, 128), jnp.bfloat16, sharding=sharding)
  loss = lambda q, k, v: jnp.sum(dot_product_attention(q, k, v, impl="pallas", causal=True)
                                 .astype(jnp.float32))
  jaxpr = str(jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, kv, kv).jaxpr)
  limits = dict((name, limit) for limit, name in re.findall(
      r"vmem_limit_bytes=(\w+).*?name=(jaxformer_flash_\w+)", jaxpr, re.S))
  assert limits.keys() == {"jaxformer_flash_forward", "jaxformer_flash_dq",
                           "jaxformer_flash_dkdv"}
  assert limits["jaxformer_flash_forward"] == limits["jaxformer_flash_dq"] == "None"
  assert 110 < int(limits["jaxformer_flash_dkdv"]) / 2**20 <= 128


@pytest.mark.slow
@pytest.mark.parametrize("h, single", [(32, False), (64, True)])
def test_dkdv_blocks_near_the_chips_vmem_compile(h, single, monkeypatch):
  """dk/dv's VMEM grows with the query rows a kv head's block holds (query heads per kv head
  x T): 32 query heads over 1 kv head at T=1024 hold as many as the case above (4 per kv head
  at T=8192, ~97 MiB double-buffered; with Mosaic's default limit it fails:
  CompileTimeScopedVmemOom) and compile; 64 (as T=16384 there) would need ~193 MiB
  double-buffered: the rows are single-buffered (~97 MiB) and compile. T=1024 keeps the
  compile short (T=8192/16384 took 24-38 s against 3-4 s)."""
  seen = {}
  sized = pallas_ops._tpu_vmem_limit
  def record(cfg, kernel, *args, **kw):
    seen[kernel] = sized(cfg, kernel, *args, **kw)
    return seen[kernel]
  monkeypatch.setattr(pallas_ops, "_tpu_vmem_limit", record)
  text = compile_attention_grad(1, 1024, h, 1, 128, jnp.bfloat16, causal=True)
  assert len(kernels(text)) == 3
  limit, single_buffered = seen["dk/dv"]
  assert single_buffered == single and 110 < limit / 2**20 <= 128


def test_blocks_beyond_the_chips_vmem_are_refused_before_compiling():
  """T=32768 needs ~193 MiB even single-buffered (the estimate matches what Mosaic reports
  when forced past it: 144 MiB used at T=24576, estimated 145)."""
  with pytest.raises(ValueError, match=r"on TPU v5 lite: the dk/dv kernel needs about 193 MiB "
                                       r"of VMEM \(128 MiB per core\).*model.max_len"):
    compile_attention_grad(1, 32768, 8, 2, 128, jnp.bfloat16, causal=True)
