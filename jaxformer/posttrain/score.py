"""log p(response | prompt) under a decoder LM, summed over the response's tokens.

What a DPO reward, a KL estimate on sampled responses or a likelihood check needs outside the
training step. Prompt and response are tokenized separately and concatenated, as the SFT/DPO
pipelines do (data.encode_pieces, eos included where the tokenizer has one), so a score here is
the sum the DPO objective would compute for the same record. Rows are right-padded to one
length (model.max_len + 1 tokens), so every batch has one shape and compiles once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np

from jaxformer import models
from jaxformer.posttrain.data import encode_pieces
from jaxformer.posttrain.dpo import sequence_logps


@functools.partial(jax.jit, static_argnames=("module",))
def _logps(module, params, inputs, targets, weights):
  logits = module.apply({"params": params}, inputs, deterministic=True)
  return sequence_logps(logits, targets, weights)


def response_logps(model_config, params, tokenizer, prompts: Sequence[str],
                   responses: Sequence[str], *, batch_size: int = 256) -> np.ndarray:
  """float64 [N]: sum over the tokens of responses[i] of log p(token | prompts[i], earlier
  response tokens). A record longer than model.max_len + 1 tokens is an error (a learned
  position table cannot score it; cutting would silently drop response tokens)."""
  if len(prompts) != len(responses):
    raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
  cfg = models.with_defaults(model_config)
  width = int(cfg["max_len"])
  module = models.build(cfg)
  if isinstance(params, Mapping) and "params" in params:
    params = params["params"]
  params = nn.unbox(params)
  rows = []
  for i, (prompt, response) in enumerate(zip(prompts, responses)):
    ids, weighted = encode_pieces(tokenizer, [(prompt, False), (response, True)],
                                  f"record {i}")
    if len(ids) - 1 > width:
      raise ValueError(f"record {i}: {len(ids)} tokens, more than model.max_len + 1 = "
                       f"{width + 1}")
    rows.append((ids, weighted))
  out = np.zeros(len(rows), np.float64)
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    batch = {k: np.zeros((batch_size, width), dt) for k, dt in
             (("inputs", np.int32), ("targets", np.int32), ("weights", np.float32))}
    for r, (ids, weighted) in enumerate(chunk):
      n = len(ids) - 1
      batch["inputs"][r, :n], batch["targets"][r, :n] = ids[:-1], ids[1:]
      batch["weights"][r, :n] = weighted[1:]
    logps = _logps(module, params, batch["inputs"], batch["targets"], batch["weights"])
    out[start:start + len(chunk)] = np.asarray(logps, np.float64)[:len(chunk)]
  return out
