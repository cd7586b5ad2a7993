"""What a training config costs on a TPU slice, read from the compiler before any chip is used.

`plan` builds the train step exactly as `jaxformer.train` runs it
(`jaxformer.train.program.build_program`: the trainer's own jitted step and shardings, with
abstract arguments) for libtpu's compile-only devices of a topology (`jaxformer.plan.topology`),
compiles it (each compile cached on disk, `compile_cached`) and reads what the compiler
reports: per-chip memory (`memory_analysis`), its cost model (`estimated_cycles` of every op,
summed over the executed schedule by `jaxformer.plan.hlo`), the collectives and the matmul
FLOPs. A step that does not fit is refused by the TPU compiler itself (RESOURCE_EXHAUSTED);
its message states the bytes needed, which the plan reports.

Two step-time estimates, both labelled as estimates:
- the compiler's: its cost model's cycles for every op (`estimated_cycles`), plus the
  communication its schedule does not hide (`exposed_communication`): collectives carry no
  cycles, so each is timed at the links' bandwidth, and within each scope of the schedule (a
  loop body such as one layer, the entry computation, a branch) asynchronous collectives hide
  behind that scope's compute up to its length while synchronous ones add in full. A stated
  model, not the scheduler's exact overlap: it assumes an async collective can overlap any op
  of its scope (an upper bound on hiding) and never one of another scope (a lower bound);
- a roofline (FLOPs / peak, HBM bytes / bandwidth, collective bytes / ICI or DCN bandwidth,
  the largest of the three: perfect overlap).
The chip figures are public spec sheets (`jaxformer.accelerators`, with sources).

Custom kernels (Pallas attention) have no compiler cost: their `cost_estimate` (flops, bytes
accessed) is in the FLOP and HBM counts, and the compiler-cost-model estimate adds each kernel
at `KERNEL_EFFICIENCY` of its own roofline on this chip, max(flops / peak, bytes / HBM
bandwidth) / efficiency per execution (`kernel_summary`, `Plan.kernels`). JAX's splash
attention kernels carry no cost_estimate: they are counted from their result shapes and the
config's mask with splash's own block map (`splash_kernel_flops`), at the same efficiency.
Other kernels with no cost at all are left out, and the table says so.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re

import jax

from jaxformer import accelerators, models, paths, tpu_flags
from jaxformer.ops.pallas import splash as splash_lib
from jaxformer.plan import hlo, topology as topology_lib
from jaxformer.train import progress
from jaxformer.train.program import (CompileOutput, Program, build_program, compile_program,
                                     fingerprint, fits, gib, lower, memory)


@dataclasses.dataclass
class Plan:
  """The compiled step's costs per chip; `to_json` is the `--json` report."""
  topology: str
  slices: int
  chips: int
  chip: accelerators.Chip
  mesh: dict[str, int]
  fsdp: bool
  fits: bool
  per_chip_bytes: dict[str, int]        # params, optimizer, temp, total
  flops_per_step: dict[str, float]      # compiler (loop-aware matmuls), analytic
  collectives: dict[str, dict]
  estimated_step_seconds: float | None  # the compiler's cost model
  roofline: dict[str, float]
  mfu: dict[str, float | None]
  compile_seconds: float
  refusal: str | None = None            # the compiler's out-of-memory message
  # custom (Pallas) kernels: count (distinct), executions, flops, bytes (per step, per chip),
  # splash_flops, roofline_seconds, efficiency (+ its source), seconds (roofline_seconds /
  # efficiency: in estimated_step_seconds), uncosted (kernels with no cost at all)
  kernels: dict = dataclasses.field(default_factory=dict)
  # the compiler estimate's parts: compute_seconds (cycles + kernels), communication_seconds
  # (all collectives at link bandwidth), exposed_communication_seconds (what is not hidden)
  estimate: dict = dataclasses.field(default_factory=dict)
  # LIBTPU_INIT_ARGS the compile-only devices were created with (jaxformer.tpu_flags)
  compiler_flags: str = ""

  @property
  def hbm_bytes(self) -> int:
    return self.chip.hbm_bytes

  def to_json(self) -> dict:
    return {"topology": self.topology, "slices": self.slices, "chips": self.chips,
            "chip": dataclasses.asdict(self.chip), "mesh": self.mesh, "fsdp": self.fsdp,
            "fits": self.fits, "hbm_bytes": self.hbm_bytes,
            "per_chip_bytes": self.per_chip_bytes, "flops_per_step": self.flops_per_step,
            "collectives": self.collectives,
            "estimated_step_seconds": self.estimated_step_seconds, "roofline": self.roofline,
            "mfu": self.mfu, "compile_seconds": self.compile_seconds,
            "refusal": self.refusal, "kernels": self.kernels, "estimate": self.estimate,
            "compiler_flags": self.compiler_flags}


