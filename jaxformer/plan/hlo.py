"""What a compiled TPU program does per step, read from its HLO text (`compiled.as_text()`).

`analyse(text, mesh)` walks the executed schedule from the entry computation: a `while`
counts its body (and condition) times its trip count (nested loops multiply), a `call` or an
async wrapper counts its computation once, a `fusion` is costed as one op but its fused
computation is searched for dots and collectives (TPU fusions hold both: matmuls become
`convolution`s in `kOutput` fusions, and collectives sit in async collective fusions).
A `conditional` counts ONE branch, the most expensive by estimated cycles: the train step's
`lax.cond(finite, update, skip)` normally runs the update, so the plan is for the normal step.

What is counted (per device, per execution of the program):
- `estimated_cycles`: the compiler's own cost of every top-level op that carries one in its
  backend_config (fusions, copies, ...; collectives carry none: their time is the roofline's
  communication term), loops multiplied out. Divide by `chips.Chip.clock_hz` for seconds.
- `matmul_flops`: 2 x output elements x contracted size of every dot and convolution in any
  executed computation, fused ones included. Convolutions count only the taps that land on
  real input, not on padding (TPU lowers some dots to padded convolutions). Unlike
  `compiled.cost_analysis()["flops"]`, loop bodies are multiplied by their trip counts.
- `hbm_bytes`: bytes of the operands and results of every top-level op (fusions, copies,
  custom-calls, dots, ...), not of parameters, tuples, get-tuple-elements, bitcasts,
  constants, control flow or collectives, and only of arrays in HBM: arrays the compiler
  placed in another memory space (`S(1)`, on-chip VMEM, in the layout) are left out. An
  approximation of the HBM term of a roofline: it ignores layout padding and assumes each op
  streams its operands once. A custom call that carries a `cost_estimate` (a Pallas kernel:
  `pl.pallas_call(..., cost_estimate=...)`) counts its `bytes_accessed` instead.
- Custom kernels (`tpu_custom_call`: Pallas/Mosaic) carry no `estimated_cycles` and their
  matmuls are not HLO dots. Their `cost_estimate` (the kernel author's count) is read:
  `kernel_flops` / `kernel_bytes` are its flops / bytes_accessed, loops multiplied out, and
  are included in `matmul_flops` / `hbm_bytes`; `kernels` lists them per instruction (with
  executions per step) so that a chip's figures turn them into time (a roofline per kernel,
  `jaxformer.plan.estimate`). `uncosted_kernels` counts the top-level custom calls (fused ones are
  costed with their fusion) that do work and carry neither `estimated_cycles` nor a
  `cost_estimate`: their time is in no total; `uncosted` lists them (executions per step,
  result shape) for a caller that knows a kernel by name (splash attention: the planner).
- `collectives`: per kind and mesh axes, the number of executions and the bytes each device
  moves: all-gather its result (operand x group size), reduce-scatter / all-reduce /
  all-to-all / collective-permute their operand, ragged-all-to-all the smaller of its input
  and output buffers (an upper bound: the sizes are only known at run time). An async
  -start/-done pair counts once, an all-reduce in an `all-reduce-scatter` fusion is a reduce-scatter, and the pieces of one
  collective spread over several async collective fusions (same channel_id) count once. A
  group's ids are positions in `mesh.devices.flat` (checked by the tests); its axes are the
  mesh axes along which its members' coordinates differ.
- `comm_scopes`, the input of the planner's overlap model: the executed schedule cut into
  scopes (the entry computation, each loop body and condition, the branch taken, each call),
  each with its own ops' estimated cycles and the bytes of its collectives, split into
  asynchronous ones (a `-start`/`-done` pair, a collective inside an async collective fusion
  or wrapper: they run beside the scope's other ops) and synchronous ones (a bare collective
  op in the scope's schedule: nothing runs beside it), over ICI and DCN; an all-reduce's ICI
  bytes count twice (a ring's reduce-scatter and all-gather). Counted per piece, before the
  channel deduplication of `collectives`.
- Multi-slice programs (devices with several `slice_index`es) are one SPMD program per
  slice: replica groups number the devices of one slice (in mesh order) and stay on ICI, and
  the collectives across slices are host `send`s to the megascale runtime (DCN), recorded
  with `dcn=True` over the mesh axes along which the slice changes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "collective-permute", "ragged-all-to-all", "collective-broadcast")
_DTYPE_BYTES = {"pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1,
                "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "token": 0}
_NO_HBM = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "while",
           "conditional", "call", "after-all", "partition-id", "replica-id", "opt-barrier",
           "add-dependency", "async-done", "async-update"}

_INSTR = re.compile(r"\s+(?:ROOT )?%([^\s=]+) = (.*?) ([a-z][a-z0-9_-]*)\((.*)$")
_HEADER = re.compile(r"(?:ENTRY )?%([^\s(]+)")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,<=]*)\](?:\{([^}]*)\})?")
_NAME = re.compile(r"%([^\s,)}]+)")
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_COST_ESTIMATE = re.compile(r'"cost_estimate":\{([^}]*)\}')
_COST_FIELD = re.compile(r'"(\w+)":"?(\d+(?:\.\d+)?)"?')
# custom calls that do no work of their own (buffers, annotations, index bookkeeping)
_NO_WORK_TARGETS = ("AllocateBuffer", "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
                    "MoveToHost", "MoveToDevice", "annotate_device_placement",
                    "AssumeGatherIndicesInBound", "ConcatBitcast",
                    "GatherScatterIndicesBitpacked",
                    # async wrappers: the collective they start is counted where it is
                    "AsyncCollectiveStart", "AsyncCollectiveDone", "PrepareAsyncCallStart",
                    "PrepareAsyncCallDone")


@dataclasses.dataclass(frozen=True)
class ProgramStats:
  """Per device, per execution of the program (see the module docstring)."""
  collectives: dict        # "all-gather over fsdp" -> {kind, axes, dcn, count, bytes}
  estimated_cycles: int
  matmul_flops: float
  hbm_bytes: float
  loops: list              # [(while instruction, trip count or None if not found)]
  kernel_flops: float = 0.0     # custom kernels' cost_estimate flops (within matmul_flops)
  kernel_bytes: float = 0.0     # their bytes_accessed (within hbm_bytes)
  kernel_transcendentals: float = 0.0
  # custom-call instruction -> {"target", "executions" (per step), "flops", "bytes",
  # "transcendentals" (per execution)}
  kernels: dict = dataclasses.field(default_factory=dict)
  uncosted_kernels: int = 0     # custom calls with neither estimated_cycles nor a cost_estimate
  # those calls: instruction -> {"executions" (per step), "shape" (its result's HLO shape
  # text)}, for a caller that can cost a known kernel by name (splash: `plan.estimate`)
  uncosted: dict = dataclasses.field(default_factory=dict)
  # the overlap model's input: one (estimated cycles, async ICI bytes, sync ICI bytes, async
  # DCN bytes, sync DCN bytes) per executed scope, loops multiplied out (module docstring)
  comm_scopes: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Instr:
  name: str
  shape: str
  op: str
  operands: str            # the text inside the parentheses
  attrs: str               # everything after them
  root: bool


def analyse(hlo_text: str, mesh) -> ProgramStats:
  """The statistics of the compiled program `hlo_text` whose devices are laid out as `mesh`
  (a jax.sharding.Mesh: `mesh.devices`, `mesh.axis_names`)."""
  module = _Module(hlo_text)
  groups = _Groups(mesh)
  totals = module.stats(module.entry, False, groups, scope=True)
  channels = {}
  for (kind, axes, dcn, channel, name), (count, moved) in totals.collectives.items():
    best = channels.get((kind, axes, dcn, channel))
    if best is None or count < best[0]:
      channels[(kind, axes, dcn, channel)] = (count, moved, name)
  counted = {(*key, name) for key, (_, _, name) in channels.items()}
  comm_scopes = []
  for cycles, comm in totals.scopes:              # the counted pieces only, as `collectives`
    parts = [0.0] * 4
    for piece, (moved, sync) in comm.items():
      if piece in counted:
        parts[2 * piece[2] + sync] += moved
    comm_scopes.append((cycles, *parts))
  collectives = {}
  for (kind, axes, dcn, _), (count, moved, _) in sorted(channels.items()):
    key = f"{kind} over {'+'.join(axes) or 'no axis'}" + (" (dcn)" if dcn else "")
    record = collectives.setdefault(key, {"kind": kind, "axes": axes, "dcn": dcn, "count": 0,
                                          "bytes": 0})
    record["count"] += int(count)
    record["bytes"] += int(moved)
  kernels = {name: {"target": target, "executions": count, "flops": flops, "bytes": moved,
                    "transcendentals": transcendentals}
             for name, (count, target, flops, moved, transcendentals)
             in sorted(totals.kernels.items())}
  return ProgramStats(
      collectives=collectives, estimated_cycles=int(totals.cycles),
      matmul_flops=float(totals.flops), hbm_bytes=float(totals.hbm),
      loops=list(totals.loops.items()),
      kernel_flops=float(sum(k["executions"] * k["flops"] for k in kernels.values())),
      kernel_bytes=float(sum(k["executions"] * k["bytes"] for k in kernels.values())),
      kernel_transcendentals=float(sum(k["executions"] * k["transcendentals"]
                                       for k in kernels.values())),
      kernels=kernels, uncosted_kernels=len(totals.uncosted),
      uncosted={name: {"executions": count, "shape": shape}
                for name, (count, shape) in sorted(totals.uncosted.items())},
      comm_scopes=comm_scopes)


@dataclasses.dataclass
class _Totals:
  cycles: float = 0.0
  flops: float = 0.0
  hbm: float = 0.0
  collectives: dict = dataclasses.field(default_factory=dict)   # (kind, axes, dcn) -> [n, B]
  loops: dict = dataclasses.field(default_factory=dict)
  own_cycles: float = 0.0       # cycles of this scope's own ops (not of nested scopes)
  # this scope's collectives so far: piece (the key of `collectives`) -> [bytes moved over
  # the links, synchronous]
  comm: dict = dataclasses.field(default_factory=dict)
  scopes: list = dataclasses.field(default_factory=list)     # closed: (own cycles, comm)
  # custom call -> [executions, target, flops, bytes, transcendentals] (cost per execution)
  kernels: dict = dataclasses.field(default_factory=dict)
  # custom calls with no cost at all: name -> [executions, result shape]
  uncosted: dict = dataclasses.field(default_factory=dict)

  def add(self, other: _Totals, times: float, *, fused: bool = False) -> None:
    if not fused:
      self.cycles += other.cycles * times
      self.hbm += other.hbm * times
      self.own_cycles += other.own_cycles * times    # zero for a closed scope
    for piece, (moved, sync) in other.comm.items():
      self.comm.setdefault(piece, [0.0, sync])[0] += moved * times
    self.scopes.extend((cycles * times, {piece: (moved * times, sync)
                                         for piece, (moved, sync) in comm.items()})
                       for cycles, comm in other.scopes)
    self.flops += other.flops * times
    for name, record in other.kernels.items():
      mine = self.kernels.setdefault(name, [0] + record[1:])
      mine[0] += record[0] * times
    for name, (count, shape) in other.uncosted.items():
      self.uncosted.setdefault(name, [0, shape])[0] += count * times
    for key, (count, moved) in other.collectives.items():
      record = self.collectives.setdefault(key, [0, 0])
      record[0] += count * times
      record[1] += moved * times
    for name, trip in other.loops.items():
      self.loops.setdefault(name, trip)


class _Module:
  """The computations of an HLO module, parsed in one linear pass over the lines."""

  def __init__(self, text: str):
    self.computations: dict[str, list[_Instr]] = {}
    self.instrs: dict[str, _Instr] = {}
    self.entry = None
    current = None
    for line in text.splitlines():
      if not line or line[0] == "}":
        continue
      if line[0] == " ":
        if current is None:
          continue
        match = _INSTR.match(line)
        if match:
          name, shape, op, rest = match.groups()
          close = rest.find(")")
          instr = _Instr(name, shape, op, rest[:close], rest[close + 1:],
                         line.lstrip().startswith("ROOT "))
          current.append(instr)
          self.instrs[name] = instr
      elif line[0] == "%" or line.startswith("ENTRY "):
        header = _HEADER.match(line)
        if header and line.rstrip().endswith("{"):
          current = self.computations.setdefault(header.group(1), [])
          if line.startswith("ENTRY "):
            self.entry = header.group(1)
      else:
        current = None if line.startswith(("HloModule", "FileNames", "FunctionNames",
                                           "FileLocations", "StackFrames")) else current
    if self.entry is None:
      raise ValueError("no ENTRY computation in the HLO text (is it compiled.as_text()?)")
    self._memo: dict = {}
    self._users_memo: dict = {}
    self._read_memo: dict = {}

  def stats(self, computation: str, fused: bool, groups: _Groups, scope: bool = False
            ) -> _Totals:
    """The totals of one execution of `computation`; `scope`: it is a unit of the overlap
    model (the entry, a loop body or condition, a branch, a call), whose collectives can
    hide only behind its own ops."""
    key = (computation, fused, scope)
    if key not in self._memo:
      self._memo[key] = None                      # a cycle in the call graph counts 0
      self._memo[key] = self._stats(computation, fused, groups, scope)
    return self._memo[key] or _Totals()

  def _stats(self, computation: str, fused: bool, groups: _Groups, scope: bool) -> _Totals:
    totals = _Totals()
    for instr in self.computations.get(computation, ()):
      op, attrs = instr.op, instr.attrs
      if not fused and "estimated_cycles" in attrs:
        cycles = _CYCLES.search(attrs)
        totals.cycles += int(cycles.group(1)) if cycles else 0
        totals.own_cycles += int(cycles.group(1)) if cycles else 0
      if op in ("dot", "convolution"):
        try:
          totals.flops += self._dot_flops(instr) if op == "dot" else self._conv_flops(instr)
        except (ValueError, IndexError, KeyError):   # a form not understood: counts 0
          pass
      cost = _cost_estimate(attrs) if op == "custom-call" and "estimated_cycles" not in attrs \
          else None                               # (a compiler-costed call keeps its cycles)
      if cost is not None:
        flops, moved = cost.get("flops", 0.0), cost.get("bytes_accessed", 0.0)
        target = re.search(r'custom_call_target="([^"]*)"', attrs)
        totals.kernels[instr.name] = [1, target.group(1) if target else "?", flops, moved,
                                      cost.get("transcendentals", 0.0)]
        totals.flops += flops
        if not fused:
          totals.hbm += moved
      elif (op == "custom-call" and not fused and "estimated_cycles" not in attrs
            and not any(f'custom_call_target="{t}"' in attrs for t in _NO_WORK_TARGETS)):
        totals.uncosted[instr.name] = [1, instr.shape]
      kind = _collective_kind(op, computation)
      if kind:
        # synchronous: a bare collective op in the scope's own schedule; one in an async
        # wrapper or fusion, or a -start, runs beside the scope's other ops
        self._collective(instr, kind, groups, totals,
                         sync=scope and not op.endswith("-start"))
      elif op == "send" and "_xla_megascale_transfer_type" in attrs:
        self._dcn_collective(instr, groups, totals)
      elif (not fused and cost is None and op not in _NO_HBM
            and not op.endswith(("-done", "-update"))):
        totals.hbm += self._hbm_traffic(instr)
      self._descend(instr, fused, groups, totals)
    if scope:                                     # close it: (cycles, its communication)
      totals.scopes.append((totals.own_cycles, totals.comm))
      totals.own_cycles, totals.comm = 0.0, {}
    return totals

  def _descend(self, instr: _Instr, fused: bool, groups: _Groups, totals: _Totals) -> None:
    op, attrs = instr.op, instr.attrs
    if op == "while":
      body, condition = _attr_name(attrs, "body"), _attr_name(attrs, "condition")
      trip = self._trip_count(instr, condition)
      totals.loops.setdefault(instr.name, trip)
      trip = 1 if trip is None else trip
      totals.add(self.stats(body, fused, groups, not fused), trip)
      totals.add(self.stats(condition, fused, groups, not fused), trip + 1)
    elif op == "conditional":
      branches = _branches(attrs)
      if branches:
        costs = [self.stats(b, fused, groups, not fused) for b in branches]
        totals.add(max(costs, key=lambda t: (t.cycles, t.flops, t.hbm)), 1)
    elif op == "fusion":
      totals.add(self.stats(_attr_name(attrs, "calls"), True, groups), 1, fused=True)
    elif op == "call":
      callee = _attr_name(attrs, "to_apply") or _attr_name(attrs, "calls")
      totals.add(self.stats(callee, fused, groups, not fused), 1, fused=fused)
    elif "calls=" in attrs:                       # async-start and other wrappers
      totals.add(self.stats(_attr_name(attrs, "calls"), fused, groups), 1, fused=fused)
    elif op == "custom-call" and "called_computations=" in attrs:
      for callee in _names(attrs.split("called_computations=", 1)[1].split("}", 1)[0]):
        totals.add(self.stats(callee, True, groups), 1, fused=True)

  # -- HBM traffic -------------------------------------------------------------------------

  def _hbm_traffic(self, instr: _Instr) -> float:
    """HBM bytes one top-level op reads and writes. In-place and sliced accesses count what
    they touch: a fusion whose parameter is only dynamic-sliced reads the slices, one that
    dynamic-update-slices a buffer reads nothing of it and writes the update (a scanned
    model's stacked weights and saved activations are touched one layer per iteration)."""
    op = instr.op
    operands = [n for n in _names(instr.operands) if n in self.instrs]
    if op == "custom-call" and 'custom_call_target="AllocateBuffer"' in instr.attrs:
      return 0.0
    if op == "dynamic-slice":
      return 2 * _hbm_bytes(instr.shape) if operands and _hbm_bytes(
          self.instrs[operands[0]].shape) else _hbm_bytes(instr.shape)
    if op == "dynamic-update-slice" and len(operands) > 1:
      return 2 * _bytes(self.instrs[operands[1]].shape) if _hbm_bytes(instr.shape) else 0.0
    if op != "fusion":
      total = sum(_hbm_bytes(self.instrs[n].shape) for n in operands)
      return total if op.endswith("-start") else total + _hbm_bytes(instr.shape)
    callee = _attr_name(instr.attrs, "calls") or ""
    total = 0.0
    for index, name in enumerate(operands):
      outer = _hbm_bytes(self.instrs[name].shape)
      if outer:
        read = self._param_read(callee, index)
        total += outer if read is None else min(outer, read)
    root = self._root(callee)
    outputs = _names(root.operands) if root is not None and root.op == "tuple" else \
        ([root.name] if root is not None else [])
    shapes = _tuple_elements(instr.shape) if instr.shape.startswith("(") else [instr.shape]
    if len(outputs) != len(shapes):
      return total + _hbm_bytes(instr.shape)
    for name, shape in zip(outputs, shapes):
      if _hbm_bytes(shape):
        written = self._written(name)
        total += _hbm_bytes(shape) if written is None else written
    return total

  def _root(self, computation: str) -> _Instr | None:
    return next((i for i in self.computations.get(computation, ()) if i.root), None)

  def _users(self, computation: str) -> tuple[dict, dict]:
    if computation in self._users_memo:
      return self._users_memo[computation]
    params, users = {}, {}
    for i in self.computations.get(computation, ()):
      if i.op == "parameter":
        params[int(i.operands)] = i.name
      for n in _names(i.operands):
        users.setdefault(n, []).append(i)
    self._users_memo[computation] = params, users
    return params, users

  def _param_read(self, computation: str, index: int) -> float | None:
    """Bytes a fused computation reads of its parameter `index` when it only slices it
    (dynamic-slice, slice, gather) or updates it in place (dynamic-update-slice), through
    bitcasts and nested fusions; None when it reads it some other way (all of it)."""
    if (computation, index) not in self._read_memo:
      self._read_memo[computation, index] = self._param_read_uncached(computation, index)
    return self._read_memo[computation, index]

  def _param_read_uncached(self, computation: str, index: int) -> float | None:
    params, users = self._users(computation)
    if index not in params:
      return None
    total, stack = 0.0, [params[index]]
    while stack:
      current = stack.pop()
      for user in users.get(current, ()):
        names = _names(user.operands)
        first = names[0] if names else None
        if user.op in ("bitcast", "reshape"):
          stack.append(user.name)
        elif user.op in ("dynamic-slice", "slice", "gather") and first == current:
          total += _bytes(user.shape)
        elif user.op == "dynamic-update-slice" and first == current:
          pass                                  # the buffer is updated in place
        elif user.op == "fusion":
          nested = _attr_name(user.attrs, "calls") or ""
          for position, name in enumerate(names):
            if name == current:
              read = self._param_read(nested, position)
              if read is None:
                return None
              total += read
        else:
          return None
    return total

  def _written(self, name: str) -> float | None:
    """Bytes a fusion output really writes when it is an in-place dynamic-update-slice
    (through bitcasts and nested fusions): the update's; None otherwise."""
    for _ in range(8):
      instr = self.instrs.get(name)
      if instr is None:
        return None
      if instr.op in ("bitcast", "reshape"):
        name = (_names(instr.operands) or [""])[0]
        continue
      if instr.op == "fusion":
        root = self._root(_attr_name(instr.attrs, "calls") or "")
        if root is None or root.op == "tuple":
          return None
        name = root.name
        continue
      if instr.op == "dynamic-update-slice":
        operands = _names(instr.operands)
        return _bytes(self.instrs[operands[1]].shape) if len(operands) > 1 \
            and operands[1] in self.instrs else None
      return None
    return None

  # -- collectives -------------------------------------------------------------------------

  def _collective(self, instr: _Instr, kind: str, groups: _Groups, totals: _Totals, *,
                  sync: bool = False) -> None:
    operands = [n for n in _names(instr.operands) if n in self.instrs]
    if kind == "ragged-all-to-all":
      # (input, output, offsets and sizes): a device sends at most its input and receives at
      # most its output, and all devices together send what they receive, so per device (the
      # plan's average) the smaller of the two buffers bounds it, e.g. the return trip of a
      # dropless MoE exchange sends from a worst-case [S * m] buffer into an [m] one
      operands = [min(operands[:2], key=lambda n: _bytes(self.instrs[n].shape))]
    moved = sum(_bytes(self.instrs[n].shape) for n in operands)
    axes, dcn, size = groups.of(instr)
    if kind == "all-gather":
      moved *= size
    # pieces of one collective that the scheduler spread over several async collective
    # fusions (some in a loop body, overlapping the loop) share its channel_id: the logical
    # collective runs as often as its least frequent piece (see `analyse`)
    channel = re.search(r"channel_id=(\d+)", instr.attrs)
    # (JAX lowers every all_to_all / ragged_all_to_all of a program with channel_id=1: each
    # is its own collective)
    if kind in ("all-to-all", "ragged-all-to-all"):
      channel = None
    piece = (kind, axes, dcn, channel.group(1) if channel else instr.name, instr.name)
    record = totals.collectives.setdefault(piece, [0, 0])
    record[0] += 1
    record[1] += moved
    # a ring all-reduce crosses the links twice (reduce-scatter, then all-gather)
    link_bytes = moved * (2 if kind == "all-reduce" and not dcn else 1)
    totals.comm.setdefault(piece, [0.0, sync])[0] += link_bytes

  def _dcn_collective(self, instr: _Instr, groups: _Groups, totals: _Totals) -> None:
    """A multi-slice program's collective across slices: a host `send` to the megascale
    runtime (its `_xla_megascale_transfer_type` says which collective; the matching `recv`
    is not counted again). It crosses the mesh axes along which the slices change."""
    kind = re.search(r'_xla_megascale_transfer_type="([A-Z_]+)"', instr.attrs).group(1)
    kind = kind.lower().replace("_", "-")
    operands = [n for n in _names(instr.operands) if n in self.instrs]
    moved = _bytes(self.instrs[operands[0]].shape) if operands else 0
    piece = (kind, groups.slice_axes, True, instr.name, instr.name)
    record = totals.collectives.setdefault(piece, [0, 0])
    record[0] += 1
    record[1] += moved
    totals.comm.setdefault(piece, [0.0, False])[0] += moved   # host transfers: async

  # -- FLOPs -------------------------------------------------------------------------------

  def _dot_flops(self, instr: _Instr) -> float:
    operands = _names(instr.operands)
    lhs = self.instrs.get(operands[0]) if operands else None
    if lhs is None:
      return 0.0
    dims = _dims(lhs.shape)
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.attrs)
    size = math.prod(dims[int(i)] for i in contracting.group(1).split(",") if i) \
        if contracting else 1
    return 2.0 * math.prod(_dims(instr.shape)) * size

  def _conv_flops(self, instr: _Instr) -> float:
    operands = _names(instr.operands)
    labels = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", instr.attrs)
    if len(operands) < 2 or labels is None or operands[1] not in self.instrs:
      return 0.0
    lhs_labels, rhs_labels, out_labels = labels.groups()
    lhs, rhs = _dims(self.instrs[operands[0]].shape), _dims(self.instrs[operands[1]].shape)
    out = _dims(instr.shape)
    window = re.search(r"window=\{([^}]*)\}", instr.attrs)
    window = dict(part.split("=", 1) for part in window.group(1).split()) if window else {}
    macs = out[out_labels.index("b")] * out[out_labels.index("f")] * rhs[rhs_labels.index("i")]
    spatial = sorted(c for c in out_labels if c.isdigit())
    for d, label in enumerate(spatial):
      def field(name, default, d=d):
        values = window.get(name)
        return values.split("x")[d] if values else default
      size, stride = int(field("size", "1")), int(field("stride", "1"))
      low = int(field("pad", "0_0").split("_")[0])
      lhs_dilate, rhs_dilate = int(field("lhs_dilate", "1")), int(field("rhs_dilate", "1"))
      macs *= _valid_taps(out[out_labels.index(label)], lhs[lhs_labels.index(label)], size,
                          stride, low, lhs_dilate, rhs_dilate)
    return 2.0 * macs

  # -- loops -------------------------------------------------------------------------------

  def _trip_count(self, instr: _Instr, condition: str | None) -> int | None:
    known = _TRIP.search(instr.attrs)
    if known:
      return int(known.group(1))
    body = self.computations.get(condition or "", ())
    root = next((i for i in body if i.root), None)
    if root is None:
      return None
    if root.op == "fusion":                       # compare fused with its operands
      inner = self.computations.get(_attr_name(root.attrs, "calls") or "", ())
      fused_root = next((i for i in inner if i.root), None)
      if fused_root is None or fused_root.op != "compare":
        return None
      params = {i.name: int(i.operands) for i in inner if i.op == "parameter"}
      outer = _names(root.operands)
      sides = [self._resolve(n, params, outer) for n in _names(fused_root.operands)]
      compare = fused_root
    elif root.op == "compare":
      sides = [self._resolve(n) for n in _names(root.operands)]
      compare = root
    else:
      return None
    direction = re.search(r"direction=([A-Z]+)", compare.attrs)
    if len(sides) != 2 or direction is None:
      return None
    direction = direction.group(1)
    if sides[0][0] == "const" and sides[1][0] == "counter":
      sides.reverse()
      direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
    if sides[0][0] != "counter" or sides[1][0] != "const":
      return None
    start = self._initial(instr, sides[0][1])
    bound = sides[1][1]
    trip = {"LT": bound - start, "LE": bound - start + 1, "GT": start - bound,
            "GE": start - bound + 1, "NE": abs(bound - start)}.get(direction)
    return None if trip is None else max(int(trip), 0)

  def _resolve(self, name: str, params: dict | None = None, outer: list | None = None):
    """("const", value) | ("counter", tuple index) | ("?", None) for a loop condition's
    compare operand, through copies and converts (and a fusion's parameters)."""
    for _ in range(16):
      instr = self.instrs.get(name)
      if instr is None:
        return ("?", None)
      if params is not None and instr.op == "parameter" and name in params:
        index = params[name]
        if outer is None or index >= len(outer):
          return ("?", None)
        name, params, outer = outer[index], None, None
        continue
      if instr.op == "constant":
        return ("const", _number(instr.operands))
      if instr.op == "get-tuple-element":
        index = re.search(r"index=(\d+)", instr.attrs)
        return ("counter", int(index.group(1))) if index else ("?", None)
      if instr.op in ("copy", "convert", "bitcast", "reshape") and instr.operands:
        name = _names(instr.operands)[0]
        continue
      return ("?", None)
    return ("?", None)

  def _initial(self, instr: _Instr, index: int) -> float:
    """The loop counter's initial value: element `index` of the while's init tuple when it
    is a constant (through copies), else 0."""
    operands = _names(instr.operands)
    init = self.instrs.get(operands[0]) if operands else None
    if init is None or init.op != "tuple":
      return 0
    elements = _names(init.operands)
    if index >= len(elements):
      return 0
    kind, value = self._resolve(elements[index])
    return value if kind == "const" and value is not None else 0


