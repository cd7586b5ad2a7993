"""Supervised fine-tuning (jaxformer.posttrain): response-only loss weights, packing that
keeps examples apart, one-line errors for wrong data fields, and a tiny SFT run from a
trained workdir that resumes exactly."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import sft as sft_config
from jaxformer import models, run_settings, tasks
from jaxformer.data.tokenizers import CharTokenizer
from jaxformer.posttrain import data as pdata
from jaxformer.train import loop
from jaxformer.train.metrics import read
from tests import drawn
from tests.runs import on_one_device, tiny_run_config
from tests.user_errors import user_error

TOK = CharTokenizer("abcdefghijklmnopqrstuvwxyz :\n?!.,")
RECORDS = [{"prompt": "who? ", "response": "me."},
           {"prompt": "say hi: ", "response": "hi!"},
           {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                         {"role": "user", "content": "c"}, {"role": "assistant",
                                                            "content": "dd"}]}]


def _example(record, max_len=64):
  ids, w = pdata.encode_pieces(TOK, pdata.sft_pieces(record, "test"), "test")
  return pdata.sft_example(ids, w, max_len)


def test_loss_weights_are_exactly_the_response_tokens():
  e = _example(RECORDS[0])
  prompt, response = TOK.encode("who? "), TOK.encode("me.")
  np.testing.assert_array_equal(e["inputs"], np.concatenate([prompt, response])[:-1])
  np.testing.assert_array_equal(e["targets"], np.concatenate([prompt, response])[1:])
  # predictions whose target is a response token: the last len(response) ones
  np.testing.assert_array_equal(e["weights"], [0] * (len(prompt) - 1) + [1] * len(response))
  # chat: every assistant content (+ its "\n") is weighted, headers and user turns are not
  e = _example(RECORDS[2])
  text = TOK.decode(np.concatenate([e["inputs"][:1], e["targets"]]))
  assert text == "user: a\nassistant: b\nuser: c\nassistant: dd\n"
  weighted = "".join(TOK.decode([t]) for t, w in zip(e["targets"], e["weights"]) if w)
  assert weighted == "b\ndd\n"


def test_packing_keeps_examples_apart_in_rows_and_in_the_model():
  examples = [_example(r, 32) for r in RECORDS]
  assert len(examples[2]["inputs"]) == 32   # the chat (42 predictions) cut to a row
  rows = pdata.pack_examples(examples, 32)
  assert len(rows) == 2                     # 8 + 10 share a row, the chat has its own
  row = rows[0]
  lengths = [len(e["inputs"]) for e in examples]
  assert list(np.bincount(row["segment_ids"])[1:]) == lengths[:2]
  # the decoder on the packed row gives each example the logits it gets alone
  cfg = tiny_run_config().model
  module = models.build(cfg)
  # drawn params (what the model computes, not its init) and jitted applies: one compile
  # per shape instead of one per op
  params = drawn.params(module, jnp.zeros((1, 32), jnp.int32))
  apply = jax.jit(module.apply)
  batch = {k: jnp.asarray(v)[None] for k, v in row.items()}
  packed = apply({"params": params}, batch["inputs"], segment_ids=batch["segment_ids"],
                 positions=batch["positions"])
  at = 0
  for e in examples[:2]:
    n = len(e["inputs"])
    alone = apply({"params": params}, jnp.asarray(e["inputs"])[None])
    np.testing.assert_allclose(packed[0, at:at + n], alone[0], atol=1e-5, rtol=1e-5)
    at += n
  # without segment ids the second example would see the first: the test can tell
  mixed = apply({"params": params}, batch["inputs"], positions=batch["positions"])
  assert not np.allclose(mixed[0, lengths[0]:at], packed[0, lengths[0]:at], atol=1e-3)


@pytest.mark.parametrize("line,message", [
    ('{"prompt": "a"}', r"bad\.jsonl:1: missing field 'response'; SFT records need 'prompt' and "
                        r"'response' \(or 'messages'\)"),
    ('{"prompt": "a", "response": 3}',
     r"bad\.jsonl:1: field 'response' is a int, expected a string"),
    ('[1, 2]', r"bad\.jsonl:1: expected a JSON object"),
    ('{"messages": [{"role": "user", "content": "a"}]}', r"no assistant turn"),
    ('{"prompt": "A", "response": "b"}', r"bad\.jsonl:1: characters \['A'\] are not in the"),
])
def test_wrong_data_fields_are_one_line_errors(tmp_path, line, message):
  path = tmp_path / "bad.jsonl"
  path.write_text(line + "\n")
  data = ConfigDict(dict(source=str(path), seq_len=16))     # no eval_source: one record
  text = user_error(lambda: pdata.SFTPipeline(data, TOK, seed=0, global_batch_size=2,
                                              eval_batch_size=2), "bad.jsonl")
  assert "\n" not in text and re.search(message, text), text


def _pipeline(tmp_path, records, cls=pdata.SFTPipeline, seq_len=16):
  path = tmp_path / "data.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  data = ConfigDict(dict(source=str(path), eval_source=str(path), seq_len=seq_len))
  return lambda: cls(data, TOK, seed=0, global_batch_size=2, eval_batch_size=2)


def test_sft_examples_with_no_response_token_are_dropped_and_all_of_them_refused(tmp_path):
  """An empty response (TOK has no eos) or one cut away by seq_len has no target to learn:
  such examples are dropped and counted; data holding only them is refused in one line (it
  trained to loss 0.0000, perplexity 1.0, and saved a best checkpoint)."""
  empty = [{"prompt": f"say {c}: ", "response": ""} for c in "abc"]
  cut = {"prompt": "x" * 20, "response": "late."}            # the prompt fills seq_len=16
  good = [{"prompt": "who? ", "response": "me."}, {"prompt": "hi: ", "response": "hi!"}]
  pipeline = _pipeline(tmp_path, empty + [cut] + good)()
  assert pipeline.info["dropped_examples"] == 2 * 4        # train and eval read the same file
  assert pipeline.dropped == {"train": (4, 6), "validation": (4, 6)}
  rows = [pipeline.records["train"][i] for i in range(len(pipeline.records["train"]))]
  assert sum(int(r["segment_ids"].max()) for r in rows) == len(good)
  assert all(r["weights"][r["segment_ids"] == k].any() for r in rows
             for k in range(1, int(r["segment_ids"].max()) + 1))
  line = pdata.dropped_summary(pipeline, "examples", "why")
  assert line == "sft data: dropped 4 of 6 train and 4 of 6 validation examples (why)"
  text = user_error(_pipeline(tmp_path, empty + [cut]), "data.source=", "data.jsonl",
                    "no train example has a response token", "the tokenizer has no eos",
                    "data.seq_len=16")
  assert "\n" not in text
  assert pdata.dropped_summary(_pipeline(tmp_path, good)(), "examples", "why") is None


def test_batch_specs_match_the_pipelines_first_batch(tmp_path):
  """What `jaxformer.plan` compiles for: the sft and dpo tasks' layouts."""
  sft_path, dpo_path = tmp_path / "sft.jsonl", tmp_path / "dpo.jsonl"
  sft_path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
  dpo_path.write_text("".join(json.dumps({"prompt": f"say {c}:", "chosen": c, "rejected": "z"})
                              + "\n" for c in "abcd"))
  for task, path, cls in [("sft", sft_path, pdata.SFTPipeline),
                          ("dpo", dpo_path, pdata.DPOPipeline)]:
    cfg = ConfigDict(dict(data=dict(source=str(path), eval_source=str(path), seq_len=16),
                          train=dict(batch_size=4)))
    settings = run_settings.RunSettings(
        **{**{f.name: None for f in dataclasses.fields(run_settings.RunSettings)},
           "train": run_settings.parse_section("train", {"steps": 1, "batch_size": 4}),
           "data": run_settings.parse_section("data", cfg.data.to_dict(), strict=False)})
    batch = cls(cfg.data, TOK, seed=0, global_batch_size=4, eval_batch_size=4).train_batch(0)
    got = {k: (tuple(v.shape), np.asarray(v).dtype) for k, v in batch.items()}
    assert tasks.get(task).batch_spec(cfg, settings, {}) == got, task