# The fraction of its roofline a custom kernel the compiler cannot cost (Pallas/Mosaic flash
# attention: ours, splash) is charged at: FlashAttention-2's published 50-73% of an A100's peak
# FLOP/s for attention forward + backward (Dao 2023, arXiv:2307.08691, abstract), its lower
# end. No TPU figure for splash or a Pallas flash kernel is published that we know of; the
# kernels' flops also count the recomputed QK^T twice (18 units per block pair against the
# paper's 14), so this is not optimistic.
KERNEL_EFFICIENCY = 0.5
KERNEL_EFFICIENCY_SOURCE = "FlashAttention-2's published 50-73% of peak (arXiv:2307.08691), lower end"
_SPLASH_CALL = re.compile(r"splash_(mha|mqa)_(fwd|dq|dkv)")
_FLOATS = ("bf16", "f32", "f16")        # a splash call's arrays (its int residuals aside)


def splash_kernel_flops(stats: hlo.ProgramStats, model_config) -> dict[str, float]:
  """{splash kernel call: flops per execution} for the uncosted calls of `stats` (splash has
  no cost_estimate): batch, heads, length and head_dim from the call's result (fwd/dq: the
  first [B, H, T, D] array; dk/dv: the last array, [B, Hkv, T, D] or MQA's [B, T, D], times the
  query heads per kv head), the mask from the config (decoders causal, `model.window`; other
  families counted unmasked: an upper bound), self-attention (Tq = Tk)."""
  out = {}
  cfg = None
  for name, call in stats.uncosted.items():
    kind = _SPLASH_CALL.search(name)
    arrays = [dims for dtype, dims in hlo.arrays(call["shape"]) if dtype in _FLOATS and dims]
    if kind is None or not arrays:
      continue
    if cfg is None:
      cfg = models.with_defaults(model_config)
      group = cfg["num_heads"] // (cfg.get("num_kv_heads") or cfg["num_heads"])
      causal = cfg.get("family") == "decoder"
      window = cfg.get("window")
      window = None if window is None else (window, 0) if isinstance(window, int) else \
          tuple(window)
      blocks = cfg.get("attention_block_sizes")
    if kind.group(2) == "dkv":
      shape = arrays[-1]
      b, hkv, t, d = shape if len(shape) == 4 else (shape[0], 1, *shape[1:])
      heads = hkv * group
    else:
      b, heads, t, d = next(a for a in arrays if len(a) == 4)
    out[name] = splash_lib.kernel_flops(kind.group(2), batch=b, heads=heads, tq=t, tk=t,
                                        head_dim=d, causal=causal, window=window,
                                        block_sizes=None if blocks is None else tuple(blocks))
  return out


def default_cache_dir() -> str:
  return paths.cache_dir("plans")


