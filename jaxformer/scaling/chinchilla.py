"""Compute-optimal allocation, the three approaches of Hoffmann et al. (2022, "Training
Compute-Optimal Large Language Models", section 3), NumPy + SciPy only.

Every result has `compute_optimal(C) -> (N_opt, D_opt)` and bootstrap intervals
(`stats.Fit.ci`); approaches 1 and 2 report N_opt = k_N C^a and D_opt = k_D C^b, approach 3
the parametric loss L(N, D) = E + A / N^alpha + B / D^beta, whose a = beta / (alpha + beta).

- Approach 1, `envelope_optimum(curves)`: the lower envelope of loss vs compute over all
  runs' loss curves; at each of ~1500 compute values the run on the envelope gives (N, D).
- Approach 2, `isoflop_optimum(n, d, loss, budget)`: per budget a parabola of loss in log N
  (and in log D) through the IsoFLOP points, whose vertex is that budget's optimum.
- Approach 3, `fit_parametric(n, d, loss)`: as the paper fits it (appendix D.2): the Huber
  loss (delta 1e-3) between the log of the predicted loss, written as a log-sum-exp
  LSE(a - alpha log N, b - beta log D, e) with A = e^a, B = e^b, E = e^e, and log L, summed
  over runs and minimised by L-BFGS from the paper's grid of 4500 starting points.

Published values: Chinchilla's a/b = 0.50/0.50 (approach 1), 0.49/0.51 (2), 0.46/0.54 (3),
and approach 3's E = 1.69, A = 406.4, B = 410.7, alpha = 0.34, beta = 0.28 (`HOFFMANN_2022`).
The replication `BESIROGLU_2024` refits approach 3 to the paper's points (reconstructed from
its figure); the two laws disagree on the compute-optimal ratio (see `BESIROGLU_2024`).

FLOPs: the closed forms assume C = 6 N D; a study whose budgets are exact FLOPs (Hoffmann et
al. appendix F count, larger than 6N per token for small models) passes the family's FLOPs
per token (`family_flops_per_token`) to `compute_optimal` and `exponents`, which then
minimise L(N, C / fpt(N)) numerically.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxformer.scaling import stats

DEFAULT_SAMPLES = 100
# Hoffmann et al. appendix D.2: alpha, beta in {0, .5, ..., 2}, e in {-1, -.5, ..., 1},
# a, b in {0, 5, ..., 25}.
PAPER_GRID = {"a": np.arange(0.0, 25.1, 5.0), "b": np.arange(0.0, 25.1, 5.0),
              "e": np.arange(-1.0, 1.01, 0.5), "alpha": np.arange(0.0, 2.01, 0.5),
              "beta": np.arange(0.0, 2.01, 0.5)}
_ORDER = ("a", "b", "e", "alpha", "beta")


# ----------------------------------------------------------------------------- approach 3


@dataclasses.dataclass(frozen=True)
class ParametricFit(stats.Fit):
  """L(N, D) = E + A / N^alpha + B / D^beta with `params` E, A, B, alpha, beta."""

  def compute_optimal(self, flops: Any,
                      flops_per_token: Callable[[np.ndarray], np.ndarray] | None = None
                      ) -> tuple[Any, Any]:
    """(N_opt, D_opt) minimising L(N, D) at a budget of `flops` (scalar or array).

    flops_per_token=None: the closed form for C = 6 N D (Hoffmann et al. eq. 4):
    N_opt = G (C / 6)^a, D_opt = G^-1 (C / 6)^b, G = (alpha A / (beta B))^(1 / (alpha + beta)),
    a = beta / (alpha + beta), b = alpha / (alpha + beta).

    flops_per_token: a callable N -> training FLOPs per token (vectorised over N, e.g.
    `family_flops_per_token`), for budgets counted in exact FLOPs as the studies count them
    (Hoffmann et al. appendix F: 1.59 x 6N at 7K parameters, 1.04 x at 10M): then C =
    fpt(N) D, and N_opt minimises L(N, C / fpt(N)), found numerically in log N (a grid of
    0.1 e-folds over +-15 around the closed form's N, then golden-section search in the best
    cell to 1e-12 in log N); D_opt = C / fpt(N_opt)."""
    if flops_per_token is None:
      return _compute_optimal(self.params, flops)
    return _numeric_optimum(self.params, flops, flops_per_token)

  def exponents(self, budgets: Any = None,
                flops_per_token: Callable[[np.ndarray], np.ndarray] | None = None
                ) -> dict[str, tuple[float, tuple[float, float]]]:
    """{'a': (value, ci), 'b': (value, ci)} of N_opt ~ C^a and D_opt ~ C^b; no interval
    (nan, nan) when alpha or beta is not identified; intervals from the bootstrap draws.

    Without `budgets`: the closed form's exponents under C = 6 N D, a = beta / (alpha + beta),
    b = alpha / (alpha + beta). With `budgets` (FLOPs; a pair is a range, sampled at 9
    log-spaced budgets): the least-squares slopes of log N_opt and log D_opt against log C
    over them, with `flops_per_token` as in `compute_optimal`: under exact compute N_opt(C)
    is not a power law (fpt / N falls with N), so the slope depends on the range and a + b
    need not be 1."""
    draws = [] if {"alpha", "beta"} & set(self.unidentified) else self.draws()
    if budgets is None:
      if flops_per_token is not None:
        raise ValueError("exponents: with flops_per_token, pass budgets= (the FLOP range to "
                         "fit the slopes over): under exact compute N_opt(C) is not a power "
                         "law, so its slope depends on the range")
      out = {}
      for key, fn in (("a", lambda p: p["beta"] / (p["alpha"] + p["beta"])),
                      ("b", lambda p: p["alpha"] / (p["alpha"] + p["beta"]))):
        out[key] = (fn(self.params), stats.interval([fn(p) for p in draws], self.level))
      return out
    c = np.asarray(budgets, np.float64).ravel()
    if c.size == 2:
      c = np.geomspace(c[0], c[1], 9) if np.all(c > 0) else c
    if np.any(~np.isfinite(c)) or np.any(c <= 0) or np.unique(c).size < 2:
      raise ValueError(f"exponents: budgets must be >= 2 distinct finite FLOP counts > 0 (a "
                       f"pair is a range); got {budgets}")

    def slopes(p):
      n_opt, d_opt = (_compute_optimal(p, c) if flops_per_token is None else
                      _numeric_optimum(p, c, flops_per_token))
      return (float(np.polyfit(np.log(c), np.log(n_opt), 1)[0]),
              float(np.polyfit(np.log(c), np.log(d_opt), 1)[0]))

    value = slopes(self.params)
    sampled = []
    for p in draws:
      try:
        sampled.append(slopes(p))
      except ValueError:                 # a draw with no interior optimum: no slope
        sampled.append((np.nan, np.nan))
    sampled = np.array(sampled).reshape(-1, 2)
    return {key: (value[i], stats.interval(sampled[:, i], self.level))
            for i, key in enumerate("ab")}

  def optimal_tokens(self, n_params: Any) -> Any:
    """The D for which N is compute-optimal (N = N_opt(6 N D), the C = 6 N D closed form):
    D = (N / G)^((alpha + beta) / beta) / N."""
    p = self.params
    g = (p["alpha"] * p["A"] / (p["beta"] * p["B"])) ** (1.0 / (p["alpha"] + p["beta"]))
    n = np.asarray(n_params, np.float64)
    if np.any(n <= 0):
      raise ValueError(f"optimal_tokens: n_params must be > 0; got {n_params}")
    return (n / g) ** ((p["alpha"] + p["beta"]) / p["beta"]) / n


def _parametric(params: Mapping[str, float], n: np.ndarray, d: np.ndarray) -> np.ndarray:
  return params["E"] + params["A"] / n ** params["alpha"] + params["B"] / d ** params["beta"]


def _budgets(flops: Any) -> np.ndarray:
  c = np.asarray(flops, np.float64)
  if np.any(~np.isfinite(c)) or np.any(c <= 0):
    raise ValueError(f"compute_optimal: flops must be finite and > 0; got {flops}")
  return c


def _compute_optimal(params: Mapping[str, float], flops: Any) -> tuple[Any, Any]:
  c = _budgets(flops)
  alpha, beta = params["alpha"], params["beta"]
  g = (alpha * params["A"] / (beta * params["B"])) ** (1.0 / (alpha + beta))
  n_opt = g * (c / 6.0) ** (beta / (alpha + beta))
  d_opt = (c / 6.0) ** (alpha / (alpha + beta)) / g
  if n_opt.ndim == 0:
    return float(n_opt), float(d_opt)
  return n_opt, d_opt


def _per_token(flops_per_token: Callable, n: np.ndarray) -> np.ndarray:
  """flops_per_token(n) checked: finite, > 0, one value per N."""
  fpt = np.asarray(flops_per_token(n), np.float64)
  if fpt.shape != n.shape or np.any(~np.isfinite(fpt)) or np.any(fpt <= 0):
    bad = fpt if fpt.shape != n.shape else fpt[~(np.isfinite(fpt) & (fpt > 0))][:3]
    raise ValueError(f"compute_optimal: flops_per_token(N) must return one finite value > 0 "
                     f"per N (vectorised over N, shape {n.shape}); got {bad!r}: build it "
                     "with family_flops_per_token(params, flops_per_token)")
  return fpt


_GOLDEN = (np.sqrt(5.0) - 1) / 2
_SPAN, _STEP = 15.0, 0.1         # the numeric optimum's grid: +-15 e-folds, 0.1 apart


def _numeric_optimum(params: Mapping[str, float], flops: Any,
                     flops_per_token: Callable) -> tuple[Any, Any]:
  """N_opt minimising L(N, C / fpt(N)) per budget (see `ParametricFit.compute_optimal`):
  a grid in log N around the C = 6 N D closed form, then golden-section search, vectorised
  over budgets (a bounded 1-D search, robust to a loss that is not unimodal on the grid)."""
  c = _budgets(flops)
  if not (params["alpha"] > 0 and params["beta"] > 0):
    raise ValueError(f"compute_optimal: alpha = {params['alpha']:.3g} and beta = "
                     f"{params['beta']:.3g} must be > 0 for an optimum to exist")
  flat = c.ravel()
  log_c = np.log(flat)[:, None]
  centre = np.log(np.atleast_1d(_compute_optimal(params, flat)[0]))[:, None]
  e, a, b, alpha, beta = (params[k] for k in ("E", "A", "B", "alpha", "beta"))

  def loss(u):                                   # u = log N, [K, m]
    n = np.exp(u)
    log_d = log_c - np.log(_per_token(flops_per_token, n))
    return e + a * np.exp(-alpha * u) + b * np.exp(-beta * log_d)

  offsets = np.arange(-_SPAN, _SPAN + _STEP / 2, _STEP)
  grid = centre + offsets[None]
  best = np.argmin(loss(grid), axis=1)
  edge = (best == 0) | (best == offsets.size - 1)
  if np.any(edge):
    raise ValueError(f"compute_optimal: the loss along the budget {flat[edge][0]:.3g} keeps "
                     f"falling {_SPAN:g} e-folds from the C = 6 N D optimum: flops_per_token "
                     "makes the optimum run off; check that it returns FLOPs per token "
                     "(about 6 N), not per step or per sequence")
  rows = np.arange(flat.size)
  lo, hi = grid[rows, best - 1][:, None], grid[rows, best + 1][:, None]
  x1, x2 = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
  f1, f2 = loss(x1), loss(x2)
  for _ in range(70):                            # 0.2 * 0.618^70 < 1e-15
    left = f1 <= f2                              # the minimum is in [lo, x2]
    hi, lo = np.where(left, x2, hi), np.where(left, lo, x1)
    new = np.where(left, hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo))
    f_new = loss(new)
    x1, x2, f1, f2 = (np.where(left, new, x2), np.where(left, x1, new),
                      np.where(left, f_new, f2), np.where(left, f1, f_new))
  u = np.where(f1 <= f2, x1, x2)[:, 0]
  n_opt = np.exp(u)
  d_opt = flat / _per_token(flops_per_token, n_opt)
  if c.ndim == 0:
    return float(n_opt[0]), float(d_opt[0])
  return n_opt.reshape(c.shape), d_opt.reshape(c.shape)


def family_flops_per_token(params: Any, flops_per_token: Any
                           ) -> Callable[[np.ndarray], np.ndarray]:
  """N -> training FLOPs per token for a model family, from its members' (N, exact FLOPs per
  token) pairs (e.g. `scaling.flops_per_token(model, seq, method="hoffmann")` of each size):
  log(fpt / N) interpolated linearly in log N, and extrapolated linearly beyond the smallest
  and largest member (the ratio to 6N falls smoothly with size: vocabulary and attention
  terms). For `ParametricFit.compute_optimal(C, flops_per_token=...)` and `exponents`.
  `params` must be sorted, increasing, > 0; at least 2 members."""
  what = "family_flops_per_token"
  n, fpt = stats.as_points(what, 2, ("params", "flops_per_token"), params=params,
                           flops_per_token=flops_per_token)
  step = np.diff(n)
  if np.any(step <= 0):
    i = int(np.flatnonzero(step <= 0)[0]) + 1
    raise ValueError(f"{what}: params must be strictly increasing; params[{i}] = {n[i]:.6g} "
                     f"follows params[{i - 1}] = {n[i - 1]:.6g}: sort the family by size and "
                     "drop repeated sizes")
  log_n, log_r = np.log(n), np.log(fpt / n)
  low = (log_r[1] - log_r[0]) / (log_n[1] - log_n[0])
  high = (log_r[-1] - log_r[-2]) / (log_n[-1] - log_n[-2])

  def per_token(size: Any) -> np.ndarray:
    size = np.asarray(size, np.float64)
    if np.any(~(size > 0)):
      raise ValueError(f"flops_per_token: N must be > 0; got {size}")
    x = np.log(size)
    r = np.interp(x, log_n, log_r)
    r = np.where(x < log_n[0], log_r[0] + low * (x - log_n[0]), r)
    r = np.where(x > log_n[-1], log_r[-1] + high * (x - log_n[-1]), r)
    return size * np.exp(r)

  return per_token


HOFFMANN_2022 = ParametricFit(
    law="L = E + A / N^alpha + B / D^beta",
    params={"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}, samples={},
    n_points=0, rms_residual=float("nan"),
    method="published (Hoffmann et al. 2022, eq. 10); no intervals", predict_fn=_parametric)


# Besiroglu, Erdil, Barnett & You 2024, "Chinchilla Scaling: A replication attempt" (arXiv
# 2404.10102), their refit of approach 3, to three figures: E = 1.82, A = 482, B = 2085,
# alpha = 0.348, beta = 0.366. Why the laws differ: the paper's eq. 10 gives its coefficients rounded, and
# with them the compute-optimal ratio at Chinchilla's own budget (5.76e23 FLOPs) is ~93
# tokens per parameter and grows with compute, against the ~20 of the paper's approaches 1-2
# and its Table 3; the replication found the published fit inconsistent with the paper's own
# points (and its intervals implausibly narrow), and its refit gives ~20 tokens per parameter
# and N_opt within 0.9-1.2x of Table 3 (tests/unit/scaling/test_scaling_fits.py checks both).
BESIROGLU_2024 = ParametricFit(
    law="L = E + A / N^alpha + B / D^beta",
    params={"E": 1.82, "A": 482.0, "B": 2085.0, "alpha": 0.348, "beta": 0.366},
    samples={}, n_points=0, rms_residual=float("nan"),
    method="published (Besiroglu et al. 2024, arXiv 2404.10102, refit of Hoffmann et al.'s "
           "approach 3); no intervals", predict_fn=_parametric)


def chinchilla_tokens(n_params: Any, tokens_per_param: float = 20.0) -> Any:
  """Compute-optimal tokens by Hoffmann et al.'s rule of thumb D = 20 N."""
  if np.any(np.asarray(n_params) <= 0) or tokens_per_param <= 0:
    raise ValueError(f"chinchilla_tokens: n_params ({n_params}) and tokens_per_param "
                     f"({tokens_per_param}) must be > 0")
  return tokens_per_param * np.asarray(n_params, np.float64)


