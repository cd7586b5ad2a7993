"""Beam search and greedy decoding over any autoregressive scorer, with static shapes.

`log_prob_fn(tokens [N, max_len] int32, t) -> [N, V]` gives the log-probabilities of the
token at position t (t = 1 .. max_len, a traced int) of the decoder-input buffer `tokens`,
given its prefix tokens[:, :t]: position 0 holds BOS, position j the j-th generated token,
and positions >= t hold PAD placeholders that a causal scorer must ignore. For a
teacher-forced model `logits = model(tokens)` this is `log_softmax(logits)[:, t - 1]`. The
search runs one `lax.fori_loop` over t, so it traces once and is jit-able (wrap the caller in
`jax.jit`; `log_prob_fn` is closed over).

Scores: a hypothesis' score is the sum of its tokens' log-probs, EOS included. With
length_penalty=alpha > 0 hypotheses are ranked by score / lp(len), GNMT's length penalty
lp(len) = ((5 + len) / 6)^alpha (Wu et al., 2016, eq. 14; no coverage penalty), where len
counts the generated tokens up to and including EOS (max_len if there is none); alpha = 0 is
the plain sum. At every step the beam keeps the K best candidates by that ranking (a live
hypothesis at its current length); finished hypotheses stay in the beam with their score
and emit PAD.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def length_penalty_factor(lengths, alpha: float):
  """GNMT's ((5 + len) / 6)^alpha (1 when alpha == 0)."""
  if not alpha:
    return jnp.ones(jnp.shape(lengths), jnp.float32)
  return ((5.0 + jnp.asarray(lengths, jnp.float32)) / 6.0) ** alpha


def beam_search(log_prob_fn: Callable, batch_size: int, *, beam_size: int, max_len: int,
                bos_id: int, eos_id: int, pad_id: int, length_penalty: float = 0.0):
  """The beam_size best sequences of each of batch_size rows.

  Returns (tokens [B, K, max_len] int32: the generated tokens without BOS, PAD after EOS;
  scores [B, K] float32: the ranking scores (log-prob sums, divided by the GNMT factor when
  length_penalty > 0)), best first. Rows with fewer than K possible hypotheses fill the rest
  with score -inf. `log_prob_fn` is called with N = B * K rows (row b * K + k is beam k of
  batch row b); see the module docstring for its contract.
  """
  for name, value in (("batch_size", batch_size), ("beam_size", beam_size),
                      ("max_len", max_len)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name}={value!r} must be an int >= 1")
  if length_penalty < 0:
    raise ValueError(f"length_penalty={length_penalty} must be >= 0 (0: plain log-prob sum)")
  b, k = batch_size, beam_size
  neg = jnp.float32(-jnp.inf)
  # Only beam 0 is live at the start, so the first step expands one copy of BOS.
  scores = jnp.where(jnp.arange(k) == 0, 0.0, neg) * jnp.ones((b, 1), jnp.float32)
  out = jnp.full((b, k, max_len), pad_id, jnp.int32)
  finished = jnp.zeros((b, k), bool)
  lengths = jnp.zeros((b, k), jnp.int32)

  def step(t, carry):
    out, scores, finished, lengths = carry
    inputs = jnp.concatenate([jnp.full((b, k, 1), bos_id, jnp.int32), out[:, :, :-1]], axis=-1)
    logp = jnp.asarray(log_prob_fn(inputs.reshape(b * k, max_len), t), jnp.float32)
    vocab = logp.shape[-1]
    logp = logp.reshape(b, k, vocab)
    # a finished hypothesis has one continuation: PAD, at no cost
    pad_only = jnp.where(jnp.arange(vocab) == pad_id, 0.0, neg)
    logp = jnp.where(finished[..., None], pad_only, logp)
    candidates = scores[..., None] + logp                                 # [B, K, V]
    cand_len = jnp.where(finished, lengths, t)[..., None]
    rank = candidates / length_penalty_factor(cand_len, length_penalty)
    _, flat = jax.lax.top_k(rank.reshape(b, k * vocab), k)                # [B, K]
    beam, token = flat // vocab, (flat % vocab).astype(jnp.int32)
    take = lambda x: jnp.take_along_axis(x, beam, axis=1)
    out = jnp.take_along_axis(out, beam[..., None], axis=1)
    was_finished = take(finished)
    out = jax.lax.dynamic_update_index_in_dim(out, token[..., None], t - 1, axis=2)
    scores = jnp.take_along_axis(candidates.reshape(b, k * vocab), flat, axis=1)
    lengths = jnp.where(was_finished, take(lengths), t)
    finished = was_finished | (token == eos_id)
    return out, scores, finished, lengths

  out, scores, finished, lengths = jax.lax.fori_loop(
      1, max_len + 1, step, (out, scores, finished, lengths))
  final = scores / length_penalty_factor(lengths, length_penalty)
  order = jnp.argsort(-final, axis=1, stable=True)
  return (jnp.take_along_axis(out, order[..., None], axis=1),
          jnp.take_along_axis(final, order, axis=1))


def greedy_decode(log_prob_fn: Callable, batch_size: int, *, max_len: int, bos_id: int,
                  eos_id: int, pad_id: int):
  """The argmax path: (tokens [B, max_len] (PAD after EOS), log-prob sums [B]); beam search
  with one beam."""
  tokens, scores = beam_search(log_prob_fn, batch_size, beam_size=1, max_len=max_len,
                               bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
  return tokens[:, 0], scores[:, 0]