def cache_key(config, topology: str, slices: int, lowered) -> str:
  """What a compile depends on: the lowered program (so a change of the code that builds the
  step is a new key), the config, the topology, the compiler's versions and flags."""
  import jaxlib
  versions = [jax.__version__, jaxlib.__version__, topology_lib.libtpu_version()]
  text = json.dumps([config.to_dict(), topology, slices, versions, fingerprint(lowered)]
                    + ([flags] if (flags := tpu_flags.in_effect()) else []), sort_keys=True,
                    default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def compile_cached(program: Program, key: str, cache_dir: str | None,
                   lowered=None) -> CompileOutput:
  """`compile_program`, through a gzipped JSON file per key in `cache_dir` (None: no cache)."""
  if cache_dir is None:
    return compile_program(program, lowered)
  path = os.path.join(cache_dir, key + ".json.gz")
  if os.path.exists(path):
    with gzip.open(path, "rt") as f:
      return CompileOutput(**json.load(f))
  out = compile_program(program, lowered)
  os.makedirs(cache_dir, exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  with gzip.open(tmp, "wt") as f:
    json.dump(dataclasses.asdict(out), f)
  os.replace(tmp, path)
  return out


def plan(config, topology: str, slices: int = 1, *, settings=None,
         cache_dir: str | None = None) -> Plan:
  """Compile `config`'s train step for `slices` slices of `topology` and read its costs
  (compiles cached in `cache_dir`, if given)."""
  devices = topology_lib.devices(topology, slices)
  program = build_program(config, devices, settings)
  chip = accelerators.CHIPS[topology_lib.generation(topology)]
  lowered = lower(program)            # once: the cache key hashes it, a miss compiles it
  key = None if cache_dir is None else cache_key(config, topology, slices, lowered)
  out = compile_cached(program, key, cache_dir, lowered)
  return analyse(program, out, chip, topology=topology, slices=slices)


def analyse(program: Program, out: CompileOutput, chip: accelerators.Chip, *, topology: str,
            slices: int = 1) -> Plan:
  """The compiled program's memory, FLOPs, collectives and estimated step times per chip."""
  mesh = program.plan.mesh
  n = mesh.devices.size
  per_chip = memory(program, out)      # what the memory levers keep in host memory: "host"
  analytic = float(progress.flops_per_step(program.settings.model, program.task, program.batch, 1))
  common = dict(topology=topology, slices=slices, chips=n, chip=chip, mesh=dict(mesh.shape),
                fsdp=program.settings.mesh.fsdp, compile_seconds=out.seconds,
                compiler_flags=tpu_flags.in_effect(), per_chip_bytes=per_chip,
                fits=fits(program, out, chip.hbm_bytes))
  if out.refusal is not None:
    return Plan(**common, flops_per_step={"compiler": None, "analytic": analytic},
                collectives={}, estimated_step_seconds=None, roofline={},
                mfu={"estimate": None, "roofline": None}, refusal=out.refusal)
  stats = hlo.analyse(out.hlo, mesh)
  kernels = kernel_summary(stats, chip, splash_kernel_flops(stats, program.settings.model))
  communication = communication_seconds(stats.collectives, chip)
  compute = stats.estimated_cycles / chip.clock_hz + kernels["seconds"]
  exposed = exposed_communication(stats, chip)
  estimate = compute + exposed if compute else None
  breakdown = {"compute_seconds": compute, "communication_seconds": sum(communication.values()),
               "exposed_communication_seconds": exposed}
  matmul_flops = stats.matmul_flops + kernels["splash_flops"]
  roofline = {"compute_seconds": matmul_flops / chip.peak_flops,
              "hbm_seconds": stats.hbm_bytes / chip.hbm_bytes_per_s, **communication}
  roofline["step_seconds"] = max(roofline.values())
  peak = chip.peak_flops * n
  mfu = {"estimate": analytic / (estimate * peak) if estimate else None,
         "roofline": analytic / (roofline["step_seconds"] * peak)
         if roofline["step_seconds"] else None}
  return Plan(**common, flops_per_step={"compiler": matmul_flops * n, "analytic": analytic},
              collectives=stats.collectives, estimated_step_seconds=estimate,
              roofline=roofline, mfu=mfu, kernels=kernels, estimate=breakdown)


def kernel_summary(stats: hlo.ProgramStats, chip: accelerators.Chip,
                   splash_flops: dict[str, float] | None = None) -> dict:
  """The custom kernels of a program on `chip`: each execution at its roofline,
  max(flops / peak FLOP/s, bytes / HBM bandwidth), summed over the executions of a step
  (`roofline_seconds`), and that at `KERNEL_EFFICIENCY` (`seconds`, what the estimate adds).
  `splash_flops` ({uncosted call: flops per execution}) adds splash's kernels, compute only."""
  splash_flops = splash_flops or {}
  seconds = sum((k["executions"] * max(k["flops"] / chip.peak_flops,
                                       k["bytes"] / chip.hbm_bytes_per_s)
                 for k in stats.kernels.values()), 0.0)
  splash = sum(stats.uncosted[name]["executions"] * f for name, f in splash_flops.items())
  seconds += splash / chip.peak_flops
  executions = sum(k["executions"] for k in stats.kernels.values()) + sum(
      stats.uncosted[name]["executions"] for name in splash_flops)
  return {"count": len(stats.kernels) + len(splash_flops), "executions": int(executions),
          "flops": stats.kernel_flops + splash, "bytes": stats.kernel_bytes,
          "splash_flops": splash, "roofline_seconds": seconds,
          "efficiency": KERNEL_EFFICIENCY, "efficiency_source": KERNEL_EFFICIENCY_SOURCE,
          "seconds": seconds / KERNEL_EFFICIENCY,
          "uncosted": stats.uncosted_kernels - len(splash_flops)}


def communication_seconds(collectives: dict, chip: accelerators.Chip) -> dict[str, float]:
  """Collective time at the links' bandwidth: a ring all-gather, reduce-scatter, all-to-all
  or permute moves its bytes over one mesh axis's links once (the (n-1)/n factor taken as
  1), an all-reduce twice (a reduce-scatter then an all-gather); cross-slice transfers go
  at the chip's share of the host's DCN bandwidth."""
  ici = dcn = 0.0
  for c in collectives.values():
    if c["dcn"]:
      dcn += c["bytes"] / chip.dcn_bytes_per_s
    else:
      ici += c["bytes"] * (2 if c["kind"] == "all-reduce" else 1) / chip.ici_axis_bytes_per_s
  return {"ici_seconds": ici, "dcn_seconds": dcn}


def exposed_communication(stats: hlo.ProgramStats, chip: accelerators.Chip) -> float:
  """Seconds of communication the schedule does not hide (the overlap model of the module
  docstring): per scope, its synchronous collectives in full plus max(0, its asynchronous
  ones - its compute), each collective at the links' bandwidth as in
  `communication_seconds`."""
  exposed = 0.0
  for cycles, async_ici, sync_ici, async_dcn, sync_dcn in stats.comm_scopes:
    hideable = async_ici / chip.ici_axis_bytes_per_s + async_dcn / chip.dcn_bytes_per_s
    exposed += (sync_ici / chip.ici_axis_bytes_per_s + sync_dcn / chip.dcn_bytes_per_s
                + max(0.0, hideable - cycles / chip.clock_hz))
  return exposed


def seconds(x: float | None) -> str:
  if x is None:
    return "n/a"
  return f"{x:.3f} s" if x >= 0.1 else f"{1e3 * x:.3f} ms"


def table(p: Plan) -> str:
  """The plan as the lines the CLI prints."""
  mesh = " x ".join(f"{k}={v}" for k, v in p.mesh.items())
  c = p.chip
  b = p.per_chip_bytes
  margin = p.hbm_bytes - b["total"]
  lines = [f"{p.topology}" + (f" x {p.slices} slices" if p.slices > 1 else "")
           + f": {p.chips} chips ({c.name}), mesh {mesh}, fsdp={p.fsdp}, compiled in "
           f"{p.compile_seconds:.1f} s",
           f"memory per chip: params {gib(b['params'])} + optimizer {gib(b['optimizer'])} + "
           f"temporaries {gib(b['temp'])} = {gib(b['total'])} of {gib(p.hbm_bytes)} HBM: "
           + (("fits" if margin < 0 else f"fits ({gib(margin)} free)") if p.fits else f"does NOT fit (short by "
              f"{gib(-margin)})")]
  if b.get("host") or (p.fits and margin < 0):
    lines.append(f"host memory per chip (offloaded optimizer state / activations): "
                 f"{gib(b['host'])}; the temporaries above count host buffers too, so the fit "
                 "is the compiler's verdict (it refuses a program over HBM)")
  if p.compiler_flags:
    lines.append(f"TPU compiler flags (LIBTPU_INIT_ARGS): {tpu_flags.describe(p.compiler_flags)}")
  if p.refusal:
    lines.append(f"compiler: {p.refusal}")
    return "\n".join(lines)
  f = p.flops_per_step
  kernel_flops = " incl. Pallas kernels' estimates" if (p.kernels or {}).get("count") else ""
  lines.append(f"FLOPs per step: compiler {f['compiler']:.3e} (matmuls{kernel_flops}, all "
               f"chips), analytic "
               f"{f['analytic']:.3e} (6N + attention + readout; ratio {f['compiler'] / f['analytic']:.2f})")
  for kind, rec in sorted(p.collectives.items()):
    lines.append(f"  {kind:<28} x{rec['count']:<6} {rec['bytes'] / 2**20:10.1f} MiB per chip")
  r = p.roofline
  k = p.kernels or {}
  many = k.get("count", 0) != 1
  efficiency = k.get("efficiency", 1.0)
  with_kernels = (f" (incl. {k['count']} Pallas kernel{'s' if many else ''} at "
                  f"{100 * efficiency:.0f}% of {'their' if many else 'its'} roofline, "
                  f"{seconds(k.get('seconds', k['roofline_seconds']))}; "
                  f"{k.get('efficiency_source', 'no source')})"
                  if k.get("count") else "")
  e = p.estimate or {}
  exposed = (f" = compute {seconds(e['compute_seconds'])} + communication not hidden "
             f"{seconds(e['exposed_communication_seconds'])} of "
             f"{seconds(e['communication_seconds'])}" if e else "")
  lines.append(
      f"estimated step time (estimates, not measurements): compiler cost model "
      f"{seconds(p.estimated_step_seconds)}{exposed}{with_kernels}; roofline "
      f"{seconds(r['step_seconds'])} (compute "
      f"{seconds(r['compute_seconds'])}, HBM {seconds(r['hbm_seconds'])}, ICI "
      f"{seconds(r['ici_seconds'])}, DCN {seconds(r['dcn_seconds'])})")
  if k.get("uncosted"):
    lines.append(f"WARNING: {k['uncosted']} custom kernel(s) carry no cost (no estimated_cycles, "
                 "no cost_estimate): the step time estimates and FLOPs exclude them")
  mfu = p.mfu
  lines.append("MFU implied: " + ", ".join(
      f"{k} {'n/a' if v is None else f'{100 * v:.1f}%'}" for k, v in mfu.items()))
  lines.append(f"chip figures: {c.peak_flops / 1e12:.0f} TFLOP/s bf16, "
               f"{c.hbm_bytes_per_s / 1e9:.0f} GB/s HBM, {c.ici_bytes_per_s / 1e9:.0f} GB/s "
               f"ICI, {c.dcn_bytes_per_s / 1e9:.1f} GB/s DCN per chip, clock "
               f"{c.clock_hz / 1e9:.2f} GHz ({c.source})")
  return "\n".join(lines)