def paper_grid() -> np.ndarray:
  """The 4500 starting points [a, b, e, alpha, beta] of Hoffmann et al. appendix D.2."""
  return np.array(list(itertools.product(*(PAPER_GRID[k] for k in _ORDER))), np.float64)


def _huber_objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray,
                     log_l: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
  """Sum over runs of Huber(LSE(a - alpha log N, b - beta log D, e) - log L) and its
  gradient, for a batch of parameter vectors theta [S, 5] (a, b, e, alpha, beta)."""
  a, b, e, alpha, beta = (theta[:, i:i + 1] for i in range(5))
  t1 = a - alpha * log_n
  t2 = b - beta * log_d
  t3 = np.broadcast_to(e, t1.shape)
  top = np.maximum(np.maximum(t1, t2), t3)
  w1, w2, w3 = np.exp(t1 - top), np.exp(t2 - top), np.exp(t3 - top)
  total = w1 + w2 + w3
  r = top + np.log(total) - log_l
  abs_r = np.abs(r)
  f = np.where(abs_r <= delta, 0.5 * r * r, delta * (abs_r - 0.5 * delta)).sum(axis=1)
  dr = np.clip(r, -delta, delta) / total
  g1, g2, g3 = dr * w1, dr * w2, dr * w3
  grad = np.stack([g1.sum(1), g2.sum(1), g3.sum(1), -(g1 * log_n).sum(1),
                   -(g2 * log_d).sum(1)], axis=1)
  return f, grad


