"""The TPU compiler's collective-overlap flags (`jaxformer.tpu_flags`, issue #41 item 7): merged
under a user's own LIBTPU_INIT_ARGS, chosen by group, applied by the trainer, the compile-only
devices and the TPU launcher, and recorded in a plan."""

from __future__ import annotations

import shlex

import pytest

from jaxformer import tpu_flags


def _args(value: str) -> dict:
  return dict(a.lstrip("-").split("=", 1) for a in shlex.split(value) if a.startswith("--"))


def test_every_flag_names_its_source_and_the_defaults_are_groups():
  assert set(tpu_flags.DEFAULT_GROUPS) <= set(tpu_flags.GROUPS)
  for group in tpu_flags.GROUPS.values():
    for flag in group:
      assert flag.source in (tpu_flags.JAX_DOCS, tpu_flags.MAXTEXT) and flag.effect
      assert flag.name.startswith("xla_") and flag.value
  names = [f.name for f in tpu_flags.flags()]
  assert len(names) == len(set(names))
  assert "xla_tpu_enable_async_collective_fusion" in names
  assert not any("windowed_einsum" in n for n in names)      # collective matmul: opt-in


def test_the_users_flags_win_and_everything_else_they_wrote_stays():
  user = "--xla_tpu_enable_async_collective_fusion=false TPU_MEGACORE=MEGACORE_DENSE --foo=1"
  merged = tpu_flags.merge(user)
  args = _args(merged)
  assert merged.startswith(user)
  assert args["xla_tpu_enable_async_collective_fusion"] == "false"      # theirs, once
  assert merged.count("xla_tpu_enable_async_collective_fusion=") == 1
  assert args["xla_enable_async_all_gather"] == "true"                  # ours fill the rest
  assert "TPU_MEGACORE=MEGACORE_DENSE" in shlex.split(merged) and args["foo"] == "1"
  assert tpu_flags.merge(merged) == merged                              # idempotent
  assert tpu_flags.merge(None, ()) == "" and tpu_flags.merge("--a=1", ()) == "--a=1"


def test_groups_are_chosen_by_the_environment():
  env = {}
  assert tpu_flags.groups_from_env(env) == tpu_flags.DEFAULT_GROUPS
  env[tpu_flags.GROUPS_ENV] = "none"
  assert tpu_flags.apply(env) == "" and tpu_flags.ENV not in env
  env[tpu_flags.GROUPS_ENV] = "collective_matmul"
  value = tpu_flags.apply(env)
  assert env[tpu_flags.ENV] == value and set(_args(value)) == {
      f.name for f in tpu_flags.GROUPS["collective_matmul"]}
  env[tpu_flags.GROUPS_ENV] = "async,oops"
  with pytest.raises(ValueError, match="JAXFORMER_TPU_FLAGS"):
    tpu_flags.groups_from_env(env)


def test_the_trainer_applies_them_before_jax_starts_a_backend(monkeypatch):
  """`python -m jaxformer.train`'s main merges the flags into LIBTPU_INIT_ARGS first thing
  (here it then stops at the missing --workdir, before any backend work)."""
  import types
  from jaxformer.train import __main__ as train_main
  monkeypatch.setenv(tpu_flags.ENV, "--xla_enable_async_all_gather=false")
  monkeypatch.delenv(tpu_flags.GROUPS_ENV, raising=False)
  monkeypatch.setattr(tpu_flags, "_first", {})
  given = types.SimpleNamespace(workdir=None, plan_only=False, topology=None, slices=None,
                                compilation_cache=None, config=None, print_config=False)
  monkeypatch.setattr(train_main, "flags", types.SimpleNamespace(FLAGS=given))
  monkeypatch.setattr(train_main.compilation, "enable_cache", lambda path: None)  # the suite's
  with pytest.raises(ValueError, match="--workdir"):
    train_main.main([])
  import os
  args = _args(os.environ[tpu_flags.ENV])
  assert args["xla_enable_async_all_gather"] == "false"
  assert args["xla_tpu_enable_async_collective_fusion"] == "true"
  assert tpu_flags.in_effect() == os.environ[tpu_flags.ENV]


def test_the_tpu_launcher_exports_them_on_every_worker(monkeypatch):
  from launch import tpu
  from tests.unit.launch.test_launch import TRAIN, _tpu_args
  monkeypatch.setenv(tpu_flags.ENV, "--xla_tpu_overlap_compute_collective_tc=false")
  monkeypatch.delenv(tpu_flags.GROUPS_ENV, raising=False)
  [ssh] = tpu.commands(_tpu_args("run"), TRAIN)
  remote = shlex.split(ssh[8].removeprefix("--command="))
  start = remote.index("setsid")
  name, value = remote[start - 1].split("=", 1)
  assert name == tpu_flags.ENV
  args = _args(value)
  assert args["xla_tpu_overlap_compute_collective_tc"] == "false"
  assert args["xla_tpu_enable_data_parallel_all_reduce_opt"] == "true"
  assert remote[start + 1:start + 1 + len(TRAIN)] == TRAIN