class _Groups:
  """Replica groups -> (mesh axes crossed, crosses slices, group size), cached per text."""

  def __init__(self, mesh):
    devices = np.asarray(mesh.devices)
    self.axis_names = tuple(mesh.axis_names)
    coords = np.stack(np.unravel_index(np.arange(devices.size), devices.shape), axis=-1) \
        if devices.ndim else np.zeros((1, 0), int)
    slices = np.array([getattr(d, "slice_index", 0) or 0 for d in devices.flat])
    # the mesh axes along which the slice changes: what a cross-slice (DCN) collective spans
    by_slice = slices.reshape(devices.shape) if devices.ndim else slices
    self.slice_axes = tuple(a for i, a in enumerate(self.axis_names)
                            if (np.diff(by_slice, axis=i) != 0).any())
    # A multi-slice program is one SPMD program per slice (the megascale runtime joins them):
    # its replica groups number the devices of one slice, in mesh order.
    own = slices == slices[0]
    self.coords, self.n = coords[own], int(own.sum())
    self._memo: dict = {}

  def of(self, instr: _Instr) -> tuple[tuple[str, ...], bool, int]:
    attrs = instr.attrs
    if "source_target_pairs=" in attrs:
      pairs = re.search(r"source_target_pairs=(\{[\d,{}]*\})", attrs)
      spec = "pairs" + (pairs.group(1) if pairs else "{}")
      if spec not in self._memo:
        self._memo[spec] = self._pairs(spec[len("pairs"):])
      return self._memo[spec]
    spec = _replica_groups(attrs)
    if spec not in self._memo:
      self._memo[spec] = self._groups(spec)
    return self._memo[spec]

  def _groups(self, spec: str) -> tuple[tuple[str, ...], bool, int]:
    groups = _materialize(spec, self.n)
    if groups is None or groups.size == 0 or groups.max() >= self.n:
      return (("?",), False, int(groups.shape[1]) if groups is not None and groups.size else 1)
    coords = self.coords[groups]                             # (groups, size, ndim)
    varies = (coords != coords[:, :1]).any(axis=(0, 1))
    axes = tuple(a for a, v in zip(self.axis_names, varies) if v)
    return axes, False, int(groups.shape[1])

  def _pairs(self, spec: str) -> tuple[tuple[str, ...], bool, int]:
    pairs = np.array([[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", spec)],
                     dtype=int).reshape(-1, 2)
    if pairs.size == 0 or pairs.max() >= self.n:
      return (("?",) if pairs.size else (), False, 1)
    varies = (self.coords[pairs[:, 0]] != self.coords[pairs[:, 1]]).any(axis=0)
    return tuple(a for a, v in zip(self.axis_names, varies) if v), False, 2


def _replica_groups(attrs: str) -> str:
  """The text of an instruction's replica groups ('' when it has none: all devices)."""
  start = attrs.find("replica_groups=")
  if start < 0:
    return ""
  text = attrs[start + len("replica_groups="):]
  if text.startswith("{"):                          # {{0,1},{2,3}}: up to the matching brace
    depth = 0
    for i, c in enumerate(text):
      depth += (c == "{") - (c == "}")
      if depth == 0:
        return text[:i + 1]
    return text
  if text.startswith(("mesh[", "@mesh<")):          # mesh[...] [device_ids=(...)] {axes}
    close = text.find("}")
    return text[:close + 1]
  match = re.match(r"\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?", text)
  return match.group(0) if match else text.split(",", 1)[0]


def _materialize(spec: str, n: int) -> np.ndarray | None:
  """Replica groups as a (groups, size) array of logical device ids, from any of XLA's three
  spellings: explicit `{{0,1},{2,3}}`, iota `[2,2]<=[2,2]T(1,0)`, mesh axes
  `mesh['a'=2,'b'=2] {'b'}` (with sub-axes `'a':(pre)size` and device_ids)."""
  if spec in ("", "{}"):
    return np.arange(n).reshape(1, n)
  if spec.startswith("{"):
    groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", spec)]
    groups = [g for g in groups if g]
    if not groups or len({len(g) for g in groups}) != 1:
      return np.array(sum(groups, [])).reshape(1, -1) if groups else None
    return np.array(groups)
  iota = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
  if iota:
    shape = [int(x) for x in iota.group(1).split(",")]
    reshape = [int(x) for x in iota.group(2).split(",")]
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    if iota.group(3):
      ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
    return ids.reshape(shape[0], -1)
  mesh = re.match(r"(?:mesh\[|@mesh<)([^\]>]*)[\]>](.*)\{([^}]*)\}$", spec)
  if mesh:
    return _mesh_groups(*mesh.groups())
  return None


def _mesh_groups(axes_text: str, middle: str, grouped_text: str) -> np.ndarray:
  names, sizes = [], []
  for entry in axes_text.split(","):
    name, size = entry.split("=")
    names.append(name.strip().strip("'\""))
    sizes.append(int(size))
  refs = []                                          # (axis index, pre-size, size)
  for entry in grouped_text.split(","):
    entry = entry.strip()
    if not entry:
      continue
    sub = re.match(r"(.+?):\((\d+)\)(\d+)$", entry)
    if sub:
      refs.append((names.index(sub.group(1).strip("'\"")), int(sub.group(2)),
                   int(sub.group(3))))
    else:
      axis = names.index(entry.strip("'\""))
      refs.append((axis, 1, sizes[axis]))
  ids = np.arange(math.prod(sizes))
  device_ids = re.search(r"device_ids=\((.*)\)\s*$", middle.strip())
  if device_ids:
    text = device_ids.group(1)
    tiled = re.match(r"\[([\d,]+)\](?:T\(([\d,]+)\))?$", text)
    if tiled:
      ids = ids.reshape([int(x) for x in tiled.group(1).split(",")])
      if tiled.group(2):
        ids = ids.transpose([int(x) for x in tiled.group(2).split(",")])
      ids = ids.reshape(-1)
    else:
      ids = np.array([int(x) for x in text.split(",")])
  # split every axis into factors at the sub-axes' boundaries (major to minor)
  factors, where = [], {}
  for axis, size in enumerate(sizes):
    cuts = sorted({1, size} | {p for a, p, s in refs if a == axis}
                  | {p * s for a, p, s in refs if a == axis})
    for lo, hi in zip(cuts, cuts[1:]):
      where[(axis, lo)] = len(factors)
      factors.append(hi // lo)
  ids = ids.reshape(factors)
  grouped = []
  for axis, pre, size in refs:
    if size == 1:
      continue
    position, covered = where[(axis, pre)], 1
    while covered < size:
      grouped.append(position)
      covered *= factors[position]
      position += 1
  rest = [i for i in range(len(factors)) if i not in grouped]
  group_size = math.prod(factors[i] for i in grouped)
  return ids.transpose(rest + grouped).reshape(-1, group_size)


# -- small text helpers ----------------------------------------------------------------------

def _collective_kind(op: str, computation: str) -> str | None:
  base = op[:-len("-start")] if op.endswith("-start") else op
  if base not in COLLECTIVES:
    return None
  if base == "all-reduce" and computation.startswith("all-reduce-scatter"):
    return "reduce-scatter"                  # TPU's all-reduce + dynamic-slice fusion
  return base


def _cost_estimate(attrs: str) -> dict[str, float] | None:
  """A custom call's `cost_estimate` ({"flops", "transcendentals", "bytes_accessed", ...}) in
  its backend_config, None when it has none."""
  match = _COST_ESTIMATE.search(attrs)
  if match is None:
    return None
  return {k: float(v) for k, v in _COST_FIELD.findall(match.group(1))}


def _names(text: str) -> list[str]:
  return _NAME.findall(text)


def _attr_name(attrs: str, key: str) -> str | None:
  match = re.search(rf"\b{key}=%([^\s,}}]+)", attrs)
  return match.group(1) if match else None


def _branches(attrs: str) -> list[str]:
  match = re.search(r"branch_computations=\{([^}]*)\}", attrs)
  if match:
    return _names(match.group(1))
  return [b for b in (_attr_name(attrs, "true_computation"),
                      _attr_name(attrs, "false_computation")) if b]


def _tuple_elements(shape: str) -> list[str]:
  """The top-level element shapes of a tuple shape "(a, b, (c, d))"."""
  elements, depth, start = [], 0, 1
  for i, c in enumerate(shape):
    if c in "({[":
      depth += 1
    elif c in ")}]":
      depth -= 1
      if depth == 0:
        elements.append(shape[start:i])
        break
    elif c == "," and depth == 1:
      elements.append(shape[start:i])
      start = i + 1
  return [re.sub(r"/\*index=\d+\*/", "", e).strip() for e in elements]


def _number(text: str) -> float | None:
  try:
    value = float(text.strip())
  except ValueError:
    return None
  return int(value) if value.is_integer() else value


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
  """(dtype, dims) of every array of an HLO (tuple) shape's text, in order:
  "(bf16[2,4]{1,0}, f32[8], s32[])" -> [("bf16", (2, 4)), ("f32", (8,)), ("s32", ())];
  a dynamic bound "<=8" reads as 8."""
  return [(m.group(1), _array_dims(m)) for m in _ARRAY.finditer(shape)]


def _array_dims(match: re.Match) -> tuple[int, ...]:
  return tuple(int(d.replace("<=", "")) for d in match.group(2).split(",") if d)


@functools.lru_cache(maxsize=65536)
def _dims(shape: str) -> tuple[int, ...]:
  match = _ARRAY.search(shape)
  return _array_dims(match) if match else ()


@functools.lru_cache(maxsize=65536)
def _bytes(shape: str) -> float:
  """Logical bytes of a (tuple) shape, every memory space."""
  return sum(_array_bytes(m) for m in _ARRAY.finditer(shape))


@functools.lru_cache(maxsize=65536)
def _hbm_bytes(shape: str) -> float:
  """Bytes of the arrays of a (tuple) shape that live in HBM (memory space 0)."""
  total = 0.0
  for m in _ARRAY.finditer(shape):
    space = re.search(r"S\((\d+)\)", m.group(3) or "")
    if space is None or space.group(1) == "0":
      total += _array_bytes(m)
  return total


def _array_bytes(match: re.Match) -> float:
  dtype = match.group(1)
  size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else None)
  if size is None:
    return 0.0
  return size * math.prod(_array_dims(match))


def _valid_taps(out: int, size_in: int, window: int, stride: int, low: int,
                lhs_dilate: int, rhs_dilate: int) -> int:
  """(output position, window tap) pairs of one spatial dimension that read a real input
  element rather than padding or a dilation hole."""
  if window == 1 and stride == 1 and low == 0 and lhs_dilate == 1:
    return out
  if out * window > 4_000_000:                    # not a dot in disguise: count every tap
    return out * window
  extent = (size_in - 1) * lhs_dilate + 1
  total = 0
  for o in range(out):
    for k in range(window):
      x = o * stride + k * rhs_dilate - low
      if 0 <= x < extent and x % lhs_dilate == 0:
        total += 1
  return total