def batched_lbfgs(fun, x0: np.ndarray, *, history: int = 10, max_iter: int = 300,
                  gtol: float = 1e-10, ftol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
  """L-BFGS (two-loop recursion, Armijo backtracking) run independently from each row of
  x0 [S, P] at once: `fun(x [k, P]) -> (f [k], grad [k, P])`. Returns (x, f) per start.
  Vectorising over starts makes the paper's 4500-start grid take seconds, not minutes.
  A start stops when its gradient is below `gtol`, its objective falls by less than `ftol`
  (relative) in a step, or after `max_iter` steps; `fit_parametric` polishes the best one
  with SciPy's L-BFGS-B, so loose stopping only costs starts that are not the best."""
  x = np.array(x0, np.float64)
  f, g = fun(x)
  starts, dim = x.shape
  s_hist = np.zeros((history, starts, dim))
  y_hist = np.zeros((history, starts, dim))
  rho = np.zeros((history, starts))            # 0: no pair stored in this slot (skipped)
  gamma = np.ones(starts)
  active = np.isfinite(f)
  slot = 0
  for it in range(max_iter):
    idx = np.flatnonzero(active)
    if idx.size == 0:
      break
    q = g[idx].copy()
    coeffs = []
    order = [(slot - 1 - j) % history for j in range(history)]        # newest first
    for j in order:
      c = rho[j, idx] * np.einsum("sp,sp->s", s_hist[j, idx], q)
      q -= c[:, None] * y_hist[j, idx]
      coeffs.append(c)
    r = gamma[idx, None] * q
    for j, c in zip(reversed(order), reversed(coeffs)):
      beta = rho[j, idx] * np.einsum("sp,sp->s", y_hist[j, idx], r)
      r += s_hist[j, idx] * (c - beta)[:, None]
    p = -r
    slope = np.einsum("sp,sp->s", g[idx], p)
    bad = ~(slope < 0) | ~np.isfinite(slope)
    p[bad] = -g[idx][bad]
    slope[bad] = -np.einsum("sp,sp->s", g[idx][bad], g[idx][bad])
    step = np.ones(idx.size)
    if it == 0:
      step = np.minimum(1.0, 1.0 / np.maximum(np.abs(g[idx]).sum(1), 1e-300))
    x_new, f_new, g_new = x[idx].copy(), f[idx].copy(), g[idx].copy()
    pending = np.ones(idx.size, bool)
    for _ in range(60):
      k = np.flatnonzero(pending)
      if k.size == 0:
        break
      trial = x[idx[k]] + step[k, None] * p[k]
      ft, gt = fun(trial)
      ok = np.isfinite(ft) & (ft <= f[idx[k]] + 1e-4 * step[k] * slope[k])
      acc = k[ok]
      x_new[acc], f_new[acc], g_new[acc] = trial[ok], ft[ok], gt[ok]
      pending[acc] = False
      step[k[~ok]] *= 0.5
    moved = ~pending
    s = x_new - x[idx]
    y = g_new - g[idx]
    sy = np.einsum("sp,sp->s", s, y)
    keep = moved & (sy > 1e-16 * np.maximum(np.einsum("sp,sp->s", y, y), 1e-300))
    rho[slot, idx] = np.where(keep, 1.0 / np.where(keep, sy, 1.0), 0.0)
    s_hist[slot, idx] = np.where(keep[:, None], s, 0.0)
    y_hist[slot, idx] = np.where(keep[:, None], y, 0.0)
    gamma[idx] = np.where(keep, sy / np.maximum(np.einsum("sp,sp->s", y, y), 1e-300),
                          gamma[idx])
    slot = (slot + 1) % history
    decrease = f[idx] - f_new
    x[idx], f[idx], g[idx] = x_new, f_new, g_new
    done = (~moved | (np.abs(g_new).max(1) < gtol) |
            (decrease <= ftol * np.maximum(np.maximum(np.abs(f_new), np.abs(f[idx])), 1e-300)))
    active[idx[done]] = False
  return x, f


def _theta_to_params(theta: np.ndarray) -> dict[str, float]:
  a, b, e, alpha, beta = (float(v) for v in theta)
  return {"E": float(np.exp(e)), "A": float(np.exp(a)), "B": float(np.exp(b)),
          "alpha": alpha, "beta": beta}


def _minimise(starts: np.ndarray, log_n, log_d, log_l, delta) -> tuple[np.ndarray, np.ndarray]:
  """Local minima from every start (batched L-BFGS), best first, the best one polished by
  SciPy's L-BFGS-B. Returns (thetas sorted by objective, objectives)."""
  from scipy import optimize        # here, not at import: training imports scaling (~0.4 s)
  fun = lambda th: _huber_objective(th, log_n, log_d, log_l, delta)  # noqa: E731
  with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
    x, f = batched_lbfgs(fun, starts)
    f = np.where(np.isfinite(f), f, np.inf)
    order = np.argsort(f)
    x, f = x[order], f[order]
    polished = optimize.minimize(lambda th: tuple(v[0] for v in fun(th[None])), x[0],
                                 jac=True, method="L-BFGS-B",
                                 options=dict(maxiter=10000, ftol=1e-15, gtol=1e-12))
  if np.isfinite(polished.fun) and polished.fun <= f[0]:
    x[0], f[0] = polished.x, polished.fun
  if not np.isfinite(f[0]):
    raise RuntimeError("fit_parametric: no starting point reached a finite objective")
  return x, f


def _distinct(thetas: np.ndarray, count: int) -> np.ndarray:
  """The first `count` rows of `thetas` (sorted best first) that are distinct local minima
  (differ by > 1e-3 in some coordinate): many grid starts end in the same basin."""
  kept = []
  for theta in thetas:
    if all(np.abs(theta - k).max() > 1e-3 for k in kept):
      kept.append(theta)
      if len(kept) == count:
        break
  return np.array(kept)


def fit_parametric(n: Any, d: Any, loss: Any, *, huber_delta: float = 1e-3,
                   samples: int = DEFAULT_SAMPLES, seed: int = 0,
                   starts: np.ndarray | None = None,
                   bootstrap_starts: int = 8, drop_highest: int = 0, groups: Any = None,
                   max_failure: float = stats.MAX_FAILURE) -> ParametricFit:
  """Chinchilla approach 3: L(N, D) = E + A / N^alpha + B / D^beta fitted as Hoffmann et al.
  (appendix D.2) do: minimise sum_i Huber_delta(LSE(a - alpha log N_i, b - beta log D_i, e)
  - log L_i) over (a, b, e, alpha, beta) by L-BFGS from each point of `starts` (default the
  paper's 4500-point grid, `paper_grid()`), keep the lowest objective; A, B, E = exp(a, b, e).

  N: parameters, D: training tokens, L: final loss of each run (nats/token). Intervals: the
  fit is repeated on `samples` bootstrap resamples of the runs, each from the full fit's
  `bootstrap_starts` best distinct local minima (the paper's whole grid per resample would cost
  4500 x samples L-BFGS runs). Default cost: ~10 s for the grid on a laptop core plus ~0.3 s
  a resample.

  Refused (ValueError) before fitting, as they leave parameters undetermined (the fit then
  returned arbitrary exponents with confident intervals): fewer than 3 distinct N or D (E
  absorbs the level, so 2 sizes leave one loss difference for A and alpha), fewer than 6
  distinct (N, D) pairs, runs on one line in (log N, log D), a constant loss, a loss that
  falls with neither N nor D. Findings (and no interval: `unidentified`): an exponent <= 0.01,
  a term below 1e-4 of the loss at all but one N or D (its exponent and scale drift), E below
  1e-4 of the loss (at its bound 0).

  `drop_highest=k` leaves out the k runs with the highest loss before fitting, as Besiroglu et
  al. 2024 did with the paper's points (the smallest, least converged runs); off by default,
  and stated in the fit's `method` and findings when used.

  `groups`: one run id per point, to resample whole runs where points share one (WSD
  cooldown branches of one trunk, several evaluations of a run); `max_failure`: the share of
  resamples that may fail before it is a `stats.BootstrapError` (default 0.1).
  """
  what = "fit_parametric"
  n, d, loss = stats.as_points(what, 6, ("n", "d", "loss"), n=n, d=d, loss=loss)
  groups = stats.as_groups(what, groups, n.size)
  dropped = None
  if drop_highest:
    if not isinstance(drop_highest, int) or not 0 < drop_highest <= n.size - 6:
      raise ValueError(f"fit_parametric: drop_highest={drop_highest!r} must be an int in "
                       f"[0, {n.size - 6}] (at least 6 runs must remain)")
    keep = np.sort(np.argsort(loss, kind="stable")[:n.size - drop_highest])
    dropped = np.sort(loss)[n.size - drop_highest:]
    n, d, loss = n[keep], d[keep], loss[keep]
    groups = None if groups is None else groups[keep]
  if not (np.isfinite(huber_delta) and huber_delta > 0):
    raise ValueError(f"fit_parametric: huber_delta={huber_delta} must be > 0 (the paper "
                     "uses 1e-3)")
  starts = paper_grid() if starts is None else np.atleast_2d(np.asarray(starts, np.float64))
  if starts.shape[1:] != (5,):
    raise ValueError(f"fit_parametric: starts must be [k, 5] rows (a, b, e, alpha, beta); "
                     f"got shape {starts.shape}")

  def check(n, d):
    for name, values, terms in (("n", n, "A and alpha"), ("d", d, "B and beta")):
      stats.require_distinct(what, name, values, 3,
                             why=f"with 2, E takes the level and one loss difference is left "
                                 f"for both {terms}, which are then not identified")
    stats.require_design(what, n, d, 5)

  check(n, d)
  stats.require_falling_in_n_or_d(what, loss, n, d)
  log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)
  thetas, objective = _minimise(starts, log_n[None], log_d[None], log_l[None], huber_delta)
  params = _theta_to_params(thetas[0])
  local = _distinct(thetas[np.isfinite(objective)], bootstrap_starts)

  def fit_once(n, d, loss):
    check(n, d)
    th, _ = _minimise(local, np.log(n)[None], np.log(d)[None], np.log(loss)[None],
                      huber_delta)
    return _theta_to_params(th[0])

  boot = stats.bootstrap(fit_once, (n, d, loss), samples=samples, seed=seed, groups=groups,
                         max_failure=max_failure, what=what)
  findings, unidentified = _parametric_findings(params, boot.draws, n, d)
  if dropped is not None:
    findings = [f"the {drop_highest} highest-loss runs were left out (losses "
                f"{', '.join(f'{x:.4g}' for x in dropped)}): drop_highest={drop_highest}",
                *findings]
  with np.errstate(over="ignore"):
    resid = np.log(_parametric(params, n, d)) - log_l
  return ParametricFit(
      law="L = E + A / N^alpha + B / D^beta", params=params,
      n_points=n.size, rms_residual=float(np.sqrt(np.mean(resid ** 2))),
      method=f"Huber (delta={huber_delta:g}) on log L, log-sum-exp form, L-BFGS from "
             f"{len(starts)} starts (bootstrap: {len(local)} starts)"
             + (f"; the {drop_highest} highest-loss runs left out" if drop_highest else "")
             + boot.method(),
      findings=(*findings, *boot.findings()), predict_fn=_parametric,
      extra={"objective": float(objective[0])}, unidentified=tuple(unidentified),
      **boot.fields())


