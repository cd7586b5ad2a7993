"""Accelerator figures: per-chip figures of each TPU generation (what a roofline divides by,
`CHIPS`) and the published dense peak FLOP/s of GPUs and TPUs (what MFU divides by,
`peak_flops_per_device`, overridden by the JAXFORMER_PEAK_FLOPS env var).

Every figure is per chip (a v4 or v5p chip is one JAX device in megacore mode) and comes from
Google's public spec pages (`source`), except the clock, which Google does not publish for
every generation and which is needed to turn the compiler's `estimated_cycles` into seconds:
it is MEASURED from the compiler itself (see "The clock" below; `tests/tpu_compile/test_tpu_analysis.py`
re-derives it).

Bandwidths, and which one a roofline should use:
- `hbm_bytes_per_s`: HBM bandwidth (read + write together), as published.
- `ici_bytes_per_s`: the published *bidirectional* inter-chip bandwidth of one chip, all its
  ICI ports together (v5e/v6e: 4 ports, a 2D torus; v4/v5p: 6 ports, a 3D torus). A
  collective over one mesh axis uses only that axis's 2 ports (one to each neighbour), each
  sending and receiving at once, so what one chip *sends* along one axis is
  `ici_axis_bytes_per_s` = 2 ports x one direction = ici_bytes_per_s / ici_ports. A ring
  all-gather / reduce-scatter over n chips of an axis moving B bytes per chip (`hlo`'s
  collective bytes) takes about (n-1)/n * B / ici_axis_bytes_per_s; an all-reduce twice that.
  Using `ici_bytes_per_s` itself for one-axis traffic would be 2x (2D) to 3x (3D) optimistic.
  Slices smaller than a full torus axis have no wrap-around link, which halves a ring's
  bandwidth on that axis; not modelled.
- `dcn_bytes_per_s`: data-centre network per chip, one direction: the host's NIC bandwidth
  shared by the chips of one host (multi-slice traffic goes chip -> host -> NIC).

The clock (measured, libtpu 0.0.42.1): compile one bf16 matmul for one chip of a generation
and read its `estimated_cycles` (in the backend_config of the compiled op). The compiler's
estimate already includes the matmul's inefficiency, so flops / estimated_cycles is *below*
the MXU's peak flops per cycle, by 3-13% depending on the shape. Measured maxima over shapes
(4096^3 ... 32768x8192x32768): v5e 126,898; v4 249,536; v5p 252,216; v6e 455,675 flops per
estimated cycle. Each lies just under a power of two, and the MXU arrays give exactly those
powers: v5e 4 MXUs x 128x128 x 2 flops = 131,072 (2^17); v4 and v5p 2 TensorCores x 4 MXUs x
128x128 x 2 = 262,144 (2^18); v6e 4 MXU-equivalents of 256x256 x 2 = 524,288 (2^19) (the
v6e page says "2 MXUs" in one version and "4" in another; the compiler's own 455,675 > 2^18
rules out the first). Clock = peak flops / peak flops per cycle: v5e 197e12 / 2^17 =
1.503 GHz, v4 275e12 / 2^18 = 1.049 GHz (the v4 paper's published 1050 MHz: the check), v5p
459e12 / 2^18 = 1.751 GHz, v6e 918e12 / 2^19 = 1.751 GHz. (Dividing peak flops by the
measured flops per cycle instead would overstate the clock by the matmul's inefficiency:
v4 would come out at 1.10-1.19 GHz, not 1050 MHz.)
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One chip of a generation; all rates per chip, per second."""
  name: str
  hbm_bytes: int              # HBM capacity usable by a program
  peak_flops: float           # dense bf16
  hbm_bytes_per_s: float
  ici_bytes_per_s: float      # bidirectional, all ports (see module docstring)
  dcn_bytes_per_s: float      # one direction; host NIC / chips per host
  clock_hz: float             # measured from the compiler's cycle estimates
  source: str                 # spec pages, space-separated URLs
  ici_ports: int = 4          # 4 (2D torus) or 6 (3D torus)
  mxu_flops_per_cycle: int = 2**17

  @property
  def ici_axis_bytes_per_s(self) -> float:
    """What one chip sends per second along one torus axis (2 ports, one direction each)."""
    return self.ici_bytes_per_s / self.ici_ports


_V4 = "https://cloud.google.com/tpu/docs/v4"
_V4_PAPER = "https://arxiv.org/abs/2304.01433"           # TPU v4 paper (ISCA 2023): 1050 MHz
_V4_ICI = "https://glennklockwood.com/garden/processors/TPUv4"
_V5E = "https://cloud.google.com/tpu/docs/v5e"
_V5P = "https://cloud.google.com/tpu/docs/v5p"
_V6E = "https://cloud.google.com/tpu/docs/v6e"

