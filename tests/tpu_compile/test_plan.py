"""Planning a run without its data or its chips: the batch layout a plan compiles must be the
one the real pipelines produce (`jaxformer.data.batch_spec`), and the plan's step is the
trainer's own."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import bert_mlm_shakespeare, seq2seq_synthetic, shakespeare_char, vit_tiny
from jaxformer import models
from jaxformer import tasks
from jaxformer.train import config_checks
from tests.repo_root import REPO


def _docs_dir(tmp_path):
  docs = tmp_path / "docs"
  docs.mkdir()
  with open(docs / "a.jsonl", "w") as f:
    for i in range(40):
      f.write(json.dumps({"text": f"document {i} " + "words and more words " * (i % 7 + 1)})
              + "\n")
  return str(docs)


def _configs(tmp_path):
  packed = shakespeare_char.get_config("tiny")
  packed.data.source = _docs_dir(tmp_path)
  return {
      "lm stream": shakespeare_char.get_config("tiny"),
      "lm packed": packed,
      "mlm": bert_mlm_shakespeare.get_config("tiny"),
      "classification": vit_tiny.get_config("digits"),
      "seq2seq": seq2seq_synthetic.get_config(),
  }


@pytest.mark.parametrize("name", ["lm stream", "lm packed", "mlm", "classification",
                                  "seq2seq"])
def test_batch_spec_matches_the_pipelines_first_batch(name, tmp_path):
  cfg = _configs(tmp_path)[name]
  cfg.train.batch_size = 4
  settings = config_checks.validate(cfg)
  task = tasks.task_for(cfg.model)
  pipeline = task.make_pipeline(cfg, settings, workdir=str(tmp_path / "run"))
  batch = pipeline.train_batch(0)
  spec = task.batch_spec(cfg, settings, models.with_defaults(cfg.model))
  got = {k: (tuple(v.shape), np.asarray(v).dtype) for k, v in batch.items()}
  assert spec == got


# --- compiled for TPU topologies (libtpu's compile-only devices) ------------------------------

needs_libtpu = pytest.mark.skipif(
    __import__("importlib").util.find_spec("libtpu") is None,
    reason='libtpu is not installed (pip install -e ".[tpu]"): no compile-only TPU devices')


def _tiny(*, batch: int = 8, seq: int = 64, vocab: int = 128, **model):
  """gpt2:tiny (2 layers, d_model 64) with a vocabulary every mesh divides, bf16, scanned."""
  from configs import gpt2
  cfg = gpt2.get_config("tiny")
  cfg.model.update(vocab_size=vocab, dtype="bfloat16", scan_layers=True, max_len=seq, **model)
  cfg.data.seq_len = seq
  cfg.train.batch_size = batch
  return cfg


def _too_big(**model):
  """A step whose float32 logits (12 GiB per v5e chip: 4 rows x 512 tokens x 1.5M classes,
  the dense loss: the chunked one never holds them) make it need ~20 GiB: refused at
  grad_accum=1, fits at 2 (~11.5 GiB). 512 tokens, not 2048: a fitting compile of it costs
  ~17 s of CPU, not ~27."""
  cfg = _tiny(batch=16, seq=512, vocab=3 * 2**19, **model)
  cfg.train.loss_chunk = 0
  return cfg


def _flags(cfg) -> list[str]:
  """The --config.* flags that turn configs/gpt2.py:tiny (the CLI's --config) into `cfg`."""
  from configs import gpt2
  base = {f"{s}.{k}": v for s, fields in gpt2.get_config("tiny").to_dict().items()
          for k, v in fields.items()}
  return [f"--config.{s}.{k}={v}" for s, fields in cfg.to_dict().items()
          for k, v in fields.items() if base.get(f"{s}.{k}") != v]


def test_out_of_memory_refusals_parse():
  from jaxformer.train.program import parse_out_of_memory
  assert parse_out_of_memory(
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
      "temporaries (31.47G) exceeds available HBM (15.75G).") == (
          int(31.47 * 2**30), int(15.75 * 2**30))
  assert parse_out_of_memory("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. "
                             "Used 20.51G of 15.75G hbm. Exceeded hbm capacity by 4.76G."
                             ) == (int(20.51 * 2**30), int(15.75 * 2**30))
  assert parse_out_of_memory("INVALID_ARGUMENT: something else") is None


def _kernel_config(impl: str):
  """Data parallel on v5e:2x2, one 128-wide head at 512 tokens: 4 x 4 query/key blocks of
  128 per sequence for the Pallas kernels."""
  cfg = _tiny(batch=4, seq=512, d_model=128, num_heads=1, attention_impl=impl)
  cfg.mesh.update(data=4, model=1, fsdp=False)
  return cfg


@pytest.fixture(scope="module")
def xla_plan():
  """The data-parallel XLA-attention plan: the memory-by-hand test's 'dp' strategy and the
  Pallas costing test's reference (one compile for both)."""
  from jaxformer.plan import estimate
  return estimate.plan(_kernel_config("xla"), "v5e:2x2")


@needs_libtpu
def test_plan_memory_by_hand_and_collectives_of_each_strategy(xla_plan):
  """Data parallel: every chip holds all parameters (4 bytes each) and Adam's two moments,
  and gradients are all-reduced over 'data'; FSDP gathers parameters and scatters gradients
  over 'data'; tensor parallelism communicates over 'model' only. The report a fitting plan
  writes (`--json`) and prints."""
  from jaxformer import scaling
  from jaxformer.plan import estimate
  plans = {"dp": xla_plan}
  for name, mesh in {"fsdp": dict(data=4, model=1, fsdp=True),
                     "tp": dict(data=1, model=4, fsdp=False)}.items():
    cfg = _tiny()
    cfg.mesh.update(mesh)
    plans[name] = estimate.plan(cfg, "v5e:2x2")
  dp = plans["dp"]
  n = scaling.count_params(_kernel_config("xla").model)["total"]
  assert dp.fits and dp.chips == 4 and dp.hbm_bytes == 16 * 2**30
  assert dp.per_chip_bytes["params"] == 4 * n
  assert 8 * n <= dp.per_chip_bytes["optimizer"] <= 8 * n + 64      # mu, nu (+ counters)
  assert dp.per_chip_bytes["total"] >= dp.per_chip_bytes["params"] * 3
  # FSDP shards every matrix's embed dim 4 ways; the few vectors without one stay whole
  n = scaling.count_params(_tiny().model)["total"]
  assert n <= plans["fsdp"].per_chip_bytes["params"] < 4 * n / 3
  data = json.loads(json.dumps(dp.to_json()))
  for key in ("fits", "hbm_bytes", "per_chip_bytes", "flops_per_step", "collectives",
              "estimated_step_seconds", "compile_seconds"):
    assert key in data
  assert data["fits"] and set(data["per_chip_bytes"]) == {"params", "optimizer", "temp",
                                                          "total", "host"}
  assert "fits" in estimate.table(dp) and "MFU implied" in estimate.table(dp)

  def kinds(plan, axis):
    return {rec["kind"] for rec in plan.collectives.values() if axis in rec["axes"]}

  assert "all-reduce" in kinds(dp, "data") and "all-gather" not in kinds(dp, "data")
  assert {"all-gather", "reduce-scatter"} <= kinds(plans["fsdp"], "data")
  assert kinds(plans["tp"], "model") and not kinds(plans["tp"], "data")
  from jaxformer import tpu_flags     # compiled with the overlap flags, and the plan says so
  for p in plans.values():
    assert p.compiler_flags == tpu_flags.in_effect() == p.to_json()["compiler_flags"]
    assert "--xla_tpu_enable_async_collective_fusion=true" in p.compiler_flags
    assert "TPU compiler flags (LIBTPU_INIT_ARGS): " in estimate.table(p)
    assert p.estimated_step_seconds > 0 and p.roofline["step_seconds"] > 0
    assert 0.5 < p.flops_per_step["compiler"] / p.flops_per_step["analytic"] < 3
    # the compiler estimate = its compute + the communication its schedule leaves exposed
    e = p.estimate
    assert e["compute_seconds"] + e["exposed_communication_seconds"] == pytest.approx(
        p.estimated_step_seconds)
    assert e["communication_seconds"] == pytest.approx(
        p.roofline["ici_seconds"] + p.roofline["dcn_seconds"])
    assert 0 <= e["exposed_communication_seconds"] <= e["communication_seconds"]


@pytest.fixture(scope="module")
def plan_cache(tmp_path_factory):
  """One compile cache for the file's plans of `_too_big()`: the CLI's plan of it (its flags
  give exactly that config) is the search's grad_accum=1 candidate, compiled once, and
  --nearest's fitting change is one of the search's."""
  return str(tmp_path_factory.mktemp("plans"))


def _too_big_cli(plan_cache, tmp_path, *flags):
  """`python -m jaxformer.plan --json ... *flags` of `_too_big()` through `plan_cache`:
  (the finished process, its --json report or None)."""
  report = tmp_path / "plan.json"
  result = _run("jaxformer.plan", "--config=configs/gpt2.py:tiny", "--topology=v5e:2x2",
                f"--json={report}", f"--cache_dir={plan_cache}", *flags,
                *_flags(_too_big()), cwd=REPO)
  return result, json.loads(report.read_text()) if report.exists() else None


@needs_libtpu
def test_a_step_that_cannot_fit_is_reported_not_fitting_and_exits_3(plan_cache, tmp_path):
  """Through `python -m jaxformer.plan`, as a script sees it: the plan printed and written,
  and exit code 3 (not 0, not the user-error 2)."""
  from jaxformer.plan import EXIT_DOES_NOT_FIT
  result, p = _too_big_cli(plan_cache, tmp_path)
  assert result.returncode == EXIT_DOES_NOT_FIT == 3, result.stderr[-2000:]
  assert "does NOT fit" in result.stdout and "Traceback" not in result.stderr
  assert not p["fits"] and "RESOURCE_EXHAUSTED" in p["refusal"]
  assert p["per_chip_bytes"]["temp"] > 16 * 2**30


@needs_libtpu
@pytest.mark.slow
def test_search_returns_the_best_of_a_space_ranked_by_hand(plan_cache):
  """Gradient accumulation 1, 2 or 4 (8 would leave a micro-batch the 4 batch shards cannot
  split): 1 does not fit, and of 2 and 4 the one with fewer, larger micro-batches is faster.
  A rerun reads every compile from the cache (1's may already be there: `plan_cache`)."""
  from jaxformer.plan import search
  result = search.search(_too_big(), "v5e:2x2", dimensions=["accum"], workers=1,
                         cache_dir=plan_cache, log=lambda *_: None)
  by_accum = {c.overrides["optim.grad_accum"]: c for c in result.candidates}
  assert by_accum[8].status == "pruned" and "does not split" in by_accum[8].reason
  assert by_accum[1].status == "compiled" and not by_accum[1].fits
  assert by_accum[2].fits and by_accum[4].fits
  assert result.best is by_accum[2]
  again = search.search(_too_big(), "v5e:2x2", dimensions=["accum"], workers=1,
                        cache_dir=plan_cache, log=lambda *_: None)
  assert again.best.overrides == {"optim.grad_accum": 2} and again.seconds < result.seconds
  assert "optim.grad_accum=2" in search.table(again)


def _run(module: str, *args: str, cwd=None):
  import os
  import subprocess
  import sys
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                        env=env, cwd=cwd, timeout=600)