def _parametric_findings(params: dict, draws: dict, n: np.ndarray,
                         d: np.ndarray) -> tuple[list[str], list[str]]:
  """(findings, unidentified parameters) of an approach-3 fit. Its parameters are unbounded
  (exponents, logs of A, B, E), so a degenerate fit does not stop at a bound: it drifts, to
  an exponent near 0 (the term is a constant, E absorbs it), a term too small to matter
  (alpha = 48 on a loss flat in N), or E -> 0 (no irreducible loss visible)."""
  findings, unidentified = [], []

  def lose(*keys):
    unidentified.extend(k for k in keys if k not in unidentified)

  for key, scale, axis in (("alpha", "A", "N"), ("beta", "B", "D")):
    if params[key] <= 0.01:
      findings.append(f"{key} = {params[key]:.3g}: the loss does not fall with {axis} over "
                      "these runs, so the law cannot place the optimum; vary that axis more "
                      f"({key}, {scale} and E are not measured)")
      lose(key, scale, "E")
  with np.errstate(over="ignore"):     # a drifted exponent (alpha = 48): N^alpha = inf
    total = _parametric(params, n, d)
    terms = {"alpha": params["A"] / n ** params["alpha"],
             "beta": params["B"] / d ** params["beta"]}
  for key, scale, axis, x in (("alpha", "A", "N", n), ("beta", "B", "D", d)):
    seen = stats.visible_at(terms[key], total, x)
    if seen < 2:
      findings.append(f"{scale} / {axis}^{key} is below 1e-4 of the loss at "
                      f"{'every' if seen == 0 else 'all but one'} {axis} ({key} = "
                      f"{params[key]:.3g}, {scale} = {params[scale]:.3g}): the loss does not "
                      f"change with {axis} as a power law over these runs, so {scale} and "
                      f"{key} are not measured")
      lose(key, scale)
  floor = 1e-4 * float(total.min())
  low = stats.interval(draws.get("E", ()))[0]
  if params["E"] < floor:
    findings.append(f"E = {params['E']:.3g} is at its lower bound 0: no irreducible loss is "
                    "visible over these runs (the law reduces to power laws in N and D), so "
                    "E is not measured")
    lose("E")
  elif np.isfinite(low) and low < floor:
    findings.append(f"E = {params['E']:.4g}, but its 95% interval reaches 0 ({low:.3g}), so "
                    "these runs do not pin E down: no irreducible loss need be visible")
  return findings, unidentified


