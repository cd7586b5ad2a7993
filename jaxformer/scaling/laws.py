"""Power laws of loss in model size, data and compute (NumPy + SciPy, no JAX), each with
bootstrap confidence intervals (`stats.Fit`).

- `fit_kaplan_n(n, loss)`: L(N) = (N_c / N)^alpha_N   (Kaplan et al. 2020, eq. 1.1)
- `fit_kaplan_d(d, loss)`: L(D) = (D_c / D)^alpha_D   (eq. 1.2)
- `fit_kaplan_joint(n, d, loss)`:
      L(N, D) = [(N_c / N)^(alpha_N / alpha_D) + D_c / D]^alpha_D   (eq. 1.5)
- `fit_saturating(x, loss)`: L = E + (X_c / X)^alpha (an irreducible loss E >= 0)
- `fit_zhai(compute, error)`: E = a (C + d)^(-b) + c   (Zhai et al. 2022, "Scaling Vision
  Transformers", eq. 1: error vs compute, saturating at both ends)

Kaplan's laws are fitted in log-loss (least squares on log L), as a power law is a line
there; the laws with an additive constant are fitted by bounded least squares from a grid of
starting points, and a parameter that ends on its bound is reported in `fit.findings`: it
means the data do not determine it (e.g. no saturation visible), not that its value is known,
so it (and the parameters it frees) is listed in `fit.unidentified`, with no interval.

Inputs that cannot identify the law are refused before fitting (a ValueError naming the
argument): too few distinct sizes for the parameters, a loss that is constant or does not
fall, joint (N, D) runs on one line in log-log.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxformer.scaling import stats

DEFAULT_SAMPLES = 1000


def _power(params: dict, x: np.ndarray, name: str) -> np.ndarray:
  return (params[f"{name}_c"] / x) ** params[f"alpha_{name}"]


def _fit_power(x: np.ndarray, loss: np.ndarray, name: str) -> dict[str, float]:
  stats.require_falling(f"fit_kaplan_{name.lower()}", name, "loss", x, loss, 3)
  slope, intercept = np.polyfit(np.log(x), np.log(loss), 1)
  alpha = -slope
  with np.errstate(over="ignore"):
    x_c = np.exp(intercept / alpha)
  return {f"alpha_{name}": float(alpha), f"{name}_c": float(x_c)}


def _power_fit(x: Any, loss: Any, name: str, samples: int, seed: int, groups: Any,
               max_failure: float) -> stats.Fit:
  what = f"fit_kaplan_{name.lower()}"
  x, loss = stats.as_points(what, 3, (name, "loss"), **{name: x, "loss": loss})
  groups = stats.as_groups(what, groups, x.size)
  params = _fit_power(x, loss, name)
  boot = stats.bootstrap(lambda a, b: _fit_power(a, b, name), (x, loss), samples=samples,
                         seed=seed, groups=groups, max_failure=max_failure, what=what)
  findings, unidentified = [], []
  if not 0 < params[f"{name}_c"] < np.inf:
    findings.append(f"{name}_c = {params[f'{name}_c']:.3g}: alpha_{name} = "
                    f"{params[f'alpha_{name}']:.3g} is so small that L = 1 lies beyond any "
                    f"representable {name}; the loss barely falls, so {name}_c is not measured")
    unidentified.append(f"{name}_c")
  predict = lambda p, v: _power(p, v, name)  # noqa: E731
  return stats.Fit(law=f"L = ({name}_c / {name})^alpha_{name}", params=params,
                   n_points=x.size, rms_residual=_rms_log(predict(params, x), loss),
                   method="least squares on log L (a line in log-log)" + boot.method(),
                   findings=(*findings, *boot.findings()), predict_fn=predict,
                   unidentified=tuple(unidentified), **boot.fields())


def _rms_log(pred: np.ndarray, loss: np.ndarray) -> float:
  return float(np.sqrt(np.mean((np.log(pred) - np.log(loss)) ** 2)))


def fit_kaplan_n(n: Any, loss: Any, *, samples: int = DEFAULT_SAMPLES,
                 seed: int = 0, groups: Any = None,
                 max_failure: float = stats.MAX_FAILURE) -> stats.Fit:
  """L(N) = (N_c / N)^alpha_N (Kaplan et al. 2020 eq. 1.1; they find alpha_N = 0.076,
  N_c = 8.8e13 with N the non-embedding parameters of models trained to convergence).
  Needs >= 3 distinct N.
  `groups`: one run id per point, to resample whole runs (`stats.bootstrap`) where points
  share a run; `max_failure`: the share of resamples that may fail (`stats.BootstrapError`)."""
  return _power_fit(n, loss, "N", samples, seed, groups, max_failure)


def fit_kaplan_d(d: Any, loss: Any, *, samples: int = DEFAULT_SAMPLES,
                 seed: int = 0, groups: Any = None,
                 max_failure: float = stats.MAX_FAILURE) -> stats.Fit:
  """L(D) = (D_c / D)^alpha_D (Kaplan et al. 2020 eq. 1.2: alpha_D = 0.095, D_c = 5.4e13
  tokens, large models early-stopped). Needs >= 3 distinct D.
  `groups`: one run id per point, to resample whole runs (`stats.bootstrap`) where points
  share a run; `max_failure`: the share of resamples that may fail (`stats.BootstrapError`)."""
  return _power_fit(d, loss, "D", samples, seed, groups, max_failure)


def _least_squares(residual: Callable[[np.ndarray], np.ndarray], starts: Sequence[Sequence],
                   bounds: tuple[Sequence[float], Sequence[float]]) -> np.ndarray:
  """The best of `scipy.optimize.least_squares` runs from each start (within bounds)."""
  from scipy import optimize        # here, not at import: training imports scaling (~0.4 s)
  best = None
  low, high = np.asarray(bounds[0], np.float64), np.asarray(bounds[1], np.float64)
  # Start strictly inside the finite bounds (an infinite bound needs no margin: inf - inf
  # would make the start NaN and every start fail).
  inner_low = low + np.where(np.isfinite(low), 1e-9 * (np.abs(low) + 1), 0.0)
  inner_high = high - np.where(np.isfinite(high), 1e-9 * (np.abs(high) + 1), 0.0)
  for start in starts:
    x0 = np.clip(np.asarray(start, np.float64), inner_low, inner_high)
    try:
      result = optimize.least_squares(residual, x0, bounds=(low, high), method="trf",
                                      x_scale="jac", max_nfev=2000)
    except (ValueError, FloatingPointError):
      continue
    if np.all(np.isfinite(result.fun)) and (best is None or result.cost < best.cost):
      best = result
  if best is None:
    raise RuntimeError("no starting point gave a finite fit")
  return best.x


def _bound_findings(params: dict, bounds: dict, reasons: dict,
                    draws: dict | None = None) -> tuple[str, ...]:
  """A parameter on its bound, or (short of that) a bootstrap interval that reaches it: either
  way the points do not measure it, and the reader must be told."""
  out = []
  for key, (low, high) in bounds.items():
    side = stats.at_bound(params[key], low, high)
    if side:
      out.append(f"{key} = {params[key]:.4g} is at its {side} bound "
                 f"({low if side == 'lower' else high:g}): {reasons[key][side]}")
      continue
    lo, hi = stats.interval((draws or {}).get(key, ()))
    for edge, value in (("lower", lo), ("upper", hi)):
      if np.isfinite(value) and stats.at_bound(value, low, high) == edge:
        out.append(f"{key} = {params[key]:.4g}, but its 95% interval [{lo:.3g}, {hi:.3g}] "
                   f"reaches the {edge} bound ({low if edge == 'lower' else high:g}), so "
                   f"these points do not pin {key} down: {reasons[key][edge]}")
  return tuple(out)


def _unidentified(params: dict, bounds: dict, ties: dict) -> list[str]:
  """The parameters on a bound, each with those `ties[(key, side)]` says it frees (e.g. an
  exponent at 0 makes its term a constant that trades off with the additive one)."""
  out = []
  for key, (low, high) in bounds.items():
    side = stats.at_bound(params[key], low, high)
    if side:
      out += [k for k in ties.get((key, side), (key,)) if k not in out]
  return out


def _invisible(terms: dict, total: np.ndarray, fit: str) -> tuple[list[str], list[str]]:
  """(findings, unidentified) for each term {label: (values, x, x name, params)} of a law
  that shows (>= 1e-4 of `total`) at fewer than 2 distinct x: its exponent and scale drift."""
  findings, unidentified = [], []
  for label, (term, x, name, keys) in terms.items():
    seen = stats.visible_at(term, total, x)
    if seen < 2:
      findings.append(f"the term {label} is below 1e-4 of {fit} at "
                      f"{'every' if seen == 0 else 'all but one'} {name}: the loss does not "
                      f"change with {name} as a power law over these points (nothing, or a "
                      f"step), so {' and '.join(keys)} are not measured")
      unidentified += [k for k in keys if k not in unidentified]
  return findings, unidentified


def _saturating(params: dict, x: np.ndarray) -> np.ndarray:
  return params["E"] + (params["X_c"] / x) ** params["alpha"]


def fit_saturating(x: Any, loss: Any, *, samples: int = DEFAULT_SAMPLES,
                   seed: int = 0, groups: Any = None,
                   max_failure: float = stats.MAX_FAILURE) -> stats.Fit:
  """L(X) = E + (X_c / X)^alpha with 0 <= E <= min L: Kaplan's law with an irreducible loss
  (Hoffmann et al. 2022 eq. 2 at fixed D). Least squares on L over a grid of E starts.
  Needs >= 4 distinct X (3 parameters + 1 degree of freedom). The residual (and so
  `predict_interval`'s scatter) is in loss units.
  `groups`: one run id per point, to resample whole runs (`stats.bootstrap`) where points
  share a run; `max_failure`: the share of resamples that may fail (`stats.BootstrapError`)."""
  x, loss = stats.as_points("fit_saturating", 4, ("x", "loss"), x=x, loss=loss)
  stats.require_falling("fit_saturating", "x", "loss", x, loss, 4)
  groups = stats.as_groups("fit_saturating", groups, x.size)
  e_max = float(loss.min())

  def fit_once(x, loss):
    stats.require_distinct("fit_saturating", "x", x, 4)
    top = float(loss.min())
    log_x = np.log(x)

    def residual(theta):
      e, alpha, log_c = theta
      return e + np.exp(alpha * (log_c - log_x)) - loss

    starts = []
    for e in np.linspace(0.0, top, 6, endpoint=False):
      slope, intercept = np.polyfit(log_x, np.log(loss - e), 1)
      if slope < 0:
        starts.append((e, -slope, intercept / -slope))
    if not starts:
      raise ValueError("fit_saturating: the loss does not fall with x; check the runs")
    e, alpha, log_c = _least_squares(residual, starts, ([0.0, 1e-6, -np.inf],
                                                        [top, 10.0, np.inf]))
    return {"E": float(e), "alpha": float(alpha), "X_c": float(np.exp(log_c))}

  params = fit_once(x, loss)
  boot = stats.bootstrap(fit_once, (x, loss), samples=samples, seed=seed, groups=groups,
                         max_failure=max_failure, what="fit_saturating")
  bounds = {"E": (0.0, e_max), "alpha": (1e-6, 10.0)}
  findings = [*_bound_findings(params, bounds, draws=boot.draws, reasons={"E": {
      "lower": "no saturation is visible over these points, so the law reduces to Kaplan's "
               "pure power law; E is not measured (more and larger models, or longer runs, "
               "would show whether the loss flattens)",
      "upper": "the law puts all the remaining loss in E; the points barely fall with x"},
      "alpha": {"lower": "the power term is a constant that trades off with E: the loss "
                         "barely falls with x",
                "upper": "the loss falls within the smallest x and is flat after (a step, "
                         "not a power law): add sizes between"}})]
  unidentified = _unidentified(params, bounds, {("alpha", "lower"): ("alpha", "X_c", "E"),
                                                ("alpha", "upper"): ("alpha", "X_c")})
  more, keys = _invisible({"(X_c / X)^alpha": ((params["X_c"] / x) ** params["alpha"], x, "x",
                                               ("alpha", "X_c"))}, _saturating(params, x), "L")
  findings += more
  unidentified += [k for k in keys if k not in unidentified]
  return stats.Fit(law="L = E + (X_c / X)^alpha", params=params,
                   n_points=x.size, rms_residual=float(np.sqrt(np.mean(
                       (_saturating(params, x) - loss) ** 2))),
                   method="bounded least squares on L, grid of E starts" + boot.method(),
                   findings=(*findings, *boot.findings()), predict_fn=_saturating,
                   unidentified=tuple(unidentified), residual_space="linear",
                   **boot.fields())


def _kaplan_joint(params: dict, n: np.ndarray, d: np.ndarray) -> np.ndarray:
  ratio = params["alpha_N"] / params["alpha_D"]
  return ((params["N_c"] / n) ** ratio + params["D_c"] / d) ** params["alpha_D"]


def fit_kaplan_joint(n: Any, d: Any, loss: Any, *, samples: int = DEFAULT_SAMPLES,
                     seed: int = 0, groups: Any = None,
                     max_failure: float = stats.MAX_FAILURE) -> stats.Fit:
  """L(N, D) = [(N_c / N)^(alpha_N / alpha_D) + D_c / D]^alpha_D (Kaplan et al. 2020 eq. 1.5:
  alpha_N = 0.076, alpha_D = 0.103, N_c = 6.4e13, D_c = 1.8e13, fitted to early-stopped
  losses of models of several sizes on datasets of several sizes). Least squares on log L
  over a grid of exponent starts. Needs >= 5 distinct (N, D) pairs (4 parameters + 1) with
  >= 2 distinct N and D, not all on one line in (log N, log D).
  `groups`: one run id per point, to resample whole runs (`stats.bootstrap`) where points
  share a run; `max_failure`: the share of resamples that may fail (`stats.BootstrapError`)."""
  what = "fit_kaplan_joint"
  n, d, loss = stats.as_points(what, 5, ("n", "d", "loss"), n=n, d=d, loss=loss)
  groups = stats.as_groups(what, groups, n.size)

  def check(n, d):
    stats.require_distinct(what, "n", n, 2)
    stats.require_distinct(what, "d", d, 2)
    stats.require_design(what, n, d, 4)

  check(n, d)
  stats.require_falling_in_n_or_d(what, loss, n, d)

  def fit_once(n, d, loss):
    check(n, d)
    log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)

    def residual(theta):
      alpha_n, alpha_d, log_nc, log_dc = theta
      inner = np.logaddexp((alpha_n / alpha_d) * (log_nc - log_n), log_dc - log_d)
      return alpha_d * inner - log_l

    starts = [(an, ad, np.log(n.max()) + s, np.log(d.max()) + s)
              for an, ad, s in itertools.product((0.05, 0.3), (0.05, 0.3), (1.0, 10.0))]
    alpha_n, alpha_d, log_nc, log_dc = _least_squares(
        residual, starts, ([1e-4, 1e-4, -np.inf, -np.inf], [5.0, 5.0, np.inf, np.inf]))
    return {"alpha_N": float(alpha_n), "alpha_D": float(alpha_d),
            "N_c": float(np.exp(log_nc)), "D_c": float(np.exp(log_dc))}

  params = fit_once(n, d, loss)
  boot = stats.bootstrap(fit_once, (n, d, loss), samples=samples, seed=seed, groups=groups,
                         max_failure=max_failure, what=what)
  bounds = {"alpha_N": (1e-4, 5.0), "alpha_D": (1e-4, 5.0)}
  reasons = {f"alpha_{x}": {
      "lower": f"the loss does not fall with {x} over these points",
      "upper": f"the {x} term falls within the smallest {x} (a step, not a power law)"}
      for x in "ND"}
  findings = list(_bound_findings(params, bounds, reasons, draws=boot.draws))
  unidentified = _unidentified(params, bounds, {
      ("alpha_N", "lower"): ("alpha_N", "N_c"), ("alpha_N", "upper"): ("alpha_N", "N_c"),
      ("alpha_D", "lower"): ("alpha_N", "alpha_D", "N_c", "D_c"),
      ("alpha_D", "upper"): ("alpha_D", "D_c")})
  with np.errstate(over="ignore", invalid="ignore"):
    t_n = (params["N_c"] / n) ** (params["alpha_N"] / params["alpha_D"])
    t_d = params["D_c"] / d
  more, keys = _invisible({"(N_c / N)^(alpha_N / alpha_D)": (t_n, n, "n", ("alpha_N", "N_c")),
                           "D_c / D": (t_d, d, "d", ("alpha_D", "D_c"))}, t_n + t_d,
                          "the bracket")
  findings += more
  unidentified += [k for k in keys if k not in unidentified]
  return stats.Fit(law="L = [(N_c / N)^(alpha_N / alpha_D) + D_c / D]^alpha_D",
                   params=params, n_points=n.size,
                   rms_residual=_rms_log(_kaplan_joint(params, n, d), loss),
                   method="least squares on log L, grid of exponent starts" + boot.method(),
                   findings=(*findings, *boot.findings()), predict_fn=_kaplan_joint,
                   unidentified=tuple(unidentified), **boot.fields())


def _zhai(params: dict, c: np.ndarray) -> np.ndarray:
  return params["a"] * (c + params["d"]) ** (-params["b"]) + params["c"]


def fit_zhai(compute: Any, error: Any, *, samples: int = DEFAULT_SAMPLES,
             seed: int = 0, groups: Any = None,
             max_failure: float = stats.MAX_FAILURE) -> stats.Fit:
  """E(C) = a (C + d)^(-b) + c (Zhai et al. 2022 eq. 1): a power law in compute that
  saturates at small compute (d: the compute below which more does not help) and at large
  compute (c: the irreducible error, 0 <= c <= min E). Least squares on log E (errors span
  decades) over a grid of (b, d) starts. Needs >= 5 distinct compute values.
  `groups`: one run id per point, to resample whole runs (`stats.bootstrap`) where points
  share a run (a ViT run's evaluations along training); `max_failure`: the share of
  resamples that may fail (`stats.BootstrapError`)."""
  c, err = stats.as_points("fit_zhai", 5, ("compute", "error"), compute=compute, error=error)
  stats.require_falling("fit_zhai", "compute", "error", c, err, 5)
  groups = stats.as_groups("fit_zhai", groups, c.size)
  scale = float(np.median(c))            # fit in units of the median compute: well scaled
  err_min = float(err.min())

  def fit_once(c, err):
    stats.require_distinct("fit_zhai", "compute", c, 5)
    x, log_e, top = c / scale, np.log(err), float(err.min())

    def residual(theta):
      log_a, b, floor, log_d = theta
      return np.log(np.exp(log_a - b * np.log(x + np.exp(log_d))) + floor) - log_e

    starts = [(np.log(err.max()), b, 0.5 * top * f, np.log(x.min()) + s)
              for b, f, s in itertools.product((0.2, 0.5, 1.0), (0.0, 1.0), (-5.0, 0.0))]
    log_a, b, floor, log_d = _least_squares(
        residual, starts, ([-np.inf, 1e-4, 0.0, np.log(x.min()) - 20],
                           [np.inf, 10.0, top, np.log(x.max()) + 5]))
    return {"a": float(np.exp(log_a) * scale ** b), "b": float(b), "c": float(floor),
            "d": float(np.exp(log_d) * scale)}

  params = fit_once(c, err)
  boot = stats.bootstrap(fit_once, (c, err), samples=samples, seed=seed, groups=groups,
                         max_failure=max_failure, what="fit_zhai")
  bounds = {"c": (0.0, err_min), "b": (1e-4, 10.0)}
  findings = list(_bound_findings(params, bounds, draws=boot.draws, reasons={"c": {
      "lower": "no error floor is visible over this compute range (c is not measured)",
      "upper": "the fit puts all the remaining error in the floor c"}, "b": {
      "lower": "the error barely falls with compute: the power term is flat and trades off "
               "with the floor c",
      "upper": "the error falls within the smallest computes and is flat after (a step, "
               "not a power law): add points between"}}))
  unidentified = _unidentified(params, bounds, {("b", "lower"): ("a", "b", "c"),
                                                ("b", "upper"): ("a", "b")})
  # d is fitted as log(d / scale) within [log(min C) - 20, log(max C) + 5] (relative units).
  side = stats.at_bound(np.log(params["d"] / scale), np.log(c.min() / scale) - 20,
                        np.log(c.max() / scale) + 5, rel=1e-3)
  if side == "lower" or params["d"] < 1e-3 * c.min():
    findings.append(f"d = {params['d']:.3g} is negligible next to the smallest compute "
                    f"({c.min():.3g}): no low-compute saturation is visible, so d is not "
                    "measured and the law is a power law with a floor")
    unidentified.append("d")
  elif side == "upper":
    findings.append(f"d = {params['d']:.3g} is at its upper bound: the points all lie in the "
                    "flat low-compute part; train longer or larger models")
    unidentified += [k for k in ("a", "b", "d") if k not in unidentified]
  return stats.Fit(law="E = a (C + d)^(-b) + c", params=params,
                   n_points=c.size, rms_residual=_rms_log(_zhai(params, c), err),
                   method="bounded least squares on log E, grid of (b, c, d) starts"
                          + boot.method(),
                   findings=(*findings, *boot.findings()), predict_fn=_zhai,
                   unidentified=tuple(unidentified), **boot.fields())
