"""The train step as a program for any devices, and the trainer's check that it fits in HBM.

`build_program` assembles the train step exactly as `jaxformer.train` runs it (the same
`run_builder.jit_train_step`, shardings from the same `ShardingPlan`), with abstract arguments in
place of the data and the train state, for any list of devices: libtpu's compile-only devices
of a topology (`jaxformer.plan.topology`) or the machine's own. `compile_program` compiles it
and keeps what the compiler says: its memory analysis and HLO text, or its out-of-memory
refusal (the TPU compiler refuses a program over HBM with RESOURCE_EXHAUSTED and states the
bytes needed). `memory` turns that into bytes per chip, `fits` compares them with HBM.

`require_fit` is the trainer's fit check on TPUs: compile the run's step before anything is
written and refuse, in one line, a step over HBM, naming the shortfall and the levers. It
lives here, with the trainer, because the planner (`jaxformer.plan`: the estimate, the search,
`python -m jaxformer.plan`) sits above `train` and builds on this module; the trainer imports
nothing of the planner. The nearest change that fits is the planner's
(`python -m jaxformer.plan ... --nearest`), since finding it compiles several programs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import time
import warnings
from typing import Any, Sequence

import jax

from jaxformer import accelerators, parallel, run_settings, tasks
from jaxformer.parallel import offload
from jaxformer.parallel.sharding import per_device_bytes
from jaxformer.state import train_state as state_lib
from jaxformer.train import config_checks, run_builder


@dataclasses.dataclass
class Program:
  """A config's train step on a device set, with abstract (ShapeDtypeStruct) arguments."""
  config: Any
  settings: run_settings.RunSettings
  task: tasks.Task
  plan: parallel.ShardingPlan
  step: parallel.CompiledStep
  state: Any                     # the train state: ShapeDtypeStructs with their shardings
  batch: dict
  key: Any

  @property
  def args(self) -> tuple:
    return self.state, self.batch, self.key


def build_program(config, devices: Sequence[Any], settings=None) -> Program:
  """The train step of `config` for `devices`, as the trainer builds it; every config error
  (mesh, divisibility, batch) is raised here, before anything compiles."""
  settings = settings or config_checks.validate(config)
  task = tasks.task_for_run(config, settings)
  plan = parallel.ShardingPlan.from_config(settings.mesh, devices)
  plan.check_batch_size(settings.train.batch_size, grad_accum=settings.optim.grad_accum)
  module, tx, init_boxed = state_lib.train_state_fns(config, settings)
  abstract = jax.eval_shape(init_boxed)
  state_shardings = run_builder.offloaded(config, settings, plan, plan.state_shardings(abstract))
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       plan.restore_target(abstract), state_shardings)   # host memory kinds
  spec = task.batch_spec(config, settings, settings.model)
  batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=plan.batch_sharding(len(shape)))
           for k, (shape, dtype) in spec.items()}
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=plan.replicated)
  step = run_builder.jit_train_step(settings, plan, module, tx, task, state_shardings,
                              {k: v.sharding for k, v in batch.items()})
  return Program(config, settings, task, plan, step, state, batch, key)


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# TPU compiler refusals: "... HLO temporaries (31.47G) exceeds available HBM (15.75G)" and
# "Used 20.51G of 15.75G hbm. Exceeded hbm capacity by 4.76G."
_OOM_PATTERNS = (
    re.compile(r"temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"),
    re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm"),
)


def parse_out_of_memory(message: str) -> tuple[int, int] | None:
  """(bytes needed, bytes available) from a TPU compiler's out-of-memory refusal, or None."""
  if "RESOURCE_EXHAUSTED" not in message:
    return None
  for pattern in _OOM_PATTERNS:
    match = pattern.search(message)
    if match:
      need, need_unit, have, have_unit = match.groups()
      return (int(float(need) * _UNITS[need_unit]), int(float(have) * _UNITS[have_unit]))
  return None


@dataclasses.dataclass
class CompileOutput:
  """What the compiler says about a program: kept (cached) whole, so that a better analysis
  re-reads it without compiling again."""
  seconds: float
  memory: dict[str, int] | None = None   # CompiledMemoryStats fields
  hlo: str | None = None                 # the optimized HLO text
  refusal: str | None = None             # an out-of-memory refusal's first line
  needed_temp_bytes: int | None = None   # from the refusal


def _compile_only(program: Program) -> bool:
  """Whether `program`'s devices are libtpu's compile-only ones (no chip behind them)."""
  client = program.plan.mesh.devices.flat[0].client
  return type(client).__name__ == "CompileOnlyPyClient"


