"""Every committed scaling report is what its script computes from its committed JSON: the
markdown is `render(json)` byte for byte, and the fits' point estimates are what `refit(json)`
recomputes from the JSON's raw points (no bootstrap), to `report_check.RTOL` (1e-4: finer than
the reports print, far above where another CPU's rounding leaves the optimizers). A change to
a study's code that would change its report fails here until the report is regenerated
(`python -m experiments.<name> --report_only`, or a rerun of the study)."""

import json
import math

import pytest

from experiments import report_check

# Each study script with render/refit whose report is committed (in its script's current
# FORMAT).
REPORTS = ("scaling_vit", "mup_transfer", "scaling_gpt", "scaling_chinchilla", "posttrain",
           "captioning", "head_pruning", "routing_discipline", "routing_cache")


# scaling_chinchilla's refit (its bootstraps: ~22 s under load) runs in the full suite only
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n == "scaling_chinchilla" else n for n in REPORTS])
def test_committed_report_is_what_the_code_computes_from_its_json(name):
  results = report_check.load(report_check.RESULTS / name)
  module = report_check.script(name)
  assert results.get("format") == getattr(module, "FORMAT", results.get("format")), \
      f"{name}.json is in another format than experiments/{name}.py draws: rerun the study"
  assert report_check.check(name) == []


def test_the_gpt_report_holds_both_alpha_fits_and_the_extrapolation_backtest():
  """scaling_gpt: the upper-bound fit (final losses at the cap) and the fit to the
  extrapolated converged losses L_inf, both in the headline next to Kaplan's 0.076, with
  their intervals and resample counts, and the per-size back-test of the extrapolation."""
  from experiments import scaling_gpt
  results = report_check.load(report_check.RESULTS / "scaling_gpt")
  lim = results["limits"]
  assert [s["size"] for s in lim["sizes"]] == [s["size"] for s in results["sizes"]]
  for entry in [*(s["fit"] for s in lim["sizes"]), lim["kaplan"],
                lim["kaplan_sizes_resampled"]]:
    assert entry["bootstrap_attempted"] > 0
    assert entry["bootstrap_failed"] <= 0.1 * entry["bootstrap_attempted"]
  for s in lim["sizes"]:
    low, high = s["fit"]["ci"]["L_inf"]
    assert low <= s["fit"]["params"]["L_inf"] <= high
    assert s["fit"]["params"]["L_inf"] <= min(s["points"]["loss"])
    assert s["backtest"]["error"] == pytest.approx(s["backtest"]["predicted"]
                                                   - s["backtest"]["measured"])
  headline = scaling_gpt.headline(results)
  text = (report_check.RESULTS / "scaling_gpt.md").read_text()
  assert headline in text and "0.076" in headline
  for fit in (results["fits"]["kaplan"]["fit"], lim["kaplan"]):
    low, high = fit["ci"]["alpha_N"]
    assert low <= fit["params"]["alpha_N"] <= high
    assert f"{fit['params']['alpha_N']:.4f} [{low:.4f}, {high:.4f}]" in headline


def test_the_captioning_report_pairs_each_attention_model_with_its_pooled_twin():
  """captioning: every model scored on the same composites per digit count; each attention
  model is above its pooled twin beyond both Wilson intervals at every count."""
  from jaxformer.scaling import stats
  results = report_check.load(report_check.RESULTS / "captioning")
  models, first = results["models"], f"beam{results['beams'][0]}"
  for name, r in models.items():
    counts = [r["metrics"][first][str(n)]["count"] for n in results["digits"]]
    assert counts == [results["examples_per_count"]] * len(counts), name
    if not r["attention"]:
      continue
    twin = models[name + "_pooled"]["metrics"][first]
    for n in map(str, results["digits"]):
      a, b = r["metrics"][first][n], twin[n]
      low = stats.wilson_interval(round(a["exact"] * a["count"]), a["count"])[0]
      high = stats.wilson_interval(round(b["exact"] * b["count"]), b["count"])[1]
      assert low > high, (name, n)
  for name in results["attention_figures"]:
    assert (report_check.RESULTS / results["attention_figures"][name]).is_file()


