"""What every scaling fit shares: the `Fit` result with bootstrap confidence intervals, the
bootstrap itself, and input checks that name the argument and the fix (NumPy only).

Why the bootstrap: the fits here are non-linear (power laws with an offset, a Huber loss in
log space, optima of parabolas), so covariance-based errors are unreliable and often
undefined at a bound; refitting on resampled points gives an interval for any parameter or
derived number (an exponent ratio, a compute-optimal size, a predicted loss) the same way.

Three rules the scaling studies broke (issue #30): a bootstrap reports how many resamples it
attempted and how many fitted, and refuses (`BootstrapError`) when more than `max_failure`
fail, as the rest are a selected subset; points that share a run (evaluations along one run,
cooldown branches of one trunk) are resampled by run (`groups=`), as drawing them one by one
understates the interval; and the interval for a new run's loss is `Fit.predict_interval`
(law + scatter), not the mean law's `predict_ci`.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

LEVEL = 0.95                 # confidence level of every interval
MAX_FAILURE = 0.1            # share of bootstrap resamples that may fail before it is an error
PREDICTIVE_DRAWS = 4000      # Monte Carlo values per point behind `Fit.predict_interval`
_NUMBER = re.compile(r"\d[\d.eE+-]*")


@dataclasses.dataclass(frozen=True)
class Fit:
  """A fitted law.

  `params` are the point estimates (floats); `samples[key]` the same parameter refitted on
  each bootstrap resample (empty when the fit was run with samples=0), from which `ci(key)`
  gives the central `level` percentile interval. `findings` are facts a reader must see with
  the numbers, e.g. a parameter that ended at its bound. `unidentified` names the parameters
  the points do not determine (a finding says why): their `ci` is (nan, nan), as a bootstrap
  of a parameter pinned to a bound or free to drift is not a confidence interval.
  `bootstrap_attempted` counts the resamples tried and `bootstrap_failed` those that could
  not be fit (dropped; a finding says why, and more than the fit's `max_failure` share is a
  `BootstrapError`): the intervals come from attempted - failed. `bootstrap_by_run`: whole
  runs (`groups=`) were resampled rather than points. `residual_space` says where
  `rms_residual` was measured ('log': log loss; 'linear': loss units), which
  `predict_interval` needs to add the scatter. `predict(*x)` evaluates the law.
  """
  law: str
  params: dict[str, float]
  samples: dict[str, np.ndarray]
  n_points: int
  rms_residual: float
  method: str
  findings: tuple[str, ...] = ()
  level: float = LEVEL
  predict_fn: Callable[..., Any] | None = dataclasses.field(default=None, repr=False,
                                                            compare=False)
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False,
                                               compare=False)
  unidentified: tuple[str, ...] = ()
  bootstrap_failed: int = 0
  bootstrap_attempted: int = 0
  bootstrap_by_run: bool = False
  residual_space: str = "log"

  def predict(self, *x: Any) -> np.ndarray:
    if self.predict_fn is None:
      raise ValueError(f"the fit of {self.law!r} has no prediction function")
    return self.predict_fn(self.params, *(np.asarray(v, np.float64) for v in x))

  def ci(self, key: str) -> tuple[float, float]:
    """(low, high) bootstrap percentile interval of params[key]; (nan, nan) without samples
    or when the points do not identify the parameter (`unidentified`)."""
    if key not in self.params:
      raise KeyError(f"{key!r} is not a parameter of {self.law!r}: {sorted(self.params)}")
    if key in self.unidentified:
      return float("nan"), float("nan")
    return interval(self.samples.get(key, np.zeros(0)), self.level)

  def intervals(self) -> dict[str, tuple[float, float]]:
    return {key: self.ci(key) for key in self.params}

  def predict_ci(self, *x: Any) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap interval of `predict(*x)`: the law evaluated with each resample's params."""
    draws = self.draws()
    if not draws:
      nan = np.full(np.broadcast(*[np.asarray(v) for v in x]).shape, np.nan)
      return nan, nan
    values = np.stack([self.predict_fn(p, *(np.asarray(v, np.float64) for v in x))
                       for p in draws])
    return _percentiles(values, self.level)

  def residual_sigma(self) -> float:
    """The scatter of a new point about the law, in `residual_space`: the RMS residual times
    sqrt(n / (n - k)) for n points and k fitted parameters (the RMS of the fitted points is
    biased low: the law was chosen to pass near them). NaN for a published law."""
    n = int(self.extra.get("residual_points", self.n_points))
    k = int(self.extra.get("residual_parameters", len(self.params)))
    if not n > k:
      return float("nan")
    return float(self.rms_residual * np.sqrt(n / (n - k)))

  def predict_interval(self, *x: Any, noise: float | None = None, seed_sigma: float = 0.0,
                       level: float | None = None, seed: int = 0,
                       values_per_point: int = PREDICTIVE_DRAWS
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) central `level` interval for a new run's measured value at x (not the mean
    law's, `predict_ci`): the law's bootstrap uncertainty plus the scatter of runs about it.

    The scatter is `noise` (a standard deviation in `residual_space`: log loss for the laws
    fitted in log, loss units for `fit_saturating`), by default `residual_sigma()`, plus
    `seed_sigma` (loss units: seed-to-seed noise the fitted points did not show, e.g. a law
    fitted to seed means), added in quadrature; in log space seed_sigma / prediction (its
    first-order size there), so the combined sd at x is sqrt(noise^2 + (seed_sigma / L)^2).

    Deterministic Monte Carlo: each bootstrap draw's prediction is combined with
    ceil(`values_per_point` / resamples) normal deviates of the scatter (NumPy generator seeded with
    `seed`), and the interval is the central percentiles of the pooled values. NaN without
    bootstrap samples (a published law, or samples=0): there is no law uncertainty to add."""
    level = self.level if level is None else float(level)
    if not 0 < level < 1:
      raise ValueError(f"predict_interval: level={level} must be in (0, 1), e.g. 0.95")
    if noise is not None and not (np.isfinite(noise) and noise >= 0):
      raise ValueError(f"predict_interval: noise={noise} must be a standard deviation >= 0 "
                       f"(in {self.residual_space} space) or None for the fit's residual")
    if not (np.isfinite(seed_sigma) and seed_sigma >= 0):
      raise ValueError(f"predict_interval: seed_sigma={seed_sigma} must be >= 0 (loss units)")
    xs = [np.asarray(v, np.float64) for v in x]
    shape = np.broadcast(*xs).shape
    params = self.draws()
    if not params:
      nan = np.full(shape, np.nan)
      return nan, nan
    sigma = self.residual_sigma() if noise is None else float(noise)
    if not np.isfinite(sigma):
      raise ValueError(f"predict_interval: the fit of {self.law!r} has no residual scatter "
                       f"({self.n_points} points for {len(self.params)} parameters); pass "
                       "noise= (a standard deviation)")
    mu = np.stack([np.broadcast_to(self.predict_fn(p, *xs), shape).ravel() for p in params])
    per = -(-int(values_per_point) // len(params))
    rng = np.random.default_rng(seed)
    low, high = np.empty(mu.shape[1]), np.empty(mu.shape[1])
    for start in range(0, mu.shape[1], 1024):
      m = mu[:, start:start + 1024][:, None, :]                    # [B, 1, S]
      z = rng.standard_normal((mu.shape[0], per, m.shape[2]))
      if self.residual_space == "log":
        with np.errstate(divide="ignore", invalid="ignore"):
          sd = np.sqrt(sigma ** 2 + (seed_sigma / m) ** 2)
        values = m * np.exp(sd * z)
      else:
        values = m + np.sqrt(sigma ** 2 + seed_sigma ** 2) * z
      lo, hi = _percentiles(values.reshape(-1, m.shape[2]), level)
      low[start:start + 1024], high[start:start + 1024] = lo, hi
    return low.reshape(shape), high.reshape(shape)

  def draws(self) -> list[dict[str, float]]:
    """The bootstrap resamples' parameter dicts."""
    count = min((len(v) for v in self.samples.values()), default=0)
    return [{k: float(v[i]) for k, v in self.samples.items()} for i in range(count)]

  def as_dict(self) -> dict[str, Any]:
    """JSON-ready: law, params, intervals, method, findings, residual, points, and the
    bootstrap's accounting (resamples attempted, fitted, failed; by run or by point)."""
    fitted = len(self.draws())
    return {"law": self.law, "params": self.params,
            "ci": {k: list(v) for k, v in self.intervals().items()},
            "level": self.level, "bootstrap_samples": fitted,
            "bootstrap_attempted": self.bootstrap_attempted,
            "bootstrap_failed": self.bootstrap_failed,
            "bootstrap_by_run": self.bootstrap_by_run,
            "bootstrap": (f"{fitted} of {self.bootstrap_attempted} resamples fitted"
                          if self.bootstrap_attempted else "none"),
            "n_points": self.n_points, "rms_residual": self.rms_residual,
            "residual_space": self.residual_space, "method": self.method,
            "findings": list(self.findings), "unidentified": list(self.unidentified)}


