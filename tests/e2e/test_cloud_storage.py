"""A `gs://` workdir end to end against a GCS API on localhost (tests/gcs_emulator.py): train,
SIGTERM, resume, sample and a sweep write to the bucket what the same runs write to a
local directory, and nothing under the current directory; the path layer's own rules."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from jaxformer import paths
from jaxformer.train import metrics, workdir as workdir_lib
from tests.runs import config_flags, config_overrides, tiny_run_config
from tests.repo_root import REPO

ROOT = str(REPO)
CONFIG = os.path.join(ROOT, "configs", "shakespeare_char.py") + ":tiny"
BUCKET = "jaxformer-test"
KEEP = ("step", "loss", "grad_norm", "eval_loss")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The emulator on a free port (its request log in a file: a pipe nobody reads would fill
  and stall it), and the environment every client needs to reach it: gcsfs (epath's gs://
  backend) reads STORAGE_EMULATOR_HOST, TensorStore (Orbax's arrays) TENSORSTORE_GCS_HTTP_URL;
  gcsfs's bucket-type probe (a gRPC call the emulator does not serve, retried for a minute)
  is turned off, which gcsfs reads when it is imported."""
  for package in ("gcsfs", "gcp_storage_emulator"):
    if importlib.util.find_spec(package) is None:
      pytest.skip(f"{package} is not installed (pip install -e '.[test]')")
  port = _free_port()
  log = tmp_path_factory.mktemp("gcs") / "emulator.log"
  server = subprocess.Popen([sys.executable, "-m", "tests.gcs_emulator", f"--port={port}",
                             f"--bucket={BUCKET}"], cwd=ROOT, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
  deadline = time.monotonic() + 60
  while "serving" not in log.read_text():
    assert server.poll() is None and time.monotonic() < deadline, log.read_text()
    time.sleep(0.1)
  url = f"http://127.0.0.1:{port}"
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    yield env
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
    server.kill()
    server.wait()


def _python(cwd, *args, **kw):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def _kept(records):
  return [{k: r[k] for k in KEEP if k in r} for r in records]


@pytest.mark.slow
def test_a_gs_workdir_trains_resumes_samples_and_sweeps_like_a_local_one(gcs, tmp_path, capsys):
  cfg = tiny_run_config(steps=40, log_every=10, eval_every=20, checkpoint_every=20)
  flags = [f"--config={CONFIG}", *config_flags(cfg)]
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  run = f"gs://{BUCKET}/run"

  first = _python(cwd, "-m", "jaxformer.train", f"--workdir={run}", *flags)
  for line in first.stdout:                      # stop it mid-run, as a preemption does
    if line.split("/")[0].split() == ["step", "10"]:
      first.send_signal(signal.SIGTERM)
      break
  out = first.communicate(timeout=300)[0]
  assert first.returncode == 0, out[-3000:]
  stopped = metrics.read(f"{run}/metrics.jsonl")[-1]["step"]
  assert stopped < cfg.train.steps, "the signal came after the run ended: nothing resumed"

  from jaxformer.train import loop        # the resume in this process (a JAX import less)
  capsys.readouterr()
  with contextlib.chdir(cwd):
    loop.train(cfg, run)
  assert f"{run}: resumed from step" in capsys.readouterr().out
  loop.train(cfg, str(tmp_path / "local"))
  assert _kept(metrics.read(f"{run}/metrics.jsonl")) == _kept(
      metrics.read(tmp_path / "local" / "metrics.jsonl"))
  names = {p.name for p in paths.path(run).iterdir()}
  assert {"checkpoints", "best", "config.json", "tokenizer.json", "curves.png"} <= names
  assert any(n.startswith("events.out.tfevents") for n in names), names

  sample = _python(cwd, "-m", "jaxformer.sample", f"--workdir={run}", "--prompt=ROMEO:",
                   "--max_new_tokens=8")
  out = sample.communicate(timeout=300)[0]
  assert sample.returncode == 0 and "ROMEO:" in out, out[-3000:]

  from jaxformer import sweep as sweep_lib
  # one point, the run above as a sweep point: its programs are in the compilation cache
  # (two points of new programs cost ~20 s of CPU; parallel points: tests/unit/sweep/test_sweep.py)
  spec = dict(base=CONFIG, product={"optim.lr": [cfg.optim.lr]}, name="lr{optim.lr:g}",
              overrides={k: v for k, v in config_overrides(cfg).items() if k != "optim.lr"})
  rows = sweep_lib.run(spec, f"gs://{BUCKET}/sweep")
  assert [r["status"] for r in rows] == ["done"], rows
  assert paths.path(f"gs://{BUCKET}/sweep/summary.csv").exists()
  assert paths.path(f"gs://{BUCKET}/sweep/lr0.001/train.log").exists()
  assert list(cwd.iterdir()) == [], "files were written under the current directory"


def test_a_scheme_that_cannot_be_served_is_refused_before_anything_is_written(tmp_path):
  result = subprocess.run([sys.executable, "-m", "jaxformer.train", f"--config={CONFIG}",
                           "--workdir=ftp://host/run"], cwd=tmp_path, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT,
                                              JAX_PLATFORMS="cpu"), timeout=240)
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      "error: --workdir='ftp://host/run': ftp:// is not a storage jaxformer can use; give a "
      "local path or a URL of gs://, s3://")
  assert list(tmp_path.iterdir()) == []