@needs_libtpu
@pytest.mark.slow
def test_plan_cli_nearest_and_the_trainers_fit_check(plan_cache, tmp_path):
  """--nearest finds a change that fits a step that does not; the trainer's own check
  (`train.program.require_fit`, what a run on TPU does before it writes anything) refuses
  that step in one line naming the shortfall and the levers. (The CLI's --json and exit codes:
  test_a_step_that_cannot_fit_...; a fitting plan's report: test_plan_memory_by_hand_...)"""
  from jaxformer.plan import topology
  from jaxformer.train import program
  nearest, _ = _too_big_cli(plan_cache, tmp_path, "--nearest")   # refused: in the cache
  assert nearest.returncode == 3, nearest.stderr[-2000:]
  assert "nearest change that fits: --config." in nearest.stdout, nearest.stdout[-2000:]
  cfg = _too_big()
  with pytest.raises(ValueError) as refused:
    program.require_fit(cfg, config_checks.validate(cfg), topology.devices("v5e:2x2"))
  line = str(refused.value)
  assert "\n" not in line and "short by" in line and "optim.grad_accum" in line
  assert "python -m jaxformer.plan" in line and "--nearest" in line


def test_train_plan_only_is_refused_with_the_planners_command(monkeypatch):
  """`train --plan_only` (and --topology, --slices) is refused in one line that gives the
  equivalent `python -m jaxformer.plan` command, before JAX starts a backend."""
  import sys
  import types
  from jaxformer.train import __main__ as train_main
  from tests.user_errors import user_error
  argv = ["--config=configs/gpt2.py:tiny", "--plan_only", "--topology=v5e:2x2",
          "--config.train.batch_size=16", "--workdir=/tmp/x"]
  monkeypatch.setattr(sys, "argv", ["train", *argv])
  given = types.SimpleNamespace(plan_only=True, topology="v5e:2x2", slices=None)
  monkeypatch.setattr(train_main, "flags", types.SimpleNamespace(FLAGS=given))
  user_error(lambda: train_main.main([]), "python -m jaxformer.plan "
             "--config=configs/gpt2.py:tiny --config.train.batch_size=16 --topology=v5e:2x2")
  given.plan_only, given.topology, given.slices = False, None, 2
  user_error(lambda: train_main.main([]), "--topology=<a TPU topology", "--slices=2")


