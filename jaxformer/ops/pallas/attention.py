"""Flash attention as Pallas kernels (forward + backward), our `impl="pallas"`.

Why a kernel when `ops.blocked_attention` exists: the plain-JAX blocked path computes every key
block for every query, and XLA keeps its tiles in HBM. Here one program owns a tile of queries,
keeps its running max / sum / accumulator on chip, and walks only the key blocks its band can
see:

  forward   grid (batch, q_head, q_block); online softmax over key blocks; writes out and the
            per-row log-sum-exp (LSE).
  backward  delta = rowsum(dO * O) (a fused XLA reduction), then two kernels that recompute the
            probabilities from the LSE: dq (grid over q blocks, loop over key blocks; also
            writes dS, the bias cotangent, when a bias is given) and dk/dv (grid over
            (batch, kv_head, k_block), loop over the query heads of the group and their q blocks).

Block skipping: causal and sliding-window masks are bands, so `key_block_bounds` /
`query_block_bounds` give, per block, the range of blocks holding any visible entry (the loop
bounds; nothing outside is loaded or computed) and the inner range where every entry is visible
(looped without building the structural mask). Segment ids, a boolean mask and a bias are tiles
applied inside the visited blocks.

Layout: inputs are moved to [B, H, T, D] and padded to whole blocks (T) and a power-of-two head
dim (D), so every load is a power-of-two tile as Triton requires. GQA maps query head h to kv
head h // (H // Hkv) in the BlockSpec index map; K/V are never repeated. Per-row statistics and
segment ids are 2-D ([T, 1] / [1, T]) so they broadcast against [block_q, block_k] tiles and
suit Mosaic's 2-D layouts. A query row with no visible key returns zeros and zero gradients.

Cost notes: K/V of one head are a single BlockSpec block (the loop slices it), and a bias or
mask is materialised at [.., Tq, Tk]; the dbias cotangent is [B, H, Tq, Tk] float32.

Cost estimates (`pl.CostEstimate`, what XLA's cost analysis and `jaxformer.plan.hlo` read, since
a kernel's matmuls are no HLO dots): with D the padded head dim, bq x bk the blocks and P the
(query block, key block) pairs a (batch, query head) visits (`visited_block_pairs`: every pair
without a mask, ~half with a causal one), per batch and query head:
  forward   flops 4 bq bk D P (QK^T, PV); exp bq bk P + bq P (probabilities, rescaling) + Tq (log)
  dq        flops 6 bq bk D P (QK^T recomputed, dO V^T, dS K); exp bq bk P
  dk/dv     flops 8 bq bk D P (QK^T recomputed, P^T dO, dO V^T, dS^T Q); exp bq bk P
Bytes are what the grid's BlockSpecs fetch and write (Pallas copies a block only when its
index changes between consecutive grid steps): q/dO/O/dq/LSE/delta rows once each; a kv head's
whole-sequence K/V once per (batch, kv head) in the forward and dq (their index ignores the
query block and is shared by the query heads of a group); in dk/dv, K/V/dk/dv once and the
grouped query rows once per (batch, kv head); segment ids, bias and mask tiles at every step
whose index changes (a [bq, Tk] row of bias per query block, a [rows, bk] column per key block).

Backends: interpreted where the program's devices are CPUs, Triton on GPU, Mosaic on TPU; the
platform is that of the mesh the program is traced for (`target_platform`), so planning a TPU
job on a CPU host with compile-only TPU devices builds the Mosaic kernels. On TPU: float32 or
bfloat16 only, blocks >= 128 (lane width), and every kernel's VMEM is sized from its blocks
(`_tpu_vmem_limit`): the whole-sequence K/V (and dk/dv's query rows) blocks bound the sequence
length, refused with a ValueError before compiling.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxformer.ops import masks
from jaxformer.ops.flash_vjp import flash_vjp

_NN = ((1,), (0,))      # a @ b
_NT = ((1,), (1,))      # a @ b.T
_TN = ((0,), (0,))      # a.T @ b
_MIN_BLOCK = {"gpu": 16, "tpu": 128, "cpu": 1}   # tl.dot needs >= 16; Mosaic lanes are 128
_TPU_DTYPES = (jnp.float32, jnp.bfloat16)        # Mosaic refuses float16 loads (v5e: "Invalid
                                                 # vector type for load")
_CONFIG_FIELD = "model.attention_block_sizes"    # where a config sets (block_q, block_k)


def default_block_sizes(head_dim: int, backend: str | None = None) -> tuple[int, int]:
  """(block_q, block_k) for a backend ("gpu" | "tpu" | "cpu", default: `target_platform()`)
  and head dim.

  GPU: tiles that fit a Triton program's registers/shared memory (smaller for large heads);
  TPU: 128-lane aligned; CPU (interpret mode): large blocks, since every grid step and loop
  iteration is interpreted.
  """
  backend = backend or target_platform()
  if backend == "gpu":
    return (128, 64) if head_dim <= 64 else (64, 64) if head_dim <= 128 else (32, 32)
  return 128, 128


def target_platform(*arrays) -> str:
  """The platform ("cpu" | "gpu" | "tpu" | other) the program being traced is compiled for.

  That is the devices' platform, not `jax.default_backend()`: planning a TPU job on a CPU host
  traces for compile-only TPU devices while the default backend stays CPU. Read, in order,
  from the mesh in context (`jax.set_mesh`, e.g. `ShardingPlan.scope`, and its manual form
  inside `shard_map`), then from the mesh of the arrays' shardings (what `jit` in_shardings
  give its tracers), then the default backend (no mesh anywhere: eager or a plain jit).
  """
  device = _target_device(*arrays)
  return device.platform if device is not None else jax.default_backend()


def _target_device(*arrays):
  """The `jax.sharding.AbstractDevice` (platform, device_kind, num_cores) of the mesh in
  context or of the arrays' shardings, or None (see `target_platform`)."""
  meshes = [jax.sharding.get_abstract_mesh()]
  for x in arrays:
    sharding = getattr(getattr(x, "aval", None), "sharding", None)
    meshes.append(getattr(sharding, "mesh", None))
  for mesh in meshes:
    device = getattr(mesh, "abstract_device", None)     # None for an empty mesh
    if device is not None and getattr(device, "platform", None):
      return device
  return None


