"""Converged losses from runs that stopped short of convergence, and L(N) fitted to them.

A study that doubles a size's tokens until the loss stops moving (Kaplan et al. 2020's
protocol) may hit an epoch cap first: its last loss is then an upper bound of the converged
one, and more so at the larger sizes, which biases a Kaplan fit to those losses low. This
module extrapolates instead (NumPy + SciPy):

- `fit_limit(d, loss, ...)`: per size, L(D) = L_inf + (D_c / D)^beta (`fit_saturating` on
  tokens D) over the lengths it ran; `L_inf` (the fit's E) is the converged loss. Its
  bootstrap resamples whole seeds where the size has >= 2 (`groups=`: the lengths of one
  seed are branches of one trunk and share its luck), else it is parametric: the fitted curve
  plus independent normal noise of a given sd at each length (e.g. the seeds' sd at that
  length, pooled over the seeded sizes), refitted.
- `fit_kaplan_limits(n, limits)`: L_inf = (N_c / N)^alpha_N (`fit_kaplan_n` on the per-size
  point estimates), its interval from a nested bootstrap: each draw takes one L_inf from each
  size's bootstrap distribution and refits (per-size uncertainty only), or with
  `resample_sizes=True` also draws the sizes with replacement (plus the sizes' scatter about
  the law).
- `backtest_limit(d, loss, ...)`: fit L(D) without the longest length, predict it.

Each bootstrap counts attempted and fitted draws and refuses intervals when more than
`max_failure` (10%) fail (`stats.BootstrapError`), as `stats.bootstrap` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxformer.scaling import laws, stats

LAW = "L(D) = L_inf + (D_c / D)^beta"


def _rename(params: dict) -> dict[str, float]:
  """fit_saturating's {E, alpha, X_c} as {L_inf, beta, D_c}."""
  return {"L_inf": params["E"], "beta": params["alpha"], "D_c": params["X_c"]}


@dataclasses.dataclass(frozen=True)
class Limit:
  """One size's extrapolated curve: `fit` (`fit_saturating` on D, params E/alpha/X_c),
  `draws` {L_inf, beta, D_c: bootstrap values}, and how they were drawn (`method`)."""
  fit: stats.Fit
  draws: dict[str, np.ndarray]
  method: str
  attempted: int
  failed: int
  findings: tuple[str, ...] = ()

  @property
  def params(self) -> dict[str, float]:
    return _rename(self.fit.params)

  def ci(self, key: str, level: float = stats.LEVEL) -> tuple[float, float]:
    return stats.interval(self.draws.get(key, ()), level)

  def predict(self, d: Any) -> np.ndarray:
    return self.fit.predict(d)

  def predict_ci(self, d: Any) -> tuple[np.ndarray, np.ndarray]:
    """The mean curve's interval at d (each draw's curve evaluated there)."""
    return self.fit.predict_ci(d)

  def as_dict(self) -> dict[str, Any]:
    fitted = self.attempted - self.failed
    return {"law": LAW, "params": self.params,
            "ci": {k: list(self.ci(k)) for k in self.params},
            "rms_residual": self.fit.rms_residual, "n_points": self.fit.n_points,
            "method": self.method, "bootstrap_attempted": self.attempted,
            "bootstrap_failed": self.failed,
            "bootstrap": f"{fitted} of {self.attempted} resamples fitted",
            "findings": list(self.findings)}


