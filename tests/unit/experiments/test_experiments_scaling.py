"""The analysis of experiments/scaling_gpt.py and scaling_vit.py on made-up losses (the real
runs take hours: only their planning and bookkeeping are tested here)."""

import importlib.util
import os
import pathlib
import re

import numpy as np
import pytest
from tests.repo_root import REPO

ROOT = REPO


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


def _finals(loss, seeds_of, upto):
  """{size: {index: {seed: loss(size, seed, index)}}} for every index <= upto[size]."""
  return {size: {j: {s: loss(size, s, j) for s in seeds} for j in range(upto[size] + 1)}
          for size, seeds in seeds_of.items()}


def test_seed_sigma_pools_variances_over_lengths_and_sizes(gpt):
  finals = {"a": {1: {0: 2.0, 1: 2.2, 2: 2.1}, 2: {0: 1.9, 1: 1.9, 2: 1.9}},
            "b": {0: {0: 1.5, 1: 1.7}}, "c": {0: {0: 1.0}}}
  sigma = gpt.seed_sigma(finals)
  assert sigma["per_size"]["a"] == pytest.approx(np.sqrt((0.02 + 0.0) / 4))
  assert sigma["per_size"]["b"] == pytest.approx(np.sqrt(0.02))
  assert sigma["per_size"]["c"] is None and sigma["dof"] == 5
  assert sigma["pooled"] == pytest.approx(np.sqrt(0.04 / 5))
  assert gpt.seed_sigma({"c": {0: {0: 1.0}}})["pooled"] is None
  early = {"a": {0: {0: 3.0, 1: 3.6, 2: 3.3}, **finals["a"]}}   # only the last 2 lengths count
  assert gpt.seed_sigma(early)["per_size"]["a"] == pytest.approx(np.sqrt(0.02 / 4))


def test_decide_runs_missing_seeds_then_doubles_until_below_sigma(gpt):
  seeds = (0, 1, 2)
  assert gpt.decide({}, seeds, None, 4)["runs"] == [(0, 0), (1, 0), (2, 0)]
  partial = {0: {0: 2.0, 1: 2.0, 2: 2.0}, 1: {1: 1.9}}
  d = gpt.decide(partial, seeds, 0.01, 4)
  assert d["state"] == "run" and d["runs"] == [(0, 1), (2, 1)]     # only the missing seeds
  one = {0: {0: 2.0, 1: 2.0, 2: 2.0}}
  assert gpt.decide(one, seeds, 0.01, 4)["runs"] == [(0, 1), (1, 1), (2, 1)]
  assert gpt.decide(one, seeds, 0.01, 0)["state"] == "capped"     # no second length allowed
  two = {0: {s: 2.0 for s in seeds}, 1: {s: 1.95 for s in seeds}}
  d = gpt.decide(two, seeds, 0.01, 4)                              # improved 0.05 >= 0.01
  assert d["state"] == "run" and d["runs"] == [(s, 2) for s in seeds]
  assert d["history"][1]["delta"] == pytest.approx(0.05) and not d["history"][1]["converged"]
  d = gpt.decide(two, seeds, 0.06, 4)                              # 0.05 < sigma: done
  assert d["state"] == "converged" and d["index"] == 1 and d["runs"] == []
  assert gpt.decide(two, seeds, 0.01, 1)["state"] == "capped"      # still falling at the cap
  assert gpt.decide(two, seeds, None, 4)["state"] == "waiting"     # no sigma: no decision
  worse = {0: {0: 2.0}, 1: {0: 2.1}}                               # overfitting: converged
  assert gpt.decide(worse, (0,), 0.01, 4)["state"] == "converged"


