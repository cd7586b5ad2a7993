"""lm-evaluation-harness scores jaxformer decoder LMs: `JaxformerLM`, an `lm_eval.api.model.LM`
registered as "jaxformer" (importing this module registers it).

    import lm_eval
    from jaxformer.evaluate.harness import JaxformerLM
    lm = JaxformerLM(workdir="runs/shakespeare", checkpoint="best", batch_size=32)
    lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])
    # or by name, once this module is imported: simple_evaluate(model="jaxformer",
    #     model_args="workdir=runs/shakespeare,checkpoint=best", tasks=[...])

- `loglikelihood`: (context, continuation) -> (log p(continuation | context), whether greedy
  decoding gives the continuation); context and continuation are tokenized separately and
  joined (lm-eval's convention: a word's leading space belongs to the continuation); the
  context is cut on the left to the model's context;
- `loglikelihood_rolling`: a whole text scored token by token (`scoring.rolling_rows`, the
  windows `jaxformer.evaluate` perplexity uses), its first token conditioned on
  `scoring.start_token` (eos, else bos, else a newline);
- `generate_until`: greedy (or, with do_sample and a temperature > 0, sampled) decoding with
  the KV cache (`inference.generate`), batched over requests of one prompt length and one set
  of generation arguments, for `max_gen_toks` tokens, the text cut at the first of `until`
  (and at eos). The prompt keeps its last `max_length - max_gen_toks` tokens.

All three score in batches of `batch_size` rows (`scoring.Scorer`).
"""

from __future__ import annotations

import difflib
import os

import numpy as np
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from jaxformer import models
from jaxformer.evaluate.scoring import (Scorer, check_vocab, concatenate, continuation_row,
                                         rolling_rows, start_token)
from jaxformer.inference import generate, load_run

DEFAULT_MAX_GEN_TOKS = 256


