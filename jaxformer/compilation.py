"""How jaxformer compiles: cheap compiles for functions that run once, and a persistent cache.

XLA:CPU spends most of a small model's compile time in LLVM's optimisation passes, which pay
off only for code that runs many times. Functions that run once per job (the train-state
init) are compiled without them (`run_once_options`); the steps get full optimisation.

The persistent compilation cache (`enable_cache`) keeps compiled executables on disk keyed by
the program, the backend and the flags, so a second run of the same job (a rerun with
`--fresh`, another seed's workdir, `jaxformer.sample` after training) loads instead of
compiling. The command lines turn it on (`--compilation_cache`); library users call
`enable_cache` or set JAX's own `JAX_COMPILATION_CACHE_DIR`.
"""

from __future__ import annotations

import os

import jax

from jaxformer import paths

CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"      # JAX's own variable: wins over our default
MIN_CACHED_COMPILE_SECS = 0.3                 # JAX's default (1 s) would skip the eval step
MIN_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"   # JAX's own variable: wins too


def default_cache_dir() -> str:
  """$JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/jaxformer/xla (~/.cache/...)."""
  if os.environ.get(CACHE_ENV):
    return os.environ[CACHE_ENV]
  return paths.cache_dir("xla")


def enable_cache(path: str | None) -> str | None:
  """Use `path` (created if missing) as JAX's persistent compilation cache; '' or None turns
  it off. Programs compiling in >= MIN_CACHED_COMPILE_SECS are stored, unless JAX's own
  $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise. Returns the directory in use.
  Call before the first compilation."""
  if not path:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  path = os.path.abspath(os.path.expanduser(path))
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ValueError(f"--compilation_cache={path!r} cannot be created ({e.strerror}); pass a "
                     "writable directory, or --compilation_cache= to compile without a "
                     "cache") from e
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", path)
  if not os.environ.get(MIN_TIME_ENV):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_CACHED_COMPILE_SECS)
  return path


def run_once_options() -> dict | None:
  """XLA compiler options for a function that runs once: LLVM optimisation off on the CPU
  (the train-state init compiles in ~1.3 s instead of ~4 s for the README model; values
  agree to a few ulps of float rounding). None elsewhere: GPU and TPU compilers take their
  own options, and their compiles of such functions are cheap already."""
  if jax.default_backend() != "cpu":
    return None
  return {"xla_backend_optimization_level": 0}
