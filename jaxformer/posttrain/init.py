"""The `posttrain` config section and where a post-training run starts: the params and the
tokenizer of a trained workdir (`posttrain.init_from`).

    posttrain.method     'sft' | 'dpo'
    posttrain.init_from  a training workdir (its latest checkpoint's params and its tokenizer)
    posttrain.beta       DPO's beta (default 0.1)
    posttrain.label_smoothing  conservative DPO's eps (default 0)

The params are copied into the new run's fresh state when the new workdir has no checkpoint
yet; from then on the new run resumes from its own checkpoints like any run (the source is not
read again). The model section must give the source's parameter shapes (configs/sft.py copies
the source's model section); the optimizer starts fresh (AdamW's moments at zero).
Hugging Face checkpoints (`init_from='hf:DIR'`, via convert.hf.load) are not wired yet.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
from ml_collections import ConfigDict

from jaxformer import paths, run_files
from jaxformer.data import tokenizers
from jaxformer.state import checkpoint, train_state

METHODS = ("sft", "dpo")


@dataclasses.dataclass(frozen=True)
class PosttrainSettings:
  method: str
  init_from: str | None = None
  beta: float = 0.1
  label_smoothing: float = 0.0


def parse(config) -> PosttrainSettings | None:
  """The typed `posttrain` section (None: an ordinary pretraining run)."""
  section = config.get("posttrain") if hasattr(config, "get") else None
  if section is None:
    return None
  values = section.to_dict() if hasattr(section, "to_dict") else dict(section)
  known = {f.name for f in dataclasses.fields(PosttrainSettings)}
  unknown = sorted(set(values) - known)
  if unknown:
    raise ValueError(f"posttrain.{unknown[0]} is not a posttrain setting; the settings are "
                     f"{sorted(known)}")
  s = PosttrainSettings(**values)
  if s.method not in METHODS:
    raise ValueError(f"posttrain.method={s.method!r} must be one of {METHODS}")
  if not isinstance(s.beta, (int, float)) or s.beta <= 0:
    raise ValueError(f"posttrain.beta={s.beta!r} must be > 0 (DPO's KL weight, e.g. 0.1)")
  if not 0.0 <= s.label_smoothing < 0.5:
    raise ValueError(f"posttrain.label_smoothing={s.label_smoothing!r} must be in [0, 0.5)")
  return s


def _source(config) -> str:
  s = parse(config)
  if s is None or not s.init_from:
    raise ValueError("posttrain.init_from is not set: pass the trained workdir to start from, "
                     "e.g. --config=configs/sft.py:WORKDIR")
  return s.init_from


def source_config(workdir: str) -> ConfigDict:
  saved = train_state.read_config(workdir)
  if saved is None:
    raise ValueError(f"posttrain.init_from={workdir!r} holds no training run (no "
                     f"{run_files.CONFIG}); train it first")
  return ConfigDict(saved)


def source_tokenizer(config):
  workdir = _source(config)
  try:
    return tokenizers.load_tokenizer(workdir)
  except ValueError as e:
    raise ValueError(f"posttrain.init_from={workdir!r}: {e}") from None


def init_state(config, plan, state, abstract_boxed):
  """`state` (fresh) with its params replaced by those of posttrain.init_from's latest
  checkpoint, restored onto this run's shardings. The source's whole train state is
  restored (its optimizer moments are dropped right away: ~3x the params transiently)."""
  workdir = _source(config)
  src = source_config(workdir)
  _, _, src_init = train_state.train_state_fns(src)
  src_abstract = jax.eval_shape(src_init)
  ours = jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(abstract_boxed["params"]))
  theirs = jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(src_abstract["params"]))
  if ours != theirs:
    raise ValueError(f"posttrain.init_from={workdir!r}: its params do not have this run's "
                     "shapes; use the source's model section (configs/sft.py:WORKDIR copies it)")
  directory = paths.path(workdir) / run_files.CHECKPOINTS
  ckpts = checkpoint.Checkpoints(str(directory), read_only=True)
  try:
    restored = ckpts.restore_latest(plan.restore_target(src_abstract))
  finally:
    ckpts.close()
  if restored is None:
    raise ValueError(f"posttrain.init_from={workdir!r} has no checkpoint yet; train it first")
  step, src_state = restored
  print(f"initialized from {workdir} at step {step}", flush=True)
  state = {**state, "params": src_state["params"]}
  if "reference" in state:       # DPO: the frozen reference is the source (SFT) model
    state["reference"] = jax.tree.map(lambda x: x.copy(), src_state["params"])
  return state
