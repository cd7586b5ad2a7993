"""What each task feeds the model and how its loss and eval metrics are computed.

The model family's registry entry names the task: decoder -> "lm" (next token), bert and
roberta -> "mlm" (masked tokens; bert with model.nsp=True -> "mlm_nsp": plus next-sentence
prediction, whose eval adds eval_nsp_loss / eval_nsp_accuracy while eval_loss stays the
masked-token loss), vit -> "classification", seq2seq / rnn_seq2seq -> "seq2seq" (teacher-forced
target tokens), bart -> "bart_denoising" (the original text from a corrupted copy), t5 ->
"span_corruption" (the seq2seq layout, made from text), electra -> "rtd" (replaced-token
detection on the mlm batches, `rtd.py`).
Every task reduces to weighted token (or image) cross-entropy: `labels` and `weights` say which
predictions count, so padding, packed-document boundaries and unmasked MLM positions drop out
the same way. Eval metrics are sums over batches (not means of batch means), so a padded last
batch or uneven batches give the exact split-level value.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.data.batching import VALID
from jaxformer import models
from jaxformer.posttrain.dpo import DirectPreference
from jaxformer.train.rtd import ReplacedTokenDetection


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  unit: str                      # what throughput counts: "tokens" or "images"
  inputs: tuple[str, ...]        # positional model arguments, by batch key
  optional: tuple[tuple[str, str], ...]   # (batch key, model keyword) passed when present
  labels: str
  # FLOPs per example (the MFU estimate): the batch key whose length is the tokens counted per
  # example, and the keys whose longest length is the context a query attends over; None for
  # inputs that are not token sequences (the family's `tokens_per_example` counts them).
  counted: str | None = None
  context: tuple[str, ...] = ()
  # model passes per counted row relative to one training pass (fwd + bwd): DPO trains on a
  # chosen and a rejected row and runs the reference forward (1/3 of a pass) on both: 8/3
  flops_scale: float = 1.0
  text: bool = False               # ids of a text tokenizer: eval perplexity, labelled maps
  samples: bool = False            # a language model: text is sampled at evals and the end
  step_accuracy: bool = False      # each logged step records its accuracy too
  sequence_accuracy: bool = False  # evals also count the sequences right in every token
  layout: str | None = None        # the batch layout the data pipeline builds (None: name)
  # An objective that is not the cross-entropy of the model's logits against `labels`
  # (rtd.ReplacedTokenDetection): its train_sums(module, params, batch, rng) -> (objective
  # sum, (nll sum, correct sum, metrics)), eval_sums(module, params, batch) -> sums and
  # finalize(totals) -> eval metrics replace the cross-entropy ones in the steps. An objective
  # with a `frozen_key` (DPO's 'reference') also gets that entry of the train state, never
  # trained, as the keyword `frozen` of both sums.
  objective: Any = None

  @property
  def frozen_key(self) -> str | None:
    return getattr(self.objective, "frozen_key", None)

  @property
  def batch_layout(self) -> str:
    return self.layout or self.name
  # BERT's next-sentence prediction: the batch key of the per-example labels; the model
  # returns {'mlm': token logits, 'nsp': [B, 2]} and the loss adds the NSP cross-entropy
  nsp_labels: str | None = None

  def token_lengths(self, batch: dict) -> tuple[int, int] | None:
    """(tokens counted per example, context length) of `batch`, or None (see `counted`)."""
    if self.counted is None:
      return None
    return batch[self.counted].shape[1], max(batch[k].shape[1] for k in self.context)

  def model_args(self, batch: dict):
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

  def units_per_batch(self, batch: dict) -> int:
    labels = batch[self.labels]
    return int(np.prod(labels.shape)) if self.unit == "tokens" else int(labels.shape[0])


TASKS = {
    "lm": Task("lm", "tokens", ("inputs",),
               (("segment_ids", "segment_ids"), ("positions", "positions")), "targets",
               counted="inputs", context=("inputs",), text=True, samples=True),
    "mlm": Task("mlm", "tokens", ("inputs",),
                (("attention_mask", "attention_mask"),
                 ("token_type_ids", "token_type_ids")), "targets",
                counted="inputs", context=("inputs",), text=True),
    "mlm_nsp": Task("mlm_nsp", "tokens", ("inputs",),
                    (("attention_mask", "attention_mask"),
                     ("token_type_ids", "token_type_ids")), "targets",
                    counted="inputs", context=("inputs",), text=True, nsp_labels="nsp_labels"),
    "classification": Task("classification", "images", ("images",), (), "labels",
                           step_accuracy=True),
    "seq2seq": Task("seq2seq", "tokens", ("src", "tgt_in"), (("src_mask", "src_mask"),),
                    "tgt_out", counted="tgt_out", context=("src", "tgt_out"),
                    sequence_accuracy=True),
    # BART's denoising (data/denoising.py): corrupted text in, the original text out; the
    # seq2seq batch layout on a text corpus.
    "bart_denoising": Task("bart_denoising", "tokens", ("src", "tgt_in"),
                           (("src_mask", "src_mask"),), "tgt_out", counted="tgt_out",
                           context=("src", "tgt_out"), text=True),
    # T5's objective: seq2seq batches made from text (data/span_corruption.py)
    "span_corruption": Task("span_corruption", "tokens", ("src", "tgt_in"),
                            (("src_mask", "src_mask"),), "tgt_out", counted="tgt_out",
                            context=("src", "tgt_out"), text=True),
    # ELECTRA: generator MLM + λ x replaced-token detection, on the mlm batches (rtd.py)
    "rtd": Task("rtd", "tokens", ("inputs",),
                (("attention_mask", "attention_mask"), ("token_type_ids", "token_type_ids")),
                "targets", counted="inputs", context=("inputs",), text=True, layout="mlm",
                objective=ReplacedTokenDetection()),
    # Image captioning (data/images/captions.py): an image in, its caption out, teacher-forced
    # like seq2seq; the image grid is the encoder's context (the family counts its tokens).
    "captioning": Task("captioning", "tokens", ("images", "tgt_in"), (), "tgt_out",
                       counted="tgt_out", context=("tgt_out",), sequence_accuracy=True),
    # Supervised fine-tuning (posttrain/data.py): the lm objective on packed prompt/response
    # rows whose weights are 1 on response tokens only; segment ids keep examples apart.
    "sft": Task("sft", "tokens", ("inputs",),
                (("segment_ids", "segment_ids"), ("positions", "positions")), "targets",
                counted="inputs", context=("inputs",), text=True, samples=True),
    # Direct preference optimization (posttrain/dpo.py): the loss is over pairs ('pairs' is
    # 1 per pair, so the step's weighted sums are per-pair means); `task_for_run` sets the
    # objective's beta from the config. The reference params are the train state's
    # 'reference' (the objective's `frozen_key`).
    "dpo": Task("dpo", "pairs", ("chosen_inputs",), (), "pairs", counted="chosen_inputs",
                context=("chosen_inputs",), flops_scale=8 / 3, text=True, samples=True,
                objective=DirectPreference()),
}


def task_for_run(config) -> Task:
  """The task of a training config: `posttrain.method` (posttrain/init.py) where the config
  has a posttrain section, else the model family's (`task_for`)."""
  from jaxformer.posttrain import init as posttrain_init
  post = posttrain_init.check_config(config)
  task = task_for(config.model)
  if post is None:
    return task
  if task.name != "lm":
    raise ValueError(f"posttrain.method={post.method!r} needs a decoder LM; "
                     f"model.family={config.model.get('family')!r} trains task {task.name!r}")
  if post.method not in TASKS:
    raise ValueError(f"posttrain.method={post.method!r} has no task")
  if post.method == "dpo":
    return dataclasses.replace(TASKS["dpo"], objective=DirectPreference(
        post.beta, post.label_smoothing))
  return TASKS[post.method]