def test_plan_doubles_each_size_until_its_last_doubling_is_below_sigma(gpt):
  """Made-up losses L = floor + 0.4 * 2^-j (each doubling halves the gap) with seed noise
  +-0.01: a size stops at the first doubling that gains less than sigma_seed; the gap of the
  largest never closes before the cap, so it is capped. Seeded sizes use their own sigma."""
  seeds_of = {"big": (0,), "mid": (0,), "s1": (0, 1, 2), "s2": (0, 1, 2)}
  gap = {"big": 4.0, "mid": 0.4, "s1": 0.2, "s2": 0.1}
  noise = {0: -0.01, 1: 0.0, 2: 0.01}

  def loss(size, seed, j):
    return 1.0 + gap[size] * 2.0 ** -j + noise[seed] * (len(seeds_of[size]) > 1)

  done, rounds = {}, []
  while True:
    p = gpt.plan(done, seeds_of, 4)
    if not p["runs"]:
      break
    rounds.append(sorted({j for _, _, j in p["runs"]}))
    for size, seed, j in p["runs"]:
      done.setdefault(size, {}).setdefault(j, {})[seed] = loss(size, seed, j)
  assert rounds[:2] == [[0], [1]]                      # every chain, then every doubling
  sigma = p["sigma"]
  assert sigma["per_size"]["s1"] == pytest.approx(0.01) and sigma["pooled"] == pytest.approx(0.01)
  states = {size: (d["state"], d["index"]) for size, d in p["sizes"].items()}
  # gains gap * 2^-j: s2 0.05, 0.025, 0.0125, 0.00625 < 0.01 at j = 4? 0.1 / 16 = 0.00625: j=4
  assert states == {"big": ("capped", 4), "mid": ("capped", 4), "s1": ("capped", 4),
                    "s2": ("converged", 4)}
  p = gpt.plan(_finals(loss, seeds_of, dict.fromkeys(seeds_of, 4)), seeds_of, 6)
  assert {s: d["state"] for s, d in p["sizes"].items()} == {
      "big": "run", "mid": "run", "s1": "run", "s2": "converged"}
  assert sorted(p["runs"]) == [("big", 0, 5), ("mid", 0, 5), ("s1", 0, 5), ("s1", 1, 5),
                               ("s1", 2, 5)]


def test_lengths_decay_start_and_compute_estimate(gpt):
  from configs.sweeps import scaling_gpt as sweep
  from jaxformer import run_settings
  from jaxformer.state import optim

  assert sweep.lengths(1, 2, 9_943_099) == [1200, 2400, 4800, 9600, 19200]   # <= 2 epochs
  assert sweep.lengths(1, 0.01, 9_943_099) == [1200]                         # at least one
  o = run_settings.parse_section("optim", dict(lr=1e-3, schedule="wsd", warmup_steps=60))
  for steps in (12, 1200, 2400, 19200, 777):
    assert sweep.decay_start(steps) == optim.wsd_decay_start(o, steps)
  assert gpt.chain_steps([1200, 2400, 4800], 3) == 1200 + (2400 - 960) + (4800 - 1920)
  est = gpt.estimate([{"size": "a", "flops_per_token": 1e5, "tokens_per_s": 1024.0}],
                     [100, 200], parallel=1, eval_tokens=0)
  assert est["most"]["steps"] == 100 + 200 - 80 and est["least"] == est["most"]
  assert est["most"]["flops"] == pytest.approx(1e5 * 220 * 1024)
  assert est["most"]["hours_measured"] == pytest.approx((220 + 2 * gpt.STARTUP_S) / 3600)