# ------------------------------------------------------------------ approaches 1 and 2


@dataclasses.dataclass(frozen=True)
class OptimumFit(stats.Fit):
  """N_opt = k_N C^a and D_opt = k_D C^b (`params` a, k_N, b, k_D); `extra['points']` are the
  (C, N_opt, D_opt) the power laws were fitted to."""

  def compute_optimal(self, flops: Any) -> tuple[Any, Any]:
    c = np.asarray(flops, np.float64)
    if np.any(~np.isfinite(c)) or np.any(c <= 0):
      raise ValueError(f"compute_optimal: flops must be finite and > 0; got {flops}")
    p = self.params
    n_opt, d_opt = p["k_N"] * c ** p["a"], p["k_D"] * c ** p["b"]
    if n_opt.ndim == 0:
      return float(n_opt), float(d_opt)
    return n_opt, d_opt


def _optimum_power(c: np.ndarray, n_opt: np.ndarray, d_opt: np.ndarray) -> dict[str, float]:
  a, log_kn = np.polyfit(np.log(c), np.log(n_opt), 1)
  b, log_kd = np.polyfit(np.log(c), np.log(d_opt), 1)
  return {"a": float(a), "k_N": float(np.exp(log_kn)), "b": float(b),
          "k_D": float(np.exp(log_kd))}


