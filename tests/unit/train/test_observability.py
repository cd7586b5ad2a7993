"""Tests for training observability: TensorBoard event files, progress line, plots, profiler."""

from __future__ import annotations

import io
import json
import math
import os
import struct
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from jaxformer import accelerators
from jaxformer.train import plots, profiling, progress, tensorboard

# --- tensorboard ---------------------------------------------------------------------------


def tb_events(logdir):
  """What TensorBoard itself reads from `logdir`: {'scalars': {tag: [(step, value)]},
  'images': {tag: [(step, png, height, width)]}} (after purges and file merging)."""
  from tensorboard.backend.event_processing import event_accumulator as ea
  acc = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0, ea.IMAGES: 0})
  acc.Reload()
  return {"scalars": {t: [(e.step, e.value) for e in acc.Scalars(t)]
                      for t in acc.Tags()["scalars"]},
          "images": {t: [(e.step, e.encoded_image_string, e.height, e.width)
                         for e in acc.Images(t)] for t in acc.Tags()["images"]}}


def _event_files(logdir):
  return sorted(os.path.join(logdir, n) for n in os.listdir(logdir) if "tfevents" in n)


def test_summary_writer_roundtrip_through_tensorboards_reader(tmp_path):
  rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
  with tensorboard.SummaryWriter(tmp_path) as writer:
    writer.scalar("loss", 2.5, step=1)
    writer.scalars({"loss": 1.25, "lr": 3e-4}, step=10)
    writer.image("rgb", rgb, step=10)
  (path,) = _event_files(tmp_path)
  assert os.path.basename(path).startswith("events.out.tfevents.")
  events = tb_events(tmp_path)
  assert events["scalars"]["loss"] == [(1, 2.5), (10, 1.25)]
  assert events["scalars"]["lr"] == [(10, pytest.approx(3e-4, rel=1e-7))]
  [(step, png, height, width)] = events["images"]["rgb"]
  assert (step, height, width) == (10, 5, 7)
  np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png))), rgb)


def test_png_bytes_are_accepted(tmp_path):
  buffer = io.BytesIO()
  Image.new("L", (4, 3), 128).save(buffer, format="PNG")
  with tensorboard.SummaryWriter(tmp_path) as writer:
    writer.image("gray", buffer.getvalue(), step=0)
  [(_, png, height, width)] = tb_events(tmp_path)["images"]["gray"]
  assert (height, width) == (3, 4)
  assert (np.asarray(Image.open(io.BytesIO(png))) == 128).all()


@pytest.mark.parametrize("bad", [b"not a png", np.zeros((4, 4, 3), np.float32),
                                 np.zeros((4, 4, 2), np.uint8)])
def test_bad_image_raises(tmp_path, bad):
  with tensorboard.SummaryWriter(tmp_path) as writer, pytest.raises(ValueError, match="image"):
    writer.image("x", bad, step=0)


def test_new_file_per_writer_and_purge_step(tmp_path):
  """A resumed run (purge_step 3) rewrites steps >= 3: TensorBoard shows its points only."""
  with tensorboard.SummaryWriter(tmp_path) as first:
    first.scalars({"loss": 1.0}, step=2)
    first.scalars({"loss": 0.9}, step=5)
  time.sleep(1.1)                      # event file names carry the time in seconds
  with tensorboard.SummaryWriter(tmp_path, purge_step=3) as resumed:
    resumed.scalars({"loss": 0.5}, step=4)
  assert len(_event_files(tmp_path)) == 2
  assert tb_events(tmp_path)["scalars"]["loss"] == [(2, 1.0), (4, 0.5)]
  with pytest.raises(ValueError, match="purge_step"):
    tensorboard.SummaryWriter(tmp_path, purge_step=-1)


# --- progress ------------------------------------------------------------------------------


class FakeClock:
  def __init__(self, now=100.0):
    self.now = now

  def __call__(self):
    return self.now


class FakeTty(io.StringIO):
  def isatty(self):
    return True


