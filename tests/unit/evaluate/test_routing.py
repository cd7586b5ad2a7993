"""jaxformer/evaluate/routing.py against a float64 NumPy reference: entropy per head (raw and
normalised by log of the visible keys), Jensen-Shannon similarity of heads, on causal rows with
padded keys, fully padded query rows and rows with a single visible key."""

import math

import numpy as np
import pytest

from jaxformer.evaluate import routing
from tests.arrays import EPS32, LAMBDA, rand

B, H, T = 2, 3, 6


def _visible() -> np.ndarray:
  """[B, T, T]: causal; row 1 has its last 2 positions padded (their queries see nothing)."""
  causal = np.tril(np.ones((T, T), bool))
  vis = np.stack([causal, causal.copy()])
  vis[1, :, T - 2:] = False
  vis[1, T - 2:, :] = False
  return vis


def _weights(seed=0, heads=H) -> np.ndarray:
  """float32 softmax probabilities [B, heads, T, T], exactly 0 where not visible, all-zero
  rows where nothing is."""
  logits = rand((B, heads, T, T), seed, scale=2.0).astype(np.float64)
  vis = _visible()[:, None]
  e = np.where(vis, np.exp(logits - logits.max(-1, keepdims=True)), 0.0)
  denom = e.sum(-1, keepdims=True)
  return (e / np.where(denom == 0, 1, denom)).astype(np.float32)


def _entropy(p):
  p = np.asarray(p, np.float64)
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0.0), -1)


def reference(p, vis):
  """(entropy [H], normalised entropy [H], similarity [H, H]) in float64."""
  p = np.asarray(p, np.float64)
  n = vis.sum(-1)                                            # [B, T]
  ent = _entropy(p)                                          # [B, H, T]
  some, several = n >= 1, n >= 2
  nats = np.array([ent[:, h][some].mean() for h in range(p.shape[1])])
  norm = np.array([(ent[:, h][several] / np.log(n[several])).mean()
                   for h in range(p.shape[1])])
  sim = np.zeros((p.shape[1], p.shape[1]))
  for a in range(p.shape[1]):
    for b in range(p.shape[1]):
      pa, pb = p[:, a][several], p[:, b][several]            # [rows, T]
      m = (pa + pb) / 2
      js = _entropy(m) - (_entropy(pa) + _entropy(pb)) / 2
      sim[a, b] = np.mean(1 - js / math.log(2))
  return nats, norm, sim


def _tol() -> float:
  """float32 sums over T keys of terms up to log T, then a mean over rows: a T-term sum's
  rounding bound (tests/arrays.sum_tol) times the largest entropy, and one more for the mean."""
  return 2 * LAMBDA * math.sqrt(T * B * T) * EPS32 * math.log(T)


def test_visible_keys_are_the_mask_of_a_masked_softmax():
  np.testing.assert_array_equal(np.asarray(routing.visible_keys(_weights())), _visible())


def test_entropy_and_similarity_match_the_float64_reference():
  p, vis = _weights(), _visible()
  nats, norm = routing.head_entropy(p, vis)
  sim = routing.similarity_matrix(np.moveaxis(p, 1, 0), vis)
  want = reference(p, vis)
  for got, ref in zip((nats, norm, sim), want):
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=0, atol=_tol())
  assert np.all(np.asarray(norm) < 1) and np.all(np.asarray(norm) > 0)


def test_rows_with_one_visible_key_or_none_count_only_where_they_should():
  """Row 0 of a causal map sees one key: its entropy (0) is in `entropy` but not in the
  normalised one; padded queries count nowhere. Changing those rows' weights changes
  nothing normalised."""
  p, vis = _weights(), _visible()
  nats, norm = map(np.asarray, routing.head_entropy(p, vis))
  n = vis.sum(-1)
  ent = _entropy(p)
  assert nats[0] == pytest.approx(ent[:, 0][n >= 1].mean(), abs=_tol())
  assert nats[0] != pytest.approx(ent[:, 0][n >= 2].mean(), abs=1e-3)  # row 0 weighs in
  q = p.copy()
  q[1, :, T - 2:] = 0.5                # padded queries: garbage that the mask hides
  np.testing.assert_array_equal(np.asarray(routing.head_entropy(q, vis)[1]), norm)
  np.testing.assert_array_equal(np.asarray(routing.similarity_matrix(np.moveaxis(q, 1, 0),
                                                                     vis)),
                                np.asarray(routing.similarity_matrix(np.moveaxis(p, 1, 0),
                                                                     vis)))


def test_uniform_one_hot_identical_and_disjoint_heads():
  vis = _visible()
  n = vis.sum(-1, keepdims=True)
  uniform = np.where(vis, 1.0 / np.maximum(n, 1), 0.0)
  first = np.zeros_like(uniform)
  first[..., 0] = vis[..., 0]                                # every row: its first key
  last = np.zeros_like(uniform)
  idx = np.maximum(n[..., 0] - 1, 0)
  np.put_along_axis(last, idx[..., None], 1.0, axis=-1)
  last = np.where(vis, last, 0.0)
  p = np.stack([uniform, first, last, uniform], 1).astype(np.float32)
  _, norm = routing.head_entropy(p, vis)
  np.testing.assert_allclose(np.asarray(norm), [1, 0, 0, 1], atol=_tol())
  sim = np.asarray(routing.similarity_matrix(np.moveaxis(p, 1, 0), vis))
  assert sim[0, 3] == pytest.approx(1, abs=_tol())           # identical
  assert sim[1, 2] == pytest.approx(0, abs=_tol())           # disjoint keys on every row
  np.testing.assert_allclose(sim, sim.T, atol=_tol())


def test_summary_of_a_scanned_stack_names_layers_and_partners():
  a, b = _weights(0), _weights(1)
  b[:, 2] = a[:, 1]                                 # layer 1 head 2 copies layer 0 head 1
  out = routing.summarize({"decoder/layers": np.stack([a, b])})
  assert out["layers"] == ["decoder/layers/0", "decoder/layers/1"]
  layer1 = out["heads"][1]
  assert layer1["partner"][2] == ["decoder/layers/0", 1]
  assert layer1["partner_similarity"][2] == pytest.approx(1, abs=_tol())
  vis = _visible()
  for i, w in enumerate((a, b)):
    nats, norm, sim = reference(w, vis)
    sc = out["scalars"]
    assert sc[f"entropy/{i}"] == pytest.approx(norm.mean(), abs=_tol())
    assert sc[f"min_entropy/{i}"] == pytest.approx(norm.min(), abs=_tol())
    assert sc[f"redundancy/{i}"] == pytest.approx(sim[~np.eye(H, dtype=bool)].mean(),
                                                  abs=_tol())
  assert set(out["scalars"]) == {f"{k}/{i}" for k in ("entropy", "min_entropy", "redundancy",
                                                      "partner") for i in (0, 1)} | {
                                                          "cross_layer_redundancy"}


def test_weights_of_another_rank_are_refused():
  with pytest.raises(ValueError, match="expected \\[B, H, Tq, Tk\\]"):
    routing.summarize({"x": np.zeros((2, 3, 4))})
