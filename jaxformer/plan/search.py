"""The best sharding of a config on a TPU slice: enumerate, prune cheaply, compile, rank.

The space (each dimension can be held at the config's value): mesh shapes (data, model,
expert) over the slice's chips, FSDP on/off, the remat policy, the per-chip micro-batch (the
global batch is fixed; `optim.grad_accum` splits it), the attention implementation and
layer scanning; with `optimizer` (not in the CLI's default) also the optimizer state's
dtype and host offload, and with `replica` hybrid sharding (`mesh.replica` data-parallel
replicas of an FSDP mesh: across slices, parameter gathers stay on ICI). Cheap checks
first, on abstract shapes only: the trainer's own validation and divisibility errors, and
the exact per-chip bytes of parameters, optimizer moments and gradients, which no sharding
of activations can reduce (a candidate over HBM on those alone is dropped uncompiled). The
rest are compiled best-first in worker processes: those an activation estimate expects to
fit (its error learnt from every compile so far, per remat policy), fastest first by a rough
analytic step time; the order is redone after each result, until the time budget or the
compile cap. Each compile is cached on disk under a
hash of the lowered program, config, topology and compiler versions, so a rerun is
instant. Fitting candidates are ranked by the compiler's estimated step time.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import multiprocessing
import os
import time
from typing import Any, Iterable

import jax

from jaxformer import accelerators, cli, models, parallel, run_settings, tasks
from jaxformer.layers.block_settings import REMAT_POLICIES
from jaxformer.parallel.sharding import per_device_bytes
from jaxformer.plan import estimate, topology as topology_lib
from jaxformer.state import train_state as state_lib
from jaxformer.train import config_checks, progress

DIMENSIONS = ("mesh", "fsdp", "remat", "accum", "attention", "scan", "optimizer", "replica")
# optimizer-state levers: (state dtype, offloaded to host)
OPTIMIZER_STATES = (("float32", False), ("bfloat16", False), ("bfloat16", True))
# Settings that only trade memory for time or precision: a candidate that fits without them
# makes its siblings that differ only by using them pointless to compile.
_MEMORY_LEVERS = {"optim.state_dtype": OPTIMIZER_STATES[0][0],
                  "optim.offload_state": OPTIMIZER_STATES[0][1]}
ATTENTION_IMPLS = ("xla", "pallas", "splash")     # splash refuses what it cannot do: pruned


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def set_field(config, dotted: str, value) -> None:
  """`config.<dotted> = value` on an unlocked copy's nested ConfigDict."""
  section, _, name = dotted.partition(".")
  with config.unlocked():
    config[section][name] = value


def with_overrides(config, overrides: dict[str, Any]):
  out = copy.deepcopy(config)
  for key, value in overrides.items():
    set_field(out, key, value)
  return out