def _tpu_vmem_capacity(device_kind: str | None) -> int | None:
  """VMEM bytes per TensorCore of a TPU kind ("TPU v5 lite"), None if unknown (Pallas's own
  chip table; the kind -> version map is private, so read defensively)."""
  if device_kind is None:
    return None
  try:
    from jax._src.pallas.mosaic import tpu_info
    from jax.experimental.pallas import tpu as pltpu
    version = tpu_info.chip_version_from_device_kind(device_kind)
    return None if version is None else pltpu.get_tpu_info_for_chip(
        version, 1).vmem_capacity_bytes
  except Exception:       # noqa: BLE001 (another JAX: no capacity, Mosaic's default limit)
    return None


def pallas_attention(q, k, v, *, bias=None, mask=None, q_segment_ids=None,
                     kv_segment_ids=None, causal: bool = False, window=None, scale: float,
                     block_q: int | None = None, block_k: int | None = None,
                     interpret: bool | None = None, backend: str | None = None):
  """Attention over validated inputs (see `ops.attention.dot_product_attention`).

  q [B, Tq, H, D]; k, v [B, Tk, Hkv, D]; bias/mask 4-D broadcastable to [B, H, Tq, Tk] or None;
  segment ids [B, Tq] / [B, Tk] or None; window a (left, right) tuple or None.
  block_q/block_k: powers of two (default `default_block_sizes`, shrunk for short inputs);
  interpret: run the kernels in the Pallas interpreter (default: unless the backend is GPU/TPU).
  backend: the platform to build the kernels for, "gpu" | "tpu" | "cpu" (default:
    `target_platform`, the platform of the mesh's devices, else jax's default backend). A
    GPU/TPU backend on another host lowers ahead of time, e.g. with
    `jax.jit(f).trace(...).lower(lowering_platforms=("tpu",))`, or under a mesh of
    compile-only TPU devices (`jax.experimental.topologies`) with no argument at all.
  Returns [B, Tq, H, D] in q's dtype.
  """
  cfg = _make_config(q, k, causal, window, scale, block_q, block_k, interpret, backend)
  b, tq, h, d = q.shape
  d_pad = _pow2_at_least(d, _MIN_BLOCK["gpu"] if cfg.backend == "gpu" else 1)
  qp = _to_kernel_layout(q, cfg.padded_tq, d_pad)
  kp, vp = (_to_kernel_layout(x, cfg.padded_tk, d_pad) for x in (k, v))
  pair_shape = (cfg.padded_tq, cfg.padded_tk)
  if bias is not None and cfg.backend == "tpu" and bias.dtype not in _TPU_DTYPES:
    bias = bias.astype(jnp.float32)              # (a float16 bias; its gradient casts back)
  bias = None if bias is None else _pad_pair(bias, (tq, cfg.tk), pair_shape)
  mask = None if mask is None else _pad_pair(mask.astype(jnp.int8), (tq, cfg.tk), pair_shape)
  q_ids = kv_ids = None
  if q_segment_ids is not None:
    q_ids = _pad_axis(q_segment_ids.astype(jnp.int32), 1, cfg.padded_tq)[:, :, None]
    kv_ids = _pad_axis(kv_segment_ids.astype(jnp.int32), 1, cfg.padded_tk)[:, None, :]
  out = _flash(qp, kp, vp, bias, mask, q_ids, kv_ids, cfg)
  return jnp.swapaxes(out[:, :, :tq, :d], 1, 2)