def _progress(clock, stream=None, **kw):
  defaults = dict(units_per_step=1000, flops_per_step=2e9, peak_flops=1e10)
  return progress.Progress(100, 0, stream=stream or io.StringIO(), clock=clock,
                           **{**defaults, **kw})


def test_a_disk_that_fills_under_the_event_writer_thread_is_raised_not_waited_on(tmp_path):
  """tensorboardX writes on its own thread; on a full disk that thread used to die and the
  next add_event wait forever on its full queue (a run hung mid-training). Now the failure
  is kept and raised by the next call on the caller's thread, as the ENOSPC OSError the run
  reports in one line."""
  import errno
  import subprocess
  disk = tmp_path / "disk"
  disk.mkdir()
  if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs",
                                          str(disk)], capture_output=True).returncode:
    pytest.skip("mounting a small tmpfs needs root")
  try:
    writer = tensorboard.SummaryWriter(disk, flush_secs=0.01)
    noise = np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8)  # ~48 KB
    with pytest.raises(OSError) as info:
      for step in range(400):             # far more than fits, and more than the queue holds
        writer.image("noise", noise, step)
        time.sleep(0.005)
      writer.flush()
    assert info.value.errno == errno.ENOSPC
    writer.close()                        # logs the incomplete events; returns
  finally:
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_progress_rate_mfu_eta_and_excluded_time():
  clock = FakeClock()
  bar = _progress(clock)
  clock.now += 2.0
  line = bar.update(10, {"loss": 1.5})
  assert bar.steps_per_sec() == pytest.approx(5.0)
  assert bar.mfu() == pytest.approx(2e9 * 5.0 / 1e10)
  assert bar.eta_seconds() == pytest.approx(90 / 5.0)
  assert line == ("step  10/100  loss 1.5000  5,000 tok/s  MFU 100.0%  eta 18s  "
                  "elapsed 2s")
  with bar.paused():                     # an eval: not training time
    clock.now += 30.0
  clock.now += 4.0
  bar.exclude(1.0)                       # a checkpoint measured by the loop
  bar.pause()
  clock.now += 5.0
  bar.resume()
  bar.update(25, {"loss": 1.25})
  # 25 steps in 2 + 4 - 1 = 5 s of training time
  assert bar.steps_per_sec() == pytest.approx(25 / 5.0)
  assert bar.eta_seconds() == pytest.approx(75 / 5.0)
  assert "elapsed 41s" in bar.format_line(25, {})


def test_progress_rates_start_after_the_compiling_first_step():
  clock = FakeClock()
  bar = _progress(clock)
  clock.now += 60.0                      # step 1: mostly compilation
  bar.restart_window(1)
  clock.now += 1.8                       # steps 2..10 at 5 steps/s
  bar.update(10, {"loss": 1.5})
  assert bar.steps_per_sec() == pytest.approx(5.0)
  assert bar.eta_seconds() == pytest.approx(90 / 5.0)
  bar.restart_window(10)                 # nothing measured since: no rate, not a wrong one
  assert bar.steps_per_sec() is None and "? tok/s" in bar.format_line(10, {})


def test_progress_sliding_window_forgets_slow_start():
  clock = FakeClock()
  bar = _progress(clock, window=2)
  clock.now += 60.0                      # compilation
  bar.update(1)
  for step in (2, 3, 4):
    clock.now += 0.5
    bar.update(step)
  assert bar.steps_per_sec() == pytest.approx(2.0)
  with pytest.raises(ValueError, match="window"):
    _progress(clock, window=0)


def test_progress_non_tty_prints_one_line_per_update():
  clock, stream = FakeClock(), io.StringIO()
  bar = _progress(clock, stream, unit="images", units_per_step=32, flops_per_step=None,
                  peak_flops=None)
  bar.update(0)
  clock.now += 4.0
  bar.update(50, {"loss": 0.1234567})
  bar.log("eval_loss 0.2")
  lines = stream.getvalue().splitlines()
  assert lines == ["step   0/100  ? img/s  eta ?  elapsed 0s",
                   "step  50/100  loss 0.1235  400 img/s  eta 4s  elapsed 4s",
                   "eval_loss 0.2"]
  assert "\r" not in stream.getvalue()


