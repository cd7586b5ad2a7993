"""The task protocol: everything the trainer, the planner and evaluation know about a task.

A `Task` states, in one object,
- its data: `make_pipeline` (the pipeline that builds its batches) and `batch_spec` (their
  shapes and dtypes without reading data: what `jaxformer.plan` compiles for);
- its loss: `loss(ctx, batch) -> LossSums`, sums over one (micro-)batch that the train step
  (`train/step.py`: accumulation, the skip of non-finite steps, the update; nothing
  task-specific) divides by `weight(batch)` of the whole batch;
- its evaluation: `eval_sums(module, params, batch, extra)` per eval batch (sums, so a
  padded last batch or uneven batches give the exact split-level value), added up over the
  split by the loop, and `finalize(totals)` -> the `eval_*` metrics;
- optional extra state: `extra_state` names a train-state entry besides the params that its
  loss and eval read and training never updates (DPO's frozen reference); the step and the
  eval step pass it as `ctx.extra` / `eval_sums`' `extra`;
- what throughput and MFU count: `unit`, `units_per_batch`, `rows`, `token_lengths`,
  `flops_scale`;
- optional rollout: `rolls_out` and `rollout(config, pipeline, params, extra, batch, step,
  train)`, a host-side stage that turns the pipeline's batch into the step's with the current
  params (GRPO: sample completions, score them with a Python reward);
- what evaluation and inference can do with it: `text` (ids of a text tokenizer: eval
  perplexity, labelled attention maps), `samples` (a language model: text is sampled at evals
  and at the end), `step_accuracy` (each logged step records its accuracy).

Which task a run trains: the model family's registry entry names it (`for_model` turns it into
a variant the model config asks for, e.g. BERT with next-sentence prediction), and a config's
`posttrain.method` picks SFT, DPO or GRPO (`for_posttrain`). The registry is `jaxformer.tasks`:
adding a task is one module and one entry there (docs/design/tasks.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxformer.data.batching import VALID


class LossSums(NamedTuple):
  """What a task's loss returns for one (micro-)batch; the step divides each sum by the
  batch's `Task.weight`, so e.g. `nll / weight` is the logged `loss`."""
  weighted: Any                  # sum of the per-prediction objective x weight (differentiated)
  nll: Any                       # sum of nll x weight: the logged `loss`
  correct: Any                   # sum of correct x weight: `accuracy`
  metrics: dict                  # per-step metrics, logged under their own names as they are
  # a mean over the micro-batch (not a sum over rows), added to the objective the way MoE's
  # auxiliary losses are: x weight / grad_accum (BERT's next-sentence loss); None: none
  aux: Any = None


@dataclasses.dataclass
class LossContext:
  """What the train step gives a task's loss: the model, its params and the step's key, and
  how to run the training forward pass.

  `forward(*args, **kwargs)` runs the model with dropout on (key `rng`), returning the final
  hidden states and readout instead of logits where the step takes the chunked loss
  (`chunk` > 0, see `cross_entropy.head_sums`); whatever the model sows into `collections`
  (the step's: MoE's auxiliary losses) is kept in `sown`, which the step reads afterwards, so
  a task never handles them. A loss may call `module.apply` itself (ELECTRA's generator and
  discriminator, DPO's reference): nothing is then sown. `over_blocks` sums a value over the
  blocks of a micro-batch when the step reduces gradients once (the identity otherwise): what
  a loss that is not a sum over rows needs to see its whole micro-batch."""
  module: Any
  params: Any
  rng: Any
  extra: Any = None              # the train-state entry `Task.extra_state`, or None
  chunk: int = 0                 # positions per tile of the chunked loss; 0: dense
  label_smoothing: float = 0.0
  z_loss: float = 0.0
  collections: tuple[str, ...] = ()
  over_blocks: Callable = lambda x: x
  sown: list = dataclasses.field(default_factory=list)

  def forward(self, *args, **kwargs):
    hidden = {"return_hidden": True} if self.chunk else {}
    apply = lambda **extra: self.module.apply({"params": self.params}, *args, **kwargs, **hidden,
                                              deterministic=False, rngs={"dropout": self.rng},
                                              **extra)
    if not self.collections:
      return apply()
    out, mutated = apply(mutable=list(self.collections))
    self.sown.append(mutated)
    return out