def test_study_rounds_branch_each_doubling_from_the_stable_checkpoint(gpt, tmp_path,
                                                                        monkeypatch):
  """run_study with the training faked: round 1 trains every chain's first length, each later
  round branches the chains still improving from their previous length's decay start, and a
  rerun (every run finished) trains and branches nothing new."""
  from jaxformer import sweep as sweep_lib
  from jaxformer.train import workdir as workdir_lib

  corpus = tmp_path / "corpus.txt"
  corpus.write_text("def f(x):\n  return x + 1\n" * 500)
  args = gpt.parse_args([f"--data={corpus}", f"--workdir={tmp_path / 'runs'}", "--seeds=2",
                         "--scale=0.01"])
  values = gpt.sweep_values(args)
  lengths = [12, 24, 48, 96]
  finished, branches, rounds = set(), [], []

  def loss(overrides):
    gap = 0.002 if overrides["model.d_model"] == 16 else 0.5     # d16 converges at once
    return 1.0 + gap * 12 / overrides["train.steps"] + 0.003 * overrides["train.seed"]

  def fake_run(spec, workdir, parallel):
    points = sweep_lib.expand(spec, validate=False)
    rounds.append([p.name for p in points if p.name not in finished])
    finished.update(p.name for p in points)
    return [{"name": p.name, "status": "done", "eval_loss": loss(p.overrides), "log": ""}
            for p in points]

  def fake_branch(trunk, step, new):
    branches.append((os.path.basename(trunk), step, os.path.basename(new)))
    return True

  monkeypatch.setattr(sweep_lib, "run", fake_run)
  monkeypatch.setattr(workdir_lib, "branch", fake_branch)
  planned, rows, decision = gpt.run_study(args, values, lengths)
  assert len(rounds[0]) == 9 and all(n.endswith("_s12") for n in rounds[0])
  assert all(n.endswith("_s24") for n in rounds[1]) and len(rounds[1]) == 9
  assert decision["sizes"]["L2_d16"]["state"] == "converged"
  assert decision["sizes"]["L3_d80"]["state"] == "capped"
  assert ("L3_d80_lr0.00413_seed0_warm1_s24", 19, "L3_d80_lr0.00413_seed0_warm1_s48") in \
      branches                                       # from the decay start of 24 steps
  assert not any("L2_d16" in b[2] and b[2].endswith("_s48") for b in branches)
  assert len(planned) == len(rows) == len(finished)
  before = len(branches)
  gpt.run_study(args, values, lengths)               # a rerun: nothing new to train
  assert all(r == [] for r in rounds[len(rounds) - 4:]) and len(branches) == 2 * before


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


@pytest.mark.slow
def test_gpt_results_render_and_refit_from_the_json_alone(gpt, tmp_path, monkeypatch):
  """A finished study's results (made-up losses L = 5 N^-0.1 + 0.5 / doubling index, seeds
  +-0.005): OUT.md is render(OUT.json), refit(OUT.json) gives the stored estimates, and the
  report shows alpha_N with its interval next to 0.076, sigma_seed and every doubling."""
  from configs.sweeps import scaling_gpt as sweep
  from experiments import report_check

  corpus = tmp_path / "corpus.txt"
  corpus.write_text("def f(x):\n  return x + 1\n" * 500)
  args = gpt.parse_args([f"--data={corpus}", f"--workdir={tmp_path}", "--bootstrap=20",
                         f"--out={tmp_path / 'out' / 'scaling_gpt'}"])
  values = gpt.sweep_values(args)
  lengths = [1200, 2400, 4800]
  seeds = sweep.seeds_of(3)
  params = {"L3_d80": 231040, "L2_d64": 98688, "L2_d48": 55584, "L2_d32": 24768,
            "L2_d24": 13968, "L2_d16": 6240}

  def loss(size, seed, j):
    return 5 * params[size] ** -0.1 + (0.02 if size == "L3_d80" else 0.004) * 2.0 ** -j \
        + 0.005 * (seed - 1) * (len(seeds[size]) > 1)

  planned = [(s, seed, j) for s in seeds for seed in seeds[s] for j in range(3)]
  rows = [{"name": f"{s}_seed{seed}_x{j}", "eval_loss": loss(s, seed, j), "status": "done",
           "params": params[s], "params_total": params[s] + 5000, "wall_time_s": 10.0}
          for s, seed, j in planned]
  decision = gpt.plan(gpt.finals_of(rows, planned), seeds, 2)

  def fake_record(name, size, seed, index, row, workdir, lengths):
    tokens = lengths[index] * 1024
    return {"name": name, "size": size, "seed": seed, "index": index,
            "steps": lengths[index], "tokens": tokens, "branched_at": None,
            "final_loss": row["eval_loss"], "best_loss": row["eval_loss"],
            "best_step": lengths[index], "wall_time_s": 10.0,
            "curve": [{"step": lengths[index], "tokens": tokens, "eval_loss": row["eval_loss"]}]}

  monkeypatch.setattr(gpt, "run_record", fake_record)
  corpus_info = {"name": "corpus.txt", "vocab": 20, "chars": 13000, "train_chars": 11700,
                 "eval_tokens": 81920}
  est = gpt.estimate([{"size": "a", "flops_per_token": 1e5, "tokens_per_s": 1e4}], lengths,
                     1, 81920)
  results = gpt.collect(args, values, lengths, planned, rows, decision, corpus_info, est, 5.0)
  results.update(png="scaling_gpt.png")
  results["settings"]["parallel"] = 1
  text = report_check.write(args.out, results, gpt.render, gpt.plot)
  assert report_check.check("scaling_gpt", tmp_path / "out") == []
  assert results["fit_points"]["by_run"] and len(results["fit_points"]["params"]) == 12
  assert results["fits"]["kaplan"]["fit"]["params"]["alpha_N"] == pytest.approx(0.1, abs=0.01)
  assert "next to Kaplan et al. 2020" in text and "0.076" in text and "σ_seed" in text
  assert "| L3_d80 | x4 | 4,800 |" in text and "no: epoch cap" in text   # still falling
  assert text.count("yes (Δ < σ)") == 2 * 5                   # the other sizes, both doublings
  assert "## Back-tests" in text and "leave-largest-size-out" in text
  assert results["limits"]["kaplan"] is None and "No converged-loss estimate" in text \
      and "ran fewer than 5 lengths" in text      # 3 lengths: L(D) is not extrapolated
  kaplan_test = results["backtests"]["kaplan"]
  assert kaplan_test["result"]["sizes"][0]["size"] == "L3_d80"     # the largest held out
  assert kaplan_test["result"]["sizes"][0]["mean_rel_error"] < 0.05
  with pytest.raises(ValueError, match="older study's JSON"):
    gpt.render({"points": []})


