"""The OpenAI-compatible HTTP API over the engine, on the standard library's http.server.

    POST /v1/completions   {"prompt": str | [int], "max_tokens": 16, "temperature": 1.0,
                            "top_p": 1.0, "top_k": null, "seed": 0, "stream": false, "n": 1}
    GET  /v1/models        the one model served
    GET  /health           {"status": "ok"}

A request's `seed` S samples as `python -m jaxformer.sample --seed=S` does (`generate_seed`:
`inference.generate` gets the seed `sample_text` gives its first chunk), so a completion is
`sample`'s text for the same prompt and settings. A completion's choice carries `text` and, beyond OpenAI's fields, `token_ids` (the new
tokens). `stream: true` answers with server-sent events, one `text_completion` chunk per
token as it is made (its text delta; a multi-byte character waits for its last token) and
then `data: [DONE]`. A request the server cannot serve is a 400 with OpenAI's error object,
whose `param` names the field; an unknown path is a 404; the server keeps running after any
error (a failed batch is a 500 for its requests).
"""

from __future__ import annotations

import json
import math
import numbers
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from jaxformer.serve.engine import Engine, Request

MAX_BODY = 1 << 20
# OpenAI fields accepted only at their "off" value (anything else is refused, not ignored)
UNSUPPORTED = {"echo": (False,), "logprobs": (None, 0), "stop": (None, [], ""),
               "suffix": (None, ""), "best_of": (None, 1), "presence_penalty": (None, 0),
               "frequency_penalty": (None, 0), "logit_bias": (None, {})}
IGNORED = ("user", "model", "stream_options")


class BadRequest(ValueError):
  """A request field the server cannot serve: HTTP 400 naming `param`."""

  def __init__(self, param: str | None, message: str):
    super().__init__(message)
    self.param = param


def generate_seed(seed: int) -> int:
  """The seed `inference.generate` gets for a request's `seed`: the one `sample_text` (and so
  `python -m jaxformer.sample --seed=SEED`) gives its first chunk of tokens, so a completion
  equals `sample`'s text for the same prompt, seed and settings."""
  return int(np.random.SeedSequence([seed, 0]).generate_state(1)[0])


def _int(body, name, default, low, high=None):
  value = body.get(name, default)
  if value is None and default is None:
    return None
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
      high is not None and value > high):
    bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
    raise BadRequest(name, f"{name}={value!r} must be an integer {bound}")
  return int(value)


def _float(body, name, default, low, high=None, *, open_low=False):
  value = body.get(name, default)
  if value is None:
    value = default
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(
      value) or value < low or (open_low and value == low) or (
          high is not None and value > high):
    bound = ("in " + ("(" if open_low else "[") + f"{low}, {high}]") if high is not None \
        else f">= {low}"
    raise BadRequest(name, f"{name}={value!r} must be a number {bound}")
  return float(value)