def test_the_path_layer(tmp_path, monkeypatch):
  assert paths.scheme("gs://b/x") == "gs" and paths.scheme("/a/gs://") is None
  assert paths.absolute("gs://b/x") == "gs://b/x"
  assert paths.absolute("rel") == os.path.join(os.getcwd(), "rel")
  assert paths.local_mirror(str(tmp_path), "logs") == str(tmp_path)
  mirror = paths.local_mirror("gs://b/run", "logs")
  assert mirror.startswith(os.path.expanduser(paths.MIRROR_ROOT)) and "gs:" not in mirror
  monkeypatch.setattr(paths.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(ValueError, match=r"--workdir='s3://b/x' needs the s3fs package"):
    paths.path("s3://b/x")
  target = tmp_path / "a.txt"
  paths.write_text(target, "one\n")
  paths.append_text(target, "two\n")
  assert target.read_text() == "one\ntwo\n"
  assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]        # no temporary left


def test_an_unwritable_bucket_is_one_clear_error(gcs):
  with pytest.raises(ValueError, match=r"--workdir='gs://no-such-bucket/run' is not writable"):
    workdir_lib.check_usable("gs://no-such-bucket/run")


def test_hf_save_writes_into_a_bucket_what_it_writes_locally(gcs, tmp_path):
  """A Hugging Face export to gs://: the same config.json and model.safetensors bytes as a
  local export, and a training run's directory is refused there as it is locally."""
  import jax
  import numpy as np
  from jaxformer import models
  from jaxformer.convert import hf
  config = dict(family="decoder", vocab_size=32, d_model=16, num_layers=1, num_heads=2,
                mlp_dim=32, max_len=8)
  shapes = jax.eval_shape(models.build(config).init, jax.random.key(0),
                          jax.ShapeDtypeStruct((1, 8), np.int32))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(0, 0.3, s.shape).astype(np.float32), shapes)
  hf.save(config, params, str(tmp_path / "local"))
  remote = f"gs://{BUCKET}/hf"
  hf.save(config, params, remote)
  for name in ("config.json", "model.safetensors"):
    assert paths.path(f"{remote}/{name}").read_bytes() == (tmp_path / "local" / name).read_bytes()
  paths.write_text(f"gs://{BUCKET}/run2/metrics.jsonl", "")
  with pytest.raises(ValueError, match="training run"):
    hf.save(config, params, f"gs://{BUCKET}/run2")