def _optimum_law(params, c):
  return params["k_N"] * c ** params["a"]


def _parabola_vertex(x: np.ndarray, loss: np.ndarray, what: str) -> tuple[float, float]:
  """(x at the minimum, loss there) of the least-squares parabola of loss in x."""
  c2, c1, c0 = np.polyfit(x, loss, 2)
  if not c2 > 0:
    raise ValueError(f"{what}: the parabola through the IsoFLOP points opens downwards (no "
                     "minimum): the sizes do not bracket the optimum; add sizes beyond the "
                     "lowest-loss one")
  x_min = -c1 / (2 * c2)
  return float(x_min), float(c0 - c1 * c1 / (4 * c2))


def _budget_optima(n, d, loss, budget) -> tuple[np.ndarray, ...]:
  out = []
  for c in np.unique(budget):
    sel = budget == c
    what = f"isoflop_optimum (budget {c:.3g})"
    stats.require_distinct(what, "n", n[sel], 3)
    stats.require_distinct(what, "d", d[sel], 3, why="the parabola in log d has 3 coefficients")
    if np.ptp(loss[sel]) <= 1e-9 * np.abs(loss[sel]).max():
      raise ValueError(f"{what}: the loss is {loss[sel][0]:.6g} at every size, so the IsoFLOP "
                       "curve has no minimum; check that each run logged its own loss")
    log_n_opt, loss_min = _parabola_vertex(np.log(n[sel]), loss[sel], what)
    log_d_opt, _ = _parabola_vertex(np.log(d[sel]), loss[sel], what)
    out.append((c, np.exp(log_n_opt), np.exp(log_d_opt), loss_min))
  return tuple(np.array(v) for v in zip(*out))


