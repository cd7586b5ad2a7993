"""Files of a transformers checkpoint directory: config.json and the weights, read and written.

Weights come from `model.safetensors`, sharded `*.safetensors` + `model.safetensors.index.json`
(safetensors + NumPy only; bfloat16/float8 are decoded with ml_dtypes), or `pytorch_model.bin`
(+ index), which needs PyTorch. Floating tensors are returned as NumPy float32.
"""

from __future__ import annotations

import json
import os

import numpy as np

from jaxformer.jsonfile import read_json
from jaxformer.optional import require

SAFE, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


def read_config(path: str) -> dict:
  """`path`/config.json, with an error naming the file when it is absent or not JSON."""
  config_file = os.path.join(path, "config.json")
  if not os.path.exists(config_file):
    raise ValueError(f"{path} has no config.json (expected a transformers checkpoint "
                     "directory)")
  return read_json(config_file, fix="restore the checkpoint's config.json")


def _to_float32(x: np.ndarray) -> np.ndarray:
  """Floating tensors (ml_dtypes' bfloat16/float8 have kind 'V') -> float32; others as is."""
  return x.astype(np.float32) if x.dtype.kind in "fV" else x


def _ml_dtypes() -> dict:
  """safetensors dtype names NumPy lacks -> ml_dtypes types (one byte per element or more;
  the sub-byte packed types F4/F6 are not listed and are refused by name)."""
  import ml_dtypes
  return {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
          "F8_E5M2": ml_dtypes.float8_e5m2, "F8_E8M0": ml_dtypes.float8_e8m0fnu}


def _read_safetensors_raw(file: str, names) -> dict[str, np.ndarray]:
  """Tensors whose dtype NumPy lacks (bfloat16, float8), decoded with ml_dtypes."""
  dtypes = _ml_dtypes()
  out = {}
  with open(file, "rb") as fh:
    n = int.from_bytes(fh.read(8), "little")
    header = json.loads(fh.read(n))
    for name in names:
      info = header[name]
      if info["dtype"] not in dtypes:
        raise ValueError(f"{file}: tensor {name!r} has dtype {info['dtype']}, which jaxformer "
                         f"cannot read (readable: NumPy's and {sorted(dtypes)}); convert the "
                         "checkpoint to bfloat16 or float32 first")
      start, end = info["data_offsets"]
      fh.seek(8 + n + start)
      out[name] = np.frombuffer(fh.read(end - start), dtypes[info["dtype"]]).reshape(
          info["shape"])
  return out


def require_safetensors():
  """The safetensors package, or an ImportError naming the `hf` extra."""
  require("safetensors.numpy", extra="hf", needed_for="Hugging Face conversion")
  import safetensors
  return safetensors


def _read_safetensors(file: str) -> dict[str, np.ndarray]:
  safe_open = require_safetensors().safe_open
  out, raw = {}, []
  try:
    with safe_open(file, framework="np") as f:
      for name in f.keys():
        try:
          out[name] = f.get_tensor(name)
        except (TypeError, AttributeError):     # "data type 'bfloat16' not understood", or
          raw.append(name)                      # "numpy has no attribute 'float8_e4m3fn'"
  except Exception as e:  # noqa: BLE001  (safetensors' own error type is not importable)
    if type(e).__name__ != "SafetensorError":
      raise
    raise ValueError(f"{file} is not a readable safetensors file ({e}); it may be truncated: "
                     "download or save it again") from e
  out.update(_read_safetensors_raw(file, raw))
  return {k: _to_float32(v) for k, v in out.items()}


def _read_torch(file: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError as e:
    raise ImportError(f"reading {file} needs PyTorch (`pip install torch`); or convert the "
                      "checkpoint to safetensors, which needs only `safetensors`") from e
  state = torch.load(file, map_location="cpu", weights_only=True)
  out = {}
  for name, t in state.items():
    t = t.detach()
    out[name] = (t.to(torch.float32) if t.is_floating_point() else t).numpy()
  return out


def read_tensors(path: str) -> dict[str, np.ndarray]:
  """Every tensor of the checkpoint directory, by its name in the file."""
  def shards(index_name):
    with open(os.path.join(path, index_name)) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    for file in files:
      if not os.path.exists(os.path.join(path, file)):
        raise ValueError(f"{path}: shard {file} named in {index_name} does not exist")
    return [os.path.join(path, file) for file in files]

  if os.path.exists(os.path.join(path, SAFE)):
    files, reader = [os.path.join(path, SAFE)], _read_safetensors
  elif os.path.exists(os.path.join(path, SAFE_INDEX)):
    files, reader = shards(SAFE_INDEX), _read_safetensors
  elif os.path.exists(os.path.join(path, BIN)):
    files, reader = [os.path.join(path, BIN)], _read_torch
  elif os.path.exists(os.path.join(path, BIN_INDEX)):
    files, reader = shards(BIN_INDEX), _read_torch
  else:
    raise ValueError(f"{path} holds none of {SAFE}, {SAFE_INDEX}, {BIN}, {BIN_INDEX}")
  tensors = {}
  for file in files:
    tensors.update(reader(file))
  return tensors


def write(out_dir: str, hf_config: dict, tensors: dict[str, np.ndarray]) -> str:
  """`config.json` + `model.safetensors` in out_dir (created if absent); returns out_dir."""
  save_file = require_safetensors().numpy.save_file
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  save_file(tensors, os.path.join(out_dir, SAFE), metadata={"format": "pt"})
  return out_dir
