"""jaxformer.compilation: the persistent cache switch and the run-once compile options."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxformer import compilation
from tests.repo_root import REPO

ROOT = str(REPO)


def test_default_cache_dir_follows_jax_then_xdg(monkeypatch, tmp_path):
  monkeypatch.setenv(compilation.CACHE_ENV, str(tmp_path / "jax"))
  assert compilation.default_cache_dir() == str(tmp_path / "jax")
  monkeypatch.delenv(compilation.CACHE_ENV)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compilation.default_cache_dir() == str(tmp_path / "xdg" / "jaxformer" / "xla")


def test_uncreatable_cache_dir_names_the_flag_and_the_fix(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  with pytest.raises(ValueError, match=r"--compilation_cache=.*cannot be created.*"
                                       r"--compilation_cache= to compile without"):
    compilation.enable_cache(str(blocker / "cache"))


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
  """Two processes compile the same function with the cache on: the first writes an entry,
  the second finds it (JAX's cache-hit counter) and writes nothing new."""
  script = (
      "import sys, jax, jax.numpy as jnp\n"
      "from jax._src import monitoring\n"
      "from jaxformer import compilation\n"
      "hits = []\n"
      "monitoring.register_event_listener("
      "lambda e, **k: hits.append(e) if e == '/jax/compilation_cache/cache_hits' else None)\n"
      "compilation.enable_cache(sys.argv[1])\n"
      "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)\n"
      "f = jax.jit(lambda x: jnp.sin(x) @ x.T + 1.0)\n"
      "f(jnp.ones((8, 8))).block_until_ready()\n"
      "print(len(hits))\n")
  cache = tmp_path / "cache"
  env = {k: v for k, v in os.environ.items() if k != compilation.CACHE_ENV}
  run = lambda: subprocess.run([sys.executable, "-c", script, str(cache)], cwd=ROOT, env=env,
                               capture_output=True, text=True, check=True).stdout.split()[-1]
  assert run() == "0"
  entries = sorted(os.listdir(cache))
  assert entries
  assert int(run()) >= 1                       # our function (and jnp.ones) loaded
  assert sorted(os.listdir(cache)) == entries


def test_run_once_options_turn_llvm_optimisation_off_on_cpu_only():
  assert jax.default_backend() == "cpu"
  assert compilation.run_once_options() == {"xla_backend_optimization_level": 0}


def test_run_once_compiled_init_agrees_with_a_fully_optimised_one():
  """The train-state init compiled without LLVM optimisation: the same values to float
  rounding (the integer random bits are the same; only the float transform may round
  differently)."""
  import flax.linen as nn
  from jaxformer.parallel import ShardingPlan
  from jaxformer.state import train_state as state_lib
  from configs import shakespeare_char
  cfg = shakespeare_char.get_config("tiny")
  _, _, init_boxed = state_lib.train_state_fns(cfg)
  plan = ShardingPlan.from_config(cfg.mesh, jax.devices()[:1])
  fast, _ = plan.init_state(init_boxed)
  full = jax.jit(lambda: nn.unbox(init_boxed()))()
  for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(full)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
