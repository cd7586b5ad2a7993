"""Multi-process (multi-host) start-up: one call, `initialize()`, before any JAX computation.

Where the process topology comes from, first match wins:
1. explicit arguments;
2. JAXFORMER_COORDINATOR / JAXFORMER_NUM_PROCESSES / JAXFORMER_PROCESS_ID (`launch/local.py`
   sets them);
3. Slurm (`srun`): coordinator = first host of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST),
   num_processes = SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), process_id = SLURM_PROCID, local
   GPUs from SLURM_LOCALID and the GPUs per task;
4. a multi-host TPU VM / pod: `jax.distributed.initialize()` detects everything itself.
Otherwise (one process) it does nothing. CPU processes talk over gloo collectives.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Mapping, Sequence

import jax

ENV_COORDINATOR = "JAXFORMER_COORDINATOR"
ENV_NUM_PROCESSES = "JAXFORMER_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXFORMER_PROCESS_ID"
_SLURM_PORT_BASE = 12_000          # + SLURM_JOB_ID % 20000: jobs sharing a node do not collide


def parse_hostlist(hostlist: str) -> list[str]:
  """Expand a Slurm hostlist: 'node[01-03,07],gpu-a[1-2]-ib' -> node01 node02 node03 node07
  gpu-a1-ib gpu-a2-ib (ranges keep their zero padding; several bracket groups multiply)."""
  hosts = []
  for entry in _split_top_level(hostlist.strip()):
    hosts += _expand(entry)
  return hosts


def _split_top_level(text: str) -> list[str]:
  """Split on commas that are not inside brackets."""
  parts, depth, current = [], 0, ""
  for char in text:
    depth += {"[": 1, "]": -1}.get(char, 0)
    if depth < 0 or depth > 1:
      raise ValueError(f"malformed Slurm hostlist {text!r}")
    if char == "," and depth == 0:
      parts.append(current)
      current = ""
    else:
      current += char
  if depth:
    raise ValueError(f"malformed Slurm hostlist {text!r}: unclosed '['")
  return [p for p in parts + [current] if p]


def _expand(entry: str) -> list[str]:
  match = re.search(r"\[([^\]]*)\]", entry)
  if match is None:
    return [entry]
  head, tail = entry[:match.start()], entry[match.end():]
  return [head + item + rest for item in _expand_ranges(match.group(1), entry)
          for rest in _expand(tail)]


def _expand_ranges(ranges: str, entry: str) -> list[str]:
  items = []
  for part in ranges.split(","):
    bounds = part.split("-")
    if len(bounds) == 1 and bounds[0].isdigit():
      items.append(bounds[0])
    elif len(bounds) == 2 and all(b.isdigit() for b in bounds) and int(bounds[0]) <= int(
        bounds[1]):
      first, last = int(bounds[0]), int(bounds[1])
      items += [str(i).zfill(len(bounds[0])) for i in range(first, last + 1)]
    else:
      raise ValueError(f"malformed Slurm hostlist entry {entry!r} (range {part!r})")
  return items


def _leading_int(value: str) -> int:
  """Slurm per-node counts look like '4' or '4(x2)'."""
  return int(re.match(r"\d+", value).group())


def slurm_local_device_ids(env: Mapping[str, str]) -> list[int] | None:
  """This task's GPU ids on its node (None: all visible devices, e.g. Slurm already bound
  CUDA_VISIBLE_DEVICES to the task's GPUs)."""
  if "SLURM_GPUS_PER_TASK" in env:
    per_task = _leading_int(env["SLURM_GPUS_PER_TASK"])
  elif "SLURM_GPUS_ON_NODE" in env and "SLURM_NTASKS_PER_NODE" in env:
    per_task = int(env["SLURM_GPUS_ON_NODE"]) // _leading_int(env["SLURM_NTASKS_PER_NODE"])
  else:
    return None
  visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
  if per_task < 1 or len(visible) == per_task:
    return None
  local = int(env.get("SLURM_LOCALID", "0"))
  return list(range(local * per_task, (local + 1) * per_task))


