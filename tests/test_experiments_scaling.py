"""The analysis of experiments/scaling_gpt.py and scaling_vit.py on made-up eval curves (the
real runs take half an hour: only their bookkeeping is tested here)."""

import importlib.util
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script(name: str):
  spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def gpt():
  return _script("scaling_gpt")


@pytest.fixture(scope="module")
def vit():
  return _script("scaling_vit")


def _curve(losses, every=100, tokens_per_step=1024):
  return [{"step": every * (i + 1), "tokens": every * (i + 1) * tokens_per_step,
           "eval_loss": loss} for i, loss in enumerate(losses)]


def test_convergence_reads_the_constant_lr_tail(gpt):
  falling = gpt.convergence(_curve(np.linspace(3.0, 2.0, 20)), tail_step=1600)
  assert falling["tail_evals"] == 5 and not falling["converged"]
  assert falling["verdict"] == "still falling" and falling["slope_per_doubling"] < -0.1
  flat = gpt.convergence(_curve([3.0, 2.5, 2.2] + [2.1] * 17), tail_step=1600)
  assert flat["converged"] and flat["verdict"].startswith("flat")
  assert flat["best_loss"] == pytest.approx(2.1)
  overfit = gpt.convergence(_curve([3.0, 2.5, 2.0, 2.05, 2.1]), tail_step=400)
  assert overfit["tail_evals"] == 3                              # at least 3 evals
  assert overfit["best_step"] == 300 and overfit["last_minus_best"] == pytest.approx(0.1)
  assert overfit["converged"] and "best at 60%" in overfit["verdict"]


def test_fit_law_drops_intervals_it_cannot_bootstrap(gpt):
  from jaxformer import scaling

  n = np.array([6e3, 1.4e4, 2.5e4, 5.6e4, 1e5])
  fit, notes = gpt.fit_law(scaling.fit_saturating, n, 1.0 + (1e4 / n) ** 0.3, 200)
  assert fit is not None and np.isnan(fit.ci("alpha")[0])      # 5 sizes: 3 parameters + 2
  assert notes and "no bootstrap intervals" in notes[0]
  fit, notes = gpt.fit_law(scaling.fit_kaplan_n, n, 1.0 + 0 * n, 20)
  assert fit is None and "does not fall" in notes[0]


def test_pareto_frontier_keeps_points_no_cheaper_point_beats(vit):
  sizes = [{"name": "small", "evals": [{"compute": 1.0, "error": 0.5},
                                       {"compute": 2.0, "error": 0.3},
                                       {"compute": 4.0, "error": 0.25}]},
           {"name": "big", "evals": [{"compute": 3.0, "error": 0.4},
                                     {"compute": 6.0, "error": 0.2},
                                     {"compute": 12.0, "error": 0.1}]}]
  frontier = vit.pareto_frontier(sizes)
  assert [(p["name"], p["compute"]) for p in frontier] == [
      ("small", 1.0), ("small", 2.0), ("small", 4.0), ("big", 6.0), ("big", 12.0)]


def test_vit_script_requires_a_data_path(vit, tmp_path, capsys):
  for argv in ([], ["--data=/some/dir"], ["--data=mnist:" + str(tmp_path / "missing")]):
    with pytest.raises(SystemExit):
      vit.parse_args(argv)
  assert "mnist:<directory" in capsys.readouterr().err
  assert vit.parse_args([f"--data=mnist:{tmp_path}"]).data == f"mnist:{tmp_path}"
  assert vit.parse_args(["--data=tfds:mnist"]).data == "tfds:mnist"
  spec = vit.sweep_spec("tfds:mnist", 3000, 10)
  assert spec["overrides"]["train.eval_every"] == 300
  assert len(spec["zip"]["model.d_model"]) == len(vit.SIZES)


def test_mup_transfer_analysis_prediction_and_report(tmp_path):
  """experiments/mup_transfer.py's bookkeeping on made-up losses: standard's optimum halves per
  doubling of width, μP's stays; a diverged run counts as the worst; the report is written."""
  import math
  mt = _script("mup_transfer")
  widths, rates = [32, 64, 128, 256], list(mt.LEARNING_RATES)
  rows = []
  for kind in mt.PARAMETRIZATIONS:
    for w in widths:
      center = 8e-3 * (32 / w if kind == "standard" else 1.0)
      for r in rates:
        loss = 2 + (math.log(r / center)) ** 2 / 10
        status = "failed" if (w, r, kind) == (256, 3.2e-2, "standard") else "done"
        rows.append({"name": f"{kind}_d{w}_lr{r:g}", "status": status, "eval_loss": loss,
                     "wall_time_s": 1.0, "overrides": {"model.parametrization": kind,
                                                       "model.d_model": w, "optim.lr": r}})
  result = mt.analyse(rows, widths)
  assert result["standard"]["slope"]["slope"] == pytest.approx(-1, abs=1e-6)
  assert result["mup"]["slope"]["slope"] == pytest.approx(0, abs=1e-6)
  assert result["standard"]["grid_steps_moved"] == 3 and result["mup"]["grid_steps_moved"] == 0
  assert math.isnan(result["standard"]["losses"]["256"]["0.032"])
  args = mt.parse_args([f"--data={__file__}", f"--workdir={tmp_path}",
                        f"--out={tmp_path / 'report'}"])
  prediction = mt.predict(args, [r for r in rows if r["name"].startswith("standard")])
  assert prediction["predicted_lr"] == pytest.approx(8e-3)
  assert mt.predict(args, []) == prediction                # written once, read back
  errors = mt.prediction_errors(prediction, result, widths)
  assert [e["grid_steps"] for e in errors] == [0, 0, 0]
  mt.write_report(args, result, rows, prediction, wall_s=1.0)
  text = (tmp_path / "report.md").read_text()
  assert "exactly (all 7 equal)" in text and "diverged" in text
  assert (tmp_path / "report.png").stat().st_size > 0
