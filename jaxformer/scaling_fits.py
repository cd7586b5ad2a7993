"""Scaling-law fits and compute-optimal token counts (NumPy + SciPy only, no JAX).

Kept apart from `jaxformer.scaling` (which builds models to count parameters) so the fits can
be used, and tested, on plain arrays of (parameters, loss) without importing JAX.

    from jaxformer import scaling_fits as sf
    fit = sf.fit_saturating_power_law(N, L)     # L = E + (N_c / N)^alpha
    fit.params['alpha'], fit.stderr['alpha'], fit.predict(1e6)
    sf.fit_power_law(N, L)                      # Kaplan et al. 2020: L = (N_c / N)^alpha
    sf.compute_frontier(runs)                   # lower envelope of loss vs C = 6 N D
    sf.chinchilla_tokens(N)                     # 20 tokens / parameter
    sf.chinchilla_optimal_tokens(N)             # Hoffmann et al. 2022, approach 3 law

Uncertainties are 1-sigma standard errors from the covariance of the least-squares fit (the
residual variance scales it; the delta method carries it to N_c). `bootstrap_stderr` adds a
non-parametric check: refit on points resampled with replacement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import optimize


@dataclasses.dataclass(frozen=True)
class Fit:
  """A fitted law: `params` and their 1-sigma `stderr` (same keys), the `law` formula, how the
  errors were estimated (`method`) and the root-mean-square residual in loss units."""
  law: str
  params: dict[str, float]
  stderr: dict[str, float]
  method: str
  rms_residual: float

  def predict(self, n: Any) -> np.ndarray:
    """The fitted loss at parameter count(s) `n`."""
    n = np.asarray(n, np.float64)
    power = (self.params["N_c"] / n) ** self.params["alpha"]
    return self.params.get("E", 0.0) + power


def _check_points(n: Any, loss: Any, min_points: int, what: str) -> tuple[np.ndarray, np.ndarray]:
  """(N, L) as float64 arrays, or a ValueError naming the argument and the fix."""
  n, loss = np.asarray(n, np.float64).ravel(), np.asarray(loss, np.float64).ravel()
  if n.shape != loss.shape:
    raise ValueError(f"{what}: N ({n.size} values) and L ({loss.size} values) must have the "
                     "same length")
  if n.size < min_points or np.unique(n).size < min_points:
    raise ValueError(f"{what} needs at least {min_points} distinct model sizes N; got "
                     f"{np.unique(n).size}: add points (more model sizes) to the sweep")
  if not (np.all(np.isfinite(n)) and np.all(np.isfinite(loss))):
    raise ValueError(f"{what}: N and L must be finite (drop failed runs with eval_loss None/NaN)")
  if np.any(n <= 0) or np.any(loss <= 0):
    raise ValueError(f"{what}: N and L must be > 0 for a power law; got min N {n.min():g}, "
                     f"min L {loss.min():g}")
  return n, loss


def fit_power_law(n: Any, loss: Any) -> Fit:
  """Kaplan et al. (2020, "Scaling Laws for Neural Language Models", eq. 1.1):
  L(N) = (N_c / N)^alpha, fit as a straight line log L = alpha log N_c - alpha log N
  (ordinary least squares in log-log). Errors: the OLS covariance (residual variance
  estimate); sd(N_c) by the delta method. Needs >= 3 distinct N."""
  n, loss = _check_points(n, loss, 3, "fit_power_law")
  x, y = np.log(n), np.log(loss)
  design = np.stack([np.ones_like(x), x], axis=1)
  coef, *_ = np.linalg.lstsq(design, y, rcond=None)
  residual = y - design @ coef
  sigma2 = residual @ residual / (x.size - 2)
  cov = sigma2 * np.linalg.inv(design.T @ design)
  intercept, slope = coef
  alpha = -slope
  log_nc = intercept / alpha
  # d(log N_c)/d(intercept, slope) for log N_c = -intercept / slope.
  grad = np.array([-1.0 / slope, intercept / slope**2])
  sd_log_nc = float(np.sqrt(grad @ cov @ grad))
  n_c = float(np.exp(log_nc))
  fit = Fit(law="L = (N_c / N)^alpha", params={"alpha": float(alpha), "N_c": n_c},
            stderr={"alpha": float(np.sqrt(cov[1, 1])), "N_c": n_c * sd_log_nc},
            method="OLS covariance in log-log (delta method for N_c)", rms_residual=0.0)
  return dataclasses.replace(fit, rms_residual=_rms(fit, n, loss))


def _rms(fit: Fit, n: np.ndarray, loss: np.ndarray) -> float:
  return float(np.sqrt(np.mean((fit.predict(n) - loss) ** 2)))


def _saturating(log_n: np.ndarray, e: float, alpha: float, log_nc: float) -> np.ndarray:
  return e + np.exp(alpha * (log_nc - log_n))


def _initial_guess(log_n: np.ndarray, loss: np.ndarray) -> tuple[float, float, float]:
  """(E, alpha, log N_c) from straight-line fits of log(L - E) over a grid of E < min L."""
  best = None
  for e in np.linspace(0.0, loss.min(), 50, endpoint=False):
    slope, intercept = np.polyfit(log_n, np.log(loss - e), 1)
    if slope >= 0:
      continue
    guess = (e, -slope, intercept / -slope)
    sse = np.sum((_saturating(log_n, *guess) - loss) ** 2)
    if best is None or sse < best[0]:
      best = (sse, guess)
  if best is None:
    raise ValueError("fit_saturating_power_law: the loss does not decrease with N, so no "
                     "E + (N_c / N)^alpha fits; check the runs (or train them longer)")
  return best[1]


def fit_saturating_power_law(n: Any, loss: Any) -> Fit:
  """L(N) = E + (N_c / N)^alpha: Kaplan's law plus an irreducible loss E (the form of
  Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", eq. 2, at fixed D).
  Nonlinear least squares in (E, alpha, log N_c) from a grid-search start, with
  0 <= E <= min L (a loss is >= 0; E = 0 means the data show no saturation and the law is
  Kaplan's). Errors: the
  covariance of `scipy.optimize.curve_fit` (scaled by the residual variance); sd(N_c) by the
  delta method. Needs >= 4 distinct N (3 parameters + 1 degree of freedom)."""
  n, loss = _check_points(n, loss, 4, "fit_saturating_power_law")
  log_n = np.log(n)
  guess = _initial_guess(log_n, loss)
  bounds = ([0.0, 1e-6, -np.inf], [loss.min(), np.inf, np.inf])
  popt, pcov = optimize.curve_fit(_saturating, log_n, loss, p0=guess, bounds=bounds,
                                  max_nfev=2000)
  e, alpha, log_nc = (float(v) for v in popt)
  sd = np.sqrt(np.clip(np.diag(pcov), 0.0, None))
  n_c = float(np.exp(log_nc))
  fit = Fit(law="L = E + (N_c / N)^alpha", params={"E": e, "alpha": alpha, "N_c": n_c},
            stderr={"E": float(sd[0]), "alpha": float(sd[1]), "N_c": n_c * float(sd[2])},
            method="curve_fit covariance (delta method for N_c)", rms_residual=0.0)
  return dataclasses.replace(fit, rms_residual=_rms(fit, n, loss))


def bootstrap_stderr(fit_fn: Callable[[Any, Any], Fit], n: Any, loss: Any, *,
                     samples: int = 200, seed: int = 0) -> dict[str, float]:
  """Standard deviation of each parameter of `fit_fn` over refits on points resampled with
  replacement. Resamples that cannot be fit (too few distinct N) are skipped; a ValueError
  if fewer than half of them fit."""
  if samples < 2:
    raise ValueError(f"bootstrap_stderr: samples={samples} must be >= 2")
  n, loss = np.asarray(n, np.float64).ravel(), np.asarray(loss, np.float64).ravel()
  rng = np.random.default_rng(seed)
  values: dict[str, list[float]] = {}
  for _ in range(samples):
    idx = rng.integers(0, n.size, n.size)
    try:
      fit = fit_fn(n[idx], loss[idx])
    except (ValueError, RuntimeError):
      continue
    for key, value in fit.params.items():
      values.setdefault(key, []).append(value)
  fitted = len(next(iter(values.values()), []))
  if fitted < samples / 2:
    raise ValueError(f"bootstrap_stderr: only {fitted} of {samples} resamples could be fit; "
                     "add model sizes to the sweep")
  return {key: float(np.std(v, ddof=1)) for key, v in values.items()}


@dataclasses.dataclass(frozen=True)
class Frontier:
  """The compute-efficient frontier: the points (compute, loss, run name) where no run
  reached a lower loss with less or equal compute, in increasing compute order."""
  compute: np.ndarray
  loss: np.ndarray
  name: list[str]


def compute_curve(metrics: Iterable[Mapping[str, Any]], params: float,
                  tokens_per_step: float) -> tuple[np.ndarray, np.ndarray]:
  """(C, loss) of one run from its metrics.jsonl records: every record with a training
  `loss`, C = 6 N D with D = step x tokens_per_step (Kaplan et al. 2020, C ~ 6 N D)."""
  if params <= 0 or tokens_per_step <= 0:
    raise ValueError(f"compute_curve: params={params} and tokens_per_step={tokens_per_step} "
                     "must be > 0")
  rows = sorted((r["step"], r["loss"]) for r in metrics if "loss" in r and "step" in r)
  steps = np.array([s for s, _ in rows], np.float64)
  loss = np.array([v for _, v in rows], np.float64)
  return 6.0 * params * steps * tokens_per_step, loss


def compute_frontier(records: Sequence[Mapping[str, Any]]) -> Frontier:
  """Lower envelope of loss vs compute over runs. Each record: `name`, `params` (N,
  non-embedding), `tokens_per_step` (batch x seq_len) and `metrics` (metrics.jsonl records);
  C = 6 N D per logged step (`compute_curve`)."""
  points = []
  for record in records:
    for key in ("name", "params", "tokens_per_step", "metrics"):
      if key not in record:
        raise ValueError(f"compute_frontier: a record lacks {key!r}; give name, params, "
                         "tokens_per_step and metrics")
    compute, loss = compute_curve(record["metrics"], record["params"], record["tokens_per_step"])
    points += [(c, v, record["name"]) for c, v in zip(compute, loss) if np.isfinite(v)]
  if not points:
    raise ValueError("compute_frontier: no training-loss records in any run")
  points.sort(key=lambda p: (p[0], p[1]))
  kept, best = [], np.inf
  for c, v, name in points:
    if v < best:
      kept.append((c, v, name))
      best = v
  return Frontier(compute=np.array([p[0] for p in kept]), loss=np.array([p[1] for p in kept]),
                  name=[p[2] for p in kept])


def chinchilla_tokens(n_params: Any, tokens_per_param: float = 20.0) -> Any:
  """Compute-optimal training tokens by the rule of thumb of Hoffmann et al. (2022),
  "Training Compute-Optimal Large Language Models": D = 20 N."""
  if np.any(np.asarray(n_params) <= 0) or tokens_per_param <= 0:
    raise ValueError(f"chinchilla_tokens: n_params ({n_params}) and tokens_per_param "
                     f"({tokens_per_param}) must be > 0")
  return tokens_per_param * np.asarray(n_params, np.float64)


@dataclasses.dataclass(frozen=True)
class ChinchillaLaw:
  """L(N, D) = E + A / N^a + B / D^b with the fitted values of Hoffmann et al. (2022),
  approach 3 (their eq. 10): E=1.69, A=406.4, B=410.7, a=0.34, b=0.28."""
  E: float = 1.69
  A: float = 406.4
  B: float = 410.7
  a: float = 0.34
  b: float = 0.28

  def loss(self, n_params: Any, tokens: Any) -> Any:
    return self.E + self.A / np.power(n_params, self.a) + self.B / np.power(tokens, self.b)

  @property
  def G(self) -> float:
    """G = (a A / (b B))^(1 / (a + b)) (Hoffmann et al. 2022, eq. 4)."""
    return (self.a * self.A / (self.b * self.B)) ** (1.0 / (self.a + self.b))

  def optimal_params(self, compute: Any) -> Any:
    """N_opt(C) = G (C / 6)^(b / (a + b)): the loss-minimizing N at C = 6 N D FLOPs."""
    return self.G * np.power(np.asarray(compute, np.float64) / 6.0, self.b / (self.a + self.b))

  def optimal_tokens_for_compute(self, compute: Any) -> Any:
    """D_opt(C) = C / (6 N_opt(C))."""
    return np.asarray(compute, np.float64) / (6.0 * self.optimal_params(compute))

  def optimal_tokens(self, n_params: Any) -> Any:
    """The D for which a model of N parameters is compute-optimal, i.e. N = N_opt(6 N D):
    N / G = (N D)^(b / (a + b))  =>  D = (N / G)^((a + b) / b) / N."""
    n = np.asarray(n_params, np.float64)
    return (n / self.G) ** ((self.a + self.b) / self.b) / n


HOFFMANN_2022 = ChinchillaLaw()


def chinchilla_optimal_tokens(n_params: Any, law: ChinchillaLaw = HOFFMANN_2022) -> Any:
  """Compute-optimal tokens for N parameters by the fitted law of Hoffmann et al. (2022),
  approach 3 (see `ChinchillaLaw.optimal_tokens`)."""
  if np.any(np.asarray(n_params) <= 0):
    raise ValueError(f"chinchilla_optimal_tokens: n_params must be > 0; got {n_params}")
  return law.optimal_tokens(n_params)
