"""Scaling science: count, fit, plan, plot.

    from jaxformer import scaling
    scaling.count_params(config.model)            # jaxformer.models.counting (builds the model)
    scaling.flops_per_token(config.model, 1024)   # Kaplan 6N + attention, or method="hoffmann"
    fit = scaling.fit_parametric(n, d, loss)      # Chinchilla approach 3 (chinchilla.py)
    fit.params, fit.ci("alpha"), fit.predict(n, d), fit.compute_optimal(1e21)
    fpt = scaling.family_flops_per_token(sizes, exact_flops_per_token)   # exact FLOPs, not 6N
    fit.compute_optimal(1e21, fpt), fit.exponents(budgets=(1e18, 1e22), flops_per_token=fpt)
    fit.predict_interval(n, d)                    # a new run's loss: law + residual scatter
    scaling.fit_parametric(n, d, loss, groups=run_ids)   # resample runs, not points
    scaling.isoflop_optimum(...), scaling.envelope_optimum(...)   # approaches 2 and 1
    scaling.fit_kaplan_n(n, loss), fit_kaplan_joint(n, d, loss)   # Kaplan et al. 2020 (laws.py)
    scaling.backtest(points)                      # leave-budget-out checks (backtest.py)
    scaling.fit_limit(d, loss, groups=seeds)      # L_inf of one size's L(D) (converged.py)
    scaling.fit_kaplan_limits(n, limits)          # alpha_N on L_inf, nested bootstrap
    scaling.backtest_sizes(n, loss, sizes, fit=scaling.fit_kaplan_n)  # leave-size-out (L(N))
    scaling.plan_isoflop(budgets, candidates, tokens_per_step=...)  # isoflop.py
    scaling.plan_wsd(runs), scaling.wsd_sweeps(trunks, base, ...)   # trunks + cooldown branches
    scaling.lr_optimum(rates, losses), scaling.lr_width_rule(widths, optima)  # LR sweeps
    from jaxformer.scaling import mup             # μP width tools (the coordinate check that
                                                  # trains is jaxformer.train.coord_check)

Every bootstrap counts its resamples (`fit.bootstrap_attempted`, `bootstrap_failed`, "N of
M resamples fitted" in `fit.method`) and refuses intervals when more than `max_failure`
(10%) of them fail (`BootstrapError`).

Fits and plans (laws, chinchilla, isoflop, stats, backtest) use NumPy and SciPy only:
importing them, or this package, does not import JAX; `count_params`, `flops_per_token` and
the other counting names are `jaxformer.models.counting`'s (next to the models, so `convert`
and `train` count without importing the studies), loaded with JAX on first use. Plots
(plots.py) need matplotlib. `scaling.backtest` is the function; its module is
`importlib.import_module("jaxformer.scaling.backtest")`.
"""

from __future__ import annotations

import importlib

from jaxformer.scaling.backtest import (Backtest, SizeBacktest, backtest, backtest_sizes,
                                        backtest_sizes_fallback)
from jaxformer.scaling.chinchilla import (BESIROGLU_2024, HOFFMANN_2022, Curve, OptimumFit,
                                          ParametricFit, chinchilla_tokens, envelope_optimum,
                                          family_flops_per_token, fit_parametric,
                                          isoflop_optimum)
from jaxformer.scaling.converged import (Limit, backtest_limit, fit_kaplan_limits,
                                         fit_limit)
from jaxformer.scaling.laws import (fit_kaplan_d, fit_kaplan_joint, fit_kaplan_n,
                                    fit_saturating, fit_zhai)
from jaxformer.scaling.isoflop import (Candidate, PlannedRun, Trunk, lr_optimum, lr_width_rule,
                                        plan_isoflop, plan_run, plan_wsd, to_sweep, working_budgets,
                                        wsd_sweeps)
from jaxformer.scaling.stats import BootstrapError, Fit

_COUNTING = ("count_params", "flops_per_token", "param_shapes", "dummy_inputs",
             "attention_layers")

__all__ = ["BESIROGLU_2024", "HOFFMANN_2022", "Curve", "OptimumFit", "ParametricFit",
           "chinchilla_tokens", "envelope_optimum", "family_flops_per_token", "Backtest",
           "backtest", "SizeBacktest", "backtest_sizes", "backtest_sizes_fallback", "BootstrapError", "fit_parametric", "isoflop_optimum", "fit_kaplan_d",
           "fit_kaplan_joint", "fit_kaplan_n", "Limit", "fit_limit", "fit_kaplan_limits",
           "backtest_limit", "fit_saturating", "fit_zhai", "Candidate",
           "PlannedRun", "Trunk", "lr_optimum", "lr_width_rule", "plan_isoflop", "plan_run", "working_budgets",
           "plan_wsd", "to_sweep", "wsd_sweeps", "Fit", *_COUNTING]


def __getattr__(name: str):
  if name in _COUNTING:
    return getattr(importlib.import_module("jaxformer.models.counting"), name)
  raise AttributeError(f"module 'jaxformer.scaling' has no attribute {name!r}")