@needs_libtpu
def test_plan_user_errors_name_the_flag_or_field():
  """A topology libtpu does not know and a mesh the topology cannot hold: user errors (what
  the CLI prints as one `error:` line with exit 2, through a subprocess in test_cli's
  plan_json_unwritable), raised before compiling."""
  from jaxformer.plan import estimate
  from tests.user_errors import user_error
  user_error(lambda: estimate.plan(_tiny(), "v9z:2x2"), "--topology='v9z:2x2'")
  cfg = _tiny()
  cfg.mesh.data = 3
  user_error(lambda: estimate.plan(cfg, "v5e:2x2"), "mesh data=3")


@pytest.fixture(scope="module")
def two_slice_plans():
  """Two v5e:2x2 slices with FSDP (one compile each, shared by the two tests below):
  mesh.data=8 spans both slices; mesh.replica=2 is a replica per slice, FSDP over its 4
  chips."""
  from jaxformer.plan import estimate
  plans = {}
  for name, mesh in {"data": dict(data=8), "hybrid": dict(replica=2, data=4)}.items():
    cfg = _tiny()
    cfg.mesh.update(model=1, fsdp=True, **mesh)
    plans[name] = estimate.plan(cfg, "v5e:2x2", slices=2)
  return plans


def _dcn(p):
  return [(r["kind"], tuple(r["axes"])) for r in p.collectives.values() if r["dcn"]]


