"""The custom VJP that both blocked attention paths (`ops.blocked_attention` in plain JAX, the
Pallas kernel) share: the forward keeps only the output and the row logsumexp, and the backward
recomputes the probabilities block by block from them, so neither path stores the [Tq, Tk]
attention matrix for the gradient."""

from __future__ import annotations

import functools
from typing import Callable

import jax


def flash_vjp(forward: Callable, backward: Callable) -> Callable:
  """`attention(q, k, v, bias, mask, q_ids, kv_ids, static)` with a custom VJP.

  forward(q, k, v, bias, mask, q_ids, kv_ids, static) -> (out, lse);
  backward(static, (q, k, v, bias, mask, q_ids, kv_ids, out, lse), d_out) -> the cotangents
  of the first seven arguments. `static` (hashable: block sizes, flags) is not differentiated.
  """
  @functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
  def attention(q, k, v, bias, mask, q_ids, kv_ids, static):
    return forward(q, k, v, bias, mask, q_ids, kv_ids, static)[0]

  def attention_fwd(q, k, v, bias, mask, q_ids, kv_ids, static):
    out, lse = forward(q, k, v, bias, mask, q_ids, kv_ids, static)
    return out, (q, k, v, bias, mask, q_ids, kv_ids, out, lse)

  attention.defvjp(attention_fwd, backward)
  return attention