@contextlib.contextmanager
def _cache_warnings_off(active: bool):
  """Compile-only executables cannot be read back from JAX's persistent compilation cache
  ('PjRtCompiler must be constructed with a Client'): JAX warns and compiles, which is what
  a plan wants, so its warning is not shown. (JAX decides once per process whether the cache
  is used, so it cannot be switched off here.)"""
  with warnings.catch_warnings():
    if active:
      warnings.filterwarnings("ignore", message=".*persistent compilation cache entry")
    yield


def lower(program: Program):
  """`program`'s step lowered to StableHLO (what `compile_program` compiles)."""
  with _cache_warnings_off(_compile_only(program)):
    return program.step.lower(*program.args)


def fingerprint(lowered) -> str:
  """A hash of a lowered program (StableHLO): what the compiler is given, so a cached plan
  goes stale when the code that builds the step changes, not only when the config does."""
  return hashlib.sha256(lowered.as_text().encode()).hexdigest()[:16]


def compile_program(program: Program, lowered=None) -> CompileOutput:
  """Compile `program` (from `lowered`, its `lower`, when the caller has it); an
  out-of-memory refusal is a result, any other error raises."""
  start = time.perf_counter()
  try:
    with _cache_warnings_off(_compile_only(program)):
      compiled = (lowered if lowered is not None else lower(program)).compile()
  except jax.errors.JaxRuntimeError as e:
    refused = parse_out_of_memory(str(e))
    if refused is None:
      raise
    return CompileOutput(time.perf_counter() - start, refusal=_first_line(str(e)),
                         needed_temp_bytes=refused[0])
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes", "host_temp_size_in_bytes")
  return CompileOutput(seconds, memory={f: int(getattr(memory, f, 0)) for f in fields},
                       hlo=compiled.as_text())


def memory(program: Program, out: CompileOutput) -> dict[str, int]:
  """Bytes per chip: params, optimizer (its device part), temp (the compiler's temporaries;
  a refused program: what the refusal asked for), total (arguments + outputs - donated +
  temporaries + code; refused: params + optimizer + temporaries + batch) and host (what the
  memory levers keep in host memory)."""
  host = offload.host_bytes(program.state)
  params = per_device_bytes(program.state["params"])
  optimizer = per_device_bytes(program.state["opt_state"]) - offload.host_bytes(
      program.state["opt_state"])
  if out.refusal is not None:
    total = params + optimizer + out.needed_temp_bytes + per_device_bytes(program.batch)
    return {"params": params, "optimizer": optimizer, "temp": out.needed_temp_bytes,
            "total": total, "host": host}
  m = out.memory
  total = (m["argument_size_in_bytes"] + m["output_size_in_bytes"] - m["alias_size_in_bytes"]
           + m["temp_size_in_bytes"] + m["generated_code_size_in_bytes"])
  return {"params": params, "optimizer": optimizer, "temp": m["temp_size_in_bytes"],
          "total": total, "host": host + m.get("host_temp_size_in_bytes", 0)}


def fits(program: Program, out: CompileOutput, hbm_bytes: int) -> bool:
  """Whether the compiled step fits in `hbm_bytes` per chip. With host offload the
  compiler's temporaries count host-memory buffers too (Llama-3 8B, moments offloaded: 32.79
  GiB of "temporaries" on a 31.25 GiB chip, compiled): there the verdict is the compiler's,
  which refuses any program over HBM (RESOURCE_EXHAUSTED)."""
  if out.refusal is not None:
    return False
  if run_builder.memory_levers(program.config, program.settings):
    return True
  return memory(program, out)["total"] <= hbm_bytes


LEVERS = ("model.remat_policy (e.g. 'full', or an offload_* policy), mesh.fsdp=True, a larger "
          "optim.grad_accum (smaller micro-batches), the mesh (mesh.model, mesh.expert), "
          "optim.state_dtype='bfloat16' or optim.offload_state=True")


def require_fit(config, settings, devices) -> None:
  """The trainer's check on TPU `devices` (see the module docstring): a ValueError naming
  the shortfall and the levers when the run's step does not fit in the chip's HBM. A TPU
  generation without figures (`accelerators.CHIPS`) is not checked."""
  chip = accelerators.for_device_kind(devices[0].device_kind)
  if chip is None:
    return
  program = build_program(config, devices, settings)
  out = compile_program(program)
  if fits(program, out, chip.hbm_bytes):
    return
  total = memory(program, out)["total"]
  raise ValueError(
      f"the train step needs {gib(total)} per chip but a {chip.name} has "
      f"{gib(chip.hbm_bytes)} of HBM (short by {gib(total - chip.hbm_bytes)}); lower it with "
      f"{LEVERS}; `python -m jaxformer.plan --config=... --topology=<this slice> --nearest` "
      "finds the nearest change that fits, `--search` the fastest")


def _first_line(message: str) -> str:
  return next((line.strip() for line in message.splitlines() if line.strip()), message)


def gib(n: float | None) -> str:
  return "n/a" if n is None else f"{n / 2**30:.2f} GiB"