def task_for(model_config) -> Task:
  task = models.get(model_config.get("family")).task
  if task == "mlm" and model_config.get("nsp"):      # BERT with its next-sentence head
    task = "mlm_nsp"
  return TASKS[task]


def nsp_sums(task: Task, logits, batch) -> dict:
  """Sums of next-sentence nll / correct / count over the (valid) rows of a batch."""
  labels = batch[task.nsp_labels]
  rows = batch[VALID] if VALID in batch else jnp.ones(labels.shape, jnp.float32)
  _, nll = cross_entropy(logits, labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return {"nsp_nll": jnp.sum(nll * rows), "nsp_correct": jnp.sum(correct * rows),
          "nsp_count": jnp.sum(rows)}


def cross_entropy(logits, labels, *, label_smoothing: float = 0.0, z_loss: float = 0.0):
  """Per-prediction float32 (objective, nll): objective adds label smoothing
  ((1-s) * nll + s * mean over classes of -log p) and z-loss (z * log(Z)^2, PaLM), which keeps
  the softmax normaliser near 1."""
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  nll = log_z - jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  objective = nll
  if label_smoothing:
    objective = (1 - label_smoothing) * nll + label_smoothing * (log_z - logits.mean(-1))
  if z_loss:
    objective = objective + z_loss * jnp.square(log_z)
  return objective, nll


def eval_sums(task: Task, logits, batch) -> dict:
  """Sums over one batch that `finalize_eval` turns into split-level metrics."""
  extra = {}
  if task.nsp_labels is not None:
    extra = nsp_sums(task, logits["nsp"], batch)
    logits = logits["mlm"]
  labels, w = batch[task.labels], task.weights(batch)
  _, nll = cross_entropy(logits, labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  sums = {"nll": jnp.sum(nll * w), "correct": jnp.sum(correct * w), "count": jnp.sum(w),
          **extra}
  if task.sequence_accuracy:       # a sequence is right when all its weighted tokens are
    row_ok = jnp.all((correct > 0) | (w == 0), axis=-1).astype(jnp.float32)
    rows = batch[VALID] if VALID in batch else jnp.ones(row_ok.shape, jnp.float32)
    sums.update(seq_correct=jnp.sum(row_ok * rows), seq_count=jnp.sum(rows))
  return sums


def finalize_eval(task: Task, totals: dict) -> dict:
  if task.objective is not None:
    return task.objective.finalize(totals)
  count = max(float(totals["count"]), 1e-9)
  loss = float(totals["nll"]) / count
  out = {"eval_loss": loss, "eval_accuracy": float(totals["correct"]) / count}
  if task.text:
    out["eval_perplexity"] = float(np.exp(min(loss, 80.0)))
  if "nsp_count" in totals:
    n = max(float(totals["nsp_count"]), 1e-9)
    out["eval_nsp_loss"] = float(totals["nsp_nll"]) / n
    out["eval_nsp_accuracy"] = float(totals["nsp_correct"]) / n
  if "seq_count" in totals:
    out["eval_sequence_accuracy"] = float(totals["seq_correct"]) / max(
        float(totals["seq_count"]), 1e-9)
  return out
