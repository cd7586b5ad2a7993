"""python -m jaxformer.serve --workdir=DIR [--checkpoint=latest|best|STEP] [--int8]
    [--host=127.0.0.1] [--port=8000] [--max_batch=16] [--batch_window_ms=5]

An OpenAI-compatible HTTP server for a trained decoder LM (docs/serving.md): `POST
/v1/completions` (prompt, max_tokens, temperature, top_p, top_k, seed, stream as server-sent
events, n=1), `GET /v1/models`, `GET /health`. Concurrent requests are decoded together, one
`inference.generate_ragged` call per micro-batch (`engine.py`); a completion is `python -m
jaxformer.sample`'s text for its prompt, seed and settings (within the model's context), i.e.
`inference.generate`'s tokens with `api.generate_seed(seed)`. `--int8` serves the dense kernels as weight-only int8
(`inference.quantize`). The standard library's ThreadingHTTPServer: no extra dependency.

`load(workdir, checkpoint, int8)` -> (config, params, tokenizer, step) checks the run (a
decoder LM with its tokenizer) before restoring or compiling anything; `Server` and `Engine`
are importable without defining any flag.
"""

from __future__ import annotations

from jaxformer import models
from jaxformer.inference import quantize
from jaxformer.inference.restore import checkpoint_choice, checkpoint_step, load_run
from jaxformer.serve.api import Server
from jaxformer.serve.engine import Engine, Request
from jaxformer.state import train_state


def check_run(workdir: str, checkpoint="latest") -> dict:
  """The saved config of a run that can be served; a ValueError naming the flag otherwise."""
  checkpoint_choice(checkpoint)
  saved = train_state.read_config(workdir)
  if saved is None:
    raise ValueError(f"--workdir={workdir!r} holds no training run (no config.json); train "
                     "a decoder there first")
  family = saved.get("model", {}).get("family")
  if family != "decoder":
    raise ValueError(f"--workdir={workdir!r} is a {family!r} run; the server generates text "
                     "from decoder LMs (model.family='decoder') only")
  return saved


def load(workdir: str, checkpoint="latest", int8: bool = False):
  """(config, params, tokenizer, step) of a servable run; params int8 with `int8`."""
  check_run(workdir, checkpoint)
  config, params, tokenizer = load_run(workdir, which=checkpoint)
  if tokenizer is None:
    raise ValueError(f"--workdir={workdir!r} has no tokenizer (tokenizer.json); rerun train "
                     "on it with the same data settings to write it")
  model = models.settings_of(config)
  if tokenizer.vocab_size > model.vocab_size:
    raise ValueError(f"the run's tokenizer has {tokenizer.vocab_size} ids but "
                     f"model.vocab_size={model.vocab_size}: it does not belong to "
                     "this model")
  if int8:
    params = quantize.quantize_params(model, params)
  return config, params, tokenizer, checkpoint_step(workdir, checkpoint)


def engine_for(config, params, tokenizer, **kwargs) -> Engine:
  """An Engine for a loaded run (ids past the tokenizer's vocabulary are never produced)."""
  model = models.settings_of(config)
  return Engine(model, params, vocab_limit=min(tokenizer.vocab_size, model.vocab_size),
                **kwargs)


def warmup_shapes(items, max_len) -> list[tuple[int, int]]:
  """--warmup's PROMPT:NEW pairs, checked against the model's context."""
  shapes = []
  for item in items:
    parts = item.split(":")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
      raise ValueError(f"--warmup={item!r} must be PROMPT:NEW token counts >= 1, e.g. 64:1")
    prompt, new = map(int, parts)
    if max_len is not None and prompt + new - 1 > max_len:
      raise ValueError(f"--warmup={item}: {prompt} + {new} - 1 tokens exceed the model's "
                       f"context, model.max_len={max_len}")
    shapes.append((prompt, new))
  return shapes


__all__ = ["Server", "Engine", "Request", "load", "check_run", "engine_for", "warmup_shapes"]