class Completions:
  """Request parsing and answers for one served model (the handler's state)."""

  def __init__(self, engine: Engine, tokenizer, model_id: str):
    self.engine = engine
    self.tokenizer = tokenizer
    self.model_id = model_id
    self.vocab = min(tokenizer.vocab_size, engine.config["vocab_size"])
    self.created = int(time.time())

  def parse(self, body: Any) -> tuple[Request, bool]:
    """(request, stream) from a JSON body; BadRequest naming the first bad field."""
    if not isinstance(body, dict):
      raise BadRequest(None, "the body must be a JSON object")
    known = {"prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "n",
             *UNSUPPORTED, *IGNORED}
    for name in body:
      if name not in known:
        raise BadRequest(name, f"unknown field {name!r}; this server takes "
                         f"{', '.join(sorted(known))}")
    for name, off in UNSUPPORTED.items():
      if name in body and body[name] not in off:
        raise BadRequest(name, f"{name}={body[name]!r} is not supported by this server")
    model = body.get("model")
    if model is not None and model != self.model_id:
      raise BadRequest("model", f"model={model!r}: this server serves {self.model_id!r}")
    if body.get("n", 1) != 1 or isinstance(body.get("n", 1), bool):
      raise BadRequest("n", f"n={body.get('n')!r}: only n=1 is supported")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
      raise BadRequest("stream", f"stream={stream!r} must be true or false")
    prompt = self._prompt(body.get("prompt"))
    limit = self.engine.max_len - len(prompt) + 1
    if limit < 1:
      raise BadRequest("prompt", f"the prompt has {len(prompt)} tokens; the model's context "
                       f"is {self.engine.max_len} (model.max_len)")
    max_tokens = _int(body, "max_tokens", 16, 1)
    if max_tokens > limit:
      raise BadRequest("max_tokens", f"max_tokens={max_tokens}: the prompt's {len(prompt)} "
                       f"tokens + max_tokens - 1 must fit model.max_len={self.engine.max_len}"
                       f" (at most {limit} here)")
    temperature = _float(body, "temperature", 1.0, 0.0, 100.0)
    top_p = _float(body, "top_p", 1.0, 0.0, 1.0, open_low=True)
    top_k = _int(body, "top_k", None, 1)
    seed = _int(body, "seed", 0, 0, 2**63 - 1)
    if temperature == 0:
      top_k = top_p = None                       # greedy: the filters change nothing
    request = Request(prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                      top_k=top_k, top_p=None if top_p == 1.0 else top_p,
                      seed=generate_seed(seed))
    return request, stream

  def _prompt(self, prompt) -> list[int]:
    if isinstance(prompt, str):
      if not prompt:
        raise BadRequest("prompt", "prompt must not be empty")
      try:
        ids = [int(i) for i in self.tokenizer.encode(prompt)]
      except Exception as e:  # noqa: BLE001  (a tokenizer refuses text in its own ways)
        raise BadRequest("prompt", f"the prompt cannot be tokenized: {e}") from e
      if not ids:
        raise BadRequest("prompt", "the prompt encodes to no tokens")
    elif isinstance(prompt, list) and prompt and all(
        isinstance(i, int) and not isinstance(i, bool) for i in prompt):
      ids = prompt
    else:
      raise BadRequest("prompt", "prompt must be a non-empty string or a list of token ids "
                       "(one prompt; lists of prompts are not supported)")
    bad = [i for i in ids if not 0 <= i < self.vocab]
    if bad:
      raise BadRequest("prompt", f"prompt token id {bad[0]} is outside the vocabulary [0, "
                       f"{self.vocab})")
    return ids

  def text(self, tokens: list[int]) -> str:
    return self.tokenizer.decode(tokens) if tokens else ""

  def answer(self, request: Request, text: str, cid: str) -> dict:
    n = len(request.tokens)
    return {"id": cid, "object": "text_completion", "created": int(time.time()),
            "model": self.model_id,
            "choices": [{"index": 0, "text": text, "token_ids": list(request.tokens),
                         "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": len(request.prompt), "completion_tokens": n,
                      "total_tokens": len(request.prompt) + n}}

  def models(self) -> dict:
    return {"object": "list", "data": [{"id": self.model_id, "object": "model",
                                        "created": self.created, "owned_by": "jaxformer"}]}


def _error(status: int, message: str, param: str | None = None, kind: str | None = None):
  return status, {"error": {"message": message, "type": kind or (
      "invalid_request_error" if status < 500 else "server_error"), "param": param,
                            "code": None}}


class Handler(BaseHTTPRequestHandler):
  """One HTTP request; the server's `completions` holds the model."""
  server_version = "jaxformer-serve"
  protocol_version = "HTTP/1.0"          # one request per connection; a stream ends at close

  def log_message(self, format, *args):  # noqa: A002  (http.server's signature)
    if getattr(self.server, "verbose", False):
      super().log_message(format, *args)

  def _send(self, status: int, payload: dict):
    data = json.dumps(payload).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_GET(self):  # noqa: N802  (http.server's name)
    path = self.path.split("?")[0].rstrip("/")
    if path in ("/health", "/v1/health"):
      self._send(200, {"status": "ok"})
    elif path == "/v1/models":
      self._send(200, self.server.completions.models())
    else:
      self._send(*_error(404, f"no such path {self.path!r}; GET /v1/models or /health",
                         kind="not_found"))

  def do_POST(self):  # noqa: N802
    path = self.path.split("?")[0].rstrip("/")
    if path != "/v1/completions":
      self._send(*_error(404, f"no such path {self.path!r}; POST /v1/completions",
                         kind="not_found"))
      return
    try:
      length = int(self.headers.get("Content-Length") or 0)
      if not 0 < length <= MAX_BODY:
        raise BadRequest(None, f"the body must be a JSON object of 1 to {MAX_BODY} bytes "
                         "with its Content-Length")
      try:
        body = json.loads(self.rfile.read(length))
      except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(None, f"the body is not valid JSON: {e}") from e
      request, stream = self.server.completions.parse(body)
    except BadRequest as e:
      self._send(*_error(400, str(e), e.param))
      return
    try:
      self.server.completions.engine.submit(request)
    except RuntimeError as e:
      self._send(*_error(503, str(e)))
      return
    cid = "cmpl-" + uuid.uuid4().hex[:24]
    if stream:
      self._stream(request, cid)
    else:
      try:
        request.wait(timeout=self.server.request_timeout_s)
      except Exception as e:  # noqa: BLE001  (a failed batch or a timeout: 500, not a crash)
        self._send(*_error(500, f"generation failed: {e or type(e).__name__}"))
        return
      completions = self.server.completions
      self._send(200, completions.answer(request, completions.text(request.tokens), cid))

  def _stream(self, request: Request, cid: str):
    completions = self.server.completions
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Cache-Control", "no-cache")
    self.end_headers()

    def event(payload):
      data = payload if isinstance(payload, str) else json.dumps(payload)
      self.wfile.write(f"data: {data}\n\n".encode())
      self.wfile.flush()

    def chunk(text, finish):
      return {"id": cid, "object": "text_completion", "created": int(time.time()),
              "model": completions.model_id,
              "choices": [{"index": 0, "text": text, "logprobs": None,
                           "finish_reason": finish}]}

    sent, tokens = "", []
    try:
      while True:
        kind, token = request.events.get(timeout=self.server.request_timeout_s)
        if kind == "done":
          break
        tokens.append(token)
        text = completions.text(tokens)
        if not text.endswith("\ufffd"):          # a character still missing bytes waits
          delta, sent = text[len(sent):], text
          if delta:
            event(chunk(delta, None))
      if request.error is not None:
        event({"error": {"message": f"generation failed: {request.error}",
                         "type": "server_error", "param": None, "code": None}})
        return
      final = completions.text(request.tokens)
      event(chunk(final[len(sent):], "length"))
      event("[DONE]")
    except (BrokenPipeError, ConnectionResetError):
      return                                    # the client left; the batch goes on
    except Exception as e:  # noqa: BLE001  (a timeout: the stream ends with an error event)
      event({"error": {"message": f"generation failed: {e or type(e).__name__}",
                       "type": "server_error", "param": None, "code": None}})


class _HTTPServer(ThreadingHTTPServer):
  # the listen backlog: http.server's default of 5 resets (or, through SYN retries, delays by
  # ~1 s) connections beyond 5 arriving at once; measured with 16 concurrent clients
  request_queue_size = 256
  daemon_threads = True


class Server:
  """An HTTP server for one model on `host:port` (port 0: an ephemeral one, see `.port`).

      server = Server(engine, tokenizer, model_id, port=0).start()
      ... POST http://127.0.0.1:{server.port}/v1/completions ...
      server.close()          # stops accepting, finishes, stops the engine
  """

  def __init__(self, engine: Engine, tokenizer, model_id: str, *, host: str = "127.0.0.1",
               port: int = 8000, request_timeout_s: float = 600.0, verbose: bool = False):
    self.httpd = _HTTPServer((host, port), Handler)
    self.httpd.completions = Completions(engine, tokenizer, model_id)
    self.httpd.request_timeout_s = request_timeout_s
    self.httpd.verbose = verbose
    self.engine = engine
    self._thread = None

  @property
  def port(self) -> int:
    return self.httpd.server_address[1]

  @property
  def host(self) -> str:
    return self.httpd.server_address[0]

  def start(self) -> "Server":
    """Serve on a background thread."""
    self._thread = threading.Thread(target=self.httpd.serve_forever, name="jaxformer-serve",
                                    daemon=True)
    self._thread.start()
    return self

  def serve_forever(self, stop_signals=(signal.SIGINT, signal.SIGTERM)) -> None:
    """Serve on this (the main) thread until one of `stop_signals` arrives, then close: the
    handlers are installed here (not left to Python's KeyboardInterrupt, which a process
    started in the background with SIGINT ignored never gets), and the previous ones are put
    back after."""
    previous = {}

    def stop(signum, frame):
      del signum, frame                  # shutdown() waits for serve_forever: another thread
      threading.Thread(target=self.httpd.shutdown, daemon=True).start()
    for sig in stop_signals:
      previous[sig] = signal.signal(sig, stop)
    try:
      self.httpd.serve_forever()
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)
      self.httpd.server_close()
      self.engine.close()

  def close(self, timeout: float = 30.0) -> None:
    self.httpd.shutdown()
    self.httpd.server_close()
    self.engine.close(timeout)
    if self._thread is not None:
      self._thread.join(timeout)
