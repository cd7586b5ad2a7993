"""Back-tests of a scaling law: does it predict a budget it was not fitted to? (NumPy only.)

    result = scaling.backtest(points)          # points: n, d, loss, budget (and run ids)
    result = scaling.backtest_sizes(n, loss, size_of_each_point, fit=scaling.fit_kaplan_n)
    print(result.markdown()); json.dump(result.as_dict(), f)

A law that fits its points can still extrapolate badly (the exponents trade off against the
scales, a curvature the points do not show): the test that matters for planning is whether
the law fitted to the smaller budgets predicts the next one. Two schemes:

- "last": leave-last-budget-out: fit on every budget but the largest, predict the largest
  (the extrapolation a study makes when it plans its next budget);
- "each": leave-one-budget-out: each budget in turn (interpolation for the middle ones).

For each held-out budget: every run's prediction error (nats, and relative), whether its
measured loss lies in the law's predictive interval (`Fit.predict_interval`: the law's
bootstrap draws plus the residual scatter, so the coverage should be near the level), and
the predicted vs measured best loss of the budget, beside a naive baseline: a power law
L_min(C) = k C^-g through the training budgets' best losses, extrapolated to the held-out
one. A law that does no better than the baseline on the best loss adds nothing to planning.

`backtest_sizes` is the same test for one-variable laws (L(N), error vs compute), whose
studies have sizes, not budgets: leave the largest size out, or each in turn, against the
local slope of the two nearest sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxformer.scaling import stats

SCHEMES = ("last", "each")
_KEYS = ("n", "d", "loss", "budget")


@dataclasses.dataclass(frozen=True)
class Backtest:
  """What `backtest` returns. `rows`: one dict per held-out run (scheme, budget, run, n, d,
  loss, predicted, low, high, error = predicted - loss in nats, rel_error = error / loss,
  covered: the loss lies in [low, high], None without intervals). `budgets`: one dict per
  (scheme, held-out budget): runs, mean/max absolute error, mean absolute relative error,
  coverage, best_measured, best_predicted (the lowest prediction over the budget's runs),
  baseline_best (k C^-g through the training budgets' best losses) and both errors on the
  best loss. `level`: the predictive intervals' level."""
  rows: tuple[dict[str, Any], ...]
  budgets: tuple[dict[str, Any], ...]
  level: float
  fit: str

  def summary(self) -> dict[str, dict[str, float]]:
    """Per scheme: mean absolute error of the runs, coverage, and mean absolute error on the
    best loss of the law and of the baseline."""
    out = {}
    for scheme in dict.fromkeys(b["scheme"] for b in self.budgets):
      rows = [r for r in self.rows if r["scheme"] == scheme]
      held = [b for b in self.budgets if b["scheme"] == scheme]
      out[scheme] = {
          "runs": len(rows), "budgets": len(held), **_error_and_coverage(rows),
          "best_abs_error": float(np.mean([abs(b["best_error"]) for b in held])),
          "baseline_abs_error": float(np.mean([abs(b["baseline_error"]) for b in held]))}
    return out

  def markdown(self) -> str:
    """A table, one row per (scheme, held-out budget), and a line per scheme."""
    pct = f"{100 * self.level:g}%"
    lines = [f"Back-test of {self.fit}: fitted without the held-out budget, then predicted "
             f"there. Errors are predicted - measured loss (nats); coverage: share of runs "
             f"inside the {pct} predictive interval; baseline: L_min = k C^-g through the "
             "training budgets' best losses.", "",
             "| scheme | held-out budget | runs | mean abs error | mean rel error | "
             f"coverage ({pct}) | best measured | best predicted | baseline | law error "
             "(best) | baseline error (best) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for b in self.budgets:
      cover = _share(b["coverage"])
      lines.append(
          f"| {b['scheme']} | {b['budget']:.3g} | {b['runs']} | {b['mean_abs_error']:.4f} | "
          f"{b['mean_rel_error']:.2%} | {cover} | {b['best_measured']:.4f} | "
          f"{b['best_predicted']:.4f} | {b['baseline_best']:.4f} | "
          f"{b['best_error']:+.4f} | {b['baseline_error']:+.4f} |")
    lines.append("")
    for scheme, s in self.summary().items():
      name = {"last": "leave-last-budget-out", "each": "leave-one-budget-out"}[scheme]
      cover = _share(s["coverage"])
      lines.append(f"- {name}: {s['runs']} runs over {s['budgets']} budget(s), mean abs error "
                   f"{s['mean_abs_error']:.4f} nats, coverage {cover}; best loss: law "
                   f"{s['best_abs_error']:.4f} vs baseline {s['baseline_abs_error']:.4f} "
                   "nats (mean abs error)")
    return "\n".join(lines) + "\n"

  def as_dict(self) -> dict[str, Any]:
    """JSON-ready (NaN as None): level, fit, per-budget rows, per-run rows, summary."""
    return stats.json_ready({"level": self.level, "fit": self.fit,
                             "budgets": list(self.budgets), "rows": list(self.rows),
                             "summary": self.summary()})


def _error_and_coverage(rows: list[dict]) -> dict[str, float]:
  """Mean absolute error of held-out rows and the share inside their intervals (NaN
  without intervals)."""
  covered = [r["covered"] for r in rows if r["covered"] is not None]
  return {"mean_abs_error": float(np.mean([abs(r["error"]) for r in rows])),
          "coverage": float(np.mean(covered)) if covered else float("nan")}


def _share(value: float) -> str:
  return "n/a" if not np.isfinite(value) else f"{value:.0%}"


def _default_fit(n, d, loss, *, groups=None) -> stats.Fit:
  from jaxformer.scaling.chinchilla import fit_parametric
  return fit_parametric(n, d, loss, groups=groups)


def _as_arrays(points: Any) -> tuple[list[np.ndarray], list[Any] | None]:
  """(n, d, loss, budget arrays; run ids or None) from a mapping of arrays or a sequence of
  mappings, each with n, d, loss, budget and optionally group (or run)."""
  if isinstance(points, Mapping):
    columns = dict(points)
  else:
    rows = list(points)
    if not rows or not all(isinstance(r, Mapping) for r in rows):
      raise ValueError("backtest: points must be a mapping of arrays or a sequence of "
                       f"mappings with keys {', '.join(_KEYS)} (and optionally group)")
    keys = set().union(*rows)
    columns = {k: [r.get(k) for r in rows] for k in keys}
  missing = [k for k in _KEYS if k not in columns]
  if missing:
    raise ValueError(f"backtest: points lack {', '.join(missing)}; each point needs "
                     f"{', '.join(_KEYS)} (and optionally group: its run id)")
  key = "group" if "group" in columns else "run" if "run" in columns else None
  groups = None if key is None else list(columns[key])
  if groups is not None and any(g is None for g in groups):
    raise ValueError(f"backtest: some points have no {key}; give every point its run id "
                     "or none")
  arrays = stats.as_points("backtest", 6, _KEYS, **{k: columns[k] for k in _KEYS})
  return arrays, groups


def _baseline(budgets: np.ndarray, best: np.ndarray, held: float) -> float:
  """k C^-g through the training budgets' best losses (least squares in log-log), at `held`."""
  slope, intercept = np.polyfit(np.log(budgets), np.log(best), 1)
  return float(np.exp(intercept + slope * np.log(held)))


def _label(value: Any) -> Any:
  """A run id as JSON has it: NumPy scalars as Python ones, anything else not a str, int or
  float as its str."""
  value = value.item() if isinstance(value, np.generic) else value
  return value if isinstance(value, (str, int, float)) else str(value)


def backtest(points: Any, *, fit: Callable[..., stats.Fit] | None = None,
             schemes: Sequence[str] = SCHEMES, level: float = stats.LEVEL,
             seed_sigma: float = 0.0, seed: int = 0) -> Backtest:
  """Leave-budget-out back-tests of a law fitted by `fit` (see the module docstring).

  points: a mapping of arrays, or a sequence of mappings, with n (parameters), d (tokens),
  loss, budget (the FLOP budget, the IsoFLOP curve the run belongs to) per run, and
  optionally group (or run): run ids, passed to `fit` to resample whole runs.
  fit: `fit(n, d, loss, groups=...) -> Fit` whose `predict(n, d)` is the loss, e.g.
  `functools.partial(scaling.fit_parametric, samples=200)` (the default: `fit_parametric`
  with its defaults, ~10 s + 30 s a fit). It needs bootstrap samples for the intervals
  (coverage is None without). schemes: "last" and/or "each". level, seed_sigma, seed: of
  `Fit.predict_interval` (seed_sigma: extra seed-to-seed noise, loss units).

  Needs >= 3 budgets (2 to fit the baseline and the law on, 1 to hold out); a subset the
  law cannot be fitted to is a ValueError naming the held-out budget."""
  (n, d, loss, budget), groups = _as_arrays(points)
  unknown = [s for s in schemes if s not in SCHEMES]
  if unknown or not schemes:
    raise ValueError(f"backtest: schemes={tuple(schemes)!r} must be some of {SCHEMES} "
                     "('last': leave the largest budget out; 'each': each budget in turn)")
  if not 0 < level < 1:
    raise ValueError(f"backtest: level={level} must be in (0, 1), e.g. 0.95")
  budgets = np.unique(budget)
  if budgets.size < 3:
    raise ValueError(f"backtest needs runs at >= 3 FLOP budgets (2 to fit the law and the "
                     f"baseline on, 1 to hold out); got {budgets.size} "
                     f"({', '.join(f'{c:.3g}' for c in budgets)}): add budgets")
  fit = fit or _default_fit
  ids = np.arange(n.size) if groups is None else groups
  best = np.array([loss[budget == c].min() for c in budgets])
  fits: dict[float, stats.Fit] = {}
  rows, summaries = [], []
  for scheme in schemes:
    for held in (budgets[-1:] if scheme == "last" else budgets):
      train, test = budget != held, budget == held
      if held not in fits:
        try:
          fits[held] = fit(n[train], d[train], loss[train],
                           groups=None if groups is None else [groups[i] for i in
                                                               np.flatnonzero(train)])
        except ValueError as e:       # a BootstrapError stays one: callers fall back on it
          raise _same_kind(e)(f"backtest (budget {held:.3g} held out): the law cannot be fitted "
                           f"to the other budgets: {e}") from e
      law = fits[held]
      predicted = np.asarray(law.predict(n[test], d[test]), np.float64)
      low, high = law.predict_interval(n[test], d[test], seed_sigma=seed_sigma, level=level,
                                       seed=seed)
      error = predicted - loss[test]
      has_ci = np.isfinite(low) & np.isfinite(high)
      for i, j in enumerate(np.flatnonzero(test)):
        rows.append({"scheme": scheme, "budget": float(held), "run": _label(ids[j]),
                     "n": float(n[j]), "d": float(d[j]), "loss": float(loss[j]),
                     "predicted": float(predicted[i]), "low": float(low[i]),
                     "high": float(high[i]), "error": float(error[i]),
                     "rel_error": float(error[i] / loss[j]),
                     "covered": bool(low[i] <= loss[j] <= high[i]) if has_ci[i] else None})
      others = budgets != held
      base = _baseline(budgets[others], best[others], held)
      measured = float(loss[test].min())
      summaries.append({
          "scheme": scheme, "budget": float(held), "runs": int(test.sum()),
          "train_budgets": budgets[others].tolist(),
          "mean_abs_error": float(np.abs(error).mean()),
          "max_abs_error": float(np.abs(error).max()),
          "mean_rel_error": float(np.abs(error / loss[test]).mean()),
          "coverage": (float(np.mean((low <= loss[test]) & (loss[test] <= high)))
                       if has_ci.all() else float("nan")),
          "best_measured": measured, "best_predicted": float(predicted.min()),
          "baseline_best": base, "best_error": float(predicted.min()) - measured,
          "baseline_error": base - measured})
  description = next(iter(fits.values())).law
  return Backtest(rows=tuple(rows), budgets=tuple(summaries), level=float(level),
                  fit=f"{description} ({_name(fit)})")


def _same_kind(error: ValueError) -> type[ValueError]:
  return stats.BootstrapError if isinstance(error, stats.BootstrapError) else ValueError


def _name(fit: Callable) -> str:
  if fit is _default_fit:
    return "fit_parametric"
  fn = getattr(fit, "func", fit)                 # functools.partial
  return getattr(fn, "__name__", type(fn).__name__)


# ---- one-variable laws: hold out whole sizes ---------------------------------------------------

SIZE_SCHEMES = ("last", "each")


@dataclasses.dataclass(frozen=True)
class SizeBacktest:
  """What `backtest_sizes` returns. `rows`: one dict per held-out point (scheme, size, x, y,
  predicted, low, high, error = predicted - y, rel_error, covered, baseline = the local
  power law's prediction, baseline_error). `sizes`: one dict per (scheme, held-out size):
  points, train_sizes, baseline_sizes, mean/max absolute error of the law, its mean
  absolute relative error, coverage and the baseline's mean absolute error."""
  rows: tuple[dict[str, Any], ...]
  sizes: tuple[dict[str, Any], ...]
  level: float
  fit: str
  x_name: str

  def summary(self) -> dict[str, dict[str, float]]:
    """Per scheme: points, sizes, the law's and the baseline's mean absolute error, coverage."""
    out = {}
    for scheme in dict.fromkeys(s["scheme"] for s in self.sizes):
      rows = [r for r in self.rows if r["scheme"] == scheme]
      out[scheme] = {
          "points": len(rows), "sizes": sum(s["scheme"] == scheme for s in self.sizes),
          **_error_and_coverage(rows),
          "baseline_abs_error": float(np.mean([abs(r["baseline_error"]) for r in rows]))}
    return out

  def markdown(self) -> str:
    """A table, one row per (scheme, held-out size), and a line per scheme."""
    pct = f"{100 * self.level:g}%"
    lines = [f"Back-test of {self.fit}: fitted without the held-out size, then predicted "
             f"there. Errors are predicted - measured (mean absolute over the size's points); "
             f"coverage: share of points inside the {pct} predictive interval; baseline: a "
             f"power law through the two nearest training sizes only (the local slope, "
             f"extrapolated).", "",
             f"| scheme | held-out size | points | {self.x_name} | mean abs error | mean rel "
             f"error | coverage ({pct}) | baseline mean abs error |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for s in self.sizes:
      cover = _share(s["coverage"])
      span = (f"{s['x_min']:.3g}" if s["x_min"] == s["x_max"]
              else f"{s['x_min']:.3g}-{s['x_max']:.3g}")
      lines.append(f"| {s['scheme']} | {s['size']} | {s['points']} | {span} | "
                   f"{s['mean_abs_error']:.4g} | {s['mean_rel_error']:.2%} | {cover} | "
                   f"{s['baseline_abs_error']:.4g} |")
    lines.append("")
    for scheme, s in self.summary().items():
      name = {"last": "leave-largest-size-out", "each": "leave-one-size-out"}[scheme]
      cover = _share(s["coverage"])
      lines.append(f"- {name}: {s['points']} points over {s['sizes']} size(s), mean abs "
                   f"error {s['mean_abs_error']:.4g} (baseline {s['baseline_abs_error']:.4g}), "
                   f"coverage {cover}")
    return "\n".join(lines) + "\n"

  def as_dict(self) -> dict[str, Any]:
    """JSON-ready (NaN as None): level, fit, x_name, per-size rows, per-point rows, summary."""
    return stats.json_ready({"level": self.level, "fit": self.fit, "x_name": self.x_name,
                             "sizes": list(self.sizes), "rows": list(self.rows),
                             "summary": self.summary()})


def _local_power(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
  """y = k x^s by least squares in log-log (through two points when there are two)."""
  if np.unique(x).size < 2:
    raise ValueError("the baseline needs two distinct x")
  slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
  return lambda v: np.exp(intercept + slope * np.log(v))


def backtest_sizes(x: Any, y: Any, sizes: Sequence[Any], *, fit: Callable[..., stats.Fit],
                   schemes: Sequence[str] = SIZE_SCHEMES, level: float = stats.LEVEL,
                   seed_sigma: float = 0.0, seed: int = 0, x_name: str = "x",
                   resample: str = "sizes") -> SizeBacktest:
  """Leave-size-out back-tests of a one-variable law y(x) (L(N), or error vs compute over
  the runs of several model sizes), the analogue of `backtest` for studies without FLOP
  budgets: "last" fits every size but the largest and predicts the largest (the
  extrapolation a study makes when it plans the next size); "each" holds out each size in
  turn. Sizes are ordered by their largest x.

  x, y: one value per point (y > 0); sizes: each point's size label (a size's points are
  its seeds, or a run's evals). resample="sizes" passes them to the fit as `groups=`, so its
  bootstrap resamples whole sizes; "points" resamples the points (groups=None): with few
  sizes left after holding one out (5 of 6: a resample then has < 3 distinct sizes ~10% of
  the time) whole-size resampling fails, and points are what remains. fit: `fit(x, y, groups=...) -> Fit` with `predict(x)`, e.g.
  `functools.partial(scaling.fit_kaplan_n, samples=200)`; it needs bootstrap samples for
  the intervals (coverage is n/a without). The naive baseline is a power law through the
  points of the two training sizes nearest the held-out one: a global law that does no
  better than the local slope adds nothing. Needs >= 3 sizes; a subset the law cannot be
  fitted to is a ValueError naming the held-out size."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  labels = [_label(s) for s in sizes]
  if not (x.ndim == y.ndim == 1 and x.size == y.size == len(labels)):
    raise ValueError(f"backtest_sizes: x, y and sizes need one value per point; got "
                     f"{x.size}, {y.size} and {len(labels)}")
  if not (np.all(np.isfinite(x)) and np.all(x > 0) and np.all(np.isfinite(y))
          and np.all(y > 0)):
    raise ValueError("backtest_sizes: x and y must be finite and > 0 (the laws are fitted "
                     "in log-log)")
  unknown = [s for s in schemes if s not in SIZE_SCHEMES]
  if unknown or not schemes:
    raise ValueError(f"backtest_sizes: schemes={tuple(schemes)!r} must be some of "
                     f"{SIZE_SCHEMES} ('last': leave the largest size out; 'each': each size "
                     "in turn)")
  if not 0 < level < 1:
    raise ValueError(f"backtest_sizes: level={level} must be in (0, 1), e.g. 0.95")
  if resample not in ("sizes", "points"):
    raise ValueError(f"backtest_sizes: resample={resample!r} must be 'sizes' (whole sizes) "
                     "or 'points'")
  label_array = np.array(labels, dtype=object)
  order = sorted(dict.fromkeys(labels), key=lambda s: x[label_array == s].max())
  if len(order) < 3:
    raise ValueError(f"backtest_sizes needs >= 3 sizes (2 to fit the law and the baseline "
                     f"on, 1 to hold out); got {len(order)} ({', '.join(map(str, order))}): "
                     "add sizes")
  fits: dict[Any, stats.Fit] = {}
  rows, summaries = [], []
  for scheme in schemes:
    for held in (order[-1:] if scheme == "last" else order):
      test = label_array == held
      train = ~test
      if held not in fits:
        try:
          fits[held] = fit(x[train], y[train], groups=list(label_array[train])
                           if resample == "sizes" else None)
        except ValueError as e:
          raise _same_kind(e)(f"backtest_sizes (size {held} held out): the law cannot be "
                           f"fitted to the other sizes: {e}") from e
      law = fits[held]
      others = [s for s in order if s != held]
      i = order.index(held)
      near = sorted(others, key=lambda s: (abs(order.index(s) - i), order.index(s)))[:2]
      local = np.isin(label_array, near)
      baseline = _local_power(x[local], y[local])(x[test])
      predicted = np.asarray(law.predict(x[test]), np.float64)
      low, high = law.predict_interval(x[test], seed_sigma=seed_sigma, level=level,
                                       seed=seed)
      error = predicted - y[test]
      has_ci = np.isfinite(low) & np.isfinite(high)
      for k, j in enumerate(np.flatnonzero(test)):
        rows.append({"scheme": scheme, "size": held, "x": float(x[j]), "y": float(y[j]),
                     "predicted": float(predicted[k]), "low": float(low[k]),
                     "high": float(high[k]), "error": float(error[k]),
                     "rel_error": float(error[k] / y[j]),
                     "covered": bool(low[k] <= y[j] <= high[k]) if has_ci[k] else None,
                     "baseline": float(baseline[k]),
                     "baseline_error": float(baseline[k] - y[j])})
      summaries.append({
          "scheme": scheme, "size": held, "points": int(test.sum()),
          "x_min": float(x[test].min()), "x_max": float(x[test].max()),
          "train_sizes": others, "baseline_sizes": near,
          "mean_abs_error": float(np.abs(error).mean()),
          "max_abs_error": float(np.abs(error).max()),
          "mean_rel_error": float(np.abs(error / y[test]).mean()),
          "coverage": (float(np.mean((low <= y[test]) & (y[test] <= high)))
                       if has_ci.all() else float("nan")),
          "baseline_abs_error": float(np.abs(baseline - y[test]).mean())})
  description = next(iter(fits.values())).law
  return SizeBacktest(rows=tuple(rows), sizes=tuple(summaries), level=float(level),
                      fit=f"{description} ({_name(fit)}, resampling {resample})",
                      x_name=x_name)


def backtest_sizes_fallback(x: Any, y: Any, sizes: Sequence[Any],
                            law: Callable[..., stats.Fit], *, samples: int, **kwargs: Any
                            ) -> tuple[SizeBacktest | None, list[str]]:
  """(back-test or None, notes): `backtest_sizes` of `law` (a fitter taking samples= and
  groups=, e.g. `scaling.fit_kaplan_n`) with `samples` resamples of whole sizes; where too
  many of those fail (`BootstrapError`: few sizes left) resampling the points, then no
  bootstrap (no coverage); None when the law cannot be fitted at all. Each note says what was
  given up and why, for the report."""
  import functools
  tries = [("sizes", samples), ("points", samples), ("points", 0)] if samples else \
      [("points", 0)]
  notes = []
  for resample, count in tries:
    try:
      return backtest_sizes(x, y, sizes, fit=functools.partial(law, samples=count),
                            resample=resample, **kwargs), notes
    except stats.BootstrapError as e:
      notes.append(f"not resampling {resample}: {e}")
    except ValueError as e:
      return None, [*notes, f"no back-test: {e}"]
  return None, notes
