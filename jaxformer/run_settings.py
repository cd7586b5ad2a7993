"""The typed settings of a run: its `train`, `optim`, `data`, `mesh`, `posttrain` and `model`
config sections, every key with its default and its valid range, in one place.

    settings = run_settings.parse(config)     # RunSettings; ValueError naming field and fix
    settings.train.keep_best, settings.optim.lr, settings.data.seq_len, settings.mesh.fsdp
    settings.model.family, settings.model.d_model     # every field of the family

`configs/common.py` writes the sections from these defaults (so `--config.train.<key>=...` can
set any key, and grep finds every key here), `train`, `sample` and `sweep` read a config through
`parse` (`train.config_checks.validate` calls it first), and no other module repeats a default.
The `model` section is typed from the family registry (`jaxformer.models.settings`: the
family's fields at their resolved defaults, frozen), which registers its parser here
(`register_model_parser`: this module imports nothing of jaxformer).
`DataSettings` holds the keys every source shares; each kind of source extends it with its own
keys (`data.packing`, `data.augment`, ...) in `jaxformer.data.settings`, whose registry
`validate` parses the section with (the task names the kind), through `parse_fields` here.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _field(default: Any = dataclasses.MISSING, *, check: Callable[[Any], bool] | None = None,
           want: str = "", optional: bool = False, doc: str = ""):
  """A settings field with its range: `check(value)` must hold (None passes when `optional`);
  `want` says what the value must be, for the error message; `doc` what the key does, in
  one line (the data sources' tables in docs/data.md are made from it)."""
  return dataclasses.field(default=default, metadata={"check": check, "want": want,
                                                      "optional": optional, "doc": doc})


def _int(minimum: int, default: Any = dataclasses.MISSING, *, optional: bool = False,
         note: str = "", doc: str = ""):
  return _field(default, check=lambda v: _is_int(v) and v >= minimum,
                want=f"an int >= {minimum}{note}", optional=optional, doc=doc)


def _number(check: Callable[[float], bool], want: str, default: Any = dataclasses.MISSING,
            *, optional: bool = False, doc: str = ""):
  return _field(default, check=lambda v: _is_number(v) and check(v), want=want,
                optional=optional, doc=doc)


def _choice(options: tuple, default: Any, *, optional: bool = False, doc: str = ""):
  return _field(default, check=lambda v: v in options,
                want="one of " + ", ".join(repr(o) for o in options), optional=optional,
                doc=doc)


def _steps(v) -> bool:
  return (isinstance(v, (tuple, list)) and all(_is_int(s) and s >= 1 for s in v)
          and list(v) == sorted(set(v)))


TRACKERS = ("tensorboard", "jsonl", "wandb", "mlflow")    # train.trackers (train/trackers.py)


def _trackers(v) -> bool:
  return (isinstance(v, (tuple, list)) and all(isinstance(n, str) and n in TRACKERS for n in v)
          and len(set(v)) == len(v))


# train.evaluators (train/evaluators.py): "<kind>" or "<kind>:<argument>", each kind with
# what its argument is (None: it takes none) and whether it needs one
EVALUATORS = {
    "perplexity": ("a text source in any form data.source takes (default: the run's own)", False),
    "choices": ("a JSONL file of multiple-choice items", True),
    "probe": ("a JSONL file of {text, label} lines (BERT family; ViT: none, the run's images)",
              False),
    "heads": (None, False),
}
EVALUATORS_WANT = ("a tuple of distinct evaluator specs, each 'perplexity[:SOURCE]', "
                   "'choices:ITEMS.jsonl', 'probe[:LABELLED.jsonl]' or 'heads', e.g. "
                   "('heads', 'choices:data/arc.jsonl')")


def evaluator_spec(spec) -> tuple[str, str | None]:
  """(kind, argument or None) of one train.evaluators entry; a ValueError naming it and the
  fix when it is not one."""
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(f"train.evaluators entry {spec!r} is not a spec; it must be "
                     f"{EVALUATORS_WANT}")
  kind, sep, arg = spec.partition(":")
  if kind not in EVALUATORS:
    near = difflib.get_close_matches(kind, list(EVALUATORS), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ValueError(f"train.evaluators entry {spec!r}: {kind!r} is not an evaluator{hint}; "
                     f"the evaluators are {', '.join(EVALUATORS)}")
  what, required = EVALUATORS[kind]
  if sep and not arg:
    raise ValueError(f"train.evaluators entry {spec!r} has an empty argument after ':'; "
                     f"write {kind!r}" + (f" or '{kind}:<{what}>'" if what else ""))
  if what is None and sep:
    raise ValueError(f"train.evaluators entry {spec!r}: {kind!r} takes no argument; write "
                     f"{kind!r}")
  if required and not sep:
    raise ValueError(f"train.evaluators entry {spec!r} needs an argument: '{kind}:<{what}>'")
  return kind, (arg or None)


def _evaluators(v) -> bool:
  return (isinstance(v, (tuple, list)) and all(isinstance(s, str) for s in v)
          and len(set(v)) == len(v))


def _typed(kind: type, default: Any, *, optional: bool = False, doc: str = ""):
  return _field(default, check=lambda v: isinstance(v, kind), want=f"a {kind.__name__}",
                optional=optional, doc=doc)


BEST_METRICS = ("eval_loss", "eval_accuracy")
SCHEDULES = ("cosine", "linear", "constant", "rsqrt", "wsd")
DECAY_SHAPES = ("1-sqrt", "linear", "cosine")
STATE_DTYPES = ("float32", "bfloat16")      # optim.state_dtype


def wsd_decay_start(steps: int, decay_fraction: float, decay_steps: int | None = None) -> int:
  """The first step of a warmup-stable-decay schedule's decay (its stable phase ends here):
  the last `decay_fraction` of the steps up to `decay_steps` (None: `steps`). A cooldown
  branch of a run of `steps` steps starts from this step of a longer run of the same
  schedule. Here, without JAX, so the scaling planners use the trainer's own rule."""
  end = decay_steps or steps
  return end - max(int(round(decay_fraction * end)), 1)


def default_log_every(steps: int) -> int:
  """`train.log_every` when a config leaves it None: the largest round number (1, 2 or 5 x a
  power of 10) that logs at least 20 times in `steps` steps, so a run prints 20 to 50 train
  lines whatever its length (every step below 40 steps): 2000 steps -> 100, 200 -> 10,
  60 -> 2. Overriding `train.steps` on a config then keeps its console readable."""
  every = 1
  for power in range(len(str(max(steps, 1)))):
    for mantissa in (1, 2, 5):
      if mantissa * 10 ** power * 20 <= steps:
        every = mantissa * 10 ** power
  return every


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """`train`: the loop. batch_size counts sequences (or images) per optimizer step."""
  steps: int = _int(1)
  batch_size: int = _int(1)
  seed: int = _field(0, check=_is_int, want="an int")
  eval_every: int = _int(1, 500)
  # None: from `steps` (`default_log_every`: 20 to 50 lines a run); a value given wins
  log_every: int | None = _int(1, None, optional=True, note=" (None: from train.steps)")
  checkpoint_every: int = _int(1, 1000)
  eval_batch_size: int | None = _int(1, None, optional=True)   # None: batch_size
  keep_checkpoints: int = _int(1, 3)             # last N Orbax checkpoints
  keep_checkpoint_every: int = _int(0, 0, note=" (0: off)")   # + multiples of N, never deleted
  # + checkpoints at these steps, never deleted: the branch points of cooldown branches
  checkpoint_steps: tuple = _field((), check=_steps,
                                   want="a tuple of increasing step numbers >= 1, e.g. (800, 1600)")
  keep_best: int = _int(0, 1, note=" (0: off)")   # params of the N best evals
  best_metric: str = _choice(BEST_METRICS, "eval_loss")
  label_smoothing: float = _number(lambda v: 0 <= v < 1, "a number in [0, 1)", 0.0)
  z_loss: float = _number(lambda v: v >= 0, "a number >= 0", 0.0)
  # the token loss in tiles of this many positions (ops.cross_entropy: the float32 logits
  # [batch, length, vocab] never exist); 0: the dense loss; None: auto, tiles of 512 for a
  # vocabulary of 1024 or more (train/step.py loss_mode)
  loss_chunk: int | None = _int(0, None, optional=True, note=" (0: the dense loss)")
  max_skipped_steps: int = _int(1, 5)           # non-finite steps in a row before stopping
  # seconds without progress (a step, an eval batch, a checkpoint, a data read) before the
  # process prints its stacks and exits so the job stops (jaxformer/parallel/watchdog.py);
  # a phase that compiles gets 5x; 0: off
  stall_timeout: float = _number(lambda v: v >= 0, "a number of seconds >= 0 (0: off)", 1800.0)
  profile_steps: str = _typed(str, "")         # e.g. "10-12": a trace into <workdir>/profile
  attention_maps: bool = _typed(bool, True)    # heatmaps + entropy of an eval example
  # evaluations at every eval, on process 0, logged with the eval metrics (train/evaluators.py):
  # the `jaxformer.evaluate` tasks ("perplexity[:SOURCE]", "choices:ITEMS.jsonl",
  # "probe[:LABELLED.jsonl]") and "heads" (attention entropy and redundancy per layer)
  evaluators: tuple = _field((), check=_evaluators, want=EVALUATORS_WANT)
  sample_tokens: int = _int(0, 0)              # LMs: tokens sampled at the end (0: none)
  sample_prompt: str = _typed(str, "\n")
  sample_every: int = _int(0, 0, note=" (0: only at the end)")   # and at evals every N steps
  # where the run reports (jaxformer/train/trackers.py): its metrics, plots and, to W&B and
  # MLflow, its hyperparameters; metrics.jsonl is written whether "jsonl" is named or not
  trackers: tuple = _field(("tensorboard", "jsonl"), check=_trackers,
                           want="a tuple of distinct names from " + ", ".join(
                               repr(n) for n in TRACKERS) + ", e.g. ('tensorboard', 'wandb')")
  # the W&B project and MLflow experiment (None: $WANDB_PROJECT / $MLFLOW_EXPERIMENT_NAME, else
  # "jaxformer"), and the group of the run (a sweep's points: the sweep's name)
  tracker_project: str | None = _typed(str, None, optional=True)
  tracker_group: str | None = _typed(str, None, optional=True)

  def __post_init__(self):
    if self.log_every is None:       # resolved here, so every reader sees the cadence used
      object.__setattr__(self, "log_every", default_log_every(self.steps))
    for spec in self.evaluators:     # each entry's own one-line error
      evaluator_spec(spec)


@dataclasses.dataclass(frozen=True)
class OptimSettings:
  """`optim`: AdamW; `lr` is the peak of `schedule`, reached after `warmup_steps`; cosine and
  linear decay to `min_lr_ratio * lr` at `decay_steps` (None: `train.steps`) and stay there;
  "rsqrt" is Vaswani et al.'s lr * min(step / warmup, sqrt(warmup / step)); "wsd"
  (warmup-stable-decay, Hägele et al. 2024) holds `lr` and decays to `min_lr_ratio * lr` over
  the last `decay_fraction` of the steps up to `decay_steps`, in `decay_shape`."""
  lr: float = _number(lambda v: v > 0, "a finite number > 0")
  name: str = _choice(("adamw",), "adamw")
  schedule: str = _choice(SCHEDULES, "cosine")
  warmup_steps: int = _int(0, 0)
  decay_steps: int | None = _int(1, None, optional=True)
  min_lr_ratio: float = _number(lambda v: 0 <= v <= 1, "a number in [0, 1]", 0.1)
  decay_fraction: float = _number(lambda v: 0 < v <= 1, "a number in (0, 1]", 0.2)   # wsd
  decay_shape: str = _choice(DECAY_SHAPES, "1-sqrt")                                # wsd
  weight_decay: float = _number(lambda v: v >= 0, "a number >= 0", 0.1)
  clip: float = _number(lambda v: v >= 0, "a number >= 0 (0: off)", 1.0)
  grad_accum: int = _int(1, 1)
  # where micro-batch gradients are reduced (train/step.py grad_reduce_once): "once" per step,
  # "per_microbatch", or "auto" (once unless parameters are FSDP-sharded)
  grad_reduce: str = _choice(("auto", "once", "per_microbatch"), "auto")
  b1: float = _number(lambda v: 0 <= v < 1, "a number in [0, 1)", 0.9)
  b2: float = _number(lambda v: 0 <= v < 1, "a number in [0, 1)", 0.95)
  eps: float = _number(lambda v: v > 0, "a number > 0", 1e-8)
  # memory levers (off by default): Adam's moments stored in bfloat16 (rounded after each
  # update, which computes in float32), and kept in host memory between steps
  state_dtype: str = _choice(STATE_DTYPES, "float32")
  offload_state: bool = _typed(bool, False)


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """`data`: the keys every source shares (see `jaxformer.data.pipeline` for the sources;
  each kind's own keys: `jaxformer.data.settings`); `data_dir` is the prepared-data cache
  (None: under ~/.cache), `eval_batches` the eval windows of a text source (None: the whole
  split)."""
  source: str = _field(check=lambda v: isinstance(v, str) and bool(v),
                       want="a dataset name (see jaxformer.data.pipeline)")
  tokenizer: str | None = _typed(str, None, optional=True)
  seq_len: int | None = _int(1, None, optional=True)
  data_dir: str | None = _typed(str, None, optional=True)
  eval_batches: int | None = _int(1, None, optional=True)


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  """`mesh`: device-mesh axis sizes (-1 takes all remaining devices); `fsdp` shards parameters
  over `data` too. `jaxformer.parallel` checks them against the devices."""
  data: int = _field(-1, check=lambda v: _is_int(v) and (v >= 1 or v == -1),
                     want="an int >= 1, or -1 for the remaining devices")
  model: int = _field(1, check=lambda v: _is_int(v) and (v >= 1 or v == -1),
                      want="an int >= 1, or -1 for the remaining devices")
  expert: int = _field(1, check=lambda v: _is_int(v) and (v >= 1 or v == -1),
                       want="an int >= 1, or -1 for the remaining devices")
  fsdp: bool = _typed(bool, False)
  # hybrid sharding: this many data-parallel replicas of the (data, model, expert) mesh; the
  # batch is split over them, parameters are not (across TPU slices: one per slice keeps
  # FSDP's all-gathers on ICI). 1: no replica axis.
  replica: int = _int(1, 1)


POSTTRAIN_METHODS = ("sft", "dpo", "grpo")
# the methods whose train state keeps the starting params, frozen, as 'reference'
REFERENCE_METHODS = ("dpo", "grpo")
# what each post-training method reads from data.source (posttrain/data.py)
POSTTRAIN_RECORDS = {"sft": "{'prompt', 'response'} (or chat 'messages')",
                     "dpo": "{'prompt', 'chosen', 'rejected'}",
                     "grpo": "{'prompt', ...} (the fields posttrain.reward reads, e.g. 'answer')"}
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")       # posttrain/grpo.py LOSS_TYPES
GRPO_SCALE_REWARDS = ("group", "batch", "none")


@dataclasses.dataclass(frozen=True)
class PosttrainSettings:
  """`posttrain` (absent: an ordinary pretraining run): SFT or DPO from the params of
  `init_from` (a training workdir, or 'hf:DIR'); see jaxformer/posttrain/start.py."""
  method: str
  init_from: str | None = None
  beta: float = 0.1                 # DPO's KL weight; GRPO's (>= 0) on the k3 KL to the reference
  label_smoothing: float = 0.0      # conservative DPO's eps
  # GRPO (posttrain/grpo.py, tasks/grpo.py): k completions per prompt (train.batch_size counts
  # completions), sampled with the KV cache at `temperature`, at most max_new_tokens each,
  # ended by the tokenizer's eos or the one-token text `stop`; scored by the registered
  # `reward` (posttrain/rewards.py)
  num_generations: int = 4
  max_new_tokens: int = 32
  temperature: float = 1.0
  reward: str | None = None
  stop: str | None = None
  loss_type: str = "dapo"           # grpo | bnpo | dr_grpo | dapo, as trl's
  scale_rewards: str = "group"      # group | batch | none (Dr. GRPO: no division by the std)
  epsilon: float = 0.2              # the clip's lower epsilon
  epsilon_high: float | None = None   # its upper one (None: epsilon; DAPO: 0.28)


@dataclasses.dataclass(frozen=True)
class RunSettings:
  train: TrainSettings
  optim: OptimSettings
  # `parse`: the shared keys; `train.config_checks.validate`: the settings of the task's kind
  # of source (a `DataSettings` subclass, `jaxformer.data.settings`)
  data: DataSettings
  mesh: MeshSettings
  posttrain: PosttrainSettings | None = None
  # the family's frozen settings (`jaxformer.models.settings.ModelSettings`); None for a
  # config without a model section, or when `parse(only=...)` leaves "model" out
  model: Any = None


SECTIONS = {"train": TrainSettings, "optim": OptimSettings, "data": DataSettings,
            "mesh": MeshSettings}


# `jaxformer.models.settings.parse`, registered when `jaxformer.models` is imported
_model_parser: Callable[[Any], Any] | None = None


def register_model_parser(parse_model: Callable[[Any], Any]) -> None:
  """Set the parser of the `model` section (`jaxformer.models` does, on import)."""
  global _model_parser
  _model_parser = parse_model


def parse_model(config) -> Any:
  """The typed `model` section of `config` (None: it has none), through the registered
  parser (`jaxformer.models.settings.parse`)."""
  values = _section(config, "model")
  if values is None:
    return None
  if _model_parser is None:
    raise RuntimeError("run_settings.parse types the model section with jaxformer.models; "
                       "import jaxformer.models first")
  return _model_parser(values)


def defaults(section: str) -> dict:
  """The default of every key of `section` that has one (what configs/common.py writes)."""
  return {f.name: f.default for f in dataclasses.fields(SECTIONS[section])
          if f.default is not dataclasses.MISSING}


def optional_keys(section: str) -> dict[str, type]:
  """Keys of `section` that may be None, with the type a command-line value parses to."""
  kinds = {"int | None": int, "str | None": str}
  return {f.name: kinds[f.type] for f in dataclasses.fields(SECTIONS[section])
          if f.type in kinds}


def parse_section(section: str, values: Mapping[str, Any] | None, *,
                  strict: bool = False):
  """`values` (a config section, a dict of a saved config.json) as typed settings: missing keys
  at their defaults, every value checked. Keys the settings do not name are a source's own
  (`data`: `jaxformer.data.settings` parses them with the task's source kind) or from a newer
  version; `strict` refuses them (train, optim and mesh)."""
  return parse_fields(SECTIONS[section], values, section=section, strict=strict)


def parse_fields(kind: type, values: Mapping[str, Any] | None, *, section: str,
                 strict: bool = False, what: str | None = None):
  """`values` as the settings dataclass `kind` (the machinery of `parse_section`, for any
  dataclass whose fields are made with `_field`): missing keys at their defaults, every value
  checked, errors naming `<section>.<key>` and the fix. `strict` refuses a key `kind` does not
  name, listing the ones it does (`what` names them in the message: "a <what> setting",
  default `section`)."""
  values = dict(values.items()) if values is not None else {}
  names = [f.name for f in dataclasses.fields(kind)]
  if strict:
    unknown = sorted(set(values) - set(names))
    if unknown:
      near = difflib.get_close_matches(unknown[0], names, n=1)
      hint = f" (did you mean {section}.{near[0]}?)" if near else ""
      raise ValueError(f"{section}.{unknown[0]} is not a {what or section} setting{hint}; the "
                       f"settings are {sorted(names)}")
  chosen = {}
  for f in dataclasses.fields(kind):
    if f.name not in values:
      if f.default is dataclasses.MISSING:
        raise ValueError(f"{section}.{f.name} is required; set --config.{section}.{f.name}="
                         "<value>")
      chosen[f.name] = f.default
      continue
    value = values[f.name]
    if isinstance(value, int) and not isinstance(value, bool) and "float" in str(f.type):
      value = float(value)                 # lr=1 in a config is the float 1.0
    if not (value is None and f.metadata["optional"]) and not f.metadata["check"](value):
      raise ValueError(f"{section}.{f.name}={value!r} must be {f.metadata['want']}; set "
                       f"--config.{section}.{f.name}=<value>")
    chosen[f.name] = value
  return kind(**chosen)


def parse_posttrain(config) -> PosttrainSettings | None:
  """The typed `posttrain` section of a config (None: none, an ordinary pretraining run)."""
  values = _section(config, "posttrain")
  if values is None:
    return None
  values = dict(values)
  known = {f.name for f in dataclasses.fields(PosttrainSettings)}
  unknown = sorted(set(values) - known)
  if unknown:
    raise ValueError(f"posttrain.{unknown[0]} is not a posttrain setting; the settings are "
                     f"{sorted(known)}")
  s = PosttrainSettings(**values)
  if s.method not in POSTTRAIN_METHODS:
    raise ValueError(f"posttrain.method={s.method!r} must be one of {POSTTRAIN_METHODS}")
  if s.method == "grpo":
    if not _is_number(s.beta) or s.beta < 0:
      raise ValueError(f"posttrain.beta={s.beta!r} must be a number >= 0 (GRPO's KL weight; "
                       "0: no KL term)")
  elif not isinstance(s.beta, (int, float)) or s.beta <= 0:
    raise ValueError(f"posttrain.beta={s.beta!r} must be > 0 (DPO's KL weight, e.g. 0.1)")
  if not 0.0 <= s.label_smoothing < 0.5:
    raise ValueError(f"posttrain.label_smoothing={s.label_smoothing!r} must be in [0, 0.5)")
  checks = (
      ("num_generations", _is_int(s.num_generations) and s.num_generations >= 2,
       "an int >= 2 (completions per prompt: a group of one has no relative advantage)"),
      ("max_new_tokens", _is_int(s.max_new_tokens) and s.max_new_tokens >= 1, "an int >= 1"),
      ("temperature", _is_number(s.temperature) and s.temperature > 0, "a number > 0"),
      ("reward", s.reward is None or (isinstance(s.reward, str) and bool(s.reward)),
       "the name of a registered reward (jaxformer/posttrain/rewards.py)"),
      ("stop", s.stop is None or (isinstance(s.stop, str) and bool(s.stop)),
       "a non-empty string (the text of one token), or None"),
      ("loss_type", s.loss_type in GRPO_LOSS_TYPES,
       "one of " + ", ".join(map(repr, GRPO_LOSS_TYPES))),
      ("scale_rewards", s.scale_rewards in GRPO_SCALE_REWARDS,
       "one of " + ", ".join(map(repr, GRPO_SCALE_REWARDS))),
      ("epsilon", _is_number(s.epsilon) and 0 <= s.epsilon < 1, "a number in [0, 1)"),
      ("epsilon_high", s.epsilon_high is None or (_is_number(s.epsilon_high)
                                                  and s.epsilon_high >= 0),
       "a number >= 0, or None (= posttrain.epsilon)"))
  for name, ok, want in checks:
    if not ok:
      raise ValueError(f"posttrain.{name}={getattr(s, name)!r} must be {want}; set "
                       f"--config.posttrain.{name}=<value>")
  if s.method == "grpo" and s.reward is None:
    raise ValueError("posttrain.reward is not set: GRPO scores completions with a registered "
                     "reward; set --config.posttrain.reward=NAME (e.g. first_line_exact)")
  return s


def _check_grpo(post: PosttrainSettings, train: TrainSettings, data: DataSettings) -> None:
  """GRPO's checks across sections: whole groups in every batch, room for the completions."""
  k = post.num_generations
  for key, value in (("batch_size", train.batch_size),
                     ("eval_batch_size", train.eval_batch_size or train.batch_size)):
    if value % k:
      raise ValueError(f"train.{key}={value} must be a multiple of posttrain.num_generations"
                       f"={k} (it counts completions: {k} per prompt)")
  if data.seq_len is not None and data.seq_len <= post.max_new_tokens:
    raise ValueError(f"data.seq_len={data.seq_len} leaves no room for a prompt before "
                     f"posttrain.max_new_tokens={post.max_new_tokens}; raise data.seq_len or "
                     "lower posttrain.max_new_tokens")


def parse(config, only: tuple[str, ...] | None = None) -> RunSettings:
  """The typed settings of a full training config (a ConfigDict or the dict of a saved
  config.json); a ValueError names the first bad field and the fix. A post-training run
  (`posttrain`) is checked first, with what it needs besides: its data source and the run it
  starts from. `only`: just these sections (and `posttrain`, without those cross checks;
  "model" for the model), the others None: what a partial config (a test's,
  `train_state_fns`) can give. The model is parsed last (`parse_model`)."""
  post = parse_posttrain(config)
  if only is not None:
    return RunSettings(**{name: parse_section(name, _section(config, name),
                                              strict=name != "data") if name in only else None
                          for name in SECTIONS}, posttrain=post,
                       model=parse_model(config) if "model" in only else None)
  if post is not None:
    if not (_section(config, "data") or {}).get("source"):
      raise ValueError(f"data.source is not set: {post.method} reads JSON Lines of "
                       f"{POSTTRAIN_RECORDS[post.method]}; set --config.data.source=FILE.jsonl")
    if not post.init_from:
      raise ValueError("posttrain.init_from is not set: pass the trained workdir to start "
                       "from, e.g. --config=configs/sft.py:WORKDIR")
  settings = RunSettings(**{name: parse_section(name, _section(config, name),
                                                strict=name != "data")
                            for name in SECTIONS}, posttrain=post)
  if post is not None and post.method == "grpo":
    _check_grpo(post, settings.train, settings.data)
  return dataclasses.replace(settings, model=parse_model(config))


def _section(config, name: str):
  if hasattr(config, "keys") and name in config.keys():
    value = config[name]
    return value.to_dict() if hasattr(value, "to_dict") else value
  return None