@pytest.fixture(scope="module")
def source_files(tmp_path_factory):
  """What a post-training config and its refusals read of a source run (its config.json and
  tokenizer), without training it: for the tests that stop before any parameter is read."""
  workdir = tmp_path_factory.mktemp("source_files") / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(tiny_run_config().to_json())
  CharTokenizer("abcdefghijklmnopqrstuvwxyz :\n").save(str(workdir))
  return str(workdir)


def test_cli_post_training_mistakes_are_one_line(tmp_path, source_files):
  from tests.unit.package.test_cli import _assert_user_error, _cli
  (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
  config = f"--config=configs/sft.py:{source_files}"
  for overrides, fragment in [
      ([], "data.source is not set: sft reads JSON Lines of {'prompt', 'response'}"),
      ([f"--config.data.source={tmp_path / 'bad.jsonl'}"],
       "bad.jsonl:1: missing field 'response'")]:
    result = _cli("jaxformer.train", config, f"--workdir={tmp_path / 'run'}", *overrides)
    _assert_user_error(result, fragment)
    assert not (tmp_path / "run").exists() or set(os.listdir(tmp_path / "run")) <= {".lock"}


def test_a_run_takes_its_source_config_and_tokenizer_from_its_own_workdir(tmp_path,
                                                                          monkeypatch):
  """What configs/sft.py and the pipeline read from posttrain.init_from is recorded in the
  run's workdir, so rerunning the command resumes the run once the source is gone."""
  import shutil
  from configs import dpo as dpo_config
  from jaxformer.posttrain import start as pinit
  source, run, other = (str(tmp_path / n) for n in ("source", "run", "other"))
  os.makedirs(source)
  source_cfg = tiny_run_config(seed=7)
  source_cfg.data.seq_len = 24
  (tmp_path / "source" / "config.json").write_text(source_cfg.to_json())
  CharTokenizer("abc :\n").save(source)
  monkeypatch.setattr("sys.argv", ["train", f"--config=configs/sft.py:{source}"])
  expected = {m: c.get_config(source).to_json() for m, c in (("sft", sft_config),
                                                             ("dpo", dpo_config))}
  cfg = ConfigDict(json.loads(expected["sft"]))
  cfg.data.source = "x.jsonl"
  source_vocab = CharTokenizer("abc :\n").vocab_size
  assert pinit.run_tokenizer(cfg, run).vocab_size == source_vocab   # the run has not started
  os.makedirs(run)
  pinit.record_source(run, source, ConfigDict(json.loads(source_cfg.to_json())))
  (tmp_path / "run" / "config.json").write_text(cfg.to_json())
  CharTokenizer("abcdef :\n").save(run)      # told apart from the source's by its size
  pinit.require_source(cfg)                  # what --fresh checks before discarding a run
  shutil.rmtree(source)
  user_error(lambda: sft_config.get_config(source), f"posttrain.init_from={source!r} holds no "
             "training run", "pass that run's --workdir")
  user_error(lambda: pinit.require_source(cfg), "--fresh would start over from it",
             "drop --fresh")
  for argv in (["--workdir", run], [f"--workdir={other}", f"--workdir={run}"]):
    monkeypatch.setattr("sys.argv", ["train", f"--config=configs/sft.py:{source}", *argv])
    got = {m: c.get_config(source).to_json() for m, c in (("sft", sft_config),
                                                          ("dpo", dpo_config))}
    assert got == expected
  assert pinit.run_tokenizer(cfg, run).vocab_size == source_vocab + 3      # its own copy
  monkeypatch.setattr("sys.argv", ["train", f"--config=configs/sft.py:{source}",
                                   f"--workdir={other}"])
  user_error(lambda: sft_config.get_config(source), f"--workdir={other!r} holds no run "
             "started from it")
  assert pinit.recorded_source(run, source + "2") is None        # a record of another source
  (tmp_path / "run" / "posttrain_source.json").write_text("[1]")
  user_error(lambda: pinit.recorded_source(run, source), "posttrain_source.json", "--fresh")


def test_resume_refuses_a_changed_posttrain_setting(tmp_path, source_files):
  from jaxformer.train import config_checks
  cfg = sft_config.get_config(source_files)
  cfg.data.source = "x.jsonl"
  (tmp_path / "config.json").write_text(cfg.to_json())
  config_checks.check_workdir_config(cfg, str(tmp_path), fresh=False)
  cfg.posttrain.beta = 0.5
  with pytest.raises(ValueError, match=r"trained with posttrain.beta=0.1, not 0.5"):
    config_checks.check_workdir_config(cfg, str(tmp_path), fresh=False)


def _sft_jsonl(path, n=40):
  rng = np.random.default_rng(0)
  names = ["ROMEO", "JULIET", "MERCUTIO", "TYBALT"]
  with open(path, "w") as f:
    for i in range(n):
      who = names[i % 4]
      f.write(json.dumps({"prompt": f"Who speaks of {'abcdefghij'[i % 10]}?\n", "response": f"{who}: " +
                          "ab"[int(rng.integers(2))] * 3 + ".\n"}) + "\n")


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("source") / "run")
  with pytest.MonkeyPatch.context() as patch:         # on 1 device, like the SFT run below
    on_one_device(patch)
    loop.train(tiny_run_config(steps=8, checkpoint_every=8, eval_every=8, log_every=4), workdir)
  return workdir