def test_the_posttrain_report_scores_four_models_on_the_same_held_out_prompts():
  """posttrain: pretrained, SFT, DPO and RLVR checked on one prompt set (greedy: one response
  per prompt; sampled: eval_samples each), the pretrained base rate near 0, the on-policy KLs,
  DPO's logged reward accuracy and RLVR's reward curve present."""
  from experiments import posttrain
  results = report_check.load(report_check.RESULTS / "posttrain")
  setup, scores = results["setup"], results["scores"]
  assert list(scores) == list(posttrain.MODELS)
  for name in posttrain.MODELS:
    assert scores[name]["greedy"]["n"] == setup["eval_prompts"]
    assert scores[name]["sampled"]["n"] == setup["eval_prompts"] * setup["eval_samples"]
  assert scores["pretrained"]["greedy"]["rate"] <= 0.02
  assert scores["dpo"]["kl_to_sft"]["n"] == scores["sft"]["kl_to_pretrained"]["n"]
  assert 0 <= results["dpo_logged"]["eval_last"]["eval_accuracy"] <= 1
  assert results["pairs"]["pairs"] == results["pairs"]["prompts"] - results["pairs"][
      "all_accepted"]
  assert scores["rlvr"]["kl_to_sft"]["n"] == scores["dpo"]["kl_to_sft"]["n"]
  curve, evals = results["rlvr_logged"]["train"], results["rlvr_logged"]["eval"]
  assert len(curve) >= 2 and all(0 <= r["reward"] <= 1 for r in curve)
  assert curve[-1]["step"] == evals[-1]["step"] == setup["rl_steps"]


def test_check_names_a_stale_report_and_a_moved_estimate(tmp_path):
  src = report_check.RESULTS / "scaling_vit"
  results = json.loads(src.with_suffix(".json").read_text())
  (tmp_path / "scaling_vit.md").write_text(src.with_suffix(".md").read_text() + "edited\n")
  results["fit"]["params"]["b"] *= 1 + 2 * report_check.RTOL
  (tmp_path / "scaling_vit.json").write_text(json.dumps(results))
  problems = report_check.check("scaling_vit", tmp_path)
  assert len(problems) == 2
  assert "differs from render" in problems[0] and "--report_only" in problems[0]
  assert "fit.b" in problems[1]


def test_compare_estimates():
  assert report_check.compare_estimates({"k": {"a": 1.0}}, {"k": {"a": 1.0 + 1e-9}}) == []
  assert report_check.compare_estimates({"k": None}, {"k": None}) == []
  assert report_check.compare_estimates({"k": {"a": math.inf}}, {"k": {"a": None}}) == []
  assert "refitted None" in report_check.compare_estimates({"k": None}, {"k": {"a": 1}})[0]
  assert "parameters" in report_check.compare_estimates({"k": {"a": 1}}, {"k": {"b": 1}})[0]


def test_report_only_rewrites_the_markdown_from_the_json(tmp_path, capsys):
  from experiments import scaling_vit
  src = report_check.RESULTS / "scaling_vit"
  (tmp_path / "scaling_vit.json").write_text(src.with_suffix(".json").read_text())
  assert scaling_vit.main(["--report_only", f"--out={tmp_path / 'scaling_vit'}"]) == 0
  assert (tmp_path / "scaling_vit.md").read_text() == src.with_suffix(".md").read_text()
  assert (tmp_path / "scaling_vit.png").stat().st_size > 0
  with pytest.raises(SystemExit) as e:
    scaling_vit.main(["--report_only", f"--out={tmp_path / 'missing'}"])
  assert e.value.code == 2 and "no missing.json there" in capsys.readouterr().err


def test_the_head_pruning_report_states_what_its_evaluations_give():
  """head_pruning: the verdict per model follows from the paired intervals recomputed from the
  raw per-batch NLLs; no method changes the unpruned model (fraction 0 is one perplexity);
  training moved the gates off their init of 1."""
  from experiments import head_pruning
  results = report_check.load(report_check.RESULTS / "head_pruning")
  text = (report_check.RESULTS / "head_pruning.md").read_text()
  assert set(results["models"]) == {"readme", "deep"}
  for name, r in results["models"].items():
    summary = head_pruning.summarize(r)
    assert len({c[0]["perplexity"] for c in summary["curves"].values()}) == 1
    assert max(abs(g - 1) for row in r["gates"] for g in row) > 0.05
    for c in summary["comparisons"]:
      low, high = c["importance_minus_layer_ci95"]
      assert low <= c["importance"] - c["layer"] <= high
    section = text.split(f"## `{name}`")[1].split("## `")[0]
    for m in head_pruning.HEAD_METHODS:
      words = head_pruning.PHRASES[head_pruning.verdict(summary["comparisons"], m)]
      assert f"{head_pruning.LABELS[m]}: {words} layers" in section