@needs_libtpu
@pytest.mark.slow
def test_two_slices_put_the_data_axis_exchange_on_dcn(two_slice_plans):
  """mesh.data=8 over all 8 chips of two slices: what 'data' exchanges (FSDP's parameter
  gathers and gradient scatters) crosses the slices over the data-centre network, and the
  roofline charges DCN time for it."""
  from jaxformer.plan import estimate
  p = two_slice_plans["data"]
  assert p.chips == 8 and p.slices == 2
  assert _dcn(p) and all(axes == ("data",) for _, axes in _dcn(p))
  assert p.roofline["dcn_seconds"] > 0
  assert "x 2 slices" in estimate.table(p)


@needs_libtpu
@pytest.mark.slow
def test_hybrid_sharding_keeps_parameter_gathers_on_ici(two_slice_plans):
  """mesh.data=8 spanning both slices all-gathers parameters over DCN; mesh.replica=2
  gathers them over ICI only, and what crosses DCN is the gradients' all-reduce over
  'replica'."""
  plans = two_slice_plans
  assert ("all-gather", ("data",)) in _dcn(plans["data"])
  hybrid = plans["hybrid"]
  assert hybrid.mesh == dict(replica=2, data=4, model=1, expert=1)
  assert _dcn(hybrid) == [("all-reduce", ("replica",))]
  assert any(r["kind"] == "all-gather" and tuple(r["axes"]) == ("data",) and not r["dcn"]
             for r in hybrid.collectives.values())
  # (which one spends less DCN time depends on the model: at this size the gradients'
  # all-reduce outweighs the bf16 parameter gathers, so it is not asserted)
  assert hybrid.roofline["dcn_seconds"] > 0


