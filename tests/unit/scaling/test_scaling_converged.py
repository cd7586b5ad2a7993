"""scaling.converged on a synthetic known law: sizes whose converged losses follow
L_inf(N) = (N_c / N)^alpha exactly, each seen along L(D) = L_inf + (D_c / D)^beta at 6
doublings of D with small noise (3 seeds at the 2 smallest sizes, 1 elsewhere)."""

import numpy as np
import pytest

from jaxformer import scaling

ALPHA, N_C, BETA, D_C, NOISE = 0.1, 1e7, 0.7, 5e5, 0.003
N = np.array([6e3, 2e4, 6e4, 2e5])
D = 1_228_800 * 2.0 ** np.arange(6)
SAMPLES = 15


def _curves(seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for i, n in enumerate(N):
    seeds = 3 if i < 2 else 1
    d = np.tile(D, seeds)
    loss = (N_C / n) ** ALPHA + (D_C / d) ** BETA + NOISE * rng.standard_normal(d.size)
    out.append((d, loss, np.repeat(np.arange(seeds), D.size)))
  return out


def test_recovers_alpha_and_the_converged_losses_within_their_intervals():
  limits = []
  for d, loss, seeds in _curves():
    lim = scaling.fit_limit(d, loss, groups=seeds if seeds.max() else None,
                            noise=NOISE, samples=SAMPLES, seed=1)
    assert lim.attempted == SAMPLES and lim.failed <= 0.1 * SAMPLES
    limits.append(lim)
  truth = (N_C / N) ** ALPHA
  inside = [lim.ci("L_inf")[0] <= t <= lim.ci("L_inf")[1] for lim, t in zip(limits, truth)]
  assert sum(inside) >= 3, (inside, [lim.params for lim in limits])
  assert [lim.method.startswith("bootstrap resampling whole seeds") for lim in limits] == \
      [True, True, False, False]
  fit = scaling.fit_kaplan_limits(N, limits, samples=200, seed=2)
  low, high = fit.ci("alpha_N")
  assert low <= ALPHA <= high and high - low < 0.05, (fit.params, low, high)
  assert abs(fit.params["alpha_N"] - ALPHA) < 0.01
  assert fit.bootstrap_attempted == 200 and "nested bootstrap" in fit.method
  with pytest.raises(scaling.BootstrapError, match="distinct values of N"):
    # 4 sizes drawn with replacement: too many draws hold < 3 distinct sizes, and the
    # intervals of the rest would be a selected subset
    scaling.fit_kaplan_limits(N, limits, samples=200, seed=2, resample_sizes=True)


def test_the_backtest_predicts_the_held_out_length():
  d, loss, _ = _curves()[2]
  result = scaling.backtest_limit(d, loss, noise=NOISE, samples=SAMPLES)
  truth = (N_C / N[2]) ** ALPHA + (D_C / D[-1]) ** BETA
  assert result["d"] == D[-1] and abs(result["error"]) < 0.02
  assert abs(result["predicted"] - truth) < 0.02 and result["low"] < result["high"]


def test_a_parametric_bootstrap_that_mostly_fails_is_refused():
  d, loss, _ = _curves()[3]
  with pytest.raises(scaling.BootstrapError, match="fit_limit"):
    scaling.fit_limit(d, loss, noise=1e6, samples=10)          # noise swamps the curve