@register_model("jaxformer")
class JaxformerLM(LM):
  """A trained jaxformer decoder LM for lm-evaluation-harness (see the module docstring).

  Give `workdir` (and `checkpoint`: latest | best | a step), or an already loaded run as
  `run=(config, params, tokenizer)`."""

  def __init__(self, workdir: str | None = None, checkpoint: str | int = "latest", *,
               run=None, batch_size: int | str = 16, max_length: int | None = None,
               max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, seed: int = 0, **unused):
    super().__init__()
    if (workdir is None) == (run is None):
      raise ValueError("JaxformerLM takes workdir=<a training run> or run=(config, params, "
                       "tokenizer), one of them")
    config, params, tokenizer = run if run is not None else load_run(workdir, which=checkpoint)
    check_vocab(config, tokenizer)
    if isinstance(batch_size, str):          # lm-eval's --batch_size; "auto" is a default here
      batch_size = int(batch_size) if batch_size.isdigit() else 16
    self.config, self.params, self.tokenizer = config, params, tokenizer
    self.scorer = Scorer(config, params, batch_size=int(batch_size),
                         width=None if max_length is None else int(max_length),
                         vocab_limit=tokenizer.vocab_size)
    self.start = start_token(tokenizer)
    self.max_gen_toks, self.seed = int(max_gen_toks), int(seed)

  @property
  def max_length(self) -> int:
    return self.scorer.width

  @property
  def batch_size(self) -> int:
    return self.scorer.batch_size

  def _encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text).tolist()

  def _context(self, text: str) -> list[int]:
    ids = self._encode(text)
    if ids:
      return ids
    if self.start is None:
      raise ValueError("an empty context needs a token to start from, and this tokenizer "
                       "has no eos, bos or single-token newline")
    return [self.start]

  # --- lm-eval's three request types -------------------------------------------------------

  def loglikelihood(self, requests) -> list[tuple[float, bool]]:
    rows = []
    for request in requests:
      context, continuation = request.args
      rows.append(continuation_row(self._context(context), self._encode(continuation),
                                   self.max_length))
    out = []
    for request, score in zip(requests, self.scorer.score(rows)):
      answer = (score.total, score.is_greedy)
      self.cache_hook.add_partial("loglikelihood", request.args, answer)
      out.append(answer)
    return out

  def loglikelihood_rolling(self, requests) -> list[float]:
    if self.start is None:
      raise ValueError("loglikelihood_rolling scores a text's first token after a start "
                       "token, and this tokenizer has no eos, bos or single-token newline")
    per_request = [rolling_rows(self._encode(r.args[0]), self.max_length, self.start)
                   for r in requests]
    scores = self.scorer.score([row for rows in per_request for row in rows])
    out, at = [], 0
    for request, rows in zip(requests, per_request):
      total = concatenate(scores[at:at + len(rows)]).logprobs.sum()
      at += len(rows)
      self.cache_hook.add_partial("loglikelihood_rolling", request.args, float(total))
      out.append(float(total))
    return out

  def generate_until(self, requests) -> list[str]:
    groups: dict[tuple, list[int]] = {}
    prompts, settings = [], []
    for i, request in enumerate(requests):
      context, kwargs = request.args
      kwargs = dict(kwargs or {})
      until = kwargs.pop("until", None) or []
      until = [until] if isinstance(until, str) else list(until)
      max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
      if not 1 <= max_new < self.max_length:
        raise ValueError(f"max_gen_toks={max_new} must be in [1, {self.max_length}) (the "
                         "model's context, --max_length)")
      sample = bool(kwargs.pop("do_sample", False))
      temperature = float(kwargs.pop("temperature", 0.0) or 0.0) if sample else 0.0
      ids = self._context(context)[-(self.max_length - max_new):]
      prompts.append(ids)
      settings.append((tuple(until), max_new, temperature))
      groups.setdefault((len(ids), max_new, temperature), []).append(i)
    out: list[str | None] = [None] * len(requests)
    model = models.settings_of(self.config)
    vocab = min(self.tokenizer.vocab_size, int(model.vocab_size))
    for (_, max_new, temperature), members in groups.items():
      for start in range(0, len(members), self.batch_size):
        chunk = members[start:start + self.batch_size]
        batch = np.asarray([prompts[i] for i in chunk], np.int32)
        pad = self.batch_size - len(chunk)          # one shape per prompt length
        if pad:
          batch = np.concatenate([batch, np.repeat(batch[:1], pad, axis=0)])
        new = generate(model, self.params, batch, max_new_tokens=max_new,
                       temperature=temperature, seed=self.seed, vocab_limit=vocab)
        for r, i in enumerate(chunk):
          text = self._cut(new[r, batch.shape[1]:], settings[i][0])
          self.cache_hook.add_partial("generate_until", requests[i].args, text)
          out[i] = text
    return out

  def _cut(self, ids: np.ndarray, until: tuple[str, ...]) -> str:
    """The generated text up to eos and the first stop string."""
    eos = self.tokenizer.eos_id
    if eos is not None and (ids == eos).any():
      ids = ids[:int(np.argmax(ids == eos))]
    text = self.tokenizer.decode(ids)
    for stop in until:
      if stop and stop in text:
        text = text[:text.index(stop)]
    return text


def task_manager(tasks, include_path: str | None = None):
  """lm-eval's TaskManager (with the YAML tasks under `include_path`), after checking that
  every name in `tasks` is one of its tasks, groups or tags."""
  from lm_eval.tasks import TaskManager
  if include_path is not None and not os.path.isdir(include_path):
    raise ValueError(f"--include_path={include_path!r} is not a directory of task YAML files")
  manager = TaskManager(include_path=include_path) if include_path else TaskManager()
  known = set(manager.all_tasks)
  unknown = [t for t in tasks if t not in known]
  if unknown:
    close = difflib.get_close_matches(unknown[0], sorted(known), n=3)
    raise ValueError(f"--tasks: {unknown} are not lm-evaluation-harness tasks" + (
        f"; did you mean {', '.join(close)}?" if close else
        "; list them with `lm-eval ls tasks`, or give --include_path=<your task YAML dir>"))
  return manager


def run(manager, config, params, tokenizer, *, tasks, num_fewshot=None, limit=None,
        batch_size: int = 16, max_length: int | None = None) -> dict:
  """lm-eval's `simple_evaluate` of the run on `tasks`: its results, sample counts and task
  versions (the per-sample log is not kept)."""
  import lm_eval
  lm = JaxformerLM(run=(config, params, tokenizer), batch_size=batch_size,
                   max_length=max_length)
  out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=num_fewshot,
                                limit=limit, task_manager=manager, log_samples=False)
  results = {task: {k: v for k, v in metrics.items() if k not in ("name", "alias")}
             for task, metrics in out["results"].items()}
  return {"results": results, "n-samples": out.get("n-samples"), "versions": out.get("versions")}