def test_progress_tty_rewrites_line_in_place():
  clock, stream = FakeClock(), FakeTty()
  bar = _progress(clock, stream, peak_flops=None)
  clock.now += 3725.0
  bar.update(10, {"loss": 9.87654})
  clock.now += 1.0
  bar.update(11)
  out = stream.getvalue()
  assert out.count("\r") == 2 and "\n" not in out
  first, second = out.split("\r")[1:]
  assert "MFU n/a" in first and "elapsed 1h02m" in first and "loss 9.8765" in first
  assert len(second) >= len(first)        # padded so the old line is fully overwritten
  bar.log("eval")
  bar.close()
  assert stream.getvalue().endswith("\reval\n")


def test_progress_bad_arguments():
  with pytest.raises(ValueError, match="unit"):
    progress.Progress(10, 0, unit="samples", units_per_step=1)
  with pytest.raises(ValueError, match="start_step"):
    progress.Progress(10, 11, units_per_step=1)
  with pytest.raises(ValueError, match="seconds"):
    progress.Progress(10, 0, units_per_step=1).exclude(-1.0)


def test_format_duration():
  assert [progress.format_duration(s) for s in (0, 59.4, 61, 3599, 3600, 90061)] == [
      "0s", "59s", "1m01s", "59m59s", "1h00m", "25h01m"]
  assert progress.format_duration(float("inf")) == "?"


@pytest.mark.parametrize("kind, dtype, expected", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4e12),
    ("NVIDIA H100 PCIe", "bfloat16", 756e12),
    ("NVIDIA H100 80GB HBM3", "float32", 67e12),
    ("NVIDIA H200", jnp.bfloat16, 989e12),
    ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12),
    ("NVIDIA A100-PCIE-40GB", np.float32, 19.5e12),
    ("Tesla V100-SXM2-16GB", "float16", 125e12),
    ("Tesla V100-PCIE-32GB", "float32", 14e12),
    ("Tesla V100-SXM2-16GB", "bfloat16", None),
    ("TPU v4", "bfloat16", 275e12),
    ("TPU v4 lite", "bfloat16", None),
    ("TPU v5 lite", "bfloat16", 197e12),
    ("TPU v5", "bfloat16", 459e12),
    ("TPU v5p", "bfloat16", 459e12),
    ("TPU v6 lite", "bfloat16", 918e12),
    ("TPU v5 lite", "float32", None),
    ("cpu", "bfloat16", None),
])
def test_peak_flops_table(monkeypatch, kind, dtype, expected):
  monkeypatch.delenv(accelerators.PEAK_FLOPS_ENV, raising=False)
  device = types.SimpleNamespace(device_kind=kind)
  assert accelerators.peak_flops_per_device(device, dtype) == expected


def test_peak_flops_cpu_overrides(monkeypatch):
  monkeypatch.delenv(accelerators.PEAK_FLOPS_ENV, raising=False)
  assert accelerators.peak_flops_per_device() is None          # this test session runs on CPU
  assert accelerators.peak_flops_per_device(override=2e12) == 2e12
  monkeypatch.setenv(accelerators.PEAK_FLOPS_ENV, "1.5e12")
  assert accelerators.peak_flops_per_device(jax.devices()[0]) == 1.5e12
  monkeypatch.setenv(accelerators.PEAK_FLOPS_ENV, "fast")
  with pytest.raises(ValueError, match=accelerators.PEAK_FLOPS_ENV):
    accelerators.peak_flops_per_device()
  with pytest.raises(ValueError, match="dtype"):
    accelerators.peak_flops_per_device(dtype="int8", override=1.0)

# --- plots ---------------------------------------------------------------------------------


def _png_size(path):
  with open(path, "rb") as f:
    header = f.read(24)
  assert header[:8] == b"\x89PNG\r\n\x1a\n"
  with Image.open(path) as image:
    image.verify()
  return struct.unpack(">II", header[16:24])