def isoflop_optimum(n: Any, d: Any, loss: Any, budget: Any, *,
                    samples: int = 1000, seed: int = 0, groups: Any = None,
                    max_failure: float = stats.MAX_FAILURE) -> OptimumFit:
  """Chinchilla approach 2. `budget[i]` is the FLOP budget run i belongs to (its IsoFLOP
  curve). Per budget: least-squares parabolas of loss in log N and in log D; their vertices
  are N_opt(C) and D_opt(C) (D from its own parabola, so no FLOP convention is assumed).
  Then log N_opt and log D_opt are fitted as lines in log C. Intervals: runs resampled
  within their budget. Needs >= 2 budgets with >= 3 distinct sizes (and token counts) each
  and a loss that varies within each budget; >= 5 sizes advised (3 are a finding: the
  parabola passes through them, and resamples repeat sizes).

  `groups` (one run id per point) resamples whole runs: within each budget when every run
  lies in one budget (replicate evaluations or seeds of a size), so each budget keeps its
  number of runs; across budgets when a run has points at several (cooldown branches of one
  WSD trunk, one per budget): a resample then draws whole trunks, and a budget it leaves with
  fewer than 3 sizes, or without a minimum among the sizes drawn, drops out of that
  resample's lines (>= 3 budgets must remain, else the resample fails: an estimator that uses
  the budgets it can, which widens the interval rather than select resamples). The `method`
  says which. `max_failure`: the share of
  resamples that may fail (`stats.BootstrapError`)."""
  n, d, loss, budget = stats.as_points("isoflop_optimum", 6, ("n", "d", "loss", "budget"),
                                       n=n, d=d, loss=loss, budget=budget)
  groups = stats.as_groups("isoflop_optimum", groups, n.size)
  if np.unique(budget).size < 2:
    raise ValueError("isoflop_optimum needs runs at >= 2 FLOP budgets to fit how the "
                     f"optimum moves with compute; got one budget ({budget[0]:.3g}): add "
                     "budgets (>= 3 spanning >= 10x)")
  c, n_opt, d_opt, loss_min = _budget_optima(n, d, loss, budget)
  params = _optimum_power(c, n_opt, d_opt)

  budgets = np.unique(budget)
  across = groups is not None and any(np.unique(budget[groups == g]).size > 1
                                      for g in np.unique(groups))

  def fit_once(n, d, loss, budget):
    if across:      # whole trunks: a budget this resample cannot fit drops out of it
      usable = []
      for c in budgets:
        sel = budget == c
        try:
          _budget_optima(n[sel], d[sel], loss[sel], budget[sel])
          usable.append(c)
        except ValueError:          # < 3 sizes left, or no minimum among those drawn
          continue
      if len(usable) < min(3, budgets.size):
        raise ValueError(f"isoflop_optimum: the resample leaves {len(usable)} budgets with "
                         ">= 3 sizes and a minimum")
      keep = np.isin(budget, usable)
      n, d, loss, budget = n[keep], d[keep], loss[keep], budget[keep]
    missing = np.setdiff1d(budgets, budget)
    if missing.size and not across:
      raise ValueError(f"isoflop_optimum: the resample drew no run at budget {missing[0]:.3g}")
    return _optimum_power(*_budget_optima(n, d, loss, budget)[:3])
  boot = stats.bootstrap(fit_once, (n, d, loss, budget), samples=samples, seed=seed,
                         groups=groups, strata=None if across else budget,
                         max_failure=max_failure, what="isoflop_optimum")
  findings = []
  exact = [f"{ci:.3g}" for ci in c if np.unique(n[budget == ci]).size == 3]
  if exact:
    findings.append(f"budget {', '.join(exact)}: 3 sizes, so the parabola (3 coefficients) "
                    "passes through them: no check of its shape; train >= 5 sizes a budget")
  for ci, no in zip(c, n_opt):
    sel = budget == ci
    if not n[sel].min() <= no <= n[sel].max():
      findings.append(f"budget {ci:.3g}: the optimum N={no:.3g} lies outside the sizes "
                      f"trained ({n[sel].min():.3g} .. {n[sel].max():.3g}); it is an "
                      "extrapolation of the parabola: add sizes on that side")
  if c.size == 2:
    findings.append("two budgets: the exponents are a line through two points (no check "
                    "of the power law); add budgets")
  if np.all(loss_min > 0) and stats.log_slopes(loss_min, c)[0] >= 0:
    findings.append("the minimum loss does not fall with compute (" + ", ".join(
        f"{ci:.3g}: {li:.4g}" for ci, li in zip(c, loss_min)) + "): the budgets' runs do not "
        "look comparable (data, LR, schedule?), so how the optimum moves with C is suspect")
  findings += boot.findings()
  return OptimumFit(
      law="N_opt = k_N C^a, D_opt = k_D C^b", params=params,
      n_points=n.size, **boot.fields(),
      rms_residual=float(np.sqrt(np.mean((np.log(_optimum_law(params, c)) -
                                          np.log(n_opt)) ** 2))),
      method="approach 2: parabola in log N (and log D) per budget, lines in log C"
             + boot.method() + ((", runs across budgets (a budget a resample cannot fit drops out of it)"
                                 if across else ", within budgets")
                                if samples else ""),
      findings=tuple(findings), predict_fn=_optimum_law,
      extra={"points": {"flops": c.tolist(), "n_opt": n_opt.tolist(),
                        "d_opt": d_opt.tolist(), "loss_min": loss_min.tolist()},
             "residual_points": c.size, "residual_parameters": 2})


