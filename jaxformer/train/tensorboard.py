"""TensorBoard event files through tensorboardX (no TensorFlow needed), as MaxText writes them.

A thin adapter that keeps the loop's calls short: `scalars` writes a dict of scalars at one
step, `image` takes PNG bytes (what the attention-map plots produce) or a uint8 array. Each
writer starts a new `events.out.tfevents.*` file, so a resumed run appends a file to the same
logdir and TensorBoard merges them; `purge_step` makes TensorBoard drop the points at steps
>= purge_step that the interrupted run wrote and the resumed run rewrites. tensorboardX writes
local files only: for a remote logdir (a bucket) the events go to a local mirror and are
uploaded every `flush_secs` and at close.

tensorboardX writes events on a thread of its own; when a write fails there (a full disk), that
thread dies and the next `add_event` waits forever on its full queue. Here the thread's writes
are guarded: a failure is kept, later events are dropped, and the next call on the run's own
thread raises it, so the run reports the full disk in one line like any other write.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import sys
import time

import numpy as np

from jaxformer import paths

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _import_tensorboardx():
  """tensorboardX, imported without torch: it imports torch whenever torch is installed only
  to accept torch tensors (we pass numpy), which costs ~2 s of every run's start-up."""
  if "torch" in sys.modules:
    import tensorboardX
    return tensorboardX
  sys.modules["torch"] = None        # `import torch` raises ImportError, which it handles
  try:
    import tensorboardX
  finally:
    del sys.modules["torch"]
  return tensorboardX


def _as_array(image) -> np.ndarray:
  """An HWC uint8 array from PNG bytes or an HW / HWC uint8 array (C in 1, 3, 4)."""
  if isinstance(image, (bytes, bytearray)):
    if not bytes(image).startswith(_PNG_SIGNATURE):
      raise ValueError("image: bytes must be a PNG file (or pass an HWC uint8 array)")
    from PIL import Image
    image = np.asarray(Image.open(io.BytesIO(bytes(image))))
  array = np.asarray(image)
  if array.ndim == 2:
    array = array[:, :, None]
  if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] not in (1, 3, 4):
    raise ValueError(f"image: expected PNG bytes or a uint8 [H, W, C] array with C in 1/3/4, "
                     f"got {array.dtype} {array.shape}; convert with (x * 255).astype(np.uint8)")
  return array


class _GuardedRecords:
  """The event-writing thread's file writer, keeping its first failure instead of dying."""

  def __init__(self, records):
    self.records, self.error = records, None

  def write_event(self, event) -> None:
    self._call(self.records.write_event, event)

  def flush(self) -> None:
    self._call(self.records.flush)

  def _call(self, fn, *args) -> None:
    if self.error is None:
      try:
        fn(*args)
      except Exception as e:  # noqa: BLE001  (raised on the run's thread: `SummaryWriter.check`)
        self.error = e


class SummaryWriter:
  """Scalars and images for TensorBoard in `logdir` (see the module docstring)."""

  def __init__(self, logdir: str | os.PathLike, *, purge_step: int | None = None,
               flush_secs: float = 10.0):
    if purge_step is not None and purge_step < 0:
      raise ValueError(f"purge_step={purge_step} must be >= 0 (the step the run resumes at)")
    tensorboardX = _import_tensorboardx()
    self.target = os.fspath(logdir)
    self.logdir = paths.local_mirror(self.target, "tensorboard")
    if self.logdir != self.target:       # an earlier run's mirrored events are uploaded already
      shutil.rmtree(self.logdir, ignore_errors=True)
    self._writer = tensorboardX.SummaryWriter(self.logdir, purge_step=purge_step,
                                              flush_secs=flush_secs)
    self._upload_secs, self._uploaded = flush_secs, time.monotonic()
    worker = self._writer._get_file_writer().event_writer._worker   # pylint: disable=protected-access
    self._guard = worker._record_writer = _GuardedRecords(worker._record_writer)

  def check(self) -> None:
    """Raise the failure of the event-writing thread, if it had one."""
    if self._guard.error is not None:
      raise self._guard.error

  def scalar(self, tag: str, value: float, step: int) -> None:
    self.check()
    self._writer.add_scalar(tag, float(value), global_step=step)

  def scalars(self, values: dict[str, float], step: int) -> None:
    for tag, value in values.items():
      self.scalar(tag, value, step)
    if paths.is_remote(self.target) and (
        time.monotonic() - self._uploaded > self._upload_secs):
      self.flush()

  def image(self, tag: str, image, step: int) -> None:
    """`image`: PNG bytes, or a uint8 array [H, W, C] (C = 1, 3 or 4) or [H, W]."""
    self.check()
    self._writer.add_image(tag, _as_array(image), global_step=step, dataformats="HWC")

  def flush(self) -> None:
    self.check()
    self._writer.flush()
    paths.upload(self.logdir, self.target)
    self._uploaded = time.monotonic()

  def close(self) -> None:
    """Flush and close. A failed flush (a full disk) is logged and the event writer is closed
    anyway: tensorboardX would otherwise retry it at exit and print its traceback twice (its
    atexit hook and its worker thread) after the run has reported the disk itself."""
    try:
      self._writer.close()
      paths.upload(self.logdir, self.target)
    except OSError as e:
      logging.warning("TensorBoard events in %s are incomplete: %s", self.logdir, e)
      for file_writer in (self._writer.all_writers or {}).values():
        events = file_writer.event_writer
        if getattr(events, "_worker", None) is not None:
          events._worker.stop()                    # pylint: disable=protected-access
        events._closed = True                      # pylint: disable=protected-access

  def __enter__(self) -> SummaryWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