def slurm_topology(env: Mapping[str, str]) -> dict | None:
  """initialize() arguments for a multi-task Slurm step, or None outside one."""
  tasks = env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS"))
  nodes = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST"))
  if "SLURM_PROCID" not in env or tasks is None or nodes is None or int(tasks) < 2:
    return None
  port = _SLURM_PORT_BASE + int(env.get("SLURM_JOB_ID", "0")) % 20_000
  return dict(coordinator_address=f"{parse_hostlist(nodes)[0]}:{port}",
              num_processes=int(tasks), process_id=int(env["SLURM_PROCID"]),
              local_device_ids=slurm_local_device_ids(env))


def _is_multihost_tpu(env: Mapping[str, str]) -> bool:
  return ("MEGASCALE_COORDINATOR_ADDRESS" in env
          or "," in env.get("TPU_WORKER_HOSTNAMES", ""))


def _from_env(env: Mapping[str, str], coordinator_address, num_processes, process_id):
  """Explicit arguments, completed by JAXFORMER_* variables."""
  def pick(value, key, cast):
    if value is not None or key not in env:
      return value
    try:
      return cast(env[key])
    except ValueError as e:
      raise ValueError(f"{key}={env[key]!r} is not a valid {cast.__name__}") from e
  return (pick(coordinator_address, ENV_COORDINATOR, str),
          pick(num_processes, ENV_NUM_PROCESSES, int),
          pick(process_id, ENV_PROCESS_ID, int))


def _check(coordinator_address, num_processes, process_id):
  if num_processes < 1:
    raise ValueError(f"num_processes={num_processes} (or ${ENV_NUM_PROCESSES}) must be >= 1")
  if num_processes == 1:
    return
  if coordinator_address is None:
    raise ValueError(f"num_processes={num_processes} needs a coordinator address: pass "
                     f"coordinator_address='host:port' or set ${ENV_COORDINATOR}")
  if process_id is None or not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} (or ${ENV_PROCESS_ID}) must be in "
                     f"[0, {num_processes})")


def _use_gloo_on_cpu():
  """CPU collectives across processes (no-op where the option does not exist)."""
  if "jax_cpu_collectives_implementation" in jax.config.values:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None,
               local_device_ids: Sequence[int] | None = None) -> tuple[int, int]:
  """Join the multi-process job (see the module docstring); idempotent.

  Returns (process_index, process_count). Call before anything touches a JAX device.
  """
  if jax.distributed.is_initialized():
    return jax.process_index(), jax.process_count()
  env = os.environ
  coordinator_address, num_processes, process_id = _from_env(
      env, coordinator_address, num_processes, process_id)
  kwargs = None
  if num_processes is not None:
    _check(coordinator_address, num_processes, process_id)
    if num_processes > 1:
      kwargs = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                    process_id=process_id, local_device_ids=local_device_ids)
  elif coordinator_address is not None or process_id is not None:
    raise ValueError(f"coordinator_address/process_id given without num_processes; pass "
                     f"num_processes or set ${ENV_NUM_PROCESSES}")
  else:
    kwargs = slurm_topology(env)
    if kwargs is None and _is_multihost_tpu(env):
      kwargs = {}
  if kwargs is not None and local_device_ids is not None:
    kwargs["local_device_ids"] = local_device_ids
  if kwargs is None:
    return jax.process_index(), jax.process_count()
  _use_gloo_on_cpu()
  logging.info("jax.distributed.initialize(%s)", kwargs or "auto-detect")
  jax.distributed.initialize(**kwargs)
  _orbax_barriers_without_collectives()
  return jax.process_index(), jax.process_count()


ORBAX_BARRIER_FLAG = "experimental_orbax_use_distributed_barrier"


def _orbax_barriers_without_collectives():
  """Make Orbax's process barriers use the distributed client instead of a device collective.

  Why: Orbax's default barrier is `sync_global_devices`, a collective; with async saves it can
  run while the training thread issues the next step's collectives, and two processes that
  order them differently deadlock (Orbax documents that such collectives must not run
  concurrently). The distributed client's barrier has no such ordering and times out instead
  of hanging. Takes effect where absl flags are parsed (`python -m jaxformer.train`).
  """
  from absl import flags
  import orbax.checkpoint  # noqa: F401  (defines the flag)
  if ORBAX_BARRIER_FLAG in flags.FLAGS:
    flags.FLAGS[ORBAX_BARRIER_FLAG].value = True
