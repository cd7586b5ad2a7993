"""`train.evaluators`: evaluations of the model at every eval step, on process 0, logged with
the eval metrics (metrics.jsonl, the console, the trackers) as `eval_<name>/<metric>`.

Each entry is "<kind>" or "<kind>:<argument>" (`run_settings.evaluator_spec`); every kind but
'heads' is a task of `python -m jaxformer.evaluate`, run through its own function:
- 'perplexity[:SOURCE]' (decoder LMs): `evaluate.perplexity.evaluate` on the validation split
  of SOURCE (default: the run's data.source), as many tokens as the run's eval reads
  (data.eval_batches x the eval batch x data.seq_len; the whole split when eval_batches is
  None); logs loss, perplexity, bits_per_byte, accuracy;
- 'choices:ITEMS.jsonl' (decoder LMs): `evaluate.choices.evaluate`; logs acc, acc_norm;
- 'probe[:LABELLED.jsonl]' (encoders: BERT family with the file, ViT without):
  `evaluate.probe.evaluate`; logs train_accuracy, test_accuracy;
- 'heads' (any model with attention): `evaluate.routing.summarize` of the attention weights
  of the first eval batch's first rows (up to HEAD_ROWS): per layer the mean and min
  normalised entropy of its heads, their mean pairwise similarity, the similarity of each
  head's nearest other head; the per-head arrays go to <workdir>/heads/step_<step>.json.

Names: 'perplexity' (or 'perplexity-<stem of SOURCE>'), 'choices-<stem>', 'probe' (or
'probe-<stem>'), 'heads'. Everything a spec names is checked by `check` before anything
compiles (the files parse, the kind fits the model family). With several processes every
process takes part in gathering the params (`gather_params`), then process 0 evaluates alone.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxformer import paths, run_settings, workdir_layout
from jaxformer.data.batching import VALID
from jaxformer.evaluate import results, routing

HEAD_ROWS = 8                    # rows of the first eval batch the 'heads' evaluator reads
LOGGED = {"perplexity": ("loss", "perplexity", "bits_per_byte", "accuracy"),
          "choices": ("acc", "acc_norm"),
          "probe": ("train_accuracy", "test_accuracy")}
LM_KINDS = ("perplexity", "choices")


@dataclasses.dataclass(frozen=True)
class Spec:
  kind: str
  arg: str | None
  name: str                      # metrics are logged as eval_<name>/<metric>

  @property
  def prefix(self) -> str:
    return f"eval_{self.name}/"


def specs(train: run_settings.TrainSettings) -> list[Spec]:
  """The parsed train.evaluators; a ValueError when two entries would log under one name."""
  out, seen = [], {}
  for text in train.evaluators:
    kind, arg = run_settings.evaluator_spec(text)
    name = kind + (f"-{results.stem(arg)}" if arg else "")
    if name in seen:
      raise ValueError(f"train.evaluators entries {seen[name]!r} and {text!r} would both log "
                       f"as eval_{name}/...; keep one, or rename a file")
    seen[name] = text
    out.append(Spec(kind, arg, name))
  return out


def check(settings: run_settings.RunSettings) -> list[Spec]:
  """Everything the specs name, before anything compiles: the kind fits the model family and
  its file parses (one-line errors naming the entry)."""
  from jaxformer.evaluate import choices, probe
  out = specs(settings.train)
  family = settings.model.family
  for spec in out:
    entry = f"train.evaluators entry {spec.kind + (':' + spec.arg if spec.arg else '')!r}"
    if spec.kind in LM_KINDS and family != "decoder":
      raise ValueError(f"{entry} scores text with a decoder LM; this run is model.family="
                       f"{family!r}" + ("; use 'probe' for an encoder" if family in
                                        probe.FAMILIES else "") + "; remove the entry")
    if spec.kind == "choices":
      choices.read_items(spec.arg)
    if spec.kind == "probe":
      if family not in probe.FAMILIES:
        raise ValueError(f"{entry}: a linear probe reads an encoder ({', '.join(probe.FAMILIES)}"
                         f"); this run is model.family={family!r}; remove the entry")
      if family in probe.TEXT_FAMILIES and not spec.arg:
        raise ValueError(f"{entry}: a {family!r} run is probed on labelled text; write "
                         "'probe:<JSONL of {\"text\": ..., \"label\": ...} lines>'")
      if family in probe.IMAGE_FAMILIES and spec.arg:
        raise ValueError(f"{entry}: a {family!r} run is probed on its own images; write "
                         "'probe'")
      if spec.arg:
        probe.read_labelled(spec.arg)
  return out


def gather_params(params):
  """The params every process can evaluate alone: with several processes each gets the whole
  arrays (a collective: every process calls this at the same eval, whatever it does next)."""
  if jax.process_count() == 1:
    return params
  return multihost_utils.process_allgather(params, tiled=True)


class Evaluators:
  """The run's train.evaluators (an empty list: nothing to do); called on process 0."""

  def __init__(self, run, steps, snapshot_fn=None):
    from jaxformer.train import attention_maps
    self.run = run
    self.specs = specs(run.settings.train)
    self.items = {}
    self.heads_fn = self.head_batch = None
    if not self.specs:
      return
    from jaxformer.evaluate import choices
    for spec in self.specs:
      if spec.kind == "choices":
        self.items[spec.name] = choices.read_items(spec.arg)
      if spec.kind == "heads":
        valid = np.asarray(steps.example.get(VALID, np.ones(1)))
        rows = max(1, min(HEAD_ROWS, int(np.sum(valid > 0)) if valid.ndim else HEAD_ROWS))
        self.heads_fn = attention_maps.make_snapshot_fn(run.module, run.task, rows=rows)
        self.head_batch = steps.example

  def __bool__(self) -> bool:
    return bool(self.specs)

  def __call__(self, params, done: int) -> dict[str, dict[str, float]]:
    """{name: {metric: value}} of every evaluator on `params` (whole arrays on this process)."""
    return {spec.name: getattr(self, f"_{spec.kind}")(spec, params, done)
            for spec in self.specs}

  def _tokenizer(self):
    from jaxformer.evaluate import scoring
    tokenizer = getattr(self.run.pipeline, "tokenizer", None)
    scoring.check_vocab(self.run.config, tokenizer)
    return tokenizer

  def _batch_size(self) -> int:
    t = self.run.settings.train
    return t.eval_batch_size or t.batch_size

  def _perplexity(self, spec: Spec, params, done: int) -> dict:
    from jaxformer.evaluate import perplexity
    data, t = self.run.settings.data, self.run.settings.train
    max_tokens = (None if data.eval_batches is None or data.seq_len is None else
                  data.eval_batches * (t.eval_batch_size or t.batch_size) * data.seq_len)
    out = perplexity.evaluate(self.run.config, params, self._tokenizer(), self.run.workdir,
                              source=spec.arg, split="validation", max_tokens=max_tokens,
                              batch_size=self._batch_size())
    return {k: out[k] for k in LOGGED["perplexity"]}

  def _choices(self, spec: Spec, params, done: int) -> dict:
    from jaxformer.evaluate import choices, scoring
    tokenizer = self._tokenizer()
    scorer = scoring.Scorer(self.run.config, params, batch_size=self._batch_size(),
                            vocab_limit=tokenizer.vocab_size)
    out = choices.evaluate(scorer, tokenizer, self.items[spec.name],
                           scoring.start_token(tokenizer))
    return {k: out[k] for k in LOGGED["choices"]}

  def _probe(self, spec: Spec, params, done: int) -> dict:
    from jaxformer.evaluate import probe
    out = probe.evaluate(self.run.config, params, getattr(self.run.pipeline, "tokenizer", None),
                         data=spec.arg)
    return {k: out[k] for k in LOGGED["probe"]}

  def _heads(self, spec: Spec, params, done: int) -> dict:
    weights = jax.device_get(self.heads_fn(params, self.head_batch))
    summary = routing.summarize(weights)
    folder = os.path.join(self.run.workdir, workdir_layout.HEADS)
    paths.path(folder).mkdir(parents=True, exist_ok=True)
    paths.write_text(os.path.join(folder, f"step_{done:06d}.json"),
                     json.dumps({"step": done, **summary}) + "\n")
    return summary["scalars"]


def flat(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
  """{name: {metric: v}} -> {"eval_<name>/<metric>": v}: the keys of the eval record."""
  return {f"eval_{name}/{k}": float(v) for name, group in metrics.items()
          for k, v in group.items()}