def _sft(source, data_path, **train):
  cfg = sft_config.get_config(source)
  cfg.data.source = data_path
  cfg.data.eval_batches = 1
  cfg.optim.warmup_steps = 2
  cfg.train.update(steps=8, batch_size=8, log_every=2, eval_every=4, checkpoint_every=4,
                   attention_maps=False, **train)
  return cfg


@pytest.mark.slow
def test_tiny_sft_run_starts_from_the_source_and_resumes_exactly(tmp_path, source_run, capsys,
                                                                monkeypatch):
  on_one_device(monkeypatch)          # what it trains and resumes, not the mesh: 1 device
  data_path = str(tmp_path / "sft.jsonl")
  _sft_jsonl(data_path)
  cfg = _sft(source_run, data_path)
  full, parted = str(tmp_path / "full"), str(tmp_path / "parted")
  loop.train(cfg, full)
  assert f"initialized from {source_run} at step 8" in capsys.readouterr().out
  loop.train(cfg, parted, stop_after=5)
  capsys.readouterr()
  loop.train(cfg, parted)
  assert "initialized from" not in capsys.readouterr().out     # its own checkpoint
  keys = ("step", "loss", "grad_norm", "eval_loss", "eval_accuracy")
  strip = lambda rs: [{k: r[k] for k in keys if k in r} for r in rs]
  records = read(os.path.join(full, "metrics.jsonl"))
  assert strip(read(os.path.join(parted, "metrics.jsonl"))) == strip(records)
  assert os.path.exists(os.path.join(full, "tokenizer.json"))
  losses = [r["loss"] for r in records if "loss" in r]
  assert len(losses) == 4 and losses[-1] < losses[0]
