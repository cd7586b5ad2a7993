"""Files of a transformers checkpoint directory: config.json and the weights, read and written.

Weights come from `model.safetensors`, sharded `*.safetensors` + `model.safetensors.index.json`
(safetensors + NumPy only; bfloat16/float8 are decoded with ml_dtypes), or `pytorch_model.bin`
(+ index), which needs PyTorch. Floating tensors are returned as NumPy float32.
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from jaxformer import paths
from jaxformer.jsonfile import read_json
from jaxformer.extras import require

SAFE, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


_CONFIG_FIX = "restore the checkpoint's config.json (download it again)"
# config.json keys the converters read as numbers: sizes are ints > 0, the rest numbers >= 0;
# null means "not set" only where transformers gives it that meaning.
_INT_KEYS = ("vocab_size", "n_embd", "n_head", "n_layer", "n_inner", "n_positions",
             "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
             "num_local_experts", "num_experts_per_tok", "type_vocab_size", "num_labels",
             "num_channels", "image_size", "patch_size")
_FLOAT_KEYS = ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps", "rope_theta",
               "resid_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout_prob",
               "attention_probs_dropout_prob", "initializer_range")
_NULLABLE = ("n_inner", "head_dim", "num_key_value_heads", "sliding_window", "rope_theta")
_ZERO_OK = ("type_vocab_size",)       # DeBERTa-v2/v3: 0 = no token-type embeddings


class HFConfig(dict):
  """config.json's contents. It remembers the keys a converter asked for with `get` that the
  file lacks (transformers fills them with its defaults, and so do the converters), so that a
  size mismatch can say which default was assumed."""

  def __init__(self, data: dict, file: str):
    super().__init__(data)
    self.file, self.defaulted = file, {}

  def get(self, key, default=None):
    if key not in self:
      self.defaulted.setdefault(key, default)
    return super().get(key, default)

  def defaults_note(self) -> str:
    """'' or "; <file> does not set n_layer, so transformers' default 12 was used"."""
    sizes = {k: v for k, v in self.defaulted.items() if k in _INT_KEYS and v is not None}
    if not sizes:
      return ""
    return (f"; {self.file} does not set {', '.join(sizes)}, so transformers' default "
            f"{', '.join(map(str, sizes.values()))} was used")


def _check_numbers(config: dict, file: str):
  def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v > 0

  for key in _INT_KEYS + _FLOAT_KEYS:
    value = config.get(key)
    if key not in config or (value is None and key in _NULLABLE):
      continue
    if key in _INT_KEYS:
      ok = is_int(value) or (key in ("image_size", "patch_size") and isinstance(value, list)
                             and len(value) > 0 and all(map(is_int, value)))
      ok = ok or (key in _ZERO_OK and value == 0 and not isinstance(value, bool))
      want = "an integer > 0"
    else:
      ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)
      want = "a number >= 0"
    if not ok:
      raise ValueError(f"{file}: {key}={value!r} must be {want}; {_CONFIG_FIX}")


def read_config(path: str) -> HFConfig:
  """`path`/config.json, checked: an error names the file when it is absent, not JSON, not an
  object, or holds a size or rate that is not a number."""
  config_file = os.path.join(path, "config.json")
  if not os.path.isfile(config_file):
    raise ValueError(f"{path} has no config.json file (expected a transformers checkpoint "
                     "directory: config.json + model.safetensors)")
  config = read_json(config_file, fix=_CONFIG_FIX)
  if not isinstance(config, dict):
    raise ValueError(f"{config_file} holds a JSON {type(config).__name__}, not an object; "
                     f"{_CONFIG_FIX}")
  _check_numbers(config, config_file)
  return HFConfig(config, config_file)


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
  try:
    state = torch.load(file, map_location="cpu", weights_only=True)
  except Exception as e:  # noqa: BLE001  (EOFError, UnpicklingError, RuntimeError, OSError)
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    marker = [i for i, line in enumerate(lines) if "WeightsUnpickler error" in line]
    why = (f"weights_only unpickling: {lines[marker[0] + 1]}"    # torch's long preamble cut
           if marker and marker[0] + 1 < len(lines) else lines[0])
    raise ValueError(f"{file} is not a readable PyTorch state dict ({why}); it may be "
                     "truncated: download or save it again") from None
  if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
    raise ValueError(f"{file} holds a {type(state).__name__}, not a state dict of tensors; "
                     "save `model.state_dict()` (or use save_pretrained)")
  out = {}
  for name, t in state.items():
    t = t.detach()
    out[name] = (t.to(torch.float32) if t.is_floating_point() else t).numpy()
  return out


def _index_shards(path: str, index_name: str) -> dict[str, str]:
  """tensor name -> shard file from a checked `*.index.json` (every shard named must exist)."""
  index_file = os.path.join(path, index_name)
  fix = "download the checkpoint again (index and shards together)"
  index = read_json(index_file, fix=fix)
  weight_map = index.get("weight_map") if isinstance(index, dict) else None
  if (not isinstance(weight_map, dict) or not weight_map
      or not all(isinstance(v, str) for v in weight_map.values())):
    raise ValueError(f"{index_file} has no 'weight_map' of tensor name -> shard file; {fix}")
  for file in sorted(set(weight_map.values())):
    if not os.path.isfile(os.path.join(path, file)):
      raise ValueError(f"{path}: shard {file} named in {index_name} does not exist; {fix}")
  return {name: os.path.join(path, file) for name, file in weight_map.items()}


def read_tensors(path: str) -> dict[str, np.ndarray]:
  """Every tensor of the checkpoint directory, by its name in the file. For a sharded
  checkpoint every tensor its index names must be in the shard it names (a shard left from
  another save would otherwise mix two models)."""
  index = None
  if os.path.exists(os.path.join(path, SAFE)):
    files, reader = [os.path.join(path, SAFE)], _read_safetensors
  elif os.path.exists(os.path.join(path, SAFE_INDEX)):
    index, reader = SAFE_INDEX, _read_safetensors
  elif os.path.exists(os.path.join(path, BIN)):
    files, reader = [os.path.join(path, BIN)], _read_torch
  elif os.path.exists(os.path.join(path, BIN_INDEX)):
    index, reader = BIN_INDEX, _read_torch
  else:
    raise ValueError(f"{path} holds none of {SAFE}, {SAFE_INDEX}, {BIN}, {BIN_INDEX}")
  named = {}                            # shard file -> the tensors the index places in it
  for name, file in (_index_shards(path, index) if index else {}).items():
    named.setdefault(file, []).append(name)
  tensors = {}
  for file in sorted(named) if index else files:
    if not os.path.isfile(file):
      raise ValueError(f"{file} is not a file; download or save the checkpoint again")
    read = reader(file)
    absent = [name for name in named.get(file, ()) if name not in read]
    if absent:
      raise ValueError(f"{path}/{index} places tensor {absent[0]!r} in "
                       f"{os.path.basename(file)}, which does not hold it: the shards are not "
                       "the ones the index was written with; download or save the checkpoint "
                       "again")
    tensors.update(read)
  return tensors


# Shards as transformers names them (model-00001-of-00003.safetensors, pytorch_model-...bin).
_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")


def checkpoint_files(path: str) -> list[str]:
  """Names of the transformers config and weight files in directory `path` (what a save there
  replaces, or would leave stale): config.json, single-file weights, indexes and shards."""
  directory = paths.path(path, "out_dir")
  if not directory.is_dir():
    return []
  fixed = ("config.json", SAFE, SAFE_INDEX, BIN, BIN_INDEX)
  return sorted(p.name for p in directory.iterdir()
                if (p.name in fixed or _SHARD.fullmatch(p.name)) and p.is_file())


def write(out_dir: str, hf_config: dict, tensors: dict[str, np.ndarray]) -> str:
  """`config.json` + `model.safetensors` in out_dir (created if absent), each written to a
  temporary name and renamed, then the weight files of an earlier save that the new ones
  replace (shards, indexes, .bin) are removed; returns out_dir."""
  safetensors = require_safetensors().numpy
  directory = paths.path(out_dir, "out_dir")
  directory.mkdir(parents=True, exist_ok=True)
  stale = [n for n in checkpoint_files(out_dir) if n not in ("config.json", SAFE)]
  weights, config = os.path.join(out_dir, SAFE), os.path.join(out_dir, "config.json")
  if paths.is_remote(out_dir):          # an object is written whole: from bytes in memory
    paths.write_bytes(weights, safetensors.save(tensors, metadata={"format": "pt"}))
  else:                                 # streamed to a temporary file, then renamed
    safetensors.save_file(tensors, weights + ".tmp", metadata={"format": "pt"})
    os.replace(weights + ".tmp", weights)
  paths.write_text(config, json.dumps(hf_config, indent=2, sort_keys=True))
  for name in stale:
    (directory / name).unlink()
  return out_dir
