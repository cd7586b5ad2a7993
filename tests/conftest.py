"""Test setup: 8 fake CPU devices (set before JAX is imported) for sharding tests."""

import gc
import importlib.metadata
import os

# Python's cyclic GC with its default thresholds (700, 10, 10) runs ~60 collections per second
# of JAX tracing (each trace allocates many short-lived objects) and took 5-10 % of compile-bound
# test files' time (test_family_t5: 4.2 s of 40 s in 2,515 collections; 1.8 s in 301 with
# these thresholds; the same peak memory). Collection is only rarer, never off.
gc.set_threshold(100_000, 50, 1_000)

# 8 fake devices; LLVM at -O0: the test programs are tiny, so XLA:CPU's compile time dominates
# them, and -O0 halves the cold suite (test_models 3m00 -> 1m43, test_train 2m41 -> 1m55)
# with the same math (no fast-math either way; tolerances unchanged).
_FLAGS = ["--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"]
# XLA:CPU's older elemental emitters instead of its fusion emitters: same math, ~20 % less CPU
# time for the suite's compile-bound tests (test_family_t5 28.6 -> 22.3 s, two family
# trainings 58.5 -> 47.4 s, cold cache). Only on the jaxlib it was measured on: XLA aborts on
# a flag it no longer knows, so a newer jaxlib runs the suite without it.
#
# One LLVM module per program instead of 32 compiled on a thread pool (the suite's 2 workers
# already fill the 2 cores: the split only adds work), and the default instruction scheduler
# instead of the concurrency-optimised one: the same kernels in another order, ~20 % less
# CPU for XLA:CPU's compiles (6 tiny-config train steps and inits, no cache: 21.5 -> 15-17
# s), ~10 % for compile-bound test files.
if importlib.metadata.version("jaxlib").startswith("0.10."):
  _FLAGS += ["--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1",
             "--xla_cpu_enable_concurrency_optimized_scheduler=false"]
for _flag in _FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# A persistent XLA compilation cache shared by the xdist workers and the subprocesses tests
# start (they inherit the environment): many tests compile the same small programs (the tiny
# configs' train and eval steps), and XLA:CPU executables are cached by HLO and flags, so a
# hit is exactly the program a fresh compile would give. Programs compiling in >= 0.1 s are
# stored (0.5 s stored 6 of a 3-file run's programs, 0.1 s 15; ~3 % less CPU for the run).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"jaxformer-test-xla-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")


def pytest_runtest_setup(item):
  """A test marked `gpu` or `tpu` runs only where JAX sees that device (tests/accelerators.py):
  elsewhere it is skipped with the command that runs it."""
  for platform in ("gpu", "tpu"):
    if item.get_closest_marker(platform) is not None:
      import pytest
      from tests import accelerators
      if not accelerators.visible(platform):
        pytest.skip(accelerators.skip_reason(platform))