def _vit_size(name, layers, d_model, errors, seed=None, per_image=1e6):
  """A size (or, with `seed`, a replicate) of scaling_vit's results with the made-up test
  errors `errors` at steps 300, 600, ..."""
  evals = [{"step": 300 * (i + 1), "images": 38400 * (i + 1),
            "compute": per_image * 38400 * (i + 1), "error": e, "eval_loss": 2 * e}
           for i, e in enumerate(errors)]
  best = min(evals, key=lambda e: e["error"])
  out = {"name": name, "num_layers": layers, "d_model": d_model, "params": layers * d_model ** 2,
         "params_total": layers * d_model ** 2 + 100, "flops_per_image": int(per_image),
         "tokens_per_image": 17, "steps": evals[-1]["step"], "images": evals[-1]["images"],
         "final_error": errors[-1], "best_error": best["error"], "best_step": best["step"],
         "wall_time_s": 10.0, "evals": evals}
  return out if seed is None else {**out, "seed": seed}


def test_vit_seed_sigma_pools_variances_over_evals_and_sizes(vit):
  sizes = [_vit_size("a", 1, 16, [0.30, 0.20]), _vit_size("b", 2, 48, [0.10, 0.05]),
           _vit_size("c", 3, 64, [0.04, 0.02])]
  seed_runs = [_vit_size("a1", 1, 16, [0.32, 0.22], seed=1),
               _vit_size("a2", 1, 16, [0.34], seed=2),         # stopped after one eval
               _vit_size("b1", 2, 48, [0.12, 0.05], seed=1)]   # c: seed 0 only
  sigma = vit.seed_sigma(sizes, seed_runs)
  assert [s["name"] for s in sigma["sizes"]] == ["a", "b"]
  a, b = sigma["sizes"]
  assert a["seeds"] == [0, 1, 2] and a["runs"] == ["a", "a1", "a2"]
  assert a["evals"][0]["errors"] == [0.30, 0.32, 0.34] and a["evals"][1]["errors"][2] is None
  assert a["evals"][0]["sd"] == pytest.approx(0.02) and a["evals"][1]["sd"] == \
      pytest.approx(np.std([0.20, 0.22], ddof=1))
  assert a["dof"] == 3 and b["dof"] == 2 and sigma["dof"] == 5
  ss_a = 2 * 0.02 ** 2 + 0.02 ** 2 / 2                   # (3 - 1) sd^2 + (2 - 1) sd^2
  assert a["sd"] == pytest.approx(np.sqrt(ss_a / 3))
  ss_b = 0.02 ** 2 / 2
  assert b["sd"] == pytest.approx(np.sqrt(ss_b / 2)) and b["evals"][1]["sd"] == 0.0
  assert sigma["pooled"] == pytest.approx(np.sqrt((ss_a + ss_b) / 5))
  logs = [np.log([0.30, 0.32, 0.34]), np.log([0.20, 0.22]), np.log([0.10, 0.12]), np.log([0.05] * 2)]
  ss_log = sum(np.sum((v - v.mean()) ** 2) for v in logs)
  assert sigma["pooled_log"] == pytest.approx(np.sqrt(ss_log / 5))
  # same seeds at every eval: the root mean variance
  even = vit.seed_sigma(sizes[:1], seed_runs[:1] + [_vit_size("a2", 1, 16, [0.34, 0.18], seed=2)])
  assert even["pooled"] == pytest.approx(np.sqrt(np.mean([
      np.var([0.30, 0.32, 0.34], ddof=1), np.var([0.20, 0.22, 0.18], ddof=1)])))
  assert vit.seed_sigma(sizes, []) is None