def json_ready(value: Any) -> Any:
  """`value` with NaN and inf as None (strict JSON) and NumPy scalars as Python numbers."""
  if isinstance(value, dict):
    return {k: json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_ready(v) for v in value]
  if isinstance(value, (float, np.floating)):
    return float(value) if np.isfinite(value) else None
  if isinstance(value, np.integer):
    return int(value)
  return value


def _percentiles(values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
  tail = 50 * (1 - level)
  low, high = np.nanpercentile(values, [tail, 100 - tail], axis=0)
  return low, high


def interval(values: Any, level: float = LEVEL) -> tuple[float, float]:
  """Central `level` percentile interval of `values` (nan, nan when empty)."""
  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  if values.size == 0:
    return float("nan"), float("nan")
  low, high = _percentiles(values, level)
  return float(low), float(high)


def as_points(what: str, min_points: int, positive: Sequence[str] = (),
              **arrays: Any) -> list[np.ndarray]:
  """The named arrays as float64 vectors of one length, or a ValueError naming the argument:
  different lengths, fewer than `min_points` points, NaN/inf (a failed run), or a value
  <= 0 in one of `positive` (a power law needs logarithms)."""
  out, length = [], None
  for name, value in arrays.items():
    try:
      v = np.asarray(value, np.float64).ravel()
    except (TypeError, ValueError) as e:
      raise ValueError(f"{what}: {name} must be numbers; got {value!r}") from e
    if length is not None and v.size != length[1]:
      raise ValueError(f"{what}: {name} has {v.size} values but {length[0]} has {length[1]}; "
                       "give one value per run")
    length = length or (name, v.size)
    if not np.all(np.isfinite(v)):
      bad = int(np.flatnonzero(~np.isfinite(v))[0])
      raise ValueError(f"{what}: {name}[{bad}] = {v[bad]} is not finite; drop failed or "
                       "diverged runs before fitting")
    if name in positive and np.any(v <= 0):
      bad = int(np.flatnonzero(v <= 0)[0])
      raise ValueError(f"{what}: {name}[{bad}] = {v[bad]:g} must be > 0 (the law takes its "
                       "logarithm)")
    out.append(v)
  if length[1] < min_points:
    raise ValueError(f"{what} needs at least {min_points} points; got {length[1]}: add runs")
  return out


def _listed(values: np.ndarray, most: int = 8) -> str:
  shown = ", ".join(f"{v:.4g}" for v in values[:most])
  return f"[{shown}{', ...' if values.size > most else ''}]"


def require_distinct(what: str, name: str, values: np.ndarray, minimum: int,
                     why: str = "") -> None:
  """A ValueError when `values` has fewer than `minimum` distinct entries (a degenerate
  design: e.g. every run at one model size cannot determine a size exponent). `why` says
  which parameters the missing values would identify."""
  distinct = np.unique(values)
  if distinct.size < minimum:
    reason = f"{why}; " if why else ""
    raise ValueError(f"{what} needs at least {minimum} distinct values of {name}; got "
                     f"{distinct.size}: vary {name} across runs ({reason}distinct values: "
                     f"{_listed(distinct)})")


def require_varying(what: str, name: str, values: np.ndarray, against: str) -> None:
  """A ValueError when `values` (a loss) is the same at every point: a constant has no
  dependence on size or data, so any exponent fits it (approach 3 returned alpha = 276)."""
  if np.ptp(values) <= 1e-9 * np.abs(values).max():
    raise ValueError(f"{what}: the {name} does not fall with {against}: it is "
                     f"{values[0]:.6g} at every point, and a constant determines no exponent; "
                     f"check that each run logged its own {name}")


def log_slopes(y: np.ndarray, *xs: np.ndarray) -> np.ndarray:
  """Least-squares slopes of log y on log x1, log x2, ... jointly (with an intercept): the
  sign of each says whether y falls along that axis, other axes held fixed."""
  design = np.column_stack([np.ones_like(y), *(np.log(x) for x in xs)])
  return np.linalg.lstsq(design, np.log(y), rcond=None)[0][1:]


def require_falling(what: str, x_name: str, y_name: str, x: np.ndarray, y: np.ndarray,
                    minimum: int) -> float:
  """What a law in one variable needs: `minimum` distinct x, and y that varies and falls with
  x (a ValueError otherwise); returns the log-log slope."""
  require_distinct(what, x_name, x, minimum)
  require_varying(what, y_name, y, x_name)
  slope = float(log_slopes(y, x)[0])
  if slope >= 0:
    raise ValueError(f"{what}: the {y_name} does not fall with {x_name}; check the runs or "
                     f"train them longer (log-log slope {slope:+.3f})")
  return slope


def require_design(what: str, n: np.ndarray, d: np.ndarray, parameters: int) -> None:
  """A ValueError unless the runs hold more distinct (n, d) pairs than the law has
  `parameters` (replicates add no equation) and do not lie on one line in (log n, log d)
  (one IsoFLOP budget, or a fixed tokens-per-parameter ratio): on a line, the N and D terms
  of a joint law trade off and neither is determined."""
  pairs = np.unique(np.column_stack([n, d]), axis=0).shape[0]
  if pairs <= parameters:
    raise ValueError(f"{what} needs at least {parameters + 1} distinct (n, d) pairs "
                     f"({parameters} parameters + 1); got {pairs}: add runs at new sizes or "
                     "token counts (replicates of a run add no equation)")
  centred = np.column_stack([np.log(n), np.log(d)])
  centred = centred - centred.mean(axis=0)
  spread = np.linalg.svd(centred, compute_uv=False)[-1] / np.sqrt(n.size)
  if spread < 0.01:
    slope = np.polyfit(np.log(n), np.log(d), 1)[0]
    raise ValueError(f"{what}: the runs lie on one line in (log n, log d) (d ~ n^{slope:.2f}, "
                     f"within {spread:.1e} in log): n and d are not varied independently "
                     "(one IsoFLOP budget, or one tokens-per-parameter ratio), so the N and D "
                     "terms cannot be told apart; add runs off that line (another budget, or "
                     "other token counts at one size)")


def visible_at(term: np.ndarray, total: np.ndarray, x: np.ndarray,
               rel: float = 1e-4) -> int:
  """How many distinct values of x have a run where `term` is at least `rel` of `total`. A
  law's term that shows at fewer than 2 (nowhere, or a step at the smallest x) fits no
  exponent and scale: they drift (approach 3 put alpha = 48 on a loss flat in N)."""
  return int(np.unique(x[term >= rel * total]).size)


class BootstrapError(ValueError):
  """More than `max_failure` of a fit's bootstrap resamples could not be fit: intervals from
  the rest would come from a selected subset (the resamples that happen to fit), so the fit
  refuses them. A ValueError, so callers that fall back to samples=0 on one still do."""


def _plain(value: Any) -> Any:
  return value.item() if isinstance(value, np.generic) else value


def as_groups(what: str, groups: Any, size: int) -> np.ndarray | None:
  """`groups` (one hashable run id per point, or None) as integer codes 0..k-1, or a
  ValueError naming the argument: a wrong length, an unhashable id, or one run only."""
  if groups is None:
    return None
  values = list(groups.ravel()) if isinstance(groups, np.ndarray) else list(groups)
  if len(values) != size:
    raise ValueError(f"{what}: groups has {len(values)} values but there are {size} points; "
                     "give one run id per point")
  codes: dict[Any, int] = {}
  try:
    out = np.array([codes.setdefault(v, len(codes)) for v in values], np.int64)
  except TypeError as e:
    raise ValueError(f"{what}: groups must be hashable run ids (str, int); {e}") from e
  if len(codes) < 2:
    raise ValueError(f"{what}: groups names one run ({values[0]!r}), and resampling runs "
                     "needs >= 2: pass groups=None to resample points, or add runs")
  return out


@dataclasses.dataclass(frozen=True)
class Resamples:
  """What `bootstrap` returns: `draws` {param: values over the resamples that were fit},
  `requested` resamples (all attempted), `errors`: why each of the others could not be fit,
  and what was resampled: `units` runs when `by_run` (`groups=`), else points."""
  draws: dict[str, np.ndarray]
  requested: int
  errors: tuple[str, ...] = ()
  by_run: bool = False
  units: int = 0

  @property
  def failed(self) -> int:
    return len(self.errors)

  @property
  def fitted(self) -> int:
    return self.requested - self.failed

  def reason(self) -> str:
    """The most common failure, 'k of them: message' (messages that differ only in their
    numbers, e.g. the budget or the values drawn, count as one)."""
    groups = collections.Counter(_NUMBER.sub("#", e) for e in self.errors)
    key, count = groups.most_common(1)[0]
    example = next(e for e in self.errors if _NUMBER.sub("#", e) == key)
    return f"{'all' if count == len(self.errors) else count} of them: {example}"

  def summary(self) -> str:
    """'N of M resamples fitted, by run (k runs)' (or 'by point'); 'no bootstrap' for none."""
    if not self.requested:
      return "no bootstrap"
    unit = f"by run ({self.units} runs)" if self.by_run else "by point"
    return f"{self.fitted} of {self.requested} resamples fitted, {unit}"

  def method(self) -> str:
    """The suffix for a fit's `method`: '; bootstrap: N of M resamples fitted, by ...'."""
    return f"; bootstrap: {self.summary()}" if self.requested else ""

  def fields(self) -> dict[str, Any]:
    """The `Fit` fields this bootstrap fills: samples and its accounting."""
    return {"samples": self.draws, "bootstrap_attempted": self.requested,
            "bootstrap_failed": self.failed, "bootstrap_by_run": self.by_run}

  def findings(self) -> tuple[str, ...]:
    """A finding when resamples were dropped: the intervals come only from the resamples
    that could be fit, a selected subset, so they may be too narrow."""
    if not self.errors:
      return ()
    return (f"{self.failed} of {self.requested} bootstrap resamples could not be fit and "
            f"were dropped ({self.reason()}); {self.fitted} of {self.requested} resamples "
            "fitted: the intervals come from those, a selected subset, so they may be too "
            "narrow",)


def bootstrap(fit_once: Callable[..., Mapping[str, float]], arrays: Sequence[np.ndarray], *,
              samples: int, seed: int = 0, groups: np.ndarray | None = None,
              strata: np.ndarray | None = None, max_failure: float = MAX_FAILURE,
              what: str = "the fit") -> Resamples:
  """Refit `fit_once(*arrays_resampled) -> {param: value}` on `samples` resamples with
  replacement.

  What is resampled: points, or with `groups` (one run id per point, e.g. `as_groups`) whole
  runs: a resample draws runs with replacement and takes every point of each (a ViT run
  evaluated 32 times, the cooldown branches of one WSD trunk: their points share the run's
  luck, so drawing them independently understates the interval). With `strata` (one label
  per point, e.g. the FLOP budget) the draw is made within each stratum, so every stratum
  keeps its number of points (of runs, with `groups`; each run must then lie in one stratum).

  Resamples that cannot be fit (ValueError/RuntimeError, e.g. too few distinct sizes drawn,
  or non-finite parameters) are dropped and counted with their reasons (`Resamples.findings`,
  `.summary()`); more than `max_failure` of them failing is a `BootstrapError` naming `what`,
  the counts, the commonest reason and the fix."""
  if samples == 0:
    return Resamples({}, 0)
  if samples < 2:
    raise ValueError(f"samples={samples} must be 0 (no intervals) or >= 2")
  if not 0 <= max_failure < 1:
    raise ValueError(f"{what}: max_failure={max_failure} must be in [0, 1): the share of "
                     "bootstrap resamples that may fail (0.1 by default)")
  rng = np.random.default_rng(seed)
  size = arrays[0].size
  unit = np.arange(size) if groups is None else np.asarray(groups)
  ids = np.unique(unit)
  members = None if groups is None else [np.flatnonzero(unit == u) for u in ids]
  if strata is None:
    pools = [np.arange(ids.size)]
  else:
    strata = np.asarray(strata)
    first = {}
    for u, s in zip(np.searchsorted(ids, unit), strata):
      if first.setdefault(u, s) != s:
        raise ValueError(f"{what}: run {_plain(ids[u])!r} has points in more than one "
                         f"stratum ({_plain(first[u])!r} and {_plain(s)!r}); resample runs "
                         "across strata instead")
    label = np.array([first[u] for u in range(ids.size)])
    pools = [np.flatnonzero(label == s) for s in np.unique(label)]

  def draw():
    chosen = np.concatenate([rng.choice(m, m.size) for m in pools])
    idx = chosen if members is None else np.concatenate([members[u] for u in chosen])
    return fit_once(*(a[idx] for a in arrays))

  unit_name = "runs per group (budget)" if strata is not None else "points (runs)"
  return _resample(draw, samples, max_failure, what, f"add {unit_name}",
                   by_run=groups is not None, units=int(ids.size))


def _resample(draw: Callable[[], Mapping[str, float]], samples: int, max_failure: float,
              what: str, fix: str, by_run: bool = False, units: int = 0) -> Resamples:
  """`draw()` (one refit on fresh data) `samples` times, with the accounting every bootstrap
  here shares: failures counted with their reasons, a `BootstrapError` above
  `max_failure`."""
  values: dict[str, list[float]] = {}
  errors = []
  for _ in range(samples):
    try:
      result = {k: float(v) for k, v in draw().items()}
    except (ValueError, RuntimeError, FloatingPointError, np.linalg.LinAlgError) as e:
      errors.append(str(e))
      continue
    bad = sorted(k for k, v in result.items() if not np.isfinite(v))
    if bad:
      errors.append(f"non-finite {', '.join(f'{k} = {result[k]}' for k in bad)}")
      continue
    for key, value in result.items():
      values.setdefault(key, []).append(value)
  out = Resamples({key: np.asarray(v) for key, v in values.items()}, samples, tuple(errors),
                  by_run=by_run, units=units)
  if out.failed > max_failure * samples or out.fitted < 2:
    raise BootstrapError(
        f"{what}: {out.failed} of {samples} bootstrap resamples could not be fit, more than "
        f"max_failure={max_failure:g} of them ({out.reason()}); intervals from the other "
        f"{out.fitted} would come from a selected subset: {fix}, or fit a law with "
        "fewer parameters (or pass samples=0 for no intervals)")
  return out


def simulate(fit_once: Callable[[np.random.Generator], Mapping[str, float]], *, samples: int,
             seed: int = 0, max_failure: float = MAX_FAILURE,
             what: str = "the fit") -> Resamples:
  """A parametric (or nested) bootstrap: `fit_once(rng)` draws its own data (e.g. a fitted
  curve plus noise, or one value from each of several bootstrap distributions) and refits;
  `samples` times from a generator seeded with `seed`. The same accounting as `bootstrap`:
  failed draws are counted with their reasons (`Resamples.findings`), and more than
  `max_failure` of them is a `BootstrapError`."""
  if samples == 0:
    return Resamples({}, 0)
  if samples < 2:
    raise ValueError(f"samples={samples} must be 0 (no intervals) or >= 2")
  if not 0 <= max_failure < 1:
    raise ValueError(f"{what}: max_failure={max_failure} must be in [0, 1)")
  rng = np.random.default_rng(seed)
  return _resample(lambda: fit_once(rng), samples, max_failure, what, "check the draws")


def at_bound(value: float, low: float, high: float, rel: float = 1e-6) -> str | None:
  """'lower'/'upper' when `value` sits on that bound (to `rel` of the range), else None."""
  span = (high - low) if np.isfinite(high - low) else max(abs(value), 1.0)
  if np.isfinite(low) and value - low <= rel * span:
    return "lower"
  if np.isfinite(high) and high - value <= rel * span:
    return "upper"
  return None


def require_falling_in_n_or_d(what: str, loss, n, d):
  """A joint law L(N, D) needs a loss that varies and falls with N or D (log-log slopes of a
  least-squares plane); a ValueError naming `what` otherwise."""
  require_varying(what, "loss", loss, "n or d")
  slopes = log_slopes(loss, n, d)
  if np.all(slopes >= 0):
    raise ValueError(f"{what}: the loss does not fall with n or d (log-log slopes "
                     f"{slopes[0]:+.3f} in n, {slopes[1]:+.3f} in d); check the runs")


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
  """Wilson's score interval of a binomial proportion (a pass rate, an accuracy over n
  examples): unlike the normal approximation it stays inside [0, 1] and is not empty at 0
  or n successes."""
  import statistics
  if n == 0:
    return (0.0, 1.0)
  z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return (max(0.0, float(centre - half)), min(1.0, float(centre + half)))