def _write_metrics(path, with_accuracy):
  records = [{"step": s, "loss": 3.0 / s, "lr": 1e-3 * min(1.0, s / 20)}
             for s in range(10, 101, 10)]
  for s in (50, 100):
    record = {"step": s, "eval_loss": 3.2 / s}
    if with_accuracy:
      record["eval_accuracy"] = s / 200
    records.append(record)
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


@pytest.mark.parametrize("with_accuracy, panels", [(True, 3), (False, 2)])
def test_plot_curves(tmp_path, with_accuracy, panels):
  _write_metrics(tmp_path / "metrics.jsonl", with_accuracy)
  out = plots.plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png",
                          log_y=with_accuracy)
  assert out == str(tmp_path / "curves.png")
  assert _png_size(out) == (640, 240 * panels)


def test_plot_curves_without_records_raises(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens_per_sec": 5}) + "\n")
  with pytest.raises(ValueError, match="no 'loss'"):
    plots.plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png")


def test_plot_attention(tmp_path):
  weights = np.random.default_rng(1).dirichlet(np.ones(6), size=(3, 4))    # [H=3, Tq=4, Tk=6]
  out = plots.plot_attention(weights, list("abcdef"), tmp_path / "attn.png", title="layer 0")
  assert _png_size(out) == (640, 620)                      # 2x2 grid of heads + colorbar
  out = plots.plot_attention(np.ones((1, 50, 50)) / 50, [f"t{i}" for i in range(50)],
                             tmp_path / "long.png")
  assert _png_size(out) == (380, 320)
  with pytest.raises(ValueError, match="tokens"):
    plots.plot_attention(weights, list("abc"), tmp_path / "x.png")
  with pytest.raises(ValueError, match="heads"):
    plots.plot_attention(weights[0], None, tmp_path / "x.png")


def _figure_of(monkeypatch):
  """The matplotlib Figure plot_attention draws (kept for its tick labels)."""
  drawn = []
  real = plots._save
  monkeypatch.setattr(plots, "_save", lambda figure, out: drawn.append(figure) or real(figure, out))
  return drawn


def test_attention_map_ticks_are_readable(tmp_path, monkeypatch):
  """64 characters: upright single-character labels thinned so they do not overlap (the
  rendered label boxes are disjoint), axis titles; image patches: integer ticks; a
  cross-attention map does not label its queries with the keys."""
  drawn = _figure_of(monkeypatch)
  text = list("ROMEO: But soft, what light through yonder window breaks? It is t")[:64]
  out = plots.plot_attention(np.ones((2, 64, 64)) / 64, text, tmp_path / "chars.png")
  assert (tmp_path / "chars.png").stat().st_size > 0 and out == str(tmp_path / "chars.png")
  ax = drawn[-1].axes[0]
  labels = [t for t in ax.get_xticklabels() if t.get_text()]
  assert 4 <= len(labels) < 64 and all(t.get_rotation() == 0 for t in labels)
  renderer = drawn[-1].canvas.get_renderer()
  boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
  assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))           # no overlap
  assert [ax.get_xlabel(), ax.get_ylabel()] == ["key", "query"]
  assert ax.get_yticklabels()[0].get_text() == "R"

  plots.plot_attention(np.ones((1, 16, 16)) / 16, None, tmp_path / "vit.png",
                       axis_names=("key patch", "query patch"))
  ax = drawn[-1].axes[0]
  ticks = [t for t in ax.get_xticks() if 0 <= t <= 15]
  assert ticks and all(float(t).is_integer() for t in ticks)
  assert ax.get_xlabel() == "key patch"

  plots.plot_attention(np.ones((1, 3, 5)) / 5, list("abcde"), tmp_path / "cross.png",
                       self_attention=False, axis_names=("key", "query position"))
  ax = drawn[-1].axes[0]
  assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
  assert all(float(t).is_integer() for t in ax.get_yticks() if 0 <= t <= 2)


def _entropy_reference(weights):
  """Float64 loops: per head, mean over non-empty rows of -sum p log p (0 log 0 = 0)."""
  heads = weights.shape[-3]
  rows = np.moveaxis(weights, -3, 0).reshape(heads, -1, weights.shape[-1])
  out = []
  for head_rows in rows:
    entropies = [-sum(float(p) * math.log(float(p)) for p in row if p > 0)
                 for row in head_rows if row.sum() > 0]
    out.append(sum(entropies) / len(entropies) if entropies else 0.0)
  return np.array(out)