def fit_limit(d: Any, loss: Any, *, groups: Any = None, noise: Any = None,
              samples: int = laws.DEFAULT_SAMPLES, seed: int = 0,
              max_failure: float = stats.MAX_FAILURE) -> Limit:
  """L(D) = L_inf + (D_c / D)^beta fitted to one size's final losses at its token counts `d`
  (one point per run: length and seed). The bootstrap: with `groups` (one seed id per point,
  >= 2 seeds) whole seeds are resampled; else `noise` (one sd per point, loss units) drives a
  parametric bootstrap (fitted curve + N(0, noise^2) at each point, independently). With
  neither, or samples=0, no interval."""
  d, loss = stats.as_points("fit_limit", 4, ("d", "loss"), d=d, loss=loss)
  seeded = groups is not None and len(set(np.asarray(groups).tolist())) >= 2
  if seeded or noise is None or not samples:
    fit = laws.fit_saturating(d, loss, samples=samples if (seeded or not samples) else 0,
                              seed=seed, groups=groups if seeded else None,
                              max_failure=max_failure)
    draws = _rename(fit.samples) if fit.samples else {}
    method = ("bootstrap resampling whole seeds" if seeded and samples else "no bootstrap")
    return Limit(fit, draws, method, fit.bootstrap_attempted, fit.bootstrap_failed,
                 tuple(fit.findings))
  fit = laws.fit_saturating(d, loss, samples=0)
  noise = np.broadcast_to(np.asarray(noise, np.float64), d.shape)
  if not np.all(np.isfinite(noise) & (noise >= 0)):
    raise ValueError(f"fit_limit: noise={noise.tolist()} must be standard deviations >= 0")
  curve = fit.predict(d)

  def once(rng):
    return laws.fit_saturating(d, curve + noise * rng.standard_normal(d.size),
                               samples=0).params

  boot = stats.simulate(once, samples=samples, seed=seed, max_failure=max_failure,
                        what="fit_limit (parametric bootstrap)")
  fit = dataclasses.replace(fit, samples=boot.draws)
  return Limit(fit, _rename(boot.draws), "parametric bootstrap (fitted curve + noise)",
               boot.requested, boot.failed, (*fit.findings, *boot.findings()))


def fit_kaplan_limits(n: Sequence[float], limits: Sequence[Limit], *,
                      samples: int = laws.DEFAULT_SAMPLES, seed: int = 0,
                      resample_sizes: bool = False,
                      max_failure: float = stats.MAX_FAILURE) -> stats.Fit:
  """L_inf = (N_c / N)^alpha_N (`fit_kaplan_n`) on the sizes' extrapolated L_inf, the
  interval from a nested bootstrap: each draw takes one L_inf at random from each size's
  bootstrap draws and refits (so the per-size uncertainty propagates); with
  `resample_sizes` the sizes are also drawn with replacement (>= 3 distinct needed)."""
  n = np.asarray(n, np.float64)
  point = np.array([lim.params["L_inf"] for lim in limits])
  fit = laws.fit_kaplan_n(n, point, samples=0)
  pools = [np.asarray(lim.draws.get("L_inf", ()), np.float64) for lim in limits]
  if samples and any(p.size == 0 for p in pools):
    raise ValueError("fit_kaplan_limits: a size has no bootstrap draws of L_inf; fit every "
                     "size with samples > 0")

  def once(rng):
    idx = rng.choice(n.size, n.size) if resample_sizes else np.arange(n.size)
    values = np.array([pools[i][rng.integers(pools[i].size)] for i in idx])
    return laws.fit_kaplan_n(n[idx], values, samples=0).params

  boot = stats.simulate(once, samples=samples, seed=seed, max_failure=max_failure,
                        what="fit_kaplan_limits")
  what = ("nested bootstrap: one L_inf from each size's bootstrap draws"
          + (", sizes drawn with replacement" if resample_sizes else ", every size") +
          f"; {boot.summary()}")
  return dataclasses.replace(fit, samples=boot.draws, method=f"{fit.method}; {what}",
                             findings=(*fit.findings, *boot.findings()),
                             bootstrap_attempted=boot.requested,
                             bootstrap_failed=boot.failed)


def backtest_limit(d: Any, loss: Any, *, groups: Any = None, noise: Any = None,
                   samples: int = 200, seed: int = 0) -> dict[str, Any]:
  """Fit `fit_limit` without the longest token count and predict the mean loss there:
  {d, predicted, low, high (the mean curve's 95% interval), measured (mean of the held-out
  points), error = predicted - measured}."""
  d, loss = np.asarray(d, np.float64), np.asarray(loss, np.float64)
  held = d == d.max()
  keep = ~held
  lim = fit_limit(d[keep], loss[keep],
                  groups=None if groups is None else np.asarray(groups)[keep],
                  noise=None if noise is None else np.broadcast_to(
                      np.asarray(noise, np.float64), d.shape)[keep],
                  samples=samples, seed=seed)
  predicted = float(lim.predict(d.max()))
  low, high = lim.predict_ci(d.max()) if lim.draws else (np.nan, np.nan)
  measured = float(loss[held].mean())
  return {"d": float(d.max()), "predicted": predicted, "low": float(low), "high": float(high),
          "measured": measured, "error": predicted - measured, "L_inf": lim.params["L_inf"],
          "method": lim.method, "bootstrap": f"{lim.attempted - lim.failed} of "
          f"{lim.attempted} resamples fitted"}
