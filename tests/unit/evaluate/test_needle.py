"""The copy needle (jaxformer/evaluate/needle.py): row layout, and scoring with fake models whose
accuracy is known (a perfect copier, uniform guessing, a copier that breaks on its own error)."""

import numpy as np
import pytest

from jaxformer.evaluate import needle

VOCAB = 40
TEXT = np.random.default_rng(0).integers(0, 30, size=5000).astype(np.int32)   # ids 0..29
ALPHABET = tuple(range(30, 38))                                               # not in the text


def copier(cue_len, *, wrong_at=None):
  """Logits of an induction oracle: at position i, find the latest earlier j whose last
  `cue_len` tokens equal those ending at i and predict tokens[j + 1] (token 0 if none).
  wrong_at: predict token 0 at that position instead (one deliberate error)."""
  def fn(tokens):
    tokens = np.asarray(tokens)
    b, t = tokens.shape
    out = np.zeros((b, t, VOCAB), np.float32)
    for r in range(b):
      for i in range(t):
        pred = 0
        if i + 1 >= cue_len:
          key = tuple(tokens[r, i - cue_len + 1:i + 1])
          for j in range(i - 1, cue_len - 2, -1):
            if tuple(tokens[r, j - cue_len + 1:j + 1]) == key:
              pred = tokens[r, j + 1]
              break
        if wrong_at is not None and i == wrong_at:
          pred = 0
        out[r, i, pred] = 1.0
    return out
  return fn


def test_row_layout():
  n = needle.make_needles(TEXT, context_len=50, alphabet=ALPHABET, depths=[0.0, 0.5, 1.0],
                          count=3, needle_len=6, cue_len=2, seed=1)
  assert n.tokens.shape == (9, 50) and n.tokens.dtype == np.int32
  m = 50 - 12                                            # text tokens per row
  np.testing.assert_array_equal(n.needle_start, [0] * 3 + [round(0.5 * m)] * 3 + [m] * 3)
  assert n.answer_start == 46
  for row, start in zip(n.tokens, n.needle_start):
    first = row[start:start + 6]
    assert set(first) <= set(ALPHABET)
    np.testing.assert_array_equal(row[-6:], first)     # the repeat: cue + answer
    assert not set(np.delete(row, list(range(start, start + 6)) + list(range(44, 50)))) & set(
        ALPHABET)                                        # the rest is the text
    assert len({tuple(first[i:i + 2]) for i in range(5)}) == 5     # its 2-grams differ
  np.testing.assert_array_equal(n.answer_mask.sum(1), 4)
  assert n.answer_mask[:, 46:].all()
  np.testing.assert_array_equal(n.distance, 45 - n.needle_start)
  assert n.rows(n.depth == 0.5).tokens.shape == (3, 50)


def test_perfect_copier_scores_one_both_ways():
  n = needle.make_needles(TEXT, context_len=60, alphabet=ALPHABET, depths=[0.2, 0.9],
                          count=4, needle_len=7, cue_len=2)
  for scoring in needle.SCORINGS:
    s = needle.score_needles(copier(2), n, scoring=scoring, batch_size=3)
    assert s["accuracy"] == 1.0 and s["exact"] == 1.0 and s["rows"] == 8
    assert s["chance"] == 1 / 8 and s["row_accuracy"] == [1.0] * 8


def test_uniform_guessing_scores_chance():
  n = needle.make_needles(TEXT, context_len=40, alphabet=ALPHABET, count=400, needle_len=8,
                          cue_len=2)
  rng = np.random.default_rng(3)

  def guess(tokens):
    out = np.full(tokens.shape + (VOCAB,), -1e9, np.float32)
    out[..., list(ALPHABET)] = rng.normal(size=tokens.shape + (len(ALPHABET),))
    return out

  s = needle.score_needles(guess, n)
  assert abs(s["accuracy"] - s["chance"]) < 0.03      # 2,400 answers: sd 0.007
  assert s["exact"] < 0.01


def test_greedy_pays_for_its_own_errors():
  """One wrong answer token: teacher forcing still copies the rest (the cue is right there);
  greedy feeds the error back, the copier loses its place and every later token is wrong."""
  n = needle.make_needles(TEXT, context_len=60, alphabet=ALPHABET, count=5, needle_len=8,
                          cue_len=2)
  fn = copier(2, wrong_at=n.answer_start)                # the prediction of answer token 1
  tf = needle.score_needles(fn, n, scoring="teacher_forced")
  assert tf["accuracy"] == pytest.approx(5 / 6)
  greedy = needle.score_needles(fn, n, scoring="greedy")
  assert greedy["accuracy"] == pytest.approx(1 / 6) and greedy["exact"] == 0.0


def test_rare_tokens():
  text = np.array([5] * 10 + [3] * 2 + [7] * 2 + [1] * 4 + [9])
  assert needle.rare_tokens(text, 3) == (9, 3, 7)
  assert needle.rare_tokens(text, 2, min_count=2) == (3, 7)
  with pytest.raises(ValueError, match="count=6"):
    needle.rare_tokens(text, 6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(cue_len=8), "cue_len=8 must be < needle_len"),
    (dict(context_len=10), "context_len=10 leaves"),
    (dict(depths=[1.5]), "depths="),
    (dict(alphabet=(3, 3)), "alphabet="),
    (dict(needle_len=1), "needle_len=1"),
])
def test_bad_arguments(kwargs, match):
  args = dict(context_len=40, alphabet=ALPHABET, needle_len=8, cue_len=2) | kwargs
  with pytest.raises(ValueError, match=match):
    needle.make_needles(TEXT, **args)


def test_bad_logits_shape_and_scoring():
  n = needle.make_needles(TEXT, context_len=30, alphabet=ALPHABET, count=2)
  with pytest.raises(ValueError, match="logits_fn must map"):
    needle.score_needles(lambda t: np.zeros((2, 5)), n)
  with pytest.raises(ValueError, match="scoring='beam'"):
    needle.score_needles(copier(2), n, scoring="beam")