@dataclasses.dataclass(frozen=True)
class Curve:
  """One run's loss curve: `params` N, `tokens` D seen at each record, `loss` there, and
  `flops_per_token` (default 6 N: C = 6 N D)."""
  params: float
  tokens: np.ndarray
  loss: np.ndarray
  flops_per_token: float | None = None

  @property
  def flops(self) -> np.ndarray:
    return np.asarray(self.tokens, np.float64) * (self.flops_per_token or 6.0 * self.params)


def _smooth(loss: np.ndarray, window: int) -> np.ndarray:
  if window <= 1 or loss.size < window:
    return loss
  kernel = np.ones(window) / window
  padded = np.concatenate([np.full(window // 2, loss[0]), loss,
                           np.full(window - 1 - window // 2, loss[-1])])
  return np.convolve(padded, kernel, mode="valid")


def _envelope(curves: Sequence[Curve], grid_points: int, window: int):
  finals = np.array([c.flops[-1] for c in curves])
  grid = np.geomspace(finals.min(), finals.max(), grid_points)
  best = np.full(grid.size, np.inf)
  owner = np.full(grid.size, -1)
  for i, curve in enumerate(curves):
    log_c = np.log(curve.flops)
    loss = _smooth(np.asarray(curve.loss, np.float64), window)
    inside = (np.log(grid) >= log_c[0]) & (np.log(grid) <= log_c[-1])
    value = np.interp(np.log(grid[inside]), log_c, loss)
    better = value < best[inside]
    where = np.flatnonzero(inside)[better]
    best[where], owner[where] = value[better], i
  keep = owner >= 0
  grid, owner, best = grid[keep], owner[keep], best[keep]
  n_opt = np.array([curves[i].params for i in owner], np.float64)
  d_opt = grid / np.array([curves[i].flops[-1] / curves[i].tokens[-1] for i in owner])
  return grid, n_opt, d_opt, best


def envelope_optimum(curves: Sequence[Curve | Mapping[str, Any]], *, grid_points: int = 1500,
                     window: int = 5, samples: int = 1000, seed: int = 0, groups: Any = None,
                     max_failure: float = stats.MAX_FAILURE) -> OptimumFit:
  """Chinchilla approach 1: the lower envelope of (smoothed, `window`-record moving average)
  loss vs compute over every run's curve, at `grid_points` log-spaced compute values between
  the smallest and the largest final compute of the runs; the run on the envelope at C gives
  N_opt(C) and D_opt(C) = its tokens at C. Then lines in log C. Intervals: runs resampled.

  Caveat (Hoffmann et al. vary the cosine length for this reason): a point in the middle of a
  run is not trained with a schedule that ends there, so it overstates the loss of a run of
  that length; with one cosine length per run the envelope favours runs that finish near C.
  Needs >= 3 runs whose envelope holds >= 2 distinct sizes.

  The bootstrap resamples curves, each a run already; `groups` (one id per curve) resamples
  curves that share a run together (the cooldown branches of one WSD trunk). `max_failure`:
  the share of resamples that may fail (`stats.BootstrapError`)."""
  curves = [c if isinstance(c, Curve) else Curve(**c) for c in curves]
  if len(curves) < 3:
    raise ValueError(f"envelope_optimum needs >= 3 runs' loss curves; got {len(curves)}")
  for i, c in enumerate(curves):
    tokens, loss = stats.as_points(f"envelope_optimum (curve {i})", 2, ("tokens", "loss"),
                                   tokens=c.tokens, loss=c.loss)
    if not c.params > 0 or np.any(np.diff(tokens) <= 0):
      raise ValueError(f"envelope_optimum: curve {i} needs params > 0 and increasing tokens")
  if grid_points < 10:
    raise ValueError(f"envelope_optimum: grid_points={grid_points} must be >= 10")
  groups = stats.as_groups("envelope_optimum", groups, len(curves))
  stats.require_varying("envelope_optimum", "loss", np.concatenate(
      [np.asarray(c.loss, np.float64) for c in curves]), "compute")
  owner_sizes = np.array([c.params for c in curves])

  def fit_once(idx):
    chosen = [curves[int(i)] for i in idx]
    c, n_opt, d_opt, _ = _envelope(chosen, grid_points, window)
    if np.unique(n_opt).size < 2:
      raise ValueError("envelope_optimum: one model size holds the whole envelope, so the "
                       "runs show no compute-optimal trade-off: add sizes around the optimum")
    return _optimum_power(c, n_opt, d_opt)

  index = np.arange(len(curves), dtype=np.float64)
  params = fit_once(index)
  boot = stats.bootstrap(fit_once, (index,), samples=samples, seed=seed, groups=groups,
                         max_failure=max_failure, what="envelope_optimum")
  c, n_opt, d_opt, best = _envelope(curves, grid_points, window)
  held = sorted(set(n_opt.tolist()))
  return OptimumFit(
      law="N_opt = k_N C^a, D_opt = k_D C^b", params=params,
      n_points=len(curves), **boot.fields(),
      rms_residual=float(np.sqrt(np.mean((np.log(_optimum_law(params, c)) -
                                          np.log(n_opt)) ** 2))),
      method=f"approach 1: envelope of {window}-point smoothed loss curves at {grid_points} "
             "compute values, lines in log C" + boot.method(),
      findings=(f"{len(held)} of {np.unique(owner_sizes).size} model sizes hold the "
                "envelope", *boot.findings()), predict_fn=_optimum_law,
      extra={"points": {"flops": c.tolist(), "n_opt": n_opt.tolist(),
                        "d_opt": d_opt.tolist(), "loss": best.tolist()},
             "residual_points": c.size, "residual_parameters": 2})
