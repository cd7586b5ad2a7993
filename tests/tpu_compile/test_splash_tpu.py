"""Attention kernels inside a Llama-style model's sharding on compile-only TPU v5e (issue #41):
impl="splash" and impl="pallas" in the trainer's own step (GQA, mesh data=2 x model=2, FSDP),
compiled for v5e:2x2 on this CPU host; what "auto" picks on TPU; the planner's cost of
splash's kernels (they carry no cost_estimate)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from configs import llama
from jaxformer.ops import attention as attention_ops
from jaxformer.ops.pallas import splash
from tests.tpu_compile.test_pallas_tpu import no_persistent_cache, tpu_devices  # noqa: F401 (fixture)

B, T, HEADS, KV_HEADS, HEAD_DIM = 4, 256, 4, 2, 64
# a kernel call: %<name> = <result shape> custom-call(... custom_call_target="tpu_custom_call"
_CALL = re.compile(r"%((?:splash_\w+|[\w.]*?jaxformer_flash_\w+?)(?:\.\d+)?) = (.+?) custom-call\(")


def llama_config(impl: str):
  """Llama-tiny's architecture (RoPE, RMSNorm, SwiGLU, GQA 4 over 2) at bf16, head_dim 64,
  one layer, 256 positions, on v5e:2x2 as data=2 x model=2 with FSDP."""
  cfg = llama.get_config("tiny")
  cfg.model.update(dtype="bfloat16", d_model=HEADS * HEAD_DIM, num_heads=HEADS,
                   num_kv_heads=KV_HEADS, mlp_dim=256, vocab_size=128, max_len=T, window=None,
                   num_layers=1, attention_impl=impl)
  cfg.data.seq_len = T
  cfg.train.batch_size = B
  cfg.mesh.update(data=2, model=2, fsdp=True)
  return cfg


@pytest.mark.parametrize("impl, names", [
    ("splash", {"splash_mqa_fwd_residuals", "splash_mqa_dq_no_residuals",
                "splash_mqa_dkv_no_residuals"}),
    # our kernel per shard in a train step is in the fast loop through test_pallas_tpu's GPT
    pytest.param("pallas", {"jaxformer_flash_forward", "jaxformer_flash_dq",
                            "jaxformer_flash_dkdv"}, marks=pytest.mark.slow),
])
def test_kernels_compile_per_shard_in_the_llama_train_step(impl, names):
  """The train step compiles with the kernel's forward and backward at per-shard shapes
  (2 rows, 2 of 4 query heads, 1 of 2 kv heads: splash's MQA kernel), and the updated state
  keeps the FSDP x tensor-parallel shardings it came in with."""
  from jaxformer import accelerators as chips
  from jaxformer.plan import estimate, hlo
  from jaxformer.train.program import build_program
  program = build_program(llama_config(impl), tpu_devices("v5e:2x2"))
  compiled = program.step.lower(*program.args).compile()
  text = compiled.as_text()
  calls = {re.sub(r"\.\d+$", "", name): shape for name, shape in _CALL.findall(text)}
  calls = {re.sub(r"^.*?(jaxformer_flash_\w+?)$", r"\1", n): s for n, s in calls.items()}
  assert set(calls) == names, sorted(calls)
  per_shard = f"[{B // 2},{HEADS // 2},{T},{HEAD_DIM}]"
  assert per_shard in calls[sorted(names)[-1] if impl == "pallas" else
                            "splash_mqa_fwd_residuals"], calls
  state_out = compiled.output_shardings[0]
  leaves = jax.tree.leaves(program.state)
  assert len(jax.tree.leaves(state_out)) == len(leaves)
  for got, want in zip(jax.tree.leaves(state_out), leaves):
    assert got.is_equivalent_to(want.sharding, want.ndim), (got, want)
  assert any("model" in str(x.sharding.spec) for x in leaves)      # tensor parallel
  assert any("data" in str(x.sharding.spec) for x in leaves)       # FSDP
  kernels = estimate.kernel_summary(
      hlo.analyse(text, program.plan.mesh), chips.CHIPS["v5e"],
      estimate.splash_kernel_flops(hlo.analyse(text, program.plan.mesh), program.config.model))
  assert kernels["count"] == 3 and kernels["uncosted"] == 0
  assert kernels["seconds"] == pytest.approx(kernels["roofline_seconds"]
                                             / estimate.KERNEL_EFFICIENCY)
  if impl == "splash":
    # one 256 x 256 block, causal: visited; (4 + 6 + 8) flops units per (row, query head)
    assert kernels["flops"] == 18 * 256 * 256 * HEAD_DIM * (B // 2) * (HEADS // 2)


def _abstract(shape, dtype, mesh):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))


def test_auto_on_tpu_picks_a_kernel_for_the_platform_compiled_for():
  """"auto" resolves for the mesh's TPU devices although jax's default backend is CPU: our
  kernel (it planned faster), splash when our whole-sequence VMEM blocks would be large, the
  XLA paths for a dtype neither kernel takes and for a decoding step (one query); without
  the mesh it stays off the kernels."""
  mesh = Mesh(tpu_devices("v5e:2x2")[:1], ("data",))
  q = _abstract((1, 4096, 32, 128), jnp.bfloat16, mesh)
  long_q = _abstract((1, 32768, 32, 128), jnp.bfloat16, mesh)
  long_kv = _abstract((1, 32768, 8, 128), jnp.bfloat16, mesh)
  f16 = _abstract((1, 256, 2, 64), jnp.float16, mesh)
  assert jax.default_backend() == "cpu"
  with jax.set_mesh(mesh):
    assert attention_ops.TPU_AUTO_KERNEL == "pallas"
    assert attention_ops.resolve_impl("auto", q, q, q) == "pallas"
    assert attention_ops.resolve_impl("auto", long_q, long_kv, long_kv) == "splash"
    assert attention_ops.resolve_impl("auto", f16, f16, f16) == "xla"
    one = _abstract((1, 1, 32, 128), jnp.bfloat16, mesh)       # a decoding step
    assert attention_ops.resolve_impl("auto", one, q, q) == "xla"
    with pytest.raises(ValueError, match="impl='splash'.*float32 or bfloat16"):
      attention_ops.resolve_impl("splash", f16, f16, f16)
  host = jax.ShapeDtypeStruct((1, 4096, 32, 128), jnp.bfloat16)
  assert attention_ops.resolve_impl("auto", host, host, host) == "blocked"


def test_splash_flops_are_its_block_maps_visited_pairs():
  """Causal T=4096 in 512-blocks: 36 of 64 pairs (8 x 9 / 2); a 1024-key window: the
  diagonal and the two blocks below it (8 + 7 + 6); non-causal: every pair."""
  assert splash.visited_block_pairs(4096, 4096, causal=True) == 36
  assert splash.visited_block_pairs(4096, 4096, causal=False) == 64
  assert splash.visited_block_pairs(4096, 4096, causal=True, window=(1024, 0)) == 8 + 7 + 6
  assert splash.kernel_flops("dkv", batch=2, heads=3, tq=4096, tk=4096, head_dim=128,
                             causal=True) == 8 * 512 * 512 * 128 * 36 * 2 * 3
  assert np.isclose(splash.kernel_flops("fwd", batch=1, heads=1, tq=256, tk=256, head_dim=64,
                                        causal=True, block_sizes=(128, 128)),
                    4 * 128 * 128 * 64 * 3)
