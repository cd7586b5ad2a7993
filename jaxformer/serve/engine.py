"""The batching engine: concurrent completion requests decoded together with the KV cache.

One worker thread takes the oldest waiting request, waits up to `batch_window_s` for more
that can share its batch (the same top-k and top-p, and a cache that fits the model: the
widest prompt + the most new tokens - 1 <= model.max_len), up to `max_batch` of them, and
decodes them in one `inference.generate_ragged` call (a micro-batch): per-row seeds and
temperatures, every row with row id 0, so a request's tokens are those of
`inference.generate` on its prompt alone with its seed (the API maps a request's seed as
`sample` does, `api.generate_seed`). Requests that arrive while a batch
runs wait for the next one (no joining a running batch). Tokens reach each request as they
are made (generate_ragged's `on_step`), which is what streaming sends.

Shapes are bucketed so few programs compile: the batch to a power of two (padding rows
repeat the first request), the prompt width and the number of new tokens to multiples of 16
(within model.max_len). Each new bucket compiles once (seconds on a CPU).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any

import numpy as np

from jaxformer import models
from jaxformer.inference import generate_ragged

BUCKET = 16


@dataclasses.dataclass
class Request:
  """One completion: prompt token ids and sampling settings (already checked)."""
  prompt: list[int]
  max_tokens: int
  temperature: float = 1.0
  top_k: int | None = None
  top_p: float | None = None
  seed: int = 0
  tokens: list[int] = dataclasses.field(default_factory=list)
  events: queue.Queue = dataclasses.field(default_factory=queue.Queue)
  error: str | None = None
  submitted: float = dataclasses.field(default_factory=time.perf_counter)

  @property
  def group(self):
    return (self.top_k, self.top_p)

  def wait(self, timeout: float | None = None) -> list[int]:
    """Block until the request is done; its new tokens (a RuntimeError if it failed)."""
    while True:
      kind, _ = self.events.get(timeout=timeout)
      if kind == "done":
        if self.error is not None:
          raise RuntimeError(self.error)
        return list(self.tokens)


def _round_up(n: int, to: int) -> int:
  return -(-n // to) * to


class Engine:
  """Decodes submitted `Request`s in micro-batches on one worker thread (module docstring).

  `submit(request)` queues it; its `events` queue then receives ("token", id) for each new
  token and finally ("done", None). `close()` stops the worker (pending requests fail)."""

  def __init__(self, model_config: Any, params, *, vocab_limit: int | None = None,
               max_batch: int = 16, batch_window_s: float = 0.005):
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
      raise ValueError(f"--max_batch={max_batch!r} must be an int >= 1")
    if not batch_window_s >= 0:
      raise ValueError(f"--batch_window_ms must be >= 0; got {batch_window_s * 1e3}")
    self.config = models.with_defaults(model_config)
    self.max_len = int(self.config["max_len"])
    self.params = params
    self.vocab_limit = vocab_limit
    self.max_batch = max_batch
    self.batch_window_s = batch_window_s
    self._pending: list[Request] = []
    self._cond = threading.Condition()
    self._stopped = False
    self._current: list[Request] = []
    self._lengths = np.zeros(0, np.int64)
    self.batches: list[int] = []            # the number of requests of each batch run
    self._thread = threading.Thread(target=self._loop, name="jaxformer-serve-engine",
                                    daemon=True)
    self._thread.start()

  def submit(self, request: Request) -> Request:
    with self._cond:
      if self._stopped:
        raise RuntimeError("the server is shutting down")
      self._pending.append(request)
      self._cond.notify()
    return request

  def close(self, timeout: float = 30.0) -> None:
    """Stop the worker after its current batch (at most `timeout` s); waiting requests fail."""
    with self._cond:
      self._stopped = True
      pending, self._pending = self._pending, []
      self._cond.notify_all()
    for request in pending:
      self._finish(request, "the server is shutting down")
    self._thread.join(timeout)

  def warm_up(self, shapes) -> float:
    """Compile the programs that batches of every size (powers of two up to max_batch) of
    sampled requests (no top-k/top-p) with each (prompt tokens, new tokens) in `shapes` run;
    seconds taken. Call before serving (it runs on the calling thread)."""
    start = time.perf_counter()
    sizes = sorted({min(1 << k, self.max_batch) for k in range(self.max_batch.bit_length() + 1)})
    for prompt, new in shapes:
      for size in sizes:
        batch = [Request(prompt=[0] * prompt, max_tokens=new) for _ in range(size)]
        self._run(batch)
    self.batches.clear()
    return time.perf_counter() - start

  # -- worker --------------------------------------------------------------------------------

  def _fits(self, batch: list[Request], request: Request) -> bool:
    width = max(len(r.prompt) for r in batch + [request])
    new = max(r.max_tokens for r in batch + [request])
    return request.group == batch[0].group and width + new - 1 <= self.max_len

  def _take_batch(self) -> list[Request] | None:
    with self._cond:
      while not self._pending and not self._stopped:
        self._cond.wait()
      if self._stopped:
        return None
      batch = [self._pending.pop(0)]
      deadline = time.perf_counter() + self.batch_window_s
      while len(batch) < self.max_batch:
        for request in list(self._pending):
          if len(batch) < self.max_batch and self._fits(batch, request):
            self._pending.remove(request)
            batch.append(request)
        left = deadline - time.perf_counter()
        if len(batch) >= self.max_batch or left <= 0 or self._stopped:
          break
        self._cond.wait(left)
      return batch

  def _loop(self):
    while True:
      batch = self._take_batch()
      if batch is None:
        return
      try:
        self._run(batch)
      except Exception as e:  # noqa: BLE001  (a failed batch fails its requests, not the server)
        for request in batch:
          self._finish(request, f"{type(e).__name__}: {e}")

  def _shapes(self, batch: list[Request]) -> tuple[int, int, int]:
    """(rows, width, new tokens) of the compiled program for `batch` (module docstring)."""
    longest = max(len(r.prompt) for r in batch)
    most = max(r.max_tokens for r in batch)
    rows = min(1 << (len(batch) - 1).bit_length(), max(self.max_batch, len(batch)))
    width, new = _round_up(longest, BUCKET), _round_up(most, BUCKET)
    if width + new - 1 > self.max_len:
      new = max(most, self.max_len - width + 1)
    if width + new - 1 > self.max_len:
      width = max(longest, self.max_len - new + 1)
    return rows, width, new

  def _run(self, batch: list[Request]) -> None:
    rows, width, new = self._shapes(batch)
    padded = batch + [batch[0]] * (rows - len(batch))
    prompts = np.zeros((rows, width), np.int32)
    for r, request in enumerate(padded):
      prompts[r, :len(request.prompt)] = request.prompt
    lengths = np.array([len(r.prompt) for r in padded])
    temps = np.array([r.temperature for r in padded], np.float64)
    seeds = np.array([r.seed for r in padded], np.int64)
    self._current, self._lengths = batch, lengths
    self.batches.append(len(batch))
    top_k, top_p = batch[0].group
    out = generate_ragged(self.config, self.params, prompts, lengths, max_new_tokens=new,
                          temperature=temps, seed=seeds, rows=np.zeros(rows, np.int64),
                          top_k=top_k, top_p=top_p, vocab_limit=self.vocab_limit,
                          prefill=max(int(lengths.min()) // BUCKET * BUCKET, 1),
                          on_step=self._on_step)
    self._current = []
    for r, request in enumerate(batch):
      final = out[r, :request.max_tokens].tolist()
      for token in final[len(request.tokens):]:     # any the callback did not deliver
        request.tokens.append(token)
        request.events.put(("token", token))
      if request.tokens != final:
        self._finish(request, "streamed tokens differ from the batch's result")
      else:
        self._finish(request, None)

  def _on_step(self, j, tokens) -> None:
    """generate_ragged's host callback: slot j's tokens, one per row."""
    j, tokens = int(j), np.asarray(tokens)
    for r, request in enumerate(self._current):
      index = j - int(self._lengths[r])
      if 0 <= index < request.max_tokens and index == len(request.tokens):
        token = int(tokens[r])
        request.tokens.append(token)
        request.events.put(("token", token))

  @staticmethod
  def _finish(request: Request, error: str | None) -> None:
    request.error = error
    request.events.put(("done", None))