@dataclasses.dataclass(frozen=True)
class Task:
  """One task (see the module docstring). Subclasses implement `make_pipeline`, `batch_spec`,
  `loss`, `eval_sums` and `finalize`; the fields describe the batch layout for the generic
  helpers below."""
  name: str
  unit: str = "tokens"           # what throughput counts: "tokens", "images" or "pairs"
  inputs: tuple[str, ...] = ()   # positional model arguments, by batch key
  optional: tuple[tuple[str, str], ...] = ()   # (batch key, model keyword) passed when present
  labels: str = "targets"        # the batch key of what is predicted
  # FLOPs per example (the MFU estimate): the batch key whose length is the tokens counted per
  # example, and the keys whose longest length is the context a query attends over; None for
  # inputs that are not token sequences (the family's `tokens_per_example` counts them).
  counted: str | None = None
  context: tuple[str, ...] = ()
  # model passes per counted row relative to one training pass (fwd + bwd): DPO trains on a
  # chosen and a rejected row and runs the reference forward (1/3 of a pass) on both: 8/3
  flops_scale: float = 1.0
  text: bool = False             # ids of a text tokenizer: eval perplexity, labelled maps
  samples: bool = False          # a language model: text is sampled at evals and the end
  step_accuracy: bool = False    # each logged step records its accuracy too
  extra_state: str | None = None  # a train-state entry the loss and eval read, never trained
  # The loss is a sum over rows, so the step may split a micro-batch's rows into blocks and
  # reduce their gradients once (`optim.grad_reduce`); False refuses that.
  row_sums: bool = True
  # The loss is the cross-entropy of the model's vocabulary head (`cross_entropy.head_sums`):
  # the step may then take the chunked loss (`train.loss_chunk`, `step.loss_mode`).
  head_loss: bool = False
  # The kind of source its data section is (`jaxformer.data.settings`): `validate` parses the
  # section with it, refusing a key the kind does not name; "shared": the shared keys only.
  data_kind: str = "shared"
  # A host-side stage between the pipeline and the step (`rollout`): RL samples completions
  # from the current policy and scores them there. False: the pipeline's batch is the step's.
  rolls_out: bool = False

  # --- what a subclass states -------------------------------------------------------------

  def make_pipeline(self, config, settings, *, workdir: str, process_index: int = 0,
                    process_count: int = 1):
    """The data pipeline (`data.batching.Pipeline`) of this task for `config`, whose typed
    sections are `settings`."""
    raise NotImplementedError

  def data_settings(self, config, settings):
    """The typed `data` settings of this task's source kind: `settings.data` where
    `validate` parsed it (the run's `RunSettings`), else `config.data` parsed now."""
    from jaxformer.data import settings as source_settings
    return source_settings.for_run(self.data_kind, config, settings)

  def batch_spec(self, config, settings, model: dict) -> dict[str, tuple[tuple[int, ...],
                                                                          np.dtype]]:
    """{key: (global shape, dtype)} of the train batch `make_pipeline` gives; `model` is the
    model config with its defaults filled in."""
    raise NotImplementedError

  def loss(self, ctx: LossContext, batch: dict) -> LossSums:
    raise NotImplementedError

  def eval_sums(self, module, params, batch: dict, extra=None) -> dict:
    """Sums over one eval batch (padded rows, `valid` = 0, count nowhere)."""
    raise NotImplementedError

  def finalize(self, totals: dict) -> dict:
    """The eval record's metrics (`eval_loss`, ...) from the sums of every eval batch."""
    raise NotImplementedError

  def rollout(self, config, pipeline, params, extra, batch: dict, *, step: int,
              train: bool) -> dict:
    """The batch the step (train, or eval where not `train`) takes at `step`, made on the host
    from the pipeline's `batch` and the current `params` (and extra state); called by the loop
    and the evaluation only where `rolls_out`, before `plan.global_batch`. `batch_spec` gives
    the shapes of what this returns."""
    del config, pipeline, params, extra, step, train
    return batch

  # --- variants -----------------------------------------------------------------------------

  def for_model(self, model_config) -> Task:
    """The task a model config trains when its family names this one (default: this)."""
    del model_config
    return self

  def for_posttrain(self, settings) -> Task:
    """This task as `posttrain.method` with the config's post-training `settings`."""
    del settings
    return self

  # --- generic helpers ----------------------------------------------------------------------

  def model_args(self, batch: dict):
    """(positional args, keyword args) of the model call on `batch`."""
    args = tuple(batch[k] for k in self.inputs)
    kwargs = {kw: batch[k] for k, kw in self.optional if k in batch}
    return args, kwargs

  def weights(self, batch: dict):
    """float32 weight per prediction (1 where it counts), shaped like the labels."""
    labels = batch[self.labels]
    w = batch["weights"] if "weights" in batch else jnp.ones(labels.shape, jnp.float32)
    if VALID in batch:                 # padded eval rows
      w = w * batch[VALID].reshape(batch[VALID].shape + (1,) * (labels.ndim - 1))
    return w.astype(jnp.float32)

  def weight(self, batch: dict):
    """What the step divides the batch's sums by: the total weight of its predictions."""
    return jnp.sum(self.weights(batch))

  def rows(self, batch: dict) -> int:
    """Examples in `batch`."""
    return batch[self.labels].shape[0]

  def token_lengths(self, batch: dict) -> tuple[int, int] | None:
    """(tokens counted per example, context length) of `batch`, or None (see `counted`)."""
    if self.counted is None:
      return None
    return batch[self.counted].shape[1], max(batch[k].shape[1] for k in self.context)

  def units_per_batch(self, batch: dict) -> int:
    labels = batch[self.labels]
    return int(np.prod(labels.shape)) if self.unit == "tokens" else int(labels.shape[0])
