"""TensorBoard event files written without TensorFlow or tensorboard installed.

The training loop should not pull in TensorFlow just to draw curves, so this module writes the
on-disk format itself: a TFRecord file (each record framed by its length, a masked CRC32C of the
length, the bytes, a masked CRC32C of the bytes) whose records are hand-encoded `Event` protocol
buffers (`tensorflow/core/util/event.proto`, `summary.proto`). Only the fields TensorBoard needs
for scalars and images are encoded, so there is no schema dependency. `read_events` parses the
same subset back (checking every CRC) for tests and quick inspection.

Each `SummaryWriter` creates a new file (`events.out.tfevents.<time>.<host>`), so a resumed run
appends a file to the same logdir and TensorBoard merges them; `purge_step` writes a
`SessionLog.START` so TensorBoard drops the stale points that a resumed run rewrites.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import time

import numpy as np

FILE_VERSION = "brain.Event:2"
_SESSION_START = 1                       # SessionLog.SessionStatus.START
_CRC_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> tuple[int, ...]:
  """Byte table of CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return tuple(table)


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC-32C of `data` (the checksum TFRecord uses); crc32c(b"123456789") == 0xE3069283."""
  crc = 0xFFFFFFFF
  table = _CRC_TABLE
  for byte in data:
    crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """TFRecord's masked CRC: rotate right by 15 and add a constant (mod 2**32)."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
  """One framed TFRecord: length, masked CRC of length, data, masked CRC of data."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", masked_crc32c(length)) + data
          + struct.pack("<I", masked_crc32c(data)))


# --- protobuf wire format (only what Event needs) ------------------------------------------

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
  if value < 0:
    value += 1 << 64                     # int64 negatives are 10-byte two's complement
  out = bytearray()
  while True:
    low, value = value & 0x7F, value >> 7
    if value:
      out.append(low | 0x80)
    else:
      out.append(low)
      return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
  return _varint(field << 3 | wire_type)


def _bytes_field(field: int, payload: bytes) -> bytes:
  return _key(field, _BYTES) + _varint(len(payload)) + payload


def _event(step: int, *, wall_time: float | None = None, file_version: str | None = None,
           summary: bytes | None = None, session_log: bytes | None = None) -> bytes:
  """Encode an `Event`: wall_time=1 (double), step=2, file_version=3, summary=5, session_log=6."""
  out = _key(1, _FIXED64) + struct.pack("<d", time.time() if wall_time is None else wall_time)
  out += _key(2, _VARINT) + _varint(int(step))
  if file_version is not None:
    out += _bytes_field(3, file_version.encode())
  if summary is not None:
    out += _bytes_field(5, summary)
  if session_log is not None:
    out += _bytes_field(6, session_log)
  return out


def _scalar_value(tag: str, value: float) -> bytes:
  """`Summary.Value` with tag=1 and simple_value=2 (float32)."""
  return _bytes_field(1, tag.encode()) + _key(2, _FIXED32) + struct.pack("<f", float(value))


def _image_value(tag: str, png: bytes, height: int, width: int, channels: int) -> bytes:
  """`Summary.Value` with tag=1 and image=4: `Summary.Image` {height=1, width=2,
  colorspace=3, encoded_image_string=4}."""
  image = (_key(1, _VARINT) + _varint(height) + _key(2, _VARINT) + _varint(width)
           + _key(3, _VARINT) + _varint(channels) + _bytes_field(4, png))
  return _bytes_field(1, tag.encode()) + _bytes_field(4, image)


def _summary(values: list[bytes]) -> bytes:
  """`Summary` with repeated value=1."""
  return b"".join(_bytes_field(1, v) for v in values)


# --- images -------------------------------------------------------------------------------

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_and_shape(image) -> tuple[bytes, int, int, int]:
  """(png bytes, height, width, channels) from PNG bytes or an HWC / HW uint8 array."""
  if isinstance(image, (bytes, bytearray)):
    png = bytes(image)
    if not png.startswith(_PNG_SIGNATURE) or png[12:16] != b"IHDR":
      raise ValueError("image: bytes must be a PNG file (or pass an HWC uint8 array)")
    width, height = struct.unpack(">II", png[16:24])
    channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}[png[25]]     # PNG colour type -> channels
    return png, height, width, channels
  array = np.asarray(image)
  if array.ndim == 2:
    array = array[:, :, None]
  if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] not in (1, 3, 4):
    raise ValueError(f"image: expected PNG bytes or a uint8 [H, W, C] array with C in 1/3/4, "
                     f"got {array.dtype} {array.shape}; convert with (x * 255).astype(np.uint8)")
  from PIL import Image                  # pylint: disable=import-outside-toplevel
  buffer = io.BytesIO()
  Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array).save(buffer, format="PNG")
  return buffer.getvalue(), array.shape[0], array.shape[1], array.shape[2]


# --- writer -------------------------------------------------------------------------------


def _create_event_file(logdir: str) -> tuple[str, io.BufferedWriter]:
  """Open a new `events.out.tfevents.<time>.<host>` file, never reusing an existing one."""
  base = os.path.join(logdir, f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}")
  path, attempt = base, 0
  while True:
    try:
      return path, open(path, "xb")    # pylint: disable=consider-using-with
    except FileExistsError:
      attempt += 1
      path = f"{base}.{os.getpid()}.{attempt}"


class SummaryWriter:
  """Appends scalar and image summaries to a fresh event file in `logdir`.

  `purge_step`: the step a resumed run restarts from; TensorBoard then discards points at
  steps >= purge_step written by the interrupted run. Writes are buffered and flushed every
  `flush_secs` seconds, on `flush()` and on `close()`.
  """

  def __init__(self, logdir: str | os.PathLike, *, purge_step: int | None = None,
               flush_secs: float = 10.0):
    if purge_step is not None and purge_step < 0:
      raise ValueError(f"purge_step={purge_step} must be >= 0 (the step the run resumes at)")
    self.logdir = os.fspath(logdir)
    os.makedirs(self.logdir, exist_ok=True)
    self.path, self._file = _create_event_file(self.logdir)
    self._flush_secs = flush_secs
    self._last_flush = time.monotonic()
    self._write(_event(0, file_version=FILE_VERSION))
    if purge_step is not None:
      self._write(_event(purge_step, session_log=_key(1, _VARINT) + _varint(_SESSION_START)))
    self.flush()

  def scalar(self, tag: str, value: float, step: int) -> None:
    self.scalars({tag: value}, step)

  def scalars(self, values: dict[str, float], step: int) -> None:
    """One event holding every (tag, value) of `values` at `step`."""
    if values:
      summary = _summary([_scalar_value(tag, v) for tag, v in values.items()])
      self._write(_event(step, summary=summary))

  def image(self, tag: str, image, step: int) -> None:
    """`image`: PNG bytes, or a uint8 array [H, W, C] (C = 1, 3 or 4) or [H, W]."""
    png, height, width, channels = _png_and_shape(image)
    self._write(_event(step, summary=_summary([_image_value(tag, png, height, width,
                                                             channels)])))

  def flush(self) -> None:
    self._file.flush()
    self._last_flush = time.monotonic()

  def close(self) -> None:
    if not self._file.closed:
      self.flush()
      self._file.close()

  def __enter__(self) -> SummaryWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _write(self, event: bytes) -> None:
    if self._file.closed:
      raise ValueError(f"SummaryWriter for {self.path} is closed")
    self._file.write(tfrecord(event))
    if time.monotonic() - self._last_flush >= self._flush_secs:
      self.flush()


# --- reader -------------------------------------------------------------------------------


def read_records(path: str | os.PathLike) -> list[bytes]:
  """The payloads of a TFRecord file; ValueError on a bad CRC or a truncated record."""
  with open(path, "rb") as f:
    data = f.read()
  records, offset = [], 0
  while offset < len(data):
    header = data[offset:offset + 12]
    if len(header) < 12:
      raise ValueError(f"{path}: truncated record header at byte {offset}")
    length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
    if masked_crc32c(length_bytes) != length_crc:
      raise ValueError(f"{path}: length CRC mismatch at byte {offset}")
    (length,) = struct.unpack("<Q", length_bytes)
    start, end = offset + 12, offset + 12 + length
    if end + 4 > len(data):
      raise ValueError(f"{path}: truncated record at byte {offset}")
    payload = data[start:end]
    if masked_crc32c(payload) != struct.unpack("<I", data[end:end + 4])[0]:
      raise ValueError(f"{path}: data CRC mismatch in the record at byte {offset}")
    records.append(payload)
    offset = end + 4
  return records


def _fields(message: bytes):
  """Yield (field number, wire type, value) of a protobuf message (value: int or bytes)."""
  offset = 0
  while offset < len(message):
    key, offset = _read_varint(message, offset)
    field, wire_type = key >> 3, key & 7
    if wire_type == _VARINT:
      value, offset = _read_varint(message, offset)
    elif wire_type == _FIXED64:
      value, offset = message[offset:offset + 8], offset + 8
    elif wire_type == _FIXED32:
      value, offset = message[offset:offset + 4], offset + 4
    elif wire_type == _BYTES:
      length, offset = _read_varint(message, offset)
      value, offset = message[offset:offset + length], offset + length
    else:
      raise ValueError(f"unsupported protobuf wire type {wire_type} in field {field}")
    yield field, wire_type, value


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
  value, shift = 0, 0
  while True:
    byte = data[offset]
    offset += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return value, offset


def _decode_value(message: bytes, scalars: dict, images: dict) -> None:
  fields = {field: value for field, _, value in _fields(message)}
  tag = fields[1].decode()
  if 2 in fields:
    scalars[tag] = struct.unpack("<f", fields[2])[0]
  if 4 in fields:
    image = {field: value for field, _, value in _fields(fields[4])}
    images[tag] = {"height": image.get(1, 0), "width": image.get(2, 0),
                   "colorspace": image.get(3, 0), "png": image.get(4, b"")}


def decode_event(message: bytes) -> dict:
  """{'wall_time', 'step', 'file_version'?, 'session_start'?, 'scalars', 'images'} of an Event."""
  event = {"wall_time": 0.0, "step": 0, "scalars": {}, "images": {}}
  for field, _, value in _fields(message):
    if field == 1:
      event["wall_time"] = struct.unpack("<d", value)[0]
    elif field == 2:
      event["step"] = value - (1 << 64) if value >= 1 << 63 else value
    elif field == 3:
      event["file_version"] = value.decode()
    elif field == 5:
      for _, _, summary_value in _fields(value):
        _decode_value(summary_value, event["scalars"], event["images"])
    elif field == 6:
      status = dict((f, v) for f, _, v in _fields(value)).get(1)
      event["session_start"] = status == _SESSION_START
  return event


def read_events(path: str | os.PathLike) -> list[dict]:
  """Decoded events of one event file, in order (CRCs verified)."""
  return [decode_event(record) for record in read_records(path)]
