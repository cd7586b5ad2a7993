"""Where a post-training run starts: the params and the tokenizer of a trained workdir
(`posttrain.init_from`). The `posttrain` section is typed in `run_settings`
(`PosttrainSettings`, `RunSettings.posttrain`; None for a pretraining run):

    posttrain.method     'sft' | 'dpo' | 'grpo'
    posttrain.init_from  a training workdir (its latest checkpoint's params and its tokenizer)
                         or 'hf:DIR', a Hugging Face checkpoint directory (`convert.hf.load`;
                         its tokenizer.json, run by the `tokenizers` library)
    posttrain.beta       DPO's beta (default 0.1)
    posttrain.label_smoothing  conservative DPO's eps (default 0)
    posttrain.num_generations, max_new_tokens, temperature, reward, stop, loss_type,
      scale_rewards, epsilon, epsilon_high   GRPO's (run_settings.PosttrainSettings)

The params are copied into the new run's fresh state when the new workdir has no checkpoint
yet; from then on the new run resumes from its own checkpoints like any run. What the config
and the data take from the source is recorded in the run's own workdir at that start: the
source's config (`posttrain_source.json`, with the `init_from` it came from) and its tokenizer
(the workdir's tokenizer files), so a resume reads neither from the source: the tokenizer
always comes from the run's own copy, the params from its own checkpoints (DPO's frozen
reference is part of its train state), and the config file (`configs/sft.py`) reads the
recorded source config once the source is gone (it finds the run through `--workdir` on
the command line). The model section must give the source's parameter shapes (configs/sft.py copies
the source's model section); the optimizer starts fresh (AdamW's moments at zero).
A Hugging Face checkpoint is read twice (the config file reads its model, the run its
weights): fine for small models; a config-only reader in convert.hf would avoid it.
"""

from __future__ import annotations

import json
import sys

import flax.linen as nn
import jax
from ml_collections import ConfigDict

from jaxformer import jsonfile, paths, run_settings, workdir_layout
from jaxformer.convert import hf
from jaxformer.data import tokenizers
from jaxformer.state import checkpoint, train_state

def _source(given) -> str:
  """posttrain.init_from of `given`: a config, or its parsed `RunSettings`."""
  post = (given.posttrain if isinstance(given, run_settings.RunSettings)
          else run_settings.parse_posttrain(given))
  if post is None or not post.init_from:
    raise ValueError("posttrain.init_from is not set: pass the trained workdir to start from, "
                     "e.g. --config=configs/sft.py:WORKDIR")
  return post.init_from


HF_PREFIX = "hf:"


def hf_dir(init_from: str) -> str | None:
  """The checkpoint directory of an 'hf:DIR' source (None for a workdir)."""
  return init_from[len(HF_PREFIX):] if init_from.startswith(HF_PREFIX) else None


def load_hf(init_from: str):
  """(model config, NumPy params) of an 'hf:DIR' source; errors name posttrain.init_from."""
  try:
    return hf.load(hf_dir(init_from))
  except (ValueError, OSError) as e:
    raise ValueError(f"posttrain.init_from={init_from!r}: {e}") from None


def source_config(init_from: str, run_workdir: str | None = None) -> ConfigDict:
  """The config of a source workdir; for 'hf:DIR' only its `model` section (from the
  checkpoint's config.json). A source that is gone is read from the record a run started from
  it left in its own workdir: `run_workdir`, else the `--workdir` of this command line."""
  directory = hf_dir(init_from)
  if directory is not None and paths.path(directory, "posttrain.init_from").exists():
    return ConfigDict({"model": dict(load_hf(init_from)[0]), "data": {}, "train": {}})
  saved = train_state.read_config(init_from) if directory is None else None
  if saved is not None:
    return ConfigDict(saved)
  run_workdir = run_workdir or command_line_workdir()
  recorded = recorded_source(run_workdir, init_from) if run_workdir else None
  if recorded is not None:
    return ConfigDict(recorded)
  if directory is not None:
    load_hf(init_from)                  # its own one-line error (no such directory, ...)
  if run_workdir:
    fix = (f"and --workdir={run_workdir!r} holds no run started from it to resume; train it "
           "first")
  else:
    fix = ("train it first (a post-training run started from it resumes without it: pass "
           "that run's --workdir)")
  raise ValueError(f"posttrain.init_from={init_from!r} holds no training run (no "
                   f"{workdir_layout.CONFIG}), {fix}")


def require_source(config) -> None:
  """Refuse (one line) a start from posttrain.init_from when it is gone: before --fresh
  discards a run that could still resume from its own record."""
  init_from = _source(config)
  directory = hf_dir(init_from)
  present = (paths.path(directory, "posttrain.init_from").exists() if directory is not None
             else train_state.read_config(init_from) is not None)
  if not present:
    raise ValueError(f"posttrain.init_from={init_from!r} holds no training run: --fresh would "
                     "start over from it; train it first, or drop --fresh to resume this run "
                     "from its own workdir")


def command_line_workdir() -> str | None:
  """The value of --workdir on this process's command line (None without one): how a config
  file, which is parsed before the flags it sits beside, finds the run it configures."""
  args, found = sys.argv[1:], None
  for i, arg in enumerate(args):
    if arg == "--":
      break
    for prefix in ("--workdir=", "-workdir="):
      if arg.startswith(prefix):
        found = arg[len(prefix):]
    if arg in ("--workdir", "-workdir") and i + 1 < len(args):
      found = args[i + 1]
  return found or None              # the last one, as absl takes it


