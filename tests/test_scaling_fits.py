"""Scaling-law fits on synthetic data with known parameters, and the Chinchilla helpers."""

from __future__ import annotations

import numpy as np
import pytest

from jaxformer import scaling_fits as sf


def _noisy(law, n, noise, seed):
  rng = np.random.default_rng(seed)
  return law(n) * (1.0 + noise * rng.standard_normal(n.shape))


def test_power_law_recovers_kaplan_parameters():
  n = np.geomspace(1.3e4, 7.7e6, 9)
  true_alpha, true_nc = 0.076, 8.8e13            # Kaplan et al. 2020, eq. 1.1
  loss = _noisy(lambda x: (true_nc / x) ** true_alpha, n, 0.002, seed=1)
  fit = sf.fit_power_law(n, loss)
  assert abs(fit.params["alpha"] - true_alpha) < 3 * fit.stderr["alpha"] + 1e-3
  assert abs(np.log(fit.params["N_c"] / true_nc)) < 3 * fit.stderr["N_c"] / fit.params["N_c"] + 0.3
  assert 0 < fit.stderr["alpha"] < 0.01
  np.testing.assert_allclose(fit.predict(n), loss, rtol=0.01)


def test_power_law_exact_data_is_exact_with_float64_reference():
  n = np.array([1234.0, 5e4, 3.3e5, 2e6, 1.1e7])
  loss = (4.2e5 / n) ** 0.21
  fit = sf.fit_power_law(n, loss)
  np.testing.assert_allclose([fit.params["alpha"], fit.params["N_c"]], [0.21, 4.2e5], rtol=1e-9)
  assert fit.stderr["alpha"] < 1e-9 and fit.rms_residual < 1e-12


def test_saturating_power_law_recovers_parameters():
  n = np.geomspace(1.2e4, 1.8e6, 7)
  true = {"E": 1.6, "alpha": 0.35, "N_c": 2.5e4}
  loss = _noisy(lambda x: true["E"] + (true["N_c"] / x) ** true["alpha"], n, 0.002, seed=3)
  fit = sf.fit_saturating_power_law(n, loss)
  for key in ("E", "alpha"):
    assert abs(fit.params[key] - true[key]) < 4 * fit.stderr[key] + 0.02, key
  assert abs(np.log(fit.params["N_c"] / true["N_c"])) < 0.5
  assert all(v > 0 for v in fit.stderr.values())
  # The Kaplan law (no E) cannot bend: it fits this curve clearly worse.
  assert sf.fit_power_law(n, loss).rms_residual > 3 * fit.rms_residual


def test_bootstrap_stderr_is_near_covariance_stderr():
  n = np.geomspace(1e3, 1e7, 12)
  loss = _noisy(lambda x: (1e9 / x) ** 0.1, n, 0.01, seed=5)
  fit = sf.fit_power_law(n, loss)
  boot = sf.bootstrap_stderr(sf.fit_power_law, n, loss, samples=200, seed=0)
  assert 0.3 < boot["alpha"] / fit.stderr["alpha"] < 3


@pytest.mark.parametrize("n, loss, match", [
    ([1e3, 1e4], [3.0, 2.0], "at least 3 distinct"),
    ([1e3, 1e4, 1e5], [3.0, 2.0], "same length"),
    ([1e3, 1e4, -1e5], [3.0, 2.0, 1.0], "must be > 0"),
    ([1e3, 1e4, 1e5], [3.0, np.nan, 1.0], "finite"),
])
def test_power_law_bad_input(n, loss, match):
  with pytest.raises(ValueError, match=match):
    sf.fit_power_law(n, loss)


def test_saturating_needs_four_sizes_and_decreasing_loss():
  with pytest.raises(ValueError, match="at least 4 distinct"):
    sf.fit_saturating_power_law([1e3, 1e4, 1e5], [3.0, 2.5, 2.2])
  with pytest.raises(ValueError, match="does not decrease"):
    sf.fit_saturating_power_law([1e3, 1e4, 1e5, 1e6], [2.0, 2.2, 2.5, 3.0])


def test_compute_frontier_is_lower_envelope():
  def metrics(losses, every=10):
    return [{"step": every * (i + 1), "loss": v} for i, v in enumerate(losses)] + [
        {"step": every * len(losses), "eval_loss": 0.0}]      # eval records are ignored

  runs = [dict(name="small", params=100, tokens_per_step=5, metrics=metrics([3.0, 2.5, 2.4])),
          dict(name="big", params=1000, tokens_per_step=5, metrics=metrics([2.9, 2.2, 2.0]))]
  frontier = sf.compute_frontier(runs)
  c_small = 6 * 100 * 5 * np.array([10, 20, 30])
  c_big = 6 * 1000 * 5 * np.array([10, 20, 30])
  np.testing.assert_allclose(frontier.compute, np.concatenate([c_small, c_big[1:]]))
  np.testing.assert_allclose(frontier.loss, [3.0, 2.5, 2.4, 2.2, 2.0])
  assert frontier.name == ["small"] * 3 + ["big"] * 2
  assert np.all(np.diff(frontier.loss) < 0) and np.all(np.diff(frontier.compute) > 0)
  with pytest.raises(ValueError, match="tokens_per_step"):
    sf.compute_frontier([dict(name="x", params=1, metrics=[])])


def test_chinchilla_twenty_tokens_per_parameter():
  assert sf.chinchilla_tokens(70e9) == pytest.approx(1.4e12)     # Chinchilla: 70B on 1.4T
  np.testing.assert_allclose(sf.chinchilla_tokens([1e6, 3e6]), [2e7, 6e7])
  with pytest.raises(ValueError, match="n_params"):
    sf.chinchilla_tokens(0)


def test_chinchilla_law_optimum_satisfies_its_equation():
  law = sf.HOFFMANN_2022
  a, b, big_a, big_b = 0.34, 0.28, 406.4, 410.7
  g = (a * big_a / (b * big_b)) ** (1 / (a + b))
  assert law.G == pytest.approx(g, rel=1e-12)
  for n in (1.7e4, 1.3e8, 7e10):
    d = sf.chinchilla_optimal_tokens(n)
    compute = 6 * n * d
    assert law.optimal_params(compute) == pytest.approx(n, rel=1e-9)
    assert law.optimal_tokens_for_compute(compute) == pytest.approx(d, rel=1e-9)
    # N_opt minimizes L(N, C / 6N) along the compute budget.
    grid = n * np.geomspace(0.5, 2.0, 201)
    losses = law.loss(grid, compute / (6 * grid))
    assert grid[np.argmin(losses)] == pytest.approx(n, rel=0.01)
  with pytest.raises(ValueError, match="n_params"):
    sf.chinchilla_optimal_tokens(-1.0)