def test_vit_seed_flag_compares_sigma_in_the_fits_residual_space(vit):
  sigma = {"pooled": 0.01, "pooled_log": 0.08}
  flag = vit.seed_flag(sigma, {"rms_residual": 0.0757, "residual_space": "log"})
  assert flag == {"space": "log", "sigma": 0.08, "rms_residual": 0.0757, "flagged": True}
  assert not vit.seed_flag(sigma, {"rms_residual": 0.09, "residual_space": "log"})["flagged"]
  assert not vit.seed_flag(sigma, {"rms_residual": 0.02, "residual_space": "linear"})["flagged"]
  assert vit.seed_flag(sigma, {"rms_residual": 0.05})["flagged"]          # log by default
  assert vit.seed_flag(None, {"rms_residual": 0.05}) is None
  assert vit.seed_flag(sigma, None) is None


def _vit_study(vit, noise):
  """5 made-up sizes on E = 0.01 + 30 (C / 1e9)^-0.5 scaled per size, with seeds 1, 2 at
  exp(-noise), exp(+noise) times seed 0's error at the SEEDED sizes (sd of log error = noise)."""
  sizes, seed_runs = [], []
  for i, (layers, d) in enumerate(sorted(vit.SIZES, key=lambda s: s[0] * s[1] ** 2)):
    per_image = 1e5 * 3 ** i
    compute = per_image * 38400 * np.arange(1, 11)
    errors = 0.01 + 3.0 * (compute / 1e9) ** -0.5 * (1 + 0.3 * (4 - i) / 4) / (1 + 0.05 * i)
    errors = np.minimum(errors, 0.5)
    name = f"L{layers}_d{d}_s3000"
    sizes.append(_vit_size(name, layers, d, errors.tolist(), per_image=per_image))
    if (layers, d) in vit.SEEDED:
      for seed, sign in ((1, -1), (2, 1)):
        seed_runs.append(_vit_size(f"{name}_seed{seed}", layers, d,
                                   (errors * np.exp(sign * noise)).tolist(), seed=seed,
                                   per_image=per_image))
  meta = {"base": vit.BASE, "data": "mnist", "steps": 3000, "evals": 10, "compute": "C",
          "seeds": 3}
  return vit.results_of(meta, sizes, 0, float("inf"), seed_runs)