@needs_libtpu
def test_pallas_attention_kernels_are_costed_at_a_stated_efficiency(xla_plan):
  """The Pallas kernels' matmuls are no HLO dots and they carry no compiler cycles: their
  cost_estimate puts the plan's FLOPs near the XLA attention plan's (causal blocks skipped)
  and adds their roofline / KERNEL_EFFICIENCY to the compiler's step time estimate."""
  from jaxformer.plan import estimate
  plans = {"xla": xla_plan, "pallas": estimate.plan(_kernel_config("pallas"), "v5e:2x2")}
  xla, pallas = plans["xla"], plans["pallas"]
  kernels = pallas.kernels
  assert kernels["count"] == 3 and kernels["uncosted"] == 0
  assert kernels["executions"] == 3 * 2                      # forward, dq, dk/dv per layer
  # per chip: 1 sequence, 1 head of 128, 4 x 4 blocks of 128 of which 10 causal, 2 layers:
  # (4 + 6 + 8) 128^3 flops per block pair
  assert kernels["flops"] == 2 * 18 * 10 * 128**3
  assert xla.kernels["count"] == 0 and xla.kernels["roofline_seconds"] == 0
  ratio = pallas.flops_per_step["compiler"] / xla.flops_per_step["compiler"]
  assert 0.7 < ratio <= 1.0, ratio
  without = (pallas.flops_per_step["compiler"] - 4 * kernels["flops"]) / \
      xla.flops_per_step["compiler"]
  assert without < 0.7 * ratio            # the kernels are a large part of the step
  assert pallas.estimated_step_seconds >= kernels["seconds"] > kernels["roofline_seconds"] > 0
  assert kernels["seconds"] == pytest.approx(kernels["roofline_seconds"]
                                             / estimate.KERNEL_EFFICIENCY)
  assert 0 < estimate.KERNEL_EFFICIENCY < 1
  assert pallas.mfu["roofline"] < 1 and pallas.to_json()["kernels"] == kernels
  assert (f"(incl. 3 Pallas kernels at {100 * estimate.KERNEL_EFFICIENCY:.0f}% of their "
          f"roofline") in estimate.table(pallas)
  assert estimate.KERNEL_EFFICIENCY_SOURCE in estimate.table(pallas)
  assert "WARNING" not in estimate.table(pallas)


def test_the_search_can_vary_the_optimizer_state_levers():
  from jaxformer.plan import search
  from jaxformer.train import config_checks
  cfg = _tiny()
  found = search.candidate_overrides(cfg, 4, ["optimizer", "attention"])
  states = {(c["optim.state_dtype"], c["optim.offload_state"]) for c in found}
  assert states == set(search.OPTIMIZER_STATES) and len(found) == 3 * 3
  assert {c["model.attention_impl"] for c in found} == {"xla", "pallas", "splash"}
  for c in found:                 # every candidate is a config the trainer accepts
    config_checks.validate(search.with_overrides(cfg, c))