def candidate_overrides(config, chips: int, dimensions: Iterable[str]) -> list[dict]:
  """Every combination of the searched dimensions' values, as `--config.*` overrides."""
  dimensions = set(dimensions)
  settings = run_settings.parse(config)
  cfg = settings.model
  fields = models.config_fields(cfg.family)
  axes: list[list[tuple[tuple[str, Any], ...]]] = []
  # hybrid sharding: R replicas of a (data, model, expert) mesh of chips / R (FSDP gathers
  # within a replica, only gradients cross replicas); R > 1 only with FSDP over data > 1
  held = settings.mesh                                        # the config's own mesh
  replicas = _divisors(chips)[:-1] if "replica" in dimensions else [held.replica]
  if "mesh" in dimensions:
    num_experts = cfg.get("num_experts") or 1
    meshes = []
    for replica in replicas:
      per = chips // replica
      for model in _divisors(per):
        for expert in _divisors(per // model):
          if expert > 1 and num_experts % expert:
            continue
          mesh = (("mesh.data", per // (model * expert)), ("mesh.model", model),
                  ("mesh.expert", expert))
          meshes.append(mesh + ((("mesh.replica", replica),) if "replica" in dimensions
                                else ()))
    axes.append(meshes)
  elif "replica" in dimensions:
    axes.append([(("mesh.replica", r),) for r in replicas])
  if "fsdp" in dimensions:
    axes.append([(("mesh.fsdp", False),), (("mesh.fsdp", True),)])
  if "remat" in dimensions and "remat_policy" in fields:
    axes.append([(("model.remat_policy", p),) for p in REMAT_POLICIES])
  if "accum" in dimensions:
    batch = settings.train.batch_size
    axes.append([(("optim.grad_accum", a),) for a in _divisors(batch) if a <= 64])
  if "attention" in dimensions and "attention_impl" in fields:
    axes.append([(("model.attention_impl", i),) for i in ATTENTION_IMPLS])
  if "optimizer" in dimensions:
    axes.append([(("optim.state_dtype", dtype), ("optim.offload_state", offload))
                 for dtype, offload in OPTIMIZER_STATES])
  if "scan" in dimensions and "scan_layers" in fields:
    axes.append([(("model.scan_layers", s),) for s in (True, False)])
  found = [dict(itertools.chain.from_iterable(combo)) for combo in itertools.product(*axes)]
  return [c for c in found if c.get("mesh.replica", held.replica) == 1 or (
      c.get("mesh.fsdp", held.fsdp) and c.get("mesh.data", 2) > 1)]


@dataclasses.dataclass
class Candidate:
  overrides: dict[str, Any]
  status: str = "pending"          # pruned | compiled | refused | skipped (budget)
  reason: str = ""
  lower_bound_bytes: int = 0       # params + optimizer + gradients per chip: exact
  rough_seconds: float = math.inf  # analytic ordering estimate, not reported as a result
  activation_bytes: float = 0.0    # analytic estimate of the rest (orders compiles)
  remat_policy: str = "none"
  plan: dict | None = None         # Plan.to_json() once compiled

  def flags(self) -> str:
    return " ".join(f"--config.{k}={cli.format_value(v)}" for k, v in self.overrides.items())

  @property
  def fits(self) -> bool:
    return bool(self.plan and self.plan["fits"])

  @property
  def seconds(self) -> float:
    if not self.plan:
      return math.inf
    est = self.plan["estimated_step_seconds"]
    return est if est is not None else self.plan["roofline"].get("step_seconds", math.inf)


def cheap_check(config, candidate: Candidate, devices, chip: accelerators.Chip,
                abstract_cache: dict) -> None:
  """Validation, divisibility and the exact lower bound on per-chip memory, no compile."""
  cfg = with_overrides(config, candidate.overrides)
  try:
    settings = config_checks.validate(cfg)
    plan = parallel.ShardingPlan.from_config(settings.mesh, devices)
    plan.check_batch_size(settings.train.batch_size)
    if settings.mesh.fsdp and plan.mesh.shape["data"] == 1:
      raise ValueError("mesh.fsdp=True shards nothing with mesh.data=1 (the same program as "
                       "mesh.fsdp=False)")
    micro = settings.train.batch_size // settings.optim.grad_accum
    if micro % plan.batch_shards:
      raise ValueError(f"the micro-batch ({micro} rows) does not split over "
                       f"{plan.batch_shards} batch shards")
    key = settings.model                      # hashable: the model's every field
    if key not in abstract_cache:
      abstract_cache[key] = jax.eval_shape(state_lib.train_state_fns(cfg, settings)[2])
    abstract = abstract_cache[key]
    state = plan.restore_target(abstract)
  except (ValueError, TypeError) as e:
    candidate.status, candidate.reason = "pruned", str(e).splitlines()[0]
    return
  params = per_device_bytes(state["params"])
  optimizer = 0 if settings.optim.offload_state else per_device_bytes(state["opt_state"])
  candidate.lower_bound_bytes = 2 * params + optimizer     # offloaded moments: host memory
  if candidate.lower_bound_bytes > chip.hbm_bytes:
    candidate.status = "pruned"
    candidate.reason = (f"parameters, gradients and optimizer alone need "
                        f"{estimate.gib(candidate.lower_bound_bytes)} per chip")
    return
  candidate.rough_seconds = _rough_seconds(cfg, settings, plan, chip, params)
  candidate.activation_bytes = _activation_bytes(cfg, settings, plan)
  candidate.remat_policy = settings.model.get("remat_policy", "none")


def _order_key(margin: "Margin", hbm_bytes: int, pace: "Pace | None" = None):
  """Compile order: the candidates expected to fit (activations scaled by the margin learnt
  from the compiles so far), fastest first by the rough estimate (scaled by the pace learnt
  so far; it does not see the memory levers), then the fewest memory levers in use."""
  pace = pace or Pace()
  return lambda c: (c.lower_bound_bytes + margin.value(c.remat_policy) * c.activation_bytes
                    > hbm_bytes, c.rough_seconds * pace.value(c),
                    _levers_used(c.overrides))


class Pace:
  """The factor between a compiled candidate's estimated step and its rough estimate, per
  gradient accumulation: the rough estimate sees neither the smaller matmuls of a
  micro-batch nor the parameter gathers FSDP repeats for each, so without this a search
  compiled a no-remat step at 4 micro-batches before any remat policy at 1 (ViT-H on
  v5e:4x4, both slower than full remat at 1). An accumulation not compiled yet takes the
  factor of the nearest one that was; 1 before any compile."""

  def __init__(self):
    self.seen: dict[int, list[float]] = {}

  @staticmethod
  def _accum(c: "Candidate") -> int:
    return int(c.overrides.get("optim.grad_accum", 1))

  def value(self, c: "Candidate") -> float:
    if not self.seen:
      return 1.0
    accum = self._accum(c)
    near = min(self.seen, key=lambda a: (abs(math.log(a / accum)), a))
    return sum(self.seen[near]) / len(self.seen[near])

  def learn(self, c: "Candidate") -> None:
    if c.fits and math.isfinite(c.rough_seconds) and c.rough_seconds > 0:
      self.seen.setdefault(self._accum(c), []).append(c.seconds / c.rough_seconds)


def _levers_used(overrides: dict[str, Any]) -> int:
  return sum(overrides.get(k, plain) != plain for k, plain in _MEMORY_LEVERS.items())


def _heavier_sibling(c: "Candidate", of: "Candidate") -> bool:
  """`c` is `of` with memory levers added: the same settings but the levers, and every lever
  `of` uses set the same way in `c`."""
  keys = set(c.overrides) | set(of.overrides)
  if any(c.overrides.get(k) != of.overrides.get(k) for k in keys - set(_MEMORY_LEVERS)):
    return False
  plain = {k: of.overrides.get(k, v) == v for k, v in _MEMORY_LEVERS.items()}
  return c.overrides != of.overrides and all(
      plain[k] or c.overrides.get(k) == of.overrides.get(k) for k in _MEMORY_LEVERS)


class Margin:
  """The factor between what compiles needed beyond the exact lower bound and the activation
  estimate, per remat policy (the estimate's error depends on what the policy saves): a prior
  until a compile of that policy, then the largest factor seen for it."""

  def __init__(self):
    self.seen: dict[str, list[float]] = {}

  def value(self, policy: str) -> float:
    seen = self.seen.get(policy)
    return max(seen) if seen else _ACTIVATION_MARGIN

  def learn(self, c: Candidate) -> None:
    if c.plan and c.activation_bytes:
      needed = c.plan["per_chip_bytes"]["total"] - c.lower_bound_bytes
      self.seen.setdefault(c.remat_policy, []).append(max(needed, 0) / c.activation_bytes)


# The compiler keeps some residuals in float32 and copies: its temporaries came out ~1.2x the
# policies' `saved` figures (layers/block_settings.py) for GPT-2 small (31.5 GiB compiled vs 27 GiB
# estimated, v5e, 16 rows/chip). A search starts from this margin and learns each policy's
# from what its compiles needed.
_ACTIVATION_MARGIN = 1.3


def _activation_bytes(cfg, settings, plan) -> float:
  """A rough per-chip activation footprint: what the ordering expects the compiler to need
  beyond the parameters, gradients and optimizer state (only orders compiles)."""
  model = settings.model
  t = plan.mesh.shape["model"]
  rows = settings.train.batch_size / (plan.batch_shards * settings.optim.grad_accum)
  seq = settings.data.seq_len or model.get("max_len") or 1
  d, layers = model.get("d_model", 1), model.get("num_layers", 1)
  heads = model.get("num_heads", 1)
  whole, split, scores = REMAT_POLICIES[model.get("remat_policy", "none")].saved
  per_token = whole * d + (split * d + scores * heads * seq) / t
  tokens = rows * seq
  vocab = model.get("vocab_size") or model.get("num_classes") or 0
  logits = tokens * vocab * 4 * 3 / t        # float32 logits, softmax, its gradient
  return layers * tokens * per_token + logits


def _rough_seconds(cfg, settings, plan, chip, param_bytes: int) -> float:
  """An analytic ordering key: compute (with the remat policy's recompute) against the
  bytes FSDP, data and tensor parallelism move. Only orders compiles; never reported."""
  model = settings.model
  task = tasks.task_for_run(cfg, settings)
  batch = {k: jax.ShapeDtypeStruct(s, d)
           for k, (s, d) in task.batch_spec(cfg, settings, model).items()}
  flops = progress.flops_per_step(model, task, batch, 1) / plan.mesh.devices.size
  flops *= REMAT_POLICIES[model.get("remat_policy", "none")].recompute
  shape = plan.mesh.shape
  accum = settings.optim.grad_accum
  moved = 0.0
  if settings.mesh.fsdp and shape["data"] > 1:
    moved += param_bytes * (shape["data"] - 1) * (2 * accum + 1) / 2   # gathers + scatter
  elif shape["data"] > 1:
    moved += 2 * param_bytes * (shape["data"] - 1) / shape["data"]      # all-reduce
  if shape["model"] > 1:
    rows = settings.train.batch_size // plan.batch_shards
    seq = settings.data.seq_len or 1
    moved += 8 * model.get("num_layers", 1) * rows * seq * model.get("d_model", 1) * 2
  return max(flops / chip.peak_flops, moved / chip.ici_bytes_per_s) + 1e-3 * accum


def compile_candidate(config, overrides: dict, topology: str, slices: int,
                      cache_dir: str | None) -> dict:
  """Worker: the plan of one candidate as JSON data (errors as a 'refused' record)."""
  try:
    return {"plan": estimate.plan(with_overrides(config, overrides), topology, slices,
                                  cache_dir=cache_dir).to_json()}
  except Exception as e:  # noqa: BLE001  (a candidate's failure is a result, not a crash)
    return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


@dataclasses.dataclass
class SearchResult:
  topology: str
  slices: int
  candidates: list[Candidate]
  seconds: float

  @property
  def ranked(self) -> list[Candidate]:
    return sorted((c for c in self.candidates if c.fits), key=lambda c: c.seconds)

  @property
  def best(self) -> Candidate | None:
    ranked = self.ranked
    return ranked[0] if ranked else None


def search(config, topology: str, slices: int = 1, *, dimensions=DIMENSIONS,
           budget_seconds: float = 1800, workers: int = 2, cache_dir: str | None = None,
           max_compiles: int | None = None, log=print) -> SearchResult:
  """Search the sharding space of `config` on `slices` x `topology` (see module docstring)."""
  start = time.perf_counter()
  devices = topology_lib.devices(topology, slices)
  chip = accelerators.CHIPS[topology_lib.generation(topology)]
  candidates = [Candidate(o) for o in candidate_overrides(config, len(devices), dimensions)]
  abstract_cache: dict = {}
  for c in candidates:
    cheap_check(config, c, devices, chip, abstract_cache)
  viable = [c for c in candidates if c.status == "pending"]
  log(f"{len(candidates)} candidates, {len(viable)} left after the cheap checks "
      f"({time.perf_counter() - start:.0f} s)")
  if viable:
    _compile_all(config, viable, topology, slices, chip, workers=workers,
                 cache_dir=cache_dir or estimate.default_cache_dir(),
                 deadline=start + budget_seconds, max_compiles=max_compiles, log=log)
  return SearchResult(topology, slices, candidates, time.perf_counter() - start)


def _quiet_worker(log_path: str) -> None:
  """A compile worker's C++ logs (libtpu, XLA) go to a file, not the search's console."""
  fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  os.dup2(fd, 2)
  os.close(fd)


def _record(candidate: Candidate, result: dict) -> None:
  if "plan" in result:
    candidate.status, candidate.plan = "compiled", result["plan"]
    if not result["plan"]["fits"]:
      candidate.reason = "does not fit"
  else:
    candidate.status, candidate.reason = "refused", result["error"]


def _compile_all(config, queue: list[Candidate], topology, slices, chip, *, workers,
                 cache_dir, deadline, max_compiles, log) -> None:
  """Compile the candidates in `workers` processes until `deadline` or `max_compiles`, always
  the best-ordered next (the order is redone after each result, with the activation margin
  learnt from it); each compile is cached in `cache_dir`, so a rerun reads it back."""
  context = multiprocessing.get_context("spawn")
  os.makedirs(cache_dir, exist_ok=True)
  worker_log = os.path.join(cache_dir, "workers.log")
  pool = context.Pool(max(1, workers), initializer=_quiet_worker, initargs=(worker_log,))
  margin, pace, launched, running = Margin(), Pace(), 0, []
  while True:
    while (queue and len(running) < max(1, workers) and time.perf_counter() < deadline
           and (max_compiles is None or launched < max_compiles)):
      queue.sort(key=_order_key(margin, chip.hbm_bytes, pace))
      # a sibling with more memory levers waits for the one in flight: it is pointless if
      # that one fits
      c = next((q for q in queue if not any(_heavier_sibling(q, r) for r, _ in running)),
               None)
      if c is None:
        break
      queue.remove(c)
      running.append((c, pool.apply_async(
          compile_candidate, (config, c.overrides, topology, slices, cache_dir))))
      launched += 1
    done = [(c, r) for c, r in running if r.ready()]
    if not running or (not done and time.perf_counter() >= deadline):
      break
    if not done:
      time.sleep(0.2)
      continue
    for c, r in done:
      running.remove((c, r))
      _record(c, r.get())
      margin.learn(c)
      pace.learn(c)
      if c.fits or c.status == "refused":   # levers cannot undo a refusal made without them
        for q in [q for q in queue if _heavier_sibling(q, c)]:
          queue.remove(q)
          q.status = "pruned"
          q.reason = (f"{c.flags()} fits without its memory levers" if c.fits
                      else f"as {c.flags()}: {c.reason}")
      log(f"  compiled {c.flags()}: {c.status}{', ' + c.reason if c.reason else ''}"
          + (f", est. step {estimate.seconds(c.seconds)}" if c.fits else ""))
  if running:
    pool.terminate()                 # compiles in flight are abandoned, not cached
  else:
    pool.close()
  pool.join()
  for c in queue + [c for c, _ in running]:
    c.status = "skipped"
    c.reason = ("time budget spent" if time.perf_counter() >= deadline
                else f"beyond max_compiles={max_compiles}")


def nearest_fitting_change(config, devices, chip: accelerators.Chip, *, topology: str,
                           slices: int = 1, refused: estimate.Plan | None = None,
                           cache_dir: str | None = None,
                           log=lambda *_: None) -> Candidate | None:
  """The smallest change to `config` that fits (`python -m jaxformer.plan --nearest`): one
  field at a time (remat policy, FSDP, gradient accumulation, the mesh), then pairs; among as
  many changes, those expected to fit first, fastest first. Planned in this process by
  `estimate.plan` (on `topology`'s devices; through `cache_dir`, so a search's compiles serve
  it and it serves a later search); `refused` (the config's own plan) calibrates the memory
  estimate, and so does each compile."""
  current = _current_values(config, devices)
  neighbours = []
  for dims in (["remat"], ["fsdp"], ["accum"], ["mesh"], ["remat", "accum"],
               ["fsdp", "remat"], ["fsdp", "accum"], ["mesh", "fsdp"]):
    for overrides in candidate_overrides(config, len(devices), dims):
      changed = {k: v for k, v in overrides.items() if current.get(k) != v}
      if changed and changed not in [n.overrides for n in neighbours]:
        neighbours.append(Candidate(changed))
  abstract_cache: dict = {}
  margin = Margin()
  if refused is not None:
    own = Candidate({}, plan=refused.to_json())
    cheap_check(config, own, devices, chip, abstract_cache)
    margin.learn(own)
  for c in neighbours:
    cheap_check(config, c, devices, chip, abstract_cache)
  viable = [c for c in neighbours if c.status == "pending"]
  while viable:
    order = _order_key(margin, chip.hbm_bytes)
    viable.sort(key=lambda c: (len(c.overrides), *order(c)))
    c = viable.pop(0)
    result = estimate.plan(with_overrides(config, c.overrides), topology, slices,
                           cache_dir=cache_dir)
    c.status, c.plan = "compiled", result.to_json()
    log(f"  tried {c.flags()}: {'fits' if result.fits else 'does not fit'}")
    if result.fits:
      return c
    margin.learn(c)
  return None


def _current_values(config, devices) -> dict[str, Any]:
  """The config's values of the searched fields, its mesh resolved on `devices` (-1 filled)."""
  settings = config_checks.validate(config)
  shape = parallel.mesh.resolve_mesh_shape(settings.mesh, devices)
  model = settings.model
  return {"mesh.data": shape[0], "mesh.model": shape[1], "mesh.expert": shape[2],
          "mesh.fsdp": settings.mesh.fsdp, "optim.grad_accum": settings.optim.grad_accum,
          **{f"model.{k}": model.get(k) for k in ("remat_policy", "attention_impl",
                                                   "scan_layers")}}


def table(result: SearchResult, top: int = 15) -> str:
  """The ranked fitting candidates, then how many were pruned, refused or skipped."""
  lines = ["| rank | overrides | per-chip GiB | est. step | roofline step | MFU (est.) | "
           "compile s |", "|---|---|---|---|---|---|---|"]
  for i, c in enumerate(result.ranked[:top], 1):
    p = c.plan
    mfu = p["mfu"]["estimate"]
    lines.append(f"| {i} | `{c.flags()}` | {p['per_chip_bytes']['total'] / 2**30:.2f} | "
                 f"{estimate.seconds(c.seconds)} | "
                 f"{estimate.seconds(p['roofline']['step_seconds'])} | "
                 f"{'n/a' if mfu is None else f'{100 * mfu:.1f}%'} | "
                 f"{p['compile_seconds']:.1f} |")
  counts: dict[str, int] = {}
  for c in result.candidates:
    key = "compiled, does not fit" if c.status == "compiled" and not c.fits else c.status
    counts[key] = counts.get(key, 0) + 1
  lines.append("")
  lines.append(", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
               + f"; {result.seconds:.0f} s in all")
  return "\n".join(lines)
