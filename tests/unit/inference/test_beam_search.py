"""Beam search against exhaustive search (float64 NumPy) with a scorer whose log-probs depend
on the whole prefix."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.inference import beam

PAD, BOS, EOS = 0, 1, 2
WORDS = (3, 4, 5)
V, MAX_LEN, B = 6, 4, 2


def make_table(seed=0):
  """Logits [B, V^MAX_LEN, V]: one random row per (batch row, whole prefix), so the scorer
  is not Markov; PAD and BOS are never proposed."""
  table = np.random.default_rng(seed).normal(scale=2.0, size=(B, V ** MAX_LEN, V))
  table[..., [PAD, BOS]] = -np.inf
  return table


def prefix_code(prefix) -> int:
  return sum(int(tok) * V ** j for j, tok in enumerate(prefix))


def make_scorer(table, beam_size):
  """log_prob_fn for beam.beam_search: row n is batch row n // beam_size."""
  logits = jnp.asarray(table, jnp.float32)

  def log_prob_fn(tokens, t):
    visible = jnp.arange(MAX_LEN) < t               # only tokens[:, :t] may matter
    code = jnp.sum(jnp.where(visible, tokens * V ** jnp.arange(MAX_LEN), 0), axis=1)
    rows = jnp.arange(tokens.shape[0]) // beam_size
    return jax.nn.log_softmax(logits[rows, code], axis=-1)
  return log_prob_fn


def np_log_probs(table, row, prefix):
  """float64 log-probs of the next token after BOS + prefix."""
  z = table[row, prefix_code((BOS,) + tuple(prefix))]
  finite = np.isfinite(z)
  out = np.full(V, -np.inf)
  out[finite] = z[finite] - np.log(np.sum(np.exp(z[finite])))
  return out


def all_hypotheses():
  """Every complete output: words then EOS (length <= MAX_LEN), or MAX_LEN words."""
  for n in range(MAX_LEN):
    for words in itertools.product(WORDS, repeat=n):
      yield words + (EOS,)
  yield from itertools.product(WORDS, repeat=MAX_LEN)


def np_score(table, row, seq, alpha=0.0):
  total = sum(np_log_probs(table, row, seq[:i])[tok] for i, tok in enumerate(seq))
  return total / ((5.0 + len(seq)) / 6.0) ** alpha if alpha else total


def ranked(table, row, alpha=0.0):
  """[(score, padded sequence)] best first, every hypothesis."""
  out = [(np_score(table, row, h, alpha), h + (PAD,) * (MAX_LEN - len(h)))
         for h in all_hypotheses()]
  return sorted(out, key=lambda x: -x[0])


def run(table, beam_size, alpha=0.0):
  fn = jax.jit(functools.partial(beam.beam_search, make_scorer(table, beam_size), B,
                                 beam_size=beam_size, max_len=MAX_LEN, bos_id=BOS,
                                 eos_id=EOS, pad_id=PAD, length_penalty=alpha))
  tokens, scores = fn()
  return np.asarray(tokens), np.asarray(scores, np.float64)


NUM_HYPOTHESES = sum(len(WORDS) ** n for n in range(MAX_LEN + 1))     # 121


@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_a_beam_as_wide_as_every_hypothesis_is_exhaustive_search(alpha):
  table = make_table(1)
  tokens, scores = run(table, NUM_HYPOTHESES, alpha)
  assert tokens.shape == (B, NUM_HYPOTHESES, MAX_LEN) and scores.shape == (B, NUM_HYPOTHESES)
  for row in range(B):
    want = ranked(table, row, alpha)
    assert [tuple(s) for s in tokens[row]] == [seq for _, seq in want]
    np.testing.assert_allclose(scores[row], [s for s, _ in want], rtol=1e-5, atol=1e-5)


def test_length_penalty_changes_the_winner_as_exhaustive_search_says():
  """A table where the GNMT factor prefers a longer caption than the plain sum."""
  for seed in range(50):
    table = make_table(seed)
    if ranked(table, 0, 0.0)[0][1] != ranked(table, 0, 3.0)[0][1]:
      break
  else:
    pytest.skip("no seed where the penalty matters")
  tokens, _ = run(table, NUM_HYPOTHESES, 3.0)
  plain, _ = run(table, NUM_HYPOTHESES, 0.0)
  assert tuple(tokens[0, 0]) == ranked(table, 0, 3.0)[0][1]
  assert tuple(plain[0, 0]) == ranked(table, 0, 0.0)[0][1]


def test_narrow_beam_returns_sorted_distinct_hypotheses_with_their_true_scores():
  table = make_table(2)
  tokens, scores = run(table, 3)
  for row in range(B):
    assert np.all(np.diff(scores[row]) <= 0)                   # best first
    seqs = [tuple(s) for s in tokens[row]]
    assert len(set(seqs)) == 3
    for seq, score in zip(seqs, scores[row]):
      body = seq[:seq.index(EOS) + 1] if EOS in seq else seq
      assert all(tok == PAD for tok in seq[len(body):])        # PAD after EOS
      np.testing.assert_allclose(score, np_score(table, row, body), rtol=1e-5, atol=1e-5)
    # never better than the exhaustive best
    assert scores[row, 0] <= ranked(table, row)[0][0] + 1e-5


def test_beam_of_one_is_greedy():
  table = make_table(3)
  tokens, scores = run(table, 1)
  greedy = jax.jit(functools.partial(beam.greedy_decode, make_scorer(table, 1), B,
                                     max_len=MAX_LEN, bos_id=BOS, eos_id=EOS, pad_id=PAD))
  g_tokens, g_scores = greedy()
  np.testing.assert_array_equal(np.asarray(g_tokens), tokens[:, 0])
  for row in range(B):                     # the argmax path, recomputed in NumPy
    seq = []
    while len(seq) < MAX_LEN and (not seq or seq[-1] != EOS):
      seq.append(int(np.argmax(np_log_probs(table, row, seq))))
    assert tuple(tokens[row, 0]) == tuple(seq) + (PAD,) * (MAX_LEN - len(seq))
    np.testing.assert_allclose(float(g_scores[row]), np_score(table, row, tuple(seq)),
                               rtol=1e-5)


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="beam_size"):
    beam.beam_search(lambda t, i: t, 1, beam_size=0, max_len=2, bos_id=1, eos_id=2, pad_id=0)
  with pytest.raises(ValueError, match="length_penalty"):
    beam.beam_search(lambda t, i: t, 1, beam_size=1, max_len=2, bos_id=1, eos_id=2, pad_id=0,
                     length_penalty=-1.0)
