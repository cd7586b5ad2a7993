"""A live console progress line (throughput, MFU, ETA).

Throughput is measured over a sliding window of recent `update` calls, so the first step's
compilation washes out, and time the loop spends on eval or checkpoints (`pause`/`resume`,
`paused()`, or `exclude(seconds)`) is left out. MFU (model FLOPs utilisation, as in the PaLM
paper) is `flops_per_step * steps_per_sec / peak_flops`, where `flops_per_step` counts the
model's FLOPs of one step (`flops_per_step`) and `peak_flops` is the dense peak of *all*
devices the step runs on: `accelerators.peak_flops_per_device(...) * jax.device_count()`.
"""

from __future__ import annotations

import collections
import contextlib
import math
import sys
import time
from typing import Callable, TextIO


_UNIT_SHORT = {"tokens": "tok", "images": "img", "pairs": "pairs",   # pairs: DPO
               "completions": "compl"}                                # completions: GRPO


def format_duration(seconds: float) -> str:
  """'42s', '3m05s', '2h07m' (or '?' when unknown)."""
  if not math.isfinite(seconds) or seconds < 0:
    return "?"
  seconds = int(round(seconds))
  if seconds < 60:
    return f"{seconds}s"
  if seconds < 3600:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def flops_per_step(model_config, task, batch: dict, process_count: int) -> int:
  """Model FLOPs of one optimizer step over all processes, Kaplan's 6N + attention plus the
  output head's matmul over the vocabulary as MaxText counts it
  (`models.counting.flops_per_token(..., readout=True)`): examples x tokens per example x
  FLOPs per token, the tokens from the task's batch layout or, for images, the family's
  `tokens_per_example`."""
  from jaxformer import models
  from jaxformer.models import counting
  rows = task.rows(batch) * process_count
  lengths = task.token_lengths(batch)
  if lengths is None:
    cfg = models.with_defaults(model_config)
    tokens = context = models.get(cfg["family"]).tokens_per_example(cfg)
  else:
    tokens, context = lengths
  return int(counting.flops_per_token(model_config, context, readout=True) * tokens * rows
             * task.flops_scale)

class Progress:
  """Prints `step/total  loss  units/s  MFU  eta  elapsed` on each `update`.

  On a TTY the line is rewritten in place (`\\r`); otherwise each update prints one line (the
  loop calls `update` every `train.log_every` steps). Rates come from the last `window`
  updates. `clock` is injectable for tests.
  """

  def __init__(self, total_steps: int, start_step: int = 0, *, unit: str = "tokens",
               units_per_step: float, flops_per_step: float | None = None,
               peak_flops: float | None = None, stream: TextIO | None = None,
               window: int = 20, clock: Callable[[], float] = time.perf_counter):
    if unit not in _UNIT_SHORT:
      raise ValueError(f"unit={unit!r} must be one of {tuple(_UNIT_SHORT)}")
    if not 0 <= start_step <= total_steps:
      raise ValueError(f"start_step={start_step} must be in [0, total_steps={total_steps}]")
    if window < 1:
      raise ValueError(f"window={window} must be >= 1")
    self.total_steps, self.unit = total_steps, unit
    self.units_per_step, self.flops_per_step = units_per_step, flops_per_step
    self.peak_flops = peak_flops
    self.stream = sys.stderr if stream is None else stream
    self._clock = clock
    self._start = clock()
    self._excluded = 0.0
    self._paused_at: float | None = None
    self._samples = collections.deque([(start_step, 0.0)], maxlen=window + 1)
    self._line_width = 0

  # --- time accounting --------------------------------------------------------------------

  def pause(self) -> None:
    """Stop the throughput clock (eval, checkpointing) until `resume()`."""
    if self._paused_at is None:
      self._paused_at = self._clock()

  def resume(self) -> None:
    if self._paused_at is not None:
      self._excluded += self._clock() - self._paused_at
      self._paused_at = None

  @contextlib.contextmanager
  def paused(self):
    self.pause()
    try:
      yield
    finally:
      self.resume()

  def exclude(self, seconds: float) -> None:
    """Leave `seconds` (already measured by the caller) out of the throughput."""
    if seconds < 0:
      raise ValueError(f"seconds={seconds} must be >= 0")
    self._excluded += seconds

  def _active_seconds(self) -> float:
    now = self._clock() if self._paused_at is None else self._paused_at
    return now - self._start - self._excluded

  def restart_window(self, step: int) -> None:
    """Measure rates from `step` on: the loop calls it once the first step of a run (or of a
    resume) is done, whose time is mostly compilation, so that the first line's tok/s, MFU
    and ETA are the steps' own (it printed 94 tok/s and an ETA of 9 minutes for a 1-minute
    run before)."""
    self._samples.clear()
    self._samples.append((step, self._active_seconds()))

  # --- rates ------------------------------------------------------------------------------

  def steps_per_sec(self) -> float | None:
    """Steps per second of training time over the window, None before two samples."""
    (first_step, first_time), (last_step, last_time) = self._samples[0], self._samples[-1]
    if last_step == first_step or last_time <= first_time:
      return None
    return (last_step - first_step) / (last_time - first_time)

  def mfu(self) -> float | None:
    rate = self.steps_per_sec()
    if rate is None or not self.flops_per_step or not self.peak_flops:
      return None
    return self.flops_per_step * rate / self.peak_flops

  def eta_seconds(self) -> float | None:
    rate = self.steps_per_sec()
    return None if rate is None else (self.total_steps - self._samples[-1][0]) / rate

  # --- output -----------------------------------------------------------------------------

  def update(self, step: int, metrics: dict | None = None) -> str:
    """Record that `step` steps are done and print the progress line (returned too)."""
    self._samples.append((step, self._active_seconds()))
    line = self.format_line(step, metrics or {})
    if self._is_tty():
      self.stream.write("\r" + line.ljust(self._line_width))
      self._line_width = len(line)
    else:
      self.stream.write(line + "\n")
    self.stream.flush()
    return line

  def log(self, message: str) -> None:
    """Print a message (e.g. an eval result) without garbling the live line on a TTY."""
    if self._is_tty() and self._line_width:
      self.stream.write("\r" + " " * self._line_width + "\r")
      self._line_width = 0
    self.stream.write(message + "\n")
    self.stream.flush()

  def close(self) -> None:
    """End the live line on a TTY."""
    if self._is_tty() and self._line_width:
      self.stream.write("\n")
      self.stream.flush()
      self._line_width = 0

  def format_line(self, step: int, metrics: dict) -> str:
    width = len(str(self.total_steps))
    parts = [f"step {step:>{width}d}/{self.total_steps}"]
    if "loss" in metrics:
      parts.append(f"loss {float(metrics['loss']):.4f}")
    rate = self.steps_per_sec()
    short = _UNIT_SHORT[self.unit]
    parts.append(f"{rate * self.units_per_step:,.0f} {short}/s" if rate else f"? {short}/s")
    if self.flops_per_step:
      mfu = self.mfu()
      parts.append(f"MFU {mfu:.1%}" if mfu is not None else "MFU n/a")
    eta = self.eta_seconds()
    parts.append(f"eta {format_duration(eta) if eta is not None else '?'}")
    parts.append(f"elapsed {format_duration(self._clock() - self._start)}")
    return "  ".join(parts)

  def _is_tty(self) -> bool:
    isatty = getattr(self.stream, "isatty", None)
    return bool(isatty and isatty())
