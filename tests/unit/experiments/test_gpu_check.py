"""experiments/gpu_check.py, the prepared GPU check, in its --smoke mode on the CPU: the same
code paths as on a GPU (every attention impl against xla, values and gradients; the GPT-2 and
Llama train steps through the planner's program), tiny."""

import json

import numpy as np
import pytest

from experiments import gpu_check
from jaxformer.ops import attention


@pytest.mark.slow
def test_smoke_checks_every_impl_and_both_train_steps(tmp_path):
  assert gpu_check.main(["--smoke", "--out", str(tmp_path)]) == 0
  report = json.loads((tmp_path / "gpu_check.json").read_text())
  assert report["complete"] and report["env"]["platform"] == "cpu"
  assert report["env"]["jax"] and report["env"]["jaxlib"]
  rows = {(r["dtype"], r["impl"]): r for r in report["attention"]}
  for dtype in ("bfloat16", "float32"):
    for impl in attention.IMPLS:
      if impl == "xla":
        continue
      row = rows[dtype, impl]
      if impl == "cudnn":                    # off a GPU: refused, with cuDNN's reason
        assert "refused" in row["note"] and "GPU" in row["note"]
        continue
      if impl == "splash" and "refused" in row.get("note", ""):   # TPU-only; the smoke
        assert "impl='splash'" in row["note"]     # shapes are not multiples of 128 either
        continue
      assert row["ok"], row
      assert len(row["err_over_tol"]) == 4 and max(row["err_over_tol"]) <= 1
      assert all(t > 0 for t in row["tolerance"]) and row["ms"] > 0
  # bf16's tolerance adds one rounding of each term: far above float32's
  assert (rows["bfloat16", "blocked"]["tolerance"][0]
          > 10 * rows["float32", "blocked"]["tolerance"][0])
  train = {r["model"]: r for r in report["train"]}
  assert set(train) == {"gpt2-small", "llama-1b"}
  for r in train.values():
    assert r["tokens_per_s"] > 0 and r["flops_per_step"] > 0 and np.isfinite(r["final_loss"])
    assert r["mfu"] is None                  # no tabulated peak for a CPU
  assert train["llama-1b"]["params"] != train["gpt2-small"]["params"]
  md = (tmp_path / "gpu_check.md").read_text()
  assert "| gpt2-small |" in md and "| llama-1b |" in md and "| pallas |" in md


def test_spent_budget_skips_every_part_with_a_note_and_writes_nothing_off_a_gpu(
    tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert gpu_check.main(["--smoke", "--budget", "1e-9"]) == 0
  out = capsys.readouterr().out
  assert "skipped: time box" in out and "not written" in out
  assert not list(tmp_path.iterdir())        # no experiments/results/ on a CPU without --out


def test_tolerance_follows_the_dtype_and_the_reduction_length():
  f32 = gpu_check.tolerance(100, 1.0, np.float32)
  assert f32 == gpu_check.LAMBDA * 10 * gpu_check.EPS32
  assert gpu_check.tolerance(400, 1.0, np.float32) == 2 * f32
  assert gpu_check.tolerance(100, 2.0, np.float32) == 2 * f32
  bf16 = gpu_check.tolerance(100, 1.0, "bfloat16")
  assert bf16 == f32 + gpu_check.LAMBDA * 2.0 ** -7
