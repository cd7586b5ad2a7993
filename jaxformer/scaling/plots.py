"""Figures of a compute-optimal study in the style of Hoffmann et al. (2022), drawn on
matplotlib axes the caller owns (so a report can put several in one figure).

- `envelope(ax, curves, fit)`: every run's loss vs compute and the lower envelope (Fig. 2).
- `isoflop_curves(ax, n, loss, budget, fit)`: IsoFLOP points and parabolas (Fig. 3 left).
- `optimum_vs_compute(ax, fits, which)`: N_opt(C) or D_opt(C) of each approach, with the
  points they were fitted to and bootstrap bands (Fig. 3 middle/right).
- `loss_contours(ax, fit, ...)`: contours of a parametric L(N, D) in the (FLOPs, N) plane with
  its efficient frontier and the runs (Fig. 4 left).
- `law(ax, fit, grid, ...)`: a fitted one-variable law on log-log axes with its 95% bootstrap
  band (Kaplan L(N), Zhai's error vs compute).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from jaxformer.scaling import chinchilla


def law(ax, fit, grid: np.ndarray, style: str, *, label: str, color: str = "C3",
        band_alpha: float | None = 0.15):
  """`fit.predict(grid)` drawn with `style`, and its 95% bootstrap band when the fit has
  resamples (band_alpha=None: the line alone)."""
  ax.loglog(grid, fit.predict(grid), style, color=color, label=label)
  if band_alpha is not None and fit.draws():
    low, high = fit.predict_ci(grid)
    ax.fill_between(grid, low, high, color=color, alpha=band_alpha, label="95% bootstrap band")


def _colors(count: int):
  import matplotlib.pyplot as plt
  return [plt.cm.viridis(i / max(count - 1, 1)) for i in range(count)]


def envelope(ax, curves: Sequence[chinchilla.Curve], fit: chinchilla.OptimumFit | None = None):
  """Loss vs compute of every run (coloured by N) and the envelope points of approach 1."""
  sizes = sorted({c.params for c in curves})
  color = dict(zip(sizes, _colors(len(sizes))))
  for c in curves:
    ax.plot(c.flops, c.loss, color=color[c.params], alpha=0.5, lw=0.8)
  if fit is not None:
    pts = fit.extra["points"]
    ax.plot(pts["flops"], pts["loss"], "k-", lw=2, label="envelope (approach 1)")
    ax.legend(fontsize=8)
  ax.set(xscale="log", xlabel="FLOPs", ylabel="training loss (nats/token)",
         title="loss curves and their envelope")


def isoflop_curves(ax, n: np.ndarray, loss: np.ndarray, budget: np.ndarray,
                   fit: chinchilla.OptimumFit | None = None):
  """Final loss vs N at each budget, with each budget's parabola in log N and its vertex."""
  budgets = np.unique(budget)
  for c, color in zip(budgets, _colors(len(budgets))):
    sel = budget == c
    ax.plot(n[sel], loss[sel], "o", color=color, label=f"{c:.2g} FLOPs")
    x = np.log(n[sel])
    if np.unique(x).size >= 3:
      c2, c1, c0 = np.polyfit(x, loss[sel], 2)
      grid = np.linspace(x.min() - 0.2, x.max() + 0.2, 100)
      ax.plot(np.exp(grid), c2 * grid ** 2 + c1 * grid + c0, "-", color=color, alpha=0.7)
  if fit is not None:
    pts = fit.extra["points"]
    ax.plot(pts["n_opt"], pts["loss_min"], "kx", ms=9, mew=2, label="vertex (approach 2)")
  ax.set(xscale="log", xlabel="parameters N", ylabel="final eval loss (nats/token)",
         title="IsoFLOP curves")
  ax.legend(fontsize=8)


def optimum_vs_compute(ax, fits: Mapping[str, chinchilla.OptimumFit | chinchilla.ParametricFit],
                       flops: Sequence[float], which: str = "n"):
  """N_opt(C) (which='n') or D_opt(C) ('d') of each named fit over `flops`, with the points
  approaches 1 and 2 were fitted to and 95% bootstrap bands."""
  grid = np.geomspace(min(flops), max(flops), 100)
  col = 0 if which == "n" else 1
  for (name, fit), color in zip(fits.items(), ("C0", "C1", "C2", "C3", "C4")):
    ax.plot(grid, fit.compute_optimal(grid)[col], "-", color=color, label=name)
    draws = fit.draws()
    if draws:
      curves = np.stack([_with_params(fit, p).compute_optimal(grid)[col] for p in draws])
      low, high = np.nanpercentile(curves, [2.5, 97.5], axis=0)
      ax.fill_between(grid, low, high, color=color, alpha=0.15)
    points = fit.extra.get("points")
    if points and "loss_min" in points:           # approach 2: one optimum per budget
      ax.plot(points["flops"], points["n_opt" if which == "n" else "d_opt"], "o", color=color)
  ax.set(xscale="log", yscale="log", xlabel="FLOPs",
         ylabel="optimal parameters N_opt" if which == "n" else "optimal tokens D_opt",
         title=("N_opt" if which == "n" else "D_opt") + " vs compute (95% bands)")
  ax.legend(fontsize=8)


def _with_params(fit, params: Mapping[str, float]):
  return dataclasses.replace(fit, params=dict(params), samples={})


def loss_contours(ax, fit: chinchilla.ParametricFit, flops_range: tuple[float, float],
                  n_range: tuple[float, float], runs: tuple[np.ndarray, np.ndarray] | None = None,
                  levels: int = 12, flops_per_token=None):
  """Contours of the fitted L(N, D) over (C, N), the efficient frontier N_opt(C) and, if
  given, the runs as (flops, n) points. C = fpt(N) D with `flops_per_token` (a callable N ->
  FLOPs per token, e.g. `scaling.family_flops_per_token`: the runs' own exact count), else
  C = 6 N D; give the runs' FLOPs in the same convention."""
  fpt = flops_per_token or (lambda n: 6.0 * n)
  c = np.geomspace(*flops_range, 200)
  n = np.geomspace(*n_range, 200)
  cc, nn = np.meshgrid(c, n)
  loss = fit.predict(nn, cc / fpt(nn))
  cs = ax.contour(cc, nn, loss, levels=levels, cmap="viridis", linewidths=0.8)
  ax.clabel(cs, fontsize=6, fmt="%.2f")
  frontier = (fit.compute_optimal(c, flops_per_token=flops_per_token) if flops_per_token
              else fit.compute_optimal(c))[0]
  ax.plot(c, frontier, "C3-", lw=2, label="efficient frontier (approach 3)")
  if runs is not None:
    ax.plot(runs[0], runs[1], "k.", ms=6, label="runs")
  unit = "exact" if flops_per_token else "C = 6ND"
  ax.set(xscale="log", yscale="log", xlabel=f"FLOPs ({unit})", ylabel="parameters N",
         xlim=flops_range, ylim=n_range, title="fitted L(N, D) contours")
  ax.legend(fontsize=8)