def recorded_source(run_workdir: str, init_from: str) -> dict | None:
  """The source config recorded in `run_workdir` when its run started from `init_from`
  (None: no record there, or one of another source)."""
  path = paths.path(run_workdir) / workdir_layout.POSTTRAIN_SOURCE
  if not path.exists():
    return None
  record = jsonfile.read_json(str(path), fix="it is written when a post-training run starts: "
                              "restore it, or start the run again from its source with --fresh")
  if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
    raise ValueError(f"{path} is not a post-training source record; restore it, or start the "
                     "run again from its source with --fresh")
  return record["config"] if record.get("init_from") == init_from else None


def record_source(workdir: str, init_from: str, source: ConfigDict | dict) -> None:
  """Write the record `recorded_source` reads (process 0, at the run's first start)."""
  config = json.loads(ConfigDict(source).to_json())     # as config.json would hold it
  paths.write_text(paths.path(workdir) / workdir_layout.POSTTRAIN_SOURCE,
                   json.dumps({"init_from": init_from, "config": config}, indent=2))


def run_tokenizer(config, workdir: str):
  """The tokenizer of the run in `workdir`: its own saved copy once it has started (its
  config.json is written), so a resume never reads the source; else the source's."""
  own = paths.path(workdir)
  if (own / workdir_layout.CONFIG).exists() and (own / tokenizers.TOKENIZER_FILE).exists():
    return tokenizers.load_tokenizer(workdir)
  return source_tokenizer(config)


def source_tokenizer(config):
  workdir = _source(config)
  directory = hf_dir(workdir)
  try:
    if directory is not None:
      return tokenizers.HuggingFaceTokenizer.from_path(directory, workdir)
    return tokenizers.load_tokenizer(workdir)
  except ValueError as e:
    raise ValueError(f"posttrain.init_from={workdir!r}: {e}") from None


def init_state(config, plan, state, abstract_boxed, run_workdir: str):
  """`state` (fresh) with its params replaced by those of posttrain.init_from's latest
  checkpoint, restored onto this run's shardings. The source's whole train state is
  restored (its optimizer moments are dropped right away: ~3x the params transiently).
  Process 0 records the source's config in `run_workdir` (`record_source`)."""
  workdir = _source(config)
  if hf_dir(workdir) is not None:
    return _init_from_hf(workdir, plan, state, abstract_boxed, run_workdir)
  saved = train_state.read_config(workdir)
  if saved is None:
    raise ValueError(f"posttrain.init_from={workdir!r} holds no training run (no "
                     f"{workdir_layout.CONFIG}): a run starting from it needs it; train it first")
  src = ConfigDict(saved)
  _, _, src_init = train_state.train_state_fns(src)
  src_abstract = jax.eval_shape(src_init)
  ours = jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(abstract_boxed["params"]))
  theirs = jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(src_abstract["params"]))
  if ours != theirs:
    raise ValueError(f"posttrain.init_from={workdir!r}: its params do not have this run's "
                     "shapes; use the source's model section (configs/sft.py:WORKDIR copies it)")
  directory = paths.path(workdir) / workdir_layout.CHECKPOINTS
  ckpts = checkpoint.Checkpoints(str(directory), read_only=True)
  try:
    restored = ckpts.restore_latest(plan.restore_target(src_abstract))
  finally:
    ckpts.close()
  if restored is None:
    raise ValueError(f"posttrain.init_from={workdir!r} has no checkpoint yet; train it first")
  step, src_state = restored
  if jax.process_index() == 0:
    record_source(run_workdir, workdir, saved)
  print(f"initialized from {workdir} at step {step}", flush=True)
  return _with_params(state, src_state["params"])


def _with_params(state, params):
  state = {**state, "params": params}
  if "reference" in state:       # DPO, GRPO: the frozen reference is the source model
    state["reference"] = jax.tree.map(lambda x: x.copy(), params)
  return state


def _init_from_hf(init_from: str, plan, state, abstract_boxed, run_workdir: str):
  model, params = load_hf(init_from)
  abstract = nn.unbox(abstract_boxed["params"])
  ours = jax.tree.map(lambda x: x.shape, abstract)
  try:
    theirs = jax.tree.map(lambda x: x.shape, params)
  except ValueError:
    theirs = None
  if jax.tree.structure(ours) != jax.tree.structure(theirs) or ours != theirs:
    raise ValueError(f"posttrain.init_from={init_from!r}: the checkpoint's params do not have "
                     "this run's shapes; use its model section (configs/sft.py:hf:DIR copies it)")
  shardings = plan.state_shardings(abstract_boxed)["params"]
  params = jax.tree.map(lambda x, a, s: jax.device_put(x.astype(a.dtype), s), params,
                        abstract, shardings)
  if jax.process_index() == 0:     # source_config's form of an hf: source
    record_source(run_workdir, init_from, {"model": dict(model), "data": {}, "train": {}})
  print(f"initialized from {init_from}", flush=True)
  return _with_params(state, params)