def test_memory_levers_are_not_compiled_where_a_sibling_fits_without_them():
  """A candidate that fits with float32 moments on device makes its siblings that differ only
  by bf16 or offloaded moments pointless: they wait while it compiles, and are pruned if it
  fits (ViT-H's search compiled three siblings of one estimate before this)."""
  from jaxformer.plan import search
  cfg = _tiny()
  found = [search.Candidate(c) for c in search.candidate_overrides(
      cfg, 4, ["optimizer", "attention"])]
  plain = {c.overrides["model.attention_impl"]: c for c in found
           if search._levers_used(c.overrides) == 0}
  for c in found:
    impl = c.overrides["model.attention_impl"]
    heavier = search._levers_used(c.overrides) > 0
    assert search._heavier_sibling(c, plain[impl]) == heavier
    for other in plain.values():
      if other.overrides["model.attention_impl"] != impl:
        assert not search._heavier_sibling(c, other)
  bf16 = next(c for c in found if c.overrides["optim.state_dtype"] == "bfloat16"
              and not c.overrides["optim.offload_state"]
              and c.overrides["model.attention_impl"] == "xla")
  offloaded = next(c for c in found if c.overrides["optim.offload_state"]
                   and c.overrides["model.attention_impl"] == "xla")
  assert search._heavier_sibling(offloaded, bf16) and not search._heavier_sibling(bf16, offloaded)
  # equal rough estimates: the fewest levers compile first
  for c in found:
    c.rough_seconds = 1.0
  order = sorted(found, key=search._order_key(search.Margin(), 2**40))
  assert [search._levers_used(c.overrides) for c in order] == sorted(
      search._levers_used(c.overrides) for c in found)


def test_the_search_learns_what_accumulation_costs_beyond_its_rough_estimate():
  from jaxformer.plan import search
  def candidate(accum, rough, est=None):
    c = search.Candidate({"optim.grad_accum": accum}, rough_seconds=rough)
    if est is not None:
      c.status, c.plan = "compiled", {"fits": True, "estimated_step_seconds": est}
    return c
  pace = search.Pace()
  untried = [candidate(1, 1.0), candidate(4, 0.9)]
  order = lambda: sorted(untried, key=search._order_key(search.Margin(), 2**40, pace))
  assert [c.overrides["optim.grad_accum"] for c in order()] == [4, 1]   # rough order
  pace.learn(candidate(4, 0.5, est=1.0))     # 4 micro-batches: 2x the rough estimate
  pace.learn(candidate(1, 0.5, est=0.6))     # 1: 1.2x
  assert pace.value(untried[1]) == 2.0 and pace.value(untried[0]) == 1.2
  assert [c.overrides["optim.grad_accum"] for c in order()] == [1, 4]
  assert pace.value(candidate(8, 1.0)) == 2.0 and pace.value(candidate(2, 1.0)) == 1.2
  pace.learn(candidate(2, 1.0))              # not compiled: nothing learnt
  assert pace.value(candidate(2, 1.0)) == 1.2


def test_exposed_communication_is_what_a_scope_cannot_hide_behind_its_own_compute():
  """Per scope: synchronous collectives in full, asynchronous ones beyond the scope's compute;
  one scope's compute never hides another's collectives."""
  import dataclasses
  from jaxformer import accelerators as chips
  from jaxformer.plan import hlo
  from jaxformer.plan import estimate
  chip = dataclasses.replace(chips.CHIPS["v5e"], clock_hz=1e9, ici_bytes_per_s=4e9,
                             ici_ports=2, dcn_bytes_per_s=1e9)
  assert chip.ici_axis_bytes_per_s == 2e9
  stats = lambda scopes: hlo.ProgramStats(collectives={}, estimated_cycles=0, matmul_flops=0,
                                          hbm_bytes=0, loops=[], comm_scopes=scopes)
  # (cycles, async ICI bytes, sync ICI bytes, async DCN bytes, sync DCN bytes)
  assert estimate.exposed_communication(stats([(3e9, 2e9, 0, 0, 0)]), chip) == 0   # 1 s < 3 s
  assert estimate.exposed_communication(stats([(1e9, 8e9, 0, 0, 0)]), chip) == 3.0  # 4 s - 1
  assert estimate.exposed_communication(stats([(5e9, 0, 4e9, 0, 1e9)]), chip) == 3.0  # sync
  assert estimate.exposed_communication(stats([(5e9, 0, 0, 2e9, 0)]), chip) == 0     # hidden
  assert estimate.exposed_communication(stats([(0, 2e9, 0, 0, 0), (9e9, 0, 0, 0, 0)]),
                                        chip) == 1.0
  assert estimate.exposed_communication(stats([]), chip) == 0