@pytest.mark.parametrize("noise", [0.15, 1e-4])
def test_vit_report_shows_the_seed_table_sigma_seed_and_the_flag(vit, tmp_path, noise):
  from experiments import report_check
  results = _vit_study(vit, noise)
  assert results["sigma_seed"]["pooled_log"] == pytest.approx(noise)
  rms = results["fit"]["rms_residual"]
  assert 1e-4 < rms < 0.15 and results["fit"]["residual_space"] == "log"
  assert results["sigma_seed"]["vs_fit"]["flagged"] == (noise > rms)
  text = report_check.write(tmp_path / "scaling_vit", results, vit.render)
  assert report_check.check("scaling_vit", tmp_path) == []        # render and refit from JSON
  assert "| run | step | C (FLOPs) | seed 0 | seed 1 | seed 2 | sd | sd (log error) |" in text
  for name in ("L1_d16_s3000", "L2_d48_s3000", "L3_d64_s3000"):        # a row per eval
    assert len(re.findall(rf"^\| {name} \| \d+ \| [\d.]+e\+\d+ \| ", text, re.M)) == 10
  assert not re.search(r"^\| L2_d64_s3000 \| \d+ \| [\d.]+e\+\d+ \| ", text, re.M)
  assert "| **L2_d48_s3000** | pooled (20 dof) |" in text and "60 degrees of freedom" in text
  assert f"**{noise:.4f}** in log error" in text
  assert ("**flagged**: sigma_seed exceeds the residual RMS" in text) == (noise > rms)
  assert ("Not flagged" in text) == (noise <= rms)
  assert [r["name"] for r in results["frontier"]] == [  # seed 0's runs only
      p["name"] for p in vit.pareto_frontier(results["sizes"])]
  assert not any("_seed" in p["name"] for p in results["frontier"])
  out = tmp_path / "scaling_vit"
  assert vit.main(["--refit", "--bootstrap=0", f"--out={out}"]) == 0      # keeps the seeds
  refitted = report_check.load(out)
  assert refitted["seed_runs"] == results["seed_runs"] and refitted["seeds"] == 3
  assert refitted["sigma_seed"]["pooled_log"] == pytest.approx(noise)
  assert (tmp_path / "scaling_vit.png").stat().st_size > 0


def test_vit_seed_zero_point_names_are_unchanged(vit):
  """The committed study's runs are seed 0's points: their names (and overrides) must not move,
  so a rerun with --seeds reuses them; the replicates are a sweep of their own."""
  import json
  from jaxformer import sweep

  committed = json.loads((ROOT / "experiments/results/scaling_vit.json").read_text())
  names = [p.name for p in sweep.expand(vit.sweep_spec("mnist:/x", 3000, 10), validate=False)]
  assert sorted(names) == sorted(s["name"] for s in committed["sizes"])
  assert names == ["L3_d64_s3000", "L2_d64_s3000", "L2_d48_s3000", "L1_d32_s3000",
                   "L1_d16_s3000"]
  seeds = sweep.expand(vit.seed_spec("mnist:/x", 3000, 10, 3), validate=False)
  assert [p.name for p in seeds] == [f"L{n}_d{d}_s3000_seed{k}" for n, d in vit.SEEDED
                                     for k in (1, 2)]
  assert len(vit.SEEDED) >= 3 and set(vit.SEEDED) <= set(vit.SIZES)
  base = sweep.expand(vit.sweep_spec("mnist:/x", 3000, 10), validate=False)[0].overrides
  assert {k: v for k, v in seeds[0].overrides.items() if k != "train.seed"} == base
  assert vit.seed_spec("mnist:/x", 3000, 10, 1) is None
  assert vit.parse_args(["--data=tfds:mnist"]).seeds == 3
  with pytest.raises(SystemExit):
    vit.parse_args(["--data=tfds:mnist", "--seeds=0"])


def test_vit_estimate_counts_unfinished_runs_from_measured_walls(vit, tmp_path):
  spec = vit.sweep_spec("tfds:mnist", 3000, 10)
  extra = vit.seed_spec("tfds:mnist", 3000, 10, 3)
  est = vit.estimate([(extra, str(tmp_path / "seeds"))], parallel=2)
  assert len(est["runs"]) == 6
  assert est["run_seconds"] == pytest.approx(2 * (640 + 436 + 264))
  assert est["wall_seconds"] == pytest.approx(640 + 436 + 264)        # pairs of equal runs
  both = vit.estimate([(spec, str(tmp_path)), (extra, str(tmp_path / "seeds"))], parallel=2)
  assert both["wall_seconds"] == pytest.approx(1169 + 1340)         # one sweep, then the other
  assert "11 run(s) to train" in vit.estimate_text(both, 2)
