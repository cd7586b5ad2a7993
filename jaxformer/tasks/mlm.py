"""Masked-token prediction (task "mlm": bert, roberta, deberta) and BERT's variant with
next-sentence prediction (task "mlm_nsp", `model.nsp=True`): masked text in, the original
tokens at the masked positions out (`data/text.py`).

With NSP the model returns {'mlm': token logits, 'nsp': [B, 2]}; the loss adds the NSP
cross-entropy's mean over rows (so the objective is HF BertForPreTraining's MLM mean + NSP
mean) and the step reports `nsp_loss`, `nsp_accuracy`; its eval adds eval_nsp_loss /
eval_nsp_accuracy while eval_loss stays the masked-token loss.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxformer.data import batch_spec, pipeline, text
from jaxformer.data.batching import VALID
from jaxformer.tasks.base import LossContext, LossSums
from jaxformer.tasks.cross_entropy import CrossEntropyTask, cross_entropy, head_sums

NSP_LABELS = "nsp_labels"    # the batch key of the per-example next-sentence labels


@dataclasses.dataclass(frozen=True)
class MaskedLM(CrossEntropyTask):
  kind: str = "mlm"          # the text pipeline's layout (data/text.py)
  data_kind: str = "masked_text"

  def make_pipeline(self, config, settings, **kw):
    return text.make_text_pipeline(self.data_settings(config, settings), self.kind,
                                   **pipeline.pipeline_kwargs(settings, **kw))

  def batch_spec(self, config, settings, model):
    del model
    return batch_spec.text_batch_spec(self.data_settings(config, settings),
                                      settings.train.batch_size, self.kind)

  def for_model(self, model_config):
    return NSP if model_config.get("nsp") else self     # BERT with its next-sentence head


def nsp_sums(logits, batch) -> dict:
  """Sums of next-sentence nll / correct / count over the (valid) rows of a batch."""
  labels = batch[NSP_LABELS]
  rows = batch[VALID] if VALID in batch else jnp.ones(labels.shape, jnp.float32)
  _, nll = cross_entropy(logits, labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return {"nsp_nll": jnp.sum(nll * rows), "nsp_correct": jnp.sum(correct * rows),
          "nsp_count": jnp.sum(rows)}


@dataclasses.dataclass(frozen=True)
class MaskedLMWithNSP(MaskedLM):
  kind: str = "mlm_nsp"

  def for_model(self, model_config):
    return self

  def loss(self, ctx: LossContext, batch: dict) -> LossSums:
    args, kwargs = self.model_args(batch)
    out = ctx.forward(*args, **kwargs)
    # NSP's mean over rows is not a sum over rows: over the whole micro-batch
    sums = ctx.over_blocks(nsp_sums(out["nsp"], batch))
    count = jnp.maximum(sums["nsp_count"], 1.0)
    metrics = {"nsp_loss": sums["nsp_nll"] / count, "nsp_accuracy": sums["nsp_correct"] / count}
    return LossSums(*head_sums(out["mlm"], batch[self.labels], self.weights(batch), ctx),
                    metrics, aux=sums["nsp_nll"] / count)

  def logit_sums(self, logits, batch: dict) -> dict:
    return {**super().logit_sums(logits["mlm"], batch), **nsp_sums(logits["nsp"], batch)}

  def finalize(self, totals: dict) -> dict:
    out = super().finalize(totals)
    n = max(float(totals["nsp_count"]), 1e-9)
    out["eval_nsp_loss"] = float(totals["nsp_nll"]) / n
    out["eval_nsp_accuracy"] = float(totals["nsp_correct"]) / n
    return out


_TEXT = dict(inputs=("inputs",), optional=(("attention_mask", "attention_mask"),
                                           ("token_type_ids", "token_type_ids")),
             counted="inputs", context=("inputs",), text=True)
NSP = MaskedLMWithNSP("mlm_nsp", **_TEXT)
TASKS = (MaskedLM("mlm", **_TEXT), NSP)