def test_attention_entropy_matches_reference():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(2, 3, 5, 7)) * 3                # [B, H, Tq, Tk], odd sizes
  mask = rng.random(logits.shape) < 0.7
  mask[..., 0] = True
  probs = np.where(mask, np.exp(logits), 0.0)
  probs /= probs.sum(-1, keepdims=True)
  probs[0, 1, 2] = 1.0 / 7                                  # uniform row
  probs[1, 2, 3] = np.eye(7)[4]                             # one-hot row
  probs[1, 0, 4] = 0.0                                      # fully masked query row
  got = plots.attention_entropy(probs.astype(np.float32))
  assert got.shape == (3,)
  np.testing.assert_allclose(got, _entropy_reference(probs), rtol=1e-5)
  single = plots.attention_entropy(probs[0, :, 2:3])        # [H, 1, Tk]
  np.testing.assert_allclose(single[1], math.log(7), rtol=1e-6)
  assert plots.attention_entropy(probs[1, :, 3:4])[2] == 0.0
  assert plots.attention_entropy(np.zeros((2, 3, 4))).tolist() == [0.0, 0.0]
  with pytest.raises(ValueError, match="non-negative"):
    plots.attention_entropy(-probs)

# --- profiling -----------------------------------------------------------------------------


@pytest.mark.parametrize("spec, expected", [
    ([10, 11, 12], (10, 11, 12)), ("10-12", (10, 11, 12)), ("10,11,12", (10, 11, 12)),
    (" 7 ", (7,)), ((3,), (3,)), ("", ()), (None, ()),
])
def test_parse_profile_steps(spec, expected):
  assert profiling.parse_profile_steps(spec) == expected


@pytest.mark.parametrize("spec", ["10-", "a-b", "12-10", "10,12", "-3", [1.5], [True], [],
                                  "3,2", [5, 4]])
def test_parse_profile_steps_rejects(spec):
  with pytest.raises(ValueError, match="train.profile_steps"):
    profiling.parse_profile_steps(spec)


def _xplane_files(trace_dir):
  return [os.path.join(root, name) for root, _, names in os.walk(trace_dir)
          for name in names if name.endswith(".xplane.pb")]


def test_step_profiler_writes_a_trace(tmp_path):
  step_fn = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
  x = jnp.ones((32, 16))
  with profiling.StepProfiler(tmp_path, "2-3") as profiler:
    for step in range(6):
      profiler.before(step)
      assert profiler.active == (step in (2, 3))
      profiler.after(step, step_fn(x))
      assert profiler.active == (step == 2)
  (trace,) = _xplane_files(profiler.trace_dir)
  assert os.path.getsize(trace) > 0
  assert profiler.trace_dir == os.path.join(str(tmp_path), "profile")


def test_step_profiler_blocks_on_outputs_before_stopping(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(jax, "block_until_ready", lambda x: calls.append(("block", x)) or x)
  stop_trace = jax.profiler.stop_trace
  monkeypatch.setattr(jax.profiler, "stop_trace", lambda: calls.append("stop") or stop_trace())
  profiler = profiling.StepProfiler(tmp_path, "0")
  profiler.before(0)
  profiler.after(0, {"loss": 1.0})
  assert calls == [("block", {"loss": 1.0}), "stop"]


def test_step_profiler_resume_inside_range_and_close(tmp_path):
  profiler = profiling.StepProfiler(tmp_path, [4, 5, 6])
  profiler.before(5)                      # resumed at step 5: trace the rest of the range
  assert profiler.active
  profiler.close()                        # preempted before step 6 finished
  assert not profiler.active and _xplane_files(profiler.trace_dir)
  profiler.before(6)                      # one trace per run
  assert not profiler.active
  idle = profiling.StepProfiler(tmp_path / "none", None)
  idle.before(0)
  idle.after(0)
  assert not os.path.exists(idle.trace_dir)
