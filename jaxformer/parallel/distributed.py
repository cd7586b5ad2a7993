"""Multi-process (multi-host) start-up: one call, `initialize()`, before any JAX computation.

Where the process topology comes from, first match wins:
1. explicit arguments;
2. JAXFORMER_COORDINATOR / JAXFORMER_NUM_PROCESSES / JAXFORMER_PROCESS_ID (`launch/local.py`
   sets them);
3. Slurm (`srun`): JAX's own Slurm detection finds the coordinator, process count and id;
   the GPUs each process owns are computed here and passed explicitly
   (`slurm_local_device_ids`: JAX's default would give every task only GPU SLURM_LOCALID);
4. a multi-host TPU VM / pod: `jax.distributed.initialize()` detects everything itself.
Otherwise (one process) it does nothing. CPU processes talk over gloo collectives.
`jax.distributed.initialize` also starts JAX's preemption service, which owns SIGTERM from
then on (`preemption.StopRequest`: a stop signal to any process stops them all at one step).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Callable, Mapping, Sequence, TypeVar

import jax

T = TypeVar("T")
ENV_COORDINATOR = "JAXFORMER_COORDINATOR"
ENV_NUM_PROCESSES = "JAXFORMER_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXFORMER_PROCESS_ID"


def _per_node_counts(value: str) -> list[int]:
  """Expand Slurm's per-node counts: '4(x2),2' -> [4, 4, 2]."""
  counts = []
  for part in value.split(","):
    match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
    if match is None:
      raise ValueError(f"malformed Slurm per-node count {value!r}")
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


def _tasks_on_this_node(env: Mapping[str, str]) -> int:
  for key in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
    if key in env:
      counts = _per_node_counts(env[key])
      node = int(env.get("SLURM_NODEID", "0"))
      return counts[node] if node < len(counts) else counts[-1]
  return 1


def _visible_gpus(env: Mapping[str, str]) -> int | None:
  """How many GPUs this process can see: CUDA_VISIBLE_DEVICES (what Slurm's GPU binding sets),
  else the node's allocation, else the /dev/nvidiaN device files; None on a CPU node."""
  if env.get("CUDA_VISIBLE_DEVICES") is not None:
    return len([d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()])
  if "SLURM_GPUS_ON_NODE" in env:
    return int(env["SLURM_GPUS_ON_NODE"])
  count = len([f for f in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", f)]) \
      if os.path.isdir("/dev") else 0
  return count or None


def slurm_local_device_ids(env: Mapping[str, str]) -> list[int] | None:
  """The local GPU ids this Slurm task owns, always explicit (None only on a CPU node).

  Why explicit: given None, `jax.distributed.initialize` applies its own Slurm rule,
  `[SLURM_LOCALID]`, which gives one task per node a single GPU of eight, and a task whose
  one GPU Slurm bound (CUDA_VISIBLE_DEVICES=3, seen as device 0) a device that does not exist.
  The layouts (`python -m launch.slurm --dry_run` prints which one a job gets):
  - one task per node with N GPUs: all N;
  - k tasks per node, all GPUs visible to each: task `SLURM_LOCALID` gets its N/k consecutive ids;
  - tasks bound by Slurm (`--gpus-per-task`, CUDA_VISIBLE_DEVICES holds only the task's GPUs):
    all the task sees, [0, .., g-1].
  """
  visible = _visible_gpus(env)
  if not visible:
    return None
  tasks = _tasks_on_this_node(env)
  node_gpus = int(env.get("SLURM_GPUS_ON_NODE", visible))
  bound = env.get("CUDA_VISIBLE_DEVICES") is not None and (visible < tasks or visible < node_gpus)
  if "SLURM_GPUS_PER_TASK" in env:
    per_task = int(re.match(r"\d+", env["SLURM_GPUS_PER_TASK"].split(":")[-1]).group())
  else:
    per_task = visible if bound else visible // tasks
  if per_task < 1:
    raise ValueError(f"Slurm gives {tasks} tasks on this node but only {visible} GPUs: use at "
                     "most one task per GPU (--ntasks-per-node <= --gpus-per-node)")
  if bound or visible <= per_task:            # the task sees only its own GPUs (or one task)
    return list(range(visible))
  local = int(env.get("SLURM_LOCALID", "0"))
  if (local + 1) * per_task > visible:
    raise ValueError(f"Slurm task SLURM_LOCALID={local} with {per_task} GPUs each needs "
                     f"{(local + 1) * per_task} visible GPUs, this node shows {visible}")
  return list(range(local * per_task, (local + 1) * per_task))


def slurm_topology(env: Mapping[str, str]) -> dict | None:
  """initialize() arguments for a multi-task Slurm step (None outside one): the local GPUs
  explicitly; coordinator, process count and id are left to JAX's own Slurm detection."""
  tasks = env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS"))
  if "SLURM_PROCID" not in env or tasks is None or int(tasks) < 2:
    return None
  return dict(local_device_ids=slurm_local_device_ids(env))


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


def coordination_client():
  """The coordination service's client of `jax.distributed.initialize` (None before it):
  its key-value store and barriers work without device collectives. JAX keeps it in a
  private module, so this is the one place that reaches for it."""
  from jax._src import distributed as jax_distributed
  return getattr(jax_distributed.global_state, "client", None)


_barriers = 0


def barrier(what: str, timeout_s: float = 24 * 3600) -> None:
  """Every process waits here until all have arrived (no-op for one process), through the
  coordination service, not a device collective. Every process must make the same sequence
  of calls. A process that never arrives is the watchdog's business (it names it)."""
  global _barriers
  if jax.process_count() == 1:
    return
  _barriers += 1
  coordination_client().wait_at_barrier(
      f"jaxformer/barrier/{_barriers}/{'_'.join(what.split())}", int(timeout_s * 1000))


# How long the other processes wait for process 0's one-time work (a big corpus can take hours).
ONE_TIME_WORK_TIMEOUT_S = 24 * 3600
_one_time_calls = 0


def process_zero_first(fn: Callable[[], T], what: str) -> T:
  """`fn()` on process 0 first, then on the others once it has succeeded.

  Why: one-time work inside `fn` (preparing a dataset, training a tokenizer, writing a packed
  cache) happens once, by process 0, while the others wait; the others' `fn()` then finds it
  done and only loads it (or, on a host whose disk process 0 cannot write to, does its own
  copy). If process 0 fails, every other process stops with a one-line error naming `what`
  instead of waiting forever. One process: just `fn()`. Every process must make the same
  sequence of calls (the calls are matched by their order).
  """
  global _one_time_calls
  if jax.process_count() == 1:
    return fn()
  client = coordination_client()
  _one_time_calls += 1
  key = f"jaxformer/process_zero_first/{_one_time_calls}"
  if jax.process_index() == 0:
    try:
      result = fn()
    except BaseException as e:
      client.key_value_set(key, f"error: {type(e).__name__}: {' '.join(str(e).split())}")
      raise
    client.key_value_set(key, "ok")
    return result
  status = client.blocking_key_value_get(key, ONE_TIME_WORK_TIMEOUT_S * 1000)
  if status != "ok":
    raise ValueError(f"process 0 failed while {what} ({status.removeprefix('error: ')}); "
                     "see its output")
  return fn()
