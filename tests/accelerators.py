"""Kernel tests on a real GPU or TPU: the pytest markers `gpu` and `tpu`.

The suite runs on the CPU (tests/conftest.py: JAX_PLATFORMS=cpu, 8 fake devices), where every
Pallas kernel runs in the Pallas interpreter. A test marked `gpu` or `tpu` runs its kernel
compiled for that device instead (Triton on GPU, Mosaic on TPU: interpret=False) against the
same float64 reference; conftest skips it, with the reason, unless JAX sees such a device in
the pytest process. JAX_PLATFORMS names the platforms JAX starts, the first being the default
backend, so on a GPU machine

    JAX_PLATFORMS=cpu,cuda python -m pytest -m gpu tests

keeps the CPU as the default (every other test as on a laptop) and lends the GPU to the marked
tests (on a TPU VM: JAX_PLATFORMS=cpu,tpu; one process, no -n: a TPU is held by one process).
`experiments/gpu_check.py` is the timed report of the same kernels on a GPU (every impl against
XLA, train-step throughput); these tests are its pass/fail unit checks.
"""

from __future__ import annotations

import contextlib
import functools

import jax

PLATFORMS = ("gpu", "tpu")
# The custom call a kernel compiled for the device lowers to (an interpreted one lowers to
# plain HLO loops).
KERNEL_CALLS = {"gpu": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}
_ENABLE = {"gpu": "JAX_PLATFORMS=cpu,cuda", "tpu": "JAX_PLATFORMS=cpu,tpu"}


@functools.cache
def visible(platform: str) -> bool:
  """Whether JAX has a `platform` device in this process."""
  try:
    return bool(jax.devices(platform))
  except RuntimeError:
    return False


def skip_reason(platform: str) -> str:
  return (f"no {platform.upper()} visible to JAX (JAX_PLATFORMS={jax.config.jax_platforms}); "
          f"on a {platform.upper()} machine run `{_ENABLE[platform]} python -m pytest -m "
          f"{platform} tests` (tests/accelerators.py)")


def params(*platforms: str) -> list:
  """pytest.param per platform, each with its marker: `@pytest.mark.parametrize("platform",
  accelerators.params("gpu", "tpu"))`."""
  import pytest
  return [pytest.param(p, marks=getattr(pytest.mark, p), id=p) for p in platforms]


@contextlib.contextmanager
def on_device(platform: str):
  """Run what is traced and called inside on the first `platform` device, as the trainer
  runs on one chip: that device by default, a one-device mesh of it in context (so the
  kernels' `target_platform` is the device's and they are compiled, not interpreted), float32
  matmuls at `highest` precision (Triton and XLA:GPU use TF32 otherwise, the TPU's MXU one
  bfloat16 pass), so the float32 tolerances of the CPU tests hold. Yields the device."""
  from jaxformer.parallel import ShardingPlan
  device = jax.devices(platform)[0]
  plan = ShardingPlan.from_config(dict(data=1, model=1, expert=1), [device])
  with jax.default_device(device), jax.default_matmul_precision("highest"), plan.scope():
    yield device


def assert_kernel_compiled(platform: str, fn, *args) -> None:
  """`fn(*args)` lowers to `platform`'s kernel custom call (the kernel is compiled for the
  device, not interpreted); call it inside `on_device`."""
  text = jax.jit(fn).lower(*args).as_text()
  assert KERNEL_CALLS[platform] in text, (
      f"no {KERNEL_CALLS[platform]} custom call: the kernel was not compiled for {platform}")