CHIPS = {
    # v4 page: 275 TFLOPs, 32 GiB at 1200 GBps. ICI is not on the page: 6 links of about
    # 50 GB/s (400 Gbps) each way (the v4 paper; summarised at _V4_ICI) -> 600 GB/s
    # bidirectional. DCN is not published for v4: taken as v5p's 50 Gbps per chip (an
    # assumption, not a published figure).
    "v4": Chip("TPU v4", 32 * GiB, 275e12, 1200e9, 600e9, 50e9 / 8, 275e12 / 2**18,
               f"{_V4} {_V4_PAPER} {_V4_ICI}", ici_ports=6, mxu_flops_per_cycle=2**18),
    # v5e page: 197 TFLOPs, 16 GB (16 GiB physical), 819 GBps, ICI 400 GBps bidirectional
    # (1600 Gbps), 4 ports; a host has 8 chips and 2 x 100 Gbps NICs -> 25 Gbps per chip.
    "v5e": Chip("TPU v5e", 16 * GiB, 197e12, 819e9, 400e9, 2 * 100e9 / 8 / 8,
                197e12 / 2**17, _V5E, ici_ports=4, mxu_flops_per_cycle=2**17),
    # v5p page: 459 TFLOPs, 95 GiB usable (96 physical), 2765 GBps, ICI 1200 GBps
    # bidirectional (4800 Gbps), 3D torus, DCN 50 Gbps per chip.
    "v5p": Chip("TPU v5p", 95 * GiB, 459e12, 2765e9, 1200e9, 50e9 / 8, 459e12 / 2**18,
                _V5P, ici_ports=6, mxu_flops_per_cycle=2**18),
    # v6e page: 918 TFLOPs, 32 GB, 1640 GBps (1600 / 1638 in other versions of the page),
    # ICI 800 GBps bidirectional (3200 Gbps), 4 ports; 8 chips and 4 x 200 Gbps NICs per
    # host -> 100 Gbps per chip.
    "v6e": Chip("TPU v6e", 32 * GiB, 918e12, 1640e9, 800e9, 4 * 200e9 / 8 / 8,
                918e12 / 2**19, _V6E, ici_ports=4, mxu_flops_per_cycle=2**19),
}

_DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
                 "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def for_device_kind(kind: str) -> Chip | None:
  """The chip of a JAX `device.device_kind` ("TPU v5 lite" -> v5e); None for a kind without
  figures here (a CPU, a GPU, a TPU generation not listed)."""
  generation = _DEVICE_KINDS.get(kind.strip())
  return CHIPS[generation] if generation else None


PEAK_FLOPS_ENV = "JAXFORMER_PEAK_FLOPS"

_DTYPES = ("bfloat16", "float16", "float32")

# Published dense (no 2:4 sparsity) peak FLOP/s per JAX device, by dtype. GPUs are matched on a
# substring of `device.device_kind`, the first match wins (so "pcie"/"nvl" rows come first);
# TPUs on the exact kind (JAX's v4, v5p and v6e devices are whole chips).
#   H100 SXM / PCIe / NVL: NVIDIA H100 datasheet (2023): BF16 989.4 / 756 / 835 TFLOPS
#     (1979 / 1513 / 1671 with sparsity), FP32 67 / 51 / 60 TFLOPS.
#   H200 SXM / NVL: NVIDIA H200 datasheet (2024): BF16 989 / 835 TFLOPS dense, FP32 67 / 60.
#   A100 (SXM and PCIe, 40/80GB): NVIDIA A100 datasheet: BF16 312 TFLOPS, FP32 19.5 TFLOPS.
#   V100 SXM2 / PCIe: NVIDIA V100 datasheet: FP16 tensor 125 / 112 TFLOPS, FP32 15.7 / 14;
#     no bfloat16 hardware, so none is listed.
#   TPUs: `CHIPS` above (bf16 only; Google does not publish fp32 peaks).
# FP32 is the non-tensor-core figure: XLA's default matmul precision on Ampere and newer GPUs
# uses TF32, so float32 MFU against it can read above 100%.
_GPU_PEAKS = (
    (("h100", "pcie"), {"bfloat16": 756e12, "float16": 756e12, "float32": 51e12}),
    (("h100", "nvl"), {"bfloat16": 835e12, "float16": 835e12, "float32": 60e12}),
    (("h100",), {"bfloat16": 989.4e12, "float16": 989.4e12, "float32": 67e12}),
    (("h200", "nvl"), {"bfloat16": 835e12, "float16": 835e12, "float32": 60e12}),
    (("h200",), {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12}),
    (("a100",), {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12}),
    (("v100", "pcie"), {"float16": 112e12, "float32": 14e12}),
    (("v100",), {"float16": 125e12, "float32": 15.7e12}),
)


def _dtype_name(dtype) -> str:
  name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
  if name not in _DTYPES:
    raise ValueError(f"dtype={dtype!r}: peak FLOP/s are tabulated for {_DTYPES}")
  return name


def _env_peak_flops() -> float | None:
  text = os.environ.get(PEAK_FLOPS_ENV)
  if not text:
    return None
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not value > 0:
    raise ValueError(f"{PEAK_FLOPS_ENV}={text!r} must be a positive number of FLOP/s per "
                     "device, e.g. 1.5e12")
  return value


def peak_flops_per_device(device=None, dtype="bfloat16", *,
                          override: float | None = None) -> float | None:
  """Published dense peak FLOP/s of one `device` (default: `jax.devices()[0]`) in `dtype`.

  `override` (or the JAXFORMER_PEAK_FLOPS env var) wins over the table, which is how a CPU or
  an unlisted accelerator gets an MFU; otherwise an unknown device or dtype gives None.
  """
  dtype = _dtype_name(dtype)
  if override is not None:
    if not override > 0:
      raise ValueError(f"override={override!r} must be a positive number of FLOP/s")
    return float(override)
  from_env = _env_peak_flops()
  if from_env is not None:
    return from_env
  if device is None:
    import jax                           # pylint: disable=import-outside-toplevel
    device = jax.devices()[0]
  chip = for_device_kind(device.device_kind)
  if chip is not None:
    return chip.peak_flops if dtype == "bfloat16" else None
  kind = device.device_kind.lower().strip()
  for needles, peaks in _GPU_PEAKS:
    if all(needle in kind for needle in needles):
      return peaks.get(dtype)
  return None