# ----------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static kernel parameters (hashable: a custom_vjp nondiff argument)."""
  causal: bool
  window: masks.Window | None
  scale: float
  block_q: int
  block_k: int
  tq: int
  tk: int
  interpret: bool
  backend: str
  head_dim: int
  device_kind: str | None = None        # the TPU's kind, when known (VMEM sizing)
  vmem_capacity: int | None = None      # its VMEM bytes per core, when known

  @property
  def padded_tq(self) -> int:
    return -(-self.tq // self.block_q) * self.block_q

  @property
  def padded_tk(self) -> int:
    return -(-self.tk // self.block_k) * self.block_k

  def bounds_kwargs(self) -> dict:
    return dict(tq=self.tq, tk=self.tk, block_q=self.block_q, block_k=self.block_k,
                causal=self.causal, window=self.window)


def _is_pow2(n) -> bool:
  return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


def _pow2_at_least(n: int, minimum: int) -> int:
  return max(minimum, pl.next_power_of_2(n))


def _fit_block(name: str, block: int | None, default: int, length: int, backend: str) -> int:
  """The user's or default block, shrunk to the (power-of-two rounded) length."""
  minimum = _MIN_BLOCK.get(backend, 1)
  if block is None:
    return max(minimum, min(default, pl.next_power_of_2(length)))
  which = f"{name} ({_CONFIG_FIELD}[{0 if name == 'block_q' else 1}] in a config)"
  if not _is_pow2(block):
    raise ValueError(f"{name}={block!r} must be a power of two (e.g. 64 or 128); {which}")
  if block < minimum:
    raise ValueError(f"{name}={block} is below {minimum}, the smallest block the {backend} "
                     f"Pallas backend supports; pass {name}>={minimum} or leave it None "
                     f"(the default); {which}")
  return block


def _make_config(q, k, causal, window, scale, block_q, block_k, interpret, backend) -> _Config:
  if not jnp.issubdtype(q.dtype, jnp.floating):
    raise ValueError(f"impl='pallas' needs floating-point q/k/v; got {q.dtype}")
  if interpret is not None and not isinstance(interpret, bool):
    raise ValueError(f"interpret must be a bool or None; got {interpret!r}")
  if backend is not None and backend not in _MIN_BLOCK:
    raise ValueError(f"backend={backend!r} must be one of {sorted(_MIN_BLOCK)} or None "
                     "(the platform of the mesh's devices, else jax's default backend)")
  backend = backend or target_platform(q, k)
  interpret = backend not in ("gpu", "tpu") if interpret is None else interpret
  if backend not in ("gpu", "tpu") and not interpret:
    raise ValueError(f"interpret=False needs a GPU or TPU backend (this one is {backend!r}); "
                     "pass interpret=None or True, or backend='gpu'/'tpu' to lower for one")
  kind = "cpu" if interpret else backend
  if kind == "tpu" and q.dtype not in _TPU_DTYPES:
    raise ValueError(f"impl='pallas' on TPU (Mosaic) takes float32 or bfloat16 q/k/v; got "
                     f"{q.dtype}. Use bfloat16 (model.dtype='bfloat16' in a config), or "
                     "impl='blocked'/'xla'")
  head_dim = q.shape[-1]
  default_q, default_k = default_block_sizes(head_dim, kind)
  device = _target_device(q, k)
  device_kind = getattr(device, "device_kind", None) if kind == "tpu" else None
  return _Config(
      device_kind=device_kind, vmem_capacity=_tpu_vmem_capacity(device_kind),
      causal=causal, window=masks.normalize_window(window), scale=float(scale),
      block_q=_fit_block("block_q", block_q, default_q, q.shape[1], kind),
      block_k=_fit_block("block_k", block_k, default_k, k.shape[1], kind),
      tq=q.shape[1], tk=k.shape[1], interpret=interpret, backend=kind, head_dim=head_dim)


def _kernel_params(cfg: _Config, kernel: str, in_specs, inputs, out_specs, out_shape,
                   resident: tuple[int, ...]):
  """(in_specs, compiler_params) of a pallas_call for the config's backend.

  TPU: VMEM is sized from the kernel's blocks (`_tpu_vmem_limit`). `resident` are the inputs
  whose block is the same for every step of the last grid axis (whole-sequence K/V; dk/dv's
  query rows): when double buffering every block would not fit the core's VMEM, those are
  single-buffered (`pl.Buffered(1)`: their DMA, once per (batch, head), is not overlapped).
  """
  if cfg.backend == "gpu":
    from jax.experimental.pallas import triton as pltriton
    return in_specs, pltriton.CompilerParams(num_warps=4 if cfg.head_dim <= 64 else 8,
                                             num_stages=2)
  if cfg.backend != "tpu":
    return in_specs, None
  from jax.experimental.pallas import tpu as pltpu
  limit, single = _tpu_vmem_limit(cfg, kernel, list(zip(in_specs, inputs)),
                                  list(zip(out_specs, out_shape)), resident)
  if single:
    in_specs = [pl.BlockSpec(spec.block_shape, spec.index_map, pipeline_mode=pl.Buffered(1))
                if i in resident and spec is not None else spec
                for i, spec in enumerate(in_specs)]
  return in_specs, pltpu.CompilerParams(dimension_semantics=("parallel",) * 3,
                                        vmem_limit_bytes=limit)


# Mosaic's default scoped VMEM limit is 16 MiB (v4/v5e/v5p; v6e has 32); a kernel whose blocks
# need more asks for what they need (+25%), up to the core's VMEM.
_DEFAULT_SCOPED_VMEM = 16 * 2**20


def _vmem_block_bytes(spec, x) -> int:
  """VMEM bytes of one buffer of x's BlockSpec block: the last two dims padded to Mosaic's
  tiles (8 sublanes of 32-bit, 16 of 16-bit, 32 of 8-bit; 128 lanes)."""
  if spec is None or x is None:
    return 0
  shape = [b if isinstance(b, int) else 1 for b in spec.block_shape]   # None: squeezed
  itemsize = jnp.dtype(x.dtype).itemsize
  rows, cols = shape[-2], shape[-1]
  sublanes = 8 * max(1, 4 // itemsize)
  return (math.prod(shape[:-2]) * -(-rows // sublanes) * sublanes * -(-cols // 128) * 128
          * itemsize)


def _tpu_vmem_limit(cfg: _Config, kernel: str, inputs, outputs, resident
                    ) -> tuple[int | None, bool]:
  """(vmem_limit_bytes, single-buffer the resident inputs) of a kernel whose inputs/outputs
  are (BlockSpec, array) pairs. None (Mosaic's default limit) when its double-buffered blocks
  and float32 tiles fit the default, else what they need (+25%, capped at the core's VMEM);
  past the core's VMEM the resident inputs are single-buffered, and past it even so a
  ValueError before compiling: the whole-sequence blocks bound the sequence length.

  Checked on compile-only v5e (128 MiB per core), bf16, head_dim 128, 4 query heads per kv
  head (dk/dv is the largest kernel): double-buffered, T=8192 needs ~97 MiB and compiles,
  T=12288 ~145 MiB and Mosaic, when forced, reports 144 MiB used (over); single-buffered
  T=16384 compiles (~97 MiB) and T=32768 (~193 MiB) is refused."""
  if cfg.vmem_capacity is None:
    return None, False
  sizes = [_vmem_block_bytes(spec, x) for spec, x in inputs + outputs]
  d = -(-cfg.head_dim // 128) * 128
  tiles = 4 * (6 * cfg.block_q * cfg.block_k + 3 * max(cfg.block_q, cfg.block_k) * d)
  need = 2 * sum(sizes) + tiles
  if need <= _DEFAULT_SCOPED_VMEM:
    return None, False
  single = need > cfg.vmem_capacity
  if single:
    need -= sum(sizes[i] for i in resident)
  if need > cfg.vmem_capacity:
    mib = lambda n: f"{n / 2**20:.0f} MiB"
    raise ValueError(
        f"impl='pallas' on {cfg.device_kind}: the {kernel} kernel needs about "
        f"{mib(need)} of VMEM ({mib(cfg.vmem_capacity)} per core) for Tq={cfg.tq}, "
        f"Tk={cfg.tk}, head_dim={cfg.head_dim} per device: it keeps a head's whole K/V, and "
        "for dk/dv the whole rows of the query heads sharing a kv head, on chip. Use a "
        "shorter sequence (model.max_len), fewer query heads per kv head (model.num_kv_heads), "
        "or impl='blocked'")
  return int(min(cfg.vmem_capacity, need * 1.25 + 2**20)), single


# ------------------------------------------------------------------------------ loop bounds


def _band(causal: bool, window) -> tuple[int | None, int | None]:
  """(left, right) key offsets a query can see; causal caps right at 0; None = unbounded."""
  left, right = window if window is not None else (None, None)
  if causal:
    right = 0 if right is None else min(right, 0)
  return left, right


def _cdiv(a, b: int):
  """ceil(a / b) for a >= 0 (traced or not)."""
  return jax.lax.div(a + (b - 1), b)


def _ordered(lo, mid_lo, mid_hi, hi):
  """Clamp so that lo <= mid_lo <= mid_hi <= hi (an empty band gives empty ranges)."""
  hi = jnp.maximum(hi, lo)
  mid_lo = jnp.clip(mid_lo, lo, hi)
  return lo, mid_lo, jnp.clip(mid_hi, mid_lo, hi), hi


def key_block_bounds(q_block, *, tq: int, tk: int, block_q: int, block_k: int, causal: bool,
                     window=None):
  """(lo, mid_lo, mid_hi, hi) key-block indices for query block `q_block`.

  Key blocks in [lo, hi) hold a structurally visible key for some real row of the block; all
  others are skipped. Blocks in [mid_lo, mid_hi) are fully visible and real (no mask needed).
  Positions follow `dot_product_attention`: query row r sits at r + (tk - tq).
  """
  left, right = _band(causal, masks.normalize_window(window))
  q_block = jnp.asarray(q_block, jnp.int32)
  num_k = -(-tk // block_k)
  first = q_block * block_q + (tk - tq)
  last = first + block_q - 1
  last_real = jnp.minimum(last, tk - 1)
  zero = jnp.zeros_like(q_block)
  lo = zero if left is None else jax.lax.div(jnp.maximum(first - left, 0), block_k)
  hi = zero + num_k if right is None else _cdiv(jnp.clip(last_real + right + 1, 0, tk), block_k)
  mid_lo = zero if left is None else _cdiv(jnp.maximum(last - left, 0), block_k)
  mid_hi = zero + tk // block_k if right is None else jax.lax.div(
      jnp.clip(first + right + 1, 0, tk), block_k)
  return _ordered(lo, mid_lo, mid_hi, hi)


def query_block_bounds(k_block, *, tq: int, tk: int, block_q: int, block_k: int, causal: bool,
                       window=None):
  """(lo, mid_lo, mid_hi, hi) query-block indices for key block `k_block` (see
  `key_block_bounds`): [lo, hi) see some real key of the block, [mid_lo, mid_hi) see all of it."""
  left, right = _band(causal, masks.normalize_window(window))
  k_block = jnp.asarray(k_block, jnp.int32)
  num_q = -(-tq // block_q)
  offset = tk - tq
  first = k_block * block_k
  last = first + block_k - 1
  last_real = jnp.minimum(last, tk - 1)
  zero = jnp.zeros_like(k_block)
  lo = zero if right is None else jax.lax.div(jnp.maximum(first - right - offset, 0), block_q)
  hi = zero + num_q if left is None else _cdiv(
      jnp.clip(last_real + left - offset + 1, 0, tq), block_q)
  mid_lo = zero if right is None else _cdiv(jnp.maximum(last - right - offset, 0), block_q)
  mid_hi = zero + num_q if left is None else jax.lax.div(
      jnp.maximum(first + left - offset + 1, 0), block_q)
  mid_hi = jnp.where(last < tk, mid_hi, 0)            # a block with padded keys needs the mask
  return _ordered(lo, mid_lo, mid_hi, hi)


def visited_block_pairs(cfg: _Config, by: str = "query") -> int:
  """(query block, key block) pairs one (batch, query head) computes: summed over query blocks
  of `key_block_bounds` (by="query": forward, dq) or over key blocks of `query_block_bounds`
  (by="key": dk/dv). The bounds in plain integers (the cost is known before tracing)."""
  left, right = _band(cfg.causal, cfg.window)
  tq, tk, bq, bk = cfg.tq, cfg.tk, cfg.block_q, cfg.block_k
  clip = lambda x, lo, hi: min(max(x, lo), hi)
  cdiv = lambda a, b: -(-a // b)
  total = 0
  if by == "query":
    for i in range(cdiv(tq, bq)):
      first = i * bq + (tk - tq)
      last_real = min(first + bq - 1, tk - 1)
      lo = 0 if left is None else max(first - left, 0) // bk
      hi = cdiv(tk, bk) if right is None else cdiv(clip(last_real + right + 1, 0, tk), bk)
      total += max(hi - lo, 0)
    return total
  offset = tk - tq
  for j in range(cdiv(tk, bk)):
    first = j * bk
    last_real = min(first + bk - 1, tk - 1)
    lo = 0 if right is None else max(first - right - offset, 0) // bq
    hi = cdiv(tq, bq) if left is None else cdiv(clip(last_real + left - offset + 1, 0, tq), bq)
    total += max(hi - lo, 0)
  return total


def _nbytes(x) -> int:
  return 0 if x is None else math.prod(x.shape) * jnp.dtype(x.dtype).itemsize


def _cost(kernel: str, cfg: _Config, q, k, q_ids, kv_ids, bias, mask,
          ds_bytes: int = 0) -> pl.CostEstimate:
  """The kernel's `pl.CostEstimate` (formulas in the module docstring). q [B, H, Tq_pad, D] and
  k [B, Hkv, Tk_pad, D] in kernel layout; bias/mask padded pairs as the kernel reads them."""
  b, h, tq_pad, d = q.shape
  hkv, tk_pad = k.shape[1], k.shape[2]
  bq, bk = cfg.block_q, cfg.block_k
  pairs = b * h * visited_block_pairs(cfg, "key" if kernel == "dk/dv" else "query")
  tile = bq * bk * pairs
  rows = _nbytes(q)                                 # [B, H, Tq_pad, D]: q, dO, O, dq
  stat = b * h * tq_pad * 4                         # [B, H, Tq_pad, 1] float32: LSE, delta
  kv = 2 * b * hkv * tk_pad * d * jnp.dtype(k.dtype).itemsize      # K and V, once
  ids = 0 if q_ids is None else 4 * b * (h * tq_pad + tk_pad)
  pair_bytes = 0
  for x in (bias, mask):
    if x is not None:      # a [bq, Tk_pad] (forward, dq) / [rows, bk] (dk/dv) tile per step:
      per_head = _nbytes(x) // (x.shape[0] * x.shape[1])     # all of a (batch, head) slice
      pair_bytes += per_head * b * (hkv if kernel == "dk/dv" else h)
  if kernel == "forward":
    flops, exps = 4 * d * tile, tile + bq * pairs + b * h * tq_pad
    moved = 2 * rows + kv + stat + ids + pair_bytes           # q in; O, LSE out
  elif kernel == "dq":
    flops, exps = 6 * d * tile, tile
    moved = 3 * rows + kv + 2 * stat + ids + pair_bytes + ds_bytes   # q, dO, LSE, delta; dq
  else:
    ids = 0 if q_ids is None else 4 * b * (tq_pad + hkv * tk_pad)
    flops, exps = 8 * d * tile, tile
    moved = 2 * rows + 2 * kv + 2 * stat + ids + pair_bytes   # q, dO, LSE, delta, K, V; dk, dv
  return pl.CostEstimate(flops=int(flops), transcendentals=int(exps), bytes_accessed=int(moved))


def _banded_loop(bounds, body, carry):
  """Run body(j, carry, structural) over [lo, hi), without the structural mask inside."""
  lo, mid_lo, mid_hi, hi = bounds
  carry = jax.lax.fori_loop(lo, mid_lo, functools.partial(body, structural=True), carry)
  carry = jax.lax.fori_loop(mid_lo, mid_hi, functools.partial(body, structural=False), carry)
  return jax.lax.fori_loop(mid_hi, hi, functools.partial(body, structural=True), carry)


# ------------------------------------------------------------------------------- tile math


class _Extras(NamedTuple):
  """Per-tile masking inputs (None when absent): ids [bq, 1] / [1, bk], bias/mask [bq, bk]."""
  q_ids: jax.Array | None
  kv_ids: jax.Array | None
  bias: jax.Array | None
  mask: jax.Array | None


def _dot(a, b, contract):
  return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def _block(start, size: int):
  return pl.ds(pl.multiple_of(start, size), size)


def _visible(cfg: _Config, row0, col0, structural: bool, extras: _Extras):
  """Boolean [bq, bk] visibility of a tile whose first query row / key is row0 / col0."""
  shape = (cfg.block_q, cfg.block_k)
  conds = []
  if structural:
    q_pos = row0 + (cfg.tk - cfg.tq) + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    k_pos = col0 + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    left, right = _band(cfg.causal, cfg.window)
    if right is not None:
      conds.append(k_pos <= q_pos + right)
    if left is not None:
      conds.append(k_pos >= q_pos - left)
    if cfg.tk % cfg.block_k:
      conds.append(k_pos < cfg.tk)
  if extras.q_ids is not None:
    conds.append(extras.q_ids == extras.kv_ids)
  if extras.mask is not None:
    conds.append(extras.mask != 0)
  return functools.reduce(jnp.logical_and, conds) if conds else None


def _logits(q, k, cfg: _Config, row0, col0, structural: bool, extras: _Extras):
  """Scaled float32 logits of one tile with invisible entries at -inf."""
  s = _dot(q, k, _NT) * cfg.scale
  if extras.bias is not None:
    s = s + extras.bias.astype(jnp.float32)
  visible = _visible(cfg, row0, col0, structural, extras)
  return s if visible is None else jnp.where(visible, s, -jnp.inf)


def _key_extras(q_ids, kv_ids_ref, bias_ref, mask_ref, cols):
  """Extras of one key block for kernels that hold a [bq, Tk] row block of bias/mask."""
  return _Extras(q_ids, None if kv_ids_ref is None else kv_ids_ref[:, cols],
                 None if bias_ref is None else bias_ref[:, cols],
                 None if mask_ref is None else mask_ref[:, cols])


# --------------------------------------------------------------------------------- kernels


def _forward_kernel(q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref, bias_ref, mask_ref,
                    o_ref, lse_ref, *, cfg: _Config):
  i = pl.program_id(2)
  q = q_ref[...]
  q_ids = None if q_ids_ref is None else q_ids_ref[...]

  def body(j, carry, structural):
    row_max, row_sum, acc = carry
    cols = _block(j * cfg.block_k, cfg.block_k)
    extras = _key_extras(q_ids, kv_ids_ref, bias_ref, mask_ref, cols)
    s = _logits(q, k_ref[cols, :], cfg, i * cfg.block_q, j * cfg.block_k, structural, extras)
    new_max = jnp.maximum(row_max, s.max(axis=1, keepdims=True))
    safe_max = jnp.where(new_max == -jnp.inf, 0.0, new_max)
    correction = jnp.exp(row_max - safe_max)
    p = jnp.exp(s - safe_max)
    row_sum = row_sum * correction + p.sum(axis=1, keepdims=True)
    v = v_ref[cols, :]
    acc = acc * correction + _dot(p.astype(v.dtype), v, _NN)
    return new_max, row_sum, acc

  stats = (cfg.block_q, 1)
  init = (jnp.full(stats, -jnp.inf, jnp.float32), jnp.zeros(stats, jnp.float32),
          jnp.zeros((cfg.block_q, o_ref.shape[-1]), jnp.float32))
  bounds = key_block_bounds(i, **cfg.bounds_kwargs())
  row_max, row_sum, acc = _banded_loop(bounds, body, init)
  empty = row_sum == 0.0
  safe_sum = jnp.where(empty, 1.0, row_sum)
  o_ref[...] = (acc / safe_sum).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(empty, 0.0, jnp.where(empty, 0.0, row_max) + jnp.log(safe_sum))


def _dq_kernel(q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref, bias_ref, mask_ref, do_ref,
               lse_ref, delta_ref, dq_ref, ds_ref, *, cfg: _Config):
  i = pl.program_id(2)
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
  q_ids = None if q_ids_ref is None else q_ids_ref[...]

  def body(j, dq, structural):
    cols = _block(j * cfg.block_k, cfg.block_k)
    k, v = k_ref[cols, :], v_ref[cols, :]
    extras = _key_extras(q_ids, kv_ids_ref, bias_ref, mask_ref, cols)
    p = jnp.exp(_logits(q, k, cfg, i * cfg.block_q, j * cfg.block_k, structural, extras) - lse)
    ds = p * (_dot(do, v, _NT) - delta)
    if ds_ref is not None:
      ds_ref[:, cols] = ds.astype(ds_ref.dtype)
    return dq + _dot(ds.astype(k.dtype), k, _NN)

  bounds = key_block_bounds(i, **cfg.bounds_kwargs())
  if ds_ref is not None:     # skipped blocks have a zero bias cotangent
    _zero_blocks(ds_ref, 0, bounds[0], cfg.block_k)
    _zero_blocks(ds_ref, bounds[3], cfg.padded_tk // cfg.block_k, cfg.block_k)
  dq = _banded_loop(bounds, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def _zero_blocks(ref, start, stop, block: int):
  """ref[:, blocks start..stop) = 0, one [rows, block] tile at a time."""
  def body(j, carry):
    ref[:, _block(j * block, block)] = jnp.zeros((ref.shape[0], block), ref.dtype)
    return carry
  jax.lax.fori_loop(start, stop, body, 0)


def _dkdv_kernel(q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref, bias_ref, mask_ref, do_ref,
                 lse_ref, delta_ref, dk_ref, dv_ref, *, cfg: _Config, groups: int,
                 bias_grouped: bool, mask_grouped: bool):
  """One key block of one kv head; q/do/lse/delta rows are [group * padded_tq] (head-major)."""
  j = pl.program_id(2)
  k, v = k_ref[...], v_ref[...]
  kv_ids = None if kv_ids_ref is None else kv_ids_ref[...]
  bq, tq_pad = cfg.block_q, cfg.padded_tq

  def pair_rows(ref, grouped, g, i):
    return None if ref is None else ref[_block((g if grouped else 0) * tq_pad + i * bq, bq), :]

  def body(i, carry, g, structural):
    dk, dv = carry
    rows = _block(g * tq_pad + i * bq, bq)
    q, do = q_ref[rows, :], do_ref[rows, :]
    extras = _Extras(None if q_ids_ref is None else q_ids_ref[_block(i * bq, bq), :], kv_ids,
                     pair_rows(bias_ref, bias_grouped, g, i),
                     pair_rows(mask_ref, mask_grouped, g, i))
    s = _logits(q, k, cfg, i * bq, j * cfg.block_k, structural, extras)
    p = jnp.exp(s - lse_ref[rows, :])
    dv = dv + _dot(p.astype(do.dtype), do, _TN)
    ds = p * (_dot(do, v, _NT) - delta_ref[rows, :])
    return dk + _dot(ds.astype(q.dtype), q, _TN), dv

  bounds = query_block_bounds(j, **cfg.bounds_kwargs())

  def per_query_head(g, carry):
    return _banded_loop(bounds, functools.partial(body, g=g), carry)

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = jax.lax.fori_loop(0, groups, per_query_head, (zeros, zeros))
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------- pallas_calls


def _pair_spec(x, rows: int, cols: int, index):
  """BlockSpec of a [b|1, h|1, Tq, Tk] array whose size-1 batch/head dims broadcast."""
  if x is None:
    return None
  keep_b, keep_h = x.shape[0] > 1, x.shape[1] > 1

  def index_map(b, h, blk):
    r, c = index(blk)
    return (b if keep_b else 0, h if keep_h else 0, r, c)
  return pl.BlockSpec((None, None, rows, cols), index_map)


def _query_block_specs(q, k, q_ids, kv_ids, bias, mask, cfg: _Config):
  """Specs for grid (batch, q_head, q_block): a query tile against all keys of its kv head."""
  d, tk_pad, bq = q.shape[-1], k.shape[2], cfg.block_q
  groups = q.shape[1] // k.shape[1]
  row = pl.BlockSpec((None, None, bq, d), lambda b, h, i: (b, h, i, 0))
  kv = pl.BlockSpec((None, None, tk_pad, d), lambda b, h, i: (b, jax.lax.div(h, groups), 0, 0))
  return dict(
      row=row, stat=pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0)),
      inputs=[row, kv, kv,
              None if q_ids is None else pl.BlockSpec((None, bq, 1), lambda b, h, i: (b, i, 0)),
              None if kv_ids is None else pl.BlockSpec((None, 1, tk_pad),
                                                       lambda b, h, i: (b, 0, 0)),
              _pair_spec(bias, bq, tk_pad, lambda i: (i, 0)),
              _pair_spec(mask, bq, tk_pad, lambda i: (i, 0))])


_KV_RESIDENT = (1, 2, 4)    # k, v, kv ids: the same for every query block of a head


def _forward(q, k, v, bias, mask, q_ids, kv_ids, cfg: _Config):
  b, h, tq_pad, _ = q.shape
  specs = _query_block_specs(q, k, q_ids, kv_ids, bias, mask, cfg)
  inputs = (q, k, v, q_ids, kv_ids, bias, mask)
  out_specs = [specs["row"], specs["stat"]]
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((b, h, tq_pad, 1), jnp.float32)]
  in_specs, params = _kernel_params(cfg, "forward", specs["inputs"], inputs, out_specs,
                                    out_shape, resident=_KV_RESIDENT)
  out, lse = pl.pallas_call(
      functools.partial(_forward_kernel, cfg=cfg),
      grid=(b, h, tq_pad // cfg.block_q),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=params, interpret=cfg.interpret,
      cost_estimate=_cost("forward", cfg, q, k, q_ids, kv_ids, bias, mask),
      name="jaxformer_flash_forward",
  )(*inputs)
  return out, lse


def _dq(q, k, v, bias, mask, q_ids, kv_ids, do, lse, delta, cfg: _Config):
  """(dq, dS or None): dS [B, H, Tq, Tk] float32 is the bias cotangent before broadcasting."""
  b, h, tq_pad, _ = q.shape
  specs = _query_block_specs(q, k, q_ids, kv_ids, bias, mask, cfg)
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
  out_specs = [specs["row"]]
  if bias is not None:
    out_shape.append(jax.ShapeDtypeStruct((b, h, tq_pad, k.shape[2]), jnp.float32))
    out_specs.append(pl.BlockSpec((None, None, cfg.block_q, k.shape[2]),
                                  lambda b, h, i: (b, h, i, 0)))
  in_specs = specs["inputs"] + [specs["row"], specs["stat"], specs["stat"]]
  inputs = (q, k, v, q_ids, kv_ids, bias, mask, do, lse, delta)
  in_specs, params = _kernel_params(cfg, "dq", in_specs, inputs, out_specs, out_shape,
                                    resident=_KV_RESIDENT)
  outs = pl.pallas_call(
      functools.partial(_dq_kernel, cfg=cfg) if bias is not None else
      functools.partial(_dq_kernel_without_ds, cfg=cfg),
      grid=(b, h, tq_pad // cfg.block_q),
      in_specs=in_specs,
      out_specs=out_specs, out_shape=out_shape,
      compiler_params=params, interpret=cfg.interpret,
      cost_estimate=_cost("dq", cfg, q, k, q_ids, kv_ids, bias, mask,
                          ds_bytes=0 if bias is None else math.prod(out_shape[1].shape) * 4),
      name="jaxformer_flash_dq",
  )(*inputs)
  return outs[0], (outs[1] if bias is not None else None)


def _dq_kernel_without_ds(*refs, cfg: _Config):
  _dq_kernel(*refs, None, cfg=cfg)


def _grouped_rows(x, num_kv_heads: int):
  """[B, H, T, ...] -> [B, Hkv, (H // Hkv) * T, ...]: a kv head's query heads stacked by rows."""
  b, h, t = x.shape[:3]
  return x.reshape((b, num_kv_heads, (h // num_kv_heads) * t) + x.shape[3:])


def _dkdv(q, k, v, bias, mask, q_ids, kv_ids, do, lse, delta, cfg: _Config):
  b, hkv, tk_pad, d = k.shape
  groups, bk = q.shape[1] // hkv, cfg.block_k
  rows = groups * cfg.padded_tq
  per_key_block = pl.BlockSpec((None, None, bk, d), lambda b, h, j: (b, h, j, 0))
  grouped = pl.BlockSpec((None, None, rows, d), lambda b, h, j: (b, h, 0, 0))
  grouped_stat = pl.BlockSpec((None, None, rows, 1), lambda b, h, j: (b, h, 0, 0))

  def pair(x):
    """(array, grouped, rows): per-head bias/mask are regrouped like q; head-broadcast ones
    keep their single head."""
    if x is None or x.shape[1] == 1:
      return x, False, cfg.padded_tq
    return _grouped_rows(x, hkv), True, rows

  bias, bias_grouped, bias_rows = pair(bias)
  mask, mask_grouped, mask_rows = pair(mask)
  in_specs = [
      grouped, per_key_block, per_key_block,
      None if q_ids is None else pl.BlockSpec((None, cfg.padded_tq, 1), lambda b, h, j: (b, 0, 0)),
      None if kv_ids is None else pl.BlockSpec((None, 1, bk), lambda b, h, j: (b, 0, j)),
      _pair_spec(bias, bias_rows, bk, lambda j: (0, j)),
      _pair_spec(mask, mask_rows, bk, lambda j: (0, j)),
      grouped, grouped_stat, grouped_stat]
  kernel = functools.partial(_dkdv_kernel, cfg=cfg, groups=groups, bias_grouped=bias_grouped,
                             mask_grouped=mask_grouped)
  inputs = (_grouped_rows(q, hkv), k, v, q_ids, kv_ids, bias, mask, _grouped_rows(do, hkv),
            _grouped_rows(lse, hkv), _grouped_rows(delta, hkv))
  out_specs = [per_key_block, per_key_block]
  out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
  # resident: q rows, q ids, dO rows, LSE, delta (the same for every key block)
  in_specs, params = _kernel_params(cfg, "dk/dv", in_specs, inputs, out_specs, out_shape,
                                    resident=(0, 3, 7, 8, 9))
  return pl.pallas_call(
      kernel, grid=(b, hkv, tk_pad // bk), in_specs=in_specs,
      out_specs=out_specs, out_shape=out_shape,
      compiler_params=params, interpret=cfg.interpret,
      cost_estimate=_cost("dk/dv", cfg, q, k, q_ids, kv_ids, bias, mask),
      name="jaxformer_flash_dkdv",
  )(*inputs)


# ---------------------------------------------------------------------------- custom_vjp


def _flash_bwd(cfg, residuals, d_out):
  q, k, v, bias, mask, q_ids, kv_ids, out, lse = residuals
  # delta_i = sum_j P_ij dP_ij = dO_i . O_i: one fused elementwise + reduction in XLA.
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
  args = (q, k, v, bias, mask, q_ids, kv_ids, d_out.astype(q.dtype), lse, delta)
  dq, ds = _dq(*args, cfg)
  dk, dv = _dkdv(*args, cfg)
  dbias = None if bias is None else masks.sum_to_shape(ds, bias.shape).astype(bias.dtype)
  return dq, dk, dv, dbias, None, None, None


_flash = flash_vjp(_forward, _flash_bwd)


# ------------------------------------------------------------------------------- layout


def _pad_axis(x, axis: int, size: int):
  pad = size - x.shape[axis]
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def _to_kernel_layout(x, length: int, head_dim: int):
  """[B, T, H, D] -> [B, H, length, head_dim], zero padded."""
  x = jnp.swapaxes(x, 1, 2)
  return _pad_axis(_pad_axis(x, 2, length), 3, head_dim)


def _pad_pair(x, real: tuple[int, int], padded: tuple[int, int]):
  """[b|1, h|1, Tq|1, Tk|1] -> [b|1, h|1, padded Tq, padded Tk] (broadcast, then zero pad)."""
  x = jnp.broadcast_to(x, x.shape[:2] + real)
  return _pad_axis(_pad_axis(x, 2, padded[0]), 3, padded[1])