def test_plan_table_warns_of_kernels_without_a_cost():
  from jaxformer import accelerators as chips
  from jaxformer.plan import estimate
  p = estimate.Plan(
      topology="v5e:2x2", slices=1, chips=4, chip=chips.CHIPS["v5e"], mesh={"data": 4},
      fsdp=False, fits=True,
      per_chip_bytes={"params": 1, "optimizer": 2, "temp": 3, "total": 6},
      flops_per_step={"compiler": 2e9, "analytic": 1e9}, collectives={},
      estimated_step_seconds=1e-3, roofline={k: 1e-4 for k in (
          "compute_seconds", "hbm_seconds", "ici_seconds", "dcn_seconds", "step_seconds")},
      mfu={"estimate": 0.1, "roofline": 0.5}, compile_seconds=1.0,
      kernels={"count": 1, "executions": 2, "flops": 1e8, "bytes": 1e6,
               "roofline_seconds": 2e-5, "efficiency": 0.5, "efficiency_source": "a paper",
               "seconds": 4e-5, "uncosted": 2})
  text = estimate.table(p)
  assert "(incl. 1 Pallas kernel at 50% of its roofline, 0.040 ms; a paper)" in text
  assert "WARNING: 2 custom kernel(s) carry no cost" in text
  assert json.loads(json.dumps(p.to_json()))["kernels"]["uncosted"] == 2


def test_splash_calls_are_counted_from_their_result_shapes():
  """`splash_kernel_flops` reads batch, heads, length and head_dim from an uncosted splash
  call's result (`hlo.arrays`: layouts, memory spaces and integer arrays aside); dk/dv count
  the query heads of each kv head."""
  from configs import llama
  from jaxformer.ops.pallas import splash
  from jaxformer.plan import estimate, hlo
  assert hlo.arrays("(bf16[2,4,256,64]{3,2,1,0:T(8,128)(2,1)}, f32[2,4,256]{2,1,0:S(1)}, "
                    "s32[], u8[<=8])") == [("bf16", (2, 4, 256, 64)), ("f32", (2, 4, 256)),
                                           ("s32", ()), ("u8", (8,))]
  cfg = llama.get_config("tiny").model
  cfg.update(num_heads=4, num_kv_heads=2, window=None)
  uncosted = {"splash_mha_fwd_residuals.3": {"executions": 2, "shape":
                  "(s32[2], bf16[2,4,256,64]{3,2,1,0}, f32[2,4,256]{2,1,0})"},
              "splash_mha_dkv_no_residuals.1": {"executions": 2, "shape":
                  "(bf16[2,2,256,64]{3,2,1,0}, bf16[2,2,256,64]{3,2,1,0})"},
              "some_other_kernel": {"executions": 1, "shape": "f32[8]"}}
  stats = hlo.ProgramStats(collectives={}, estimated_cycles=0, matmul_flops=0, hbm_bytes=0,
                           loops=[], uncosted=uncosted)
  flops = estimate.splash_kernel_flops(stats, cfg)
  args = dict(batch=2, heads=4, tq=256, tk=256, head_dim=64, causal=True)
  assert flops == {"splash_mha_fwd_residuals.3": splash.kernel_flops("fwd", **args),
                   "splash_mha_dkv_no_residuals.1": splash.kernel_flops("dkv", **args)}


def test_the_search_can_vary_hybrid_replicas_of_an_fsdp_mesh():
  from jaxformer.plan import search
  from jaxformer.train import config_checks
  cfg = _tiny()
  plain = search.candidate_overrides(cfg, 8, ["mesh", "fsdp"])
  found = search.candidate_overrides(cfg, 8, ["mesh", "fsdp", "replica"])
  hybrid = [c for c in found if c["mesh.replica"] > 1]
  # every replica count below the chips, each over an FSDP mesh of the remaining chips
  assert {c["mesh.replica"] for c in hybrid} == {2, 4}
  assert all(c["mesh.fsdp"] and c["mesh.data"] > 1 for c in hybrid)
  assert all(c["mesh.replica"] * c["mesh.data"] * c["mesh.model"] == 8 for c in hybrid)
  assert len(found) - len(hybrid) == len(plain)
  for c in hybrid:                 # every candidate is a config the trainer accepts
    config_checks.validate(search.with_overrides(cfg, c))
