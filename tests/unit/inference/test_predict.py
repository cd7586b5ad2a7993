"""`python -m jaxformer.predict` for every family, each against what the model computes
directly: a decoder's scores and greedy text, seq2seq greedy decoding (the step-by-step argmax)
and beam scores, fill-mask probabilities, a ViT's class probabilities on images standardised
as the training pipeline does, a captioner's captions and attention PNG. Mismatched inputs
are one line, exit code 2, before anything is compiled.

The runs are written directly (`tests.runs.write_run`: config, tokenizer, a checkpoint of the
initial state, scaled), once per module: what predict reads of a trained run, without the
training."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from configs import bert_mlm_shakespeare, captioning, seq2seq_synthetic, t5 as t5_config
from configs import vit_tiny
from jaxformer import cli, inference, models
from jaxformer.data import tokenizers
from jaxformer.inference import predict as lib
from jaxformer.predict import predict
from tests.runs import tiny_run_config, write_run
from tests.repo_root import REPO

ROOT = str(REPO)
TEXT = open(os.path.join(ROOT, "jaxformer", "data", "assets", "tinyshakespeare.txt"),
            encoding="utf-8").read()
CHARS = tokenizers.CharTokenizer(TEXT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{name: workdir}, each written on first use."""
  root = tmp_path_factory.mktemp("runs")
  made = {}

  def get(name):
    if name not in made:
      cfg, tok = _RUNS[name]()
      write_run(str(root / name), cfg, tok, random=True)
      made[name] = str(root / name)
    return made[name]
  return get


def _captioner():
  cfg = captioning.get_config("vit_transformer")
  cfg.data.update(source="digits", digit_size=8, max_digits=3)
  cfg.model.update(image_size=30, max_len=8, patch_size=10, d_model=16, num_heads=2,
                   mlp_dim=32, encoder_layers=1, decoder_layers=1)
  return cfg, None


def _seq2seq():
  cfg = seq2seq_synthetic.get_config("reverse")
  cfg.data.max_len = 8
  cfg.model.update(d_model=32, mlp_dim=64, num_encoder_layers=1, num_decoder_layers=1)
  return cfg, None


_RUNS = {
    "decoder": lambda: (tiny_run_config(), CHARS),
    "bert": lambda: (bert_mlm_shakespeare.get_config("tiny"), CHARS),
    "t5": lambda: (t5_config.get_config("tiny"), CHARS),
    "seq2seq": _seq2seq,
    "vit": lambda: (vit_tiny.get_config("digits"), None),
    "captioner": _captioner,
}


def _user_error(capsys, fn, *fragments):
  """fn() through the CLIs' wrapper: exit code 2 and one line naming every fragment."""
  with pytest.raises(SystemExit) as info:
    cli.user_errors(fn)()
  assert info.value.code == cli.EXIT_USER_ERROR
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and err.startswith("error: "), err
  for fragment in fragments:
    assert fragment in err, (fragment, err)


def _no_compile(monkeypatch):
  """Any jit compilation from here on fails the test (mistakes are refused before)."""
  def refuse(*a, **k):
    raise AssertionError("compiled before refusing the input")
  monkeypatch.setattr(jax, "jit", refuse)


def test_every_task_has_a_mode_or_is_refused_by_name():
  from jaxformer import tasks
  for family in models.names():
    task = models.get(family).task
    assert task in lib.MODES or task == "rtd", (family, task)
  from ml_collections import ConfigDict
  electra = ConfigDict({"model": {"family": "electra", "vocab_size": 64, "d_model": 32,
                                  "num_layers": 1, "num_heads": 2, "mlp_dim": 64}})
  with pytest.raises(ValueError, match="task 'rtd'.*predict has no mode"):
    lib.mode_for(electra)
  assert {m.name for ms in lib.MODES.values() for m in ms} == {
      "generate", "score", "decode", "fill_mask", "classify", "caption"}
  assert set(lib.MODES) <= set(tasks.names())


def test_decoder_scores_are_the_models_log_likelihoods(runs, capsys):
  run = runs("decoder")
  config, params, tok = inference.load_run(run)
  lines = ["ROMEO: I", "To be, or not to be", "a"]
  mode, records = predict(run, mode="score", input_file=_lines_file(run, lines), batch_size=2)
  assert mode is lib.SCORE and [r["input"] for r in records] == lines
  module = models.build(config.model)
  for line, record in zip(lines, records):
    ids = tok.encode(line)
    logits = np.asarray(_apply(module)(params, ids[None]), np.float64)[0]
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                           keepdims=True)) - logits.max(-1, keepdims=True)
    want = logp[np.arange(len(ids) - 1), ids[1:]].sum()       # char: no EOS, first is context
    assert record["tokens"] == len(ids) and record["scored"] == len(ids) - 1
    assert record["log_likelihood"] == pytest.approx(want, rel=1e-4, abs=1e-4)
  assert records[2]["nll_per_token"] is None                  # one token: nothing scored

  assert "params of step 8" in capsys.readouterr().err


def _lines_file(directory, lines) -> str:
  path = os.path.join(os.path.dirname(directory), f"lines_{abs(hash(tuple(lines)))}.txt")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def _apply(module):
  return jax.jit(lambda params, *args, **kw: module.apply({"params": params}, *args, **kw))


def _argmax_decode(module, params, src, src_mask, start, eos, steps, banned):
  """Greedy decoding by hand: the model on the prefix (PAD after it: causal), one token at a
  time, the argmax of the last position's logits."""
  apply, buffer = _apply(module), np.zeros((1, steps), np.int32)
  buffer[0, 0], out = start, []
  for t in range(steps):
    logits = np.array(apply(params, src, jnp.asarray(buffer), src_mask=src_mask))[0, t]
    logits[list(banned)] = -np.inf
    out.append(int(np.argmax(logits)))
    if out[-1] == eos or t + 1 == steps:
      break
    buffer[0, t + 1] = out[-1]
  return out


def _teacher_forced_logprob(module, params, src, src_mask, start, tokens) -> float:
  tgt_in = np.asarray([[start] + tokens[:-1]])
  logits = np.asarray(_apply(module)(params, src, tgt_in, src_mask=src_mask), np.float64)[0]
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return float(logp[np.arange(len(tokens)), tokens].sum())


@pytest.mark.parametrize("name, text, beam_size", [
    ("seq2seq", "3 9 4 17 5", 1),
    pytest.param("t5", "To be, or <extra_id_0> to be", 3, marks=pytest.mark.slow)])
def test_seq2seq_greedy_is_the_stepwise_argmax_and_beam_scores_are_log_probs(runs, name, text,
                                                                             beam_size):
  run = runs(name)
  config, params, tok = inference.load_run(run)
  spec = lib.seq2seq_spec(config, tok)
  module = models.build(config.model)
  ids = lib._source_ids(text, config, tok, spec)
  length = spec.src_len or len(ids)
  src = np.full((1, length), spec.pad, np.int32)
  src[0, :len(ids)] = ids
  src_mask = np.arange(length)[None] < len(ids)
  steps = 6
  _, [greedy] = predict(run, input=text, max_len=steps)
  want = _argmax_decode(module, params, src, src_mask, spec.start, spec.eos, steps,
                        spec.banned)
  assert greedy["tokens"] == want and greedy["input"] == text
  if tok is None:
    assert greedy["output"] == " ".join(str(i) for i in want if i != spec.eos)
  else:
    assert greedy["output"] == lib.decode_ids([i for i in want if i != spec.eos], tok,
                                              spec.symbols)
  if beam_size == 1:
    return
  _, [beamed] = predict(run, input=text, beam_size=beam_size, max_len=steps)
  assert beamed["score"] == pytest.approx(
      _teacher_forced_logprob(module, params, src, src_mask, spec.start, beamed["tokens"]),
      abs=1e-3)
  assert greedy["score"] == pytest.approx(
      _teacher_forced_logprob(module, params, src, src_mask, spec.start, greedy["tokens"]),
      abs=1e-3)


def test_fill_mask_lists_the_models_probabilities(runs):
  run = runs("bert")
  config, params, tok = inference.load_run(run)
  texts = ["To be, or n[MASK]t to be", "[MASK]OMEO: a[MASK]"]
  _, records = predict(run, input_file=_lines_file(run, texts), top_k=4)
  module = models.build(config.model)
  for text, record in zip(texts, records):
    ids = lib.encode_text(text, tok, lib.special_symbols(config, tok))
    logits = np.asarray(_apply(module)(params, np.asarray([ids])), np.float64)[0]
    logits = logits[:, :tok.vocab_size]                   # [MASK] is no fill
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    positions = [i for i, t in enumerate(ids) if t == 65]
    assert [m["position"] for m in record["masks"]] == positions
    for pos, masked in zip(positions, record["masks"]):
      got = [f["probability"] for f in masked["fills"]]
      assert len(got) == 4 and sum(got) <= 1 + 1e-6 and got == sorted(got, reverse=True)
      np.testing.assert_allclose(got, np.sort(probs[pos])[::-1][:4], rtol=1e-4)
      assert masked["fills"][0]["token"] == tok.decode([int(np.argmax(probs[pos]))])
    assert "[MASK]" not in record["filled"] and len(record["filled"]) == len(ids)


def _digits(n):
  from jaxformer.data.images.pipeline import open_source
  from ml_collections import ConfigDict
  images, labels = open_source(ConfigDict({"source": "digits"})).split_arrays("train")
  return images[:n], labels[:n]


def test_classify_standardises_as_the_training_pipeline(runs, tmp_path):
  from jaxformer.data.images.pipeline import make_image_pipeline
  run = runs("vit")
  config, params, _ = inference.load_run(run)
  images, labels = _digits(6)
  folder = tmp_path / "digits" / "sub"
  folder.mkdir(parents=True)
  for i, image in enumerate(images):
    Image.fromarray(image[..., 0], mode="L").save(folder / f"d{i}.png")
  _, records = predict(run, image=str(tmp_path / "digits"), top_k=3)
  assert [os.path.basename(r["image"]) for r in records] == [f"d{i}.png" for i in range(6)]
  pipeline = make_image_pipeline(config.data, seed=0, global_batch_size=6, eval_batch_size=6)
  batch = pipeline._standardise({"images": images, "labels": labels})
  probs = np.asarray(jax.nn.softmax(_apply(models.build(config.model))(
      params, jnp.asarray(batch["images"])), -1))
  for record, p in zip(records, probs):
    top = np.argsort(-p, kind="stable")[:3]
    assert [t["class"] for t in record["top"]] == top.tolist()
    assert [t["label"] for t in record["top"]] == [str(i) for i in top]
    np.testing.assert_allclose([t["probability"] for t in record["top"]], p[top], rtol=1e-5)


def test_caption_and_its_attention_png(runs, tmp_path):
  from jaxformer.data.images import captions as caption_data
  run = runs("captioner")
  config, params, _ = inference.load_run(run)
  task = caption_data.CaptionTask(config.data)
  image = np.round(task.example("eval", 0)["image"][..., 0] * 255).astype(np.uint8)
  Image.fromarray(image, mode="L").save(tmp_path / "composite.png")
  _, [record] = predict(run, image=str(tmp_path / "composite.png"), beam_size=2,
                        attention_dir=str(tmp_path / "maps"))
  tokens, _ = inference.caption_images(config.model, params,
                                       image[None, ..., None] / np.float32(255), beam_size=2)
  assert record["caption"] == " ".join(caption_data.decode(np.asarray(tokens)[0]))
  png = tmp_path / "maps" / "composite_attention.png"
  assert record["attention_png"] == str(png)
  assert Image.open(png).format == "PNG" and Image.open(png).size[0] > 100


def test_mismatched_inputs_are_one_line_before_compiling(runs, tmp_path, capsys, monkeypatch):
  decoder, vit, bert = runs("decoder"), runs("vit"), runs("bert")
  png = tmp_path / "x.png"
  Image.fromarray(np.zeros((8, 8), np.uint8), mode="L").save(png)
  rgb = tmp_path / "rgb.png"
  Image.fromarray(np.zeros((8, 8, 3), np.uint8), mode="RGB").save(rgb)
  big = tmp_path / "big.png"
  Image.fromarray(np.zeros((28, 28), np.uint8), mode="L").save(big)
  _no_compile(monkeypatch)
  cases = [
      (lambda: predict(decoder, image=str(png)), "takes text, not images"),
      (lambda: predict(vit, input="a cat"), "takes images, not text", "--image"),
      (lambda: predict(bert, input="no mask here"), "has no mask token", "[MASK]"),
      (lambda: predict(decoder, input_file=str(tmp_path / "none.txt")), "none.txt",
       "no such file"),
      (lambda: predict(vit, image=str(tmp_path / "none")), "no such file or folder"),
      (lambda: predict(vit, image=str(rgb)), "3 channels", "8x8 grayscale"),
      (lambda: predict(vit, image=str(big)), "28x28", "takes 8x8"),
      (lambda: predict(decoder, mode="classify", input="a"), "--mode='classify'",
       "generate, score"),
      (lambda: predict(decoder, input="a", image=str(png)), "exactly one of"),
      (lambda: predict(decoder, input="a" * 300, mode="score"), "line 1 is 300 tokens",
       "model.max_len=32"),
      (lambda: predict(str(tmp_path), input="a"), "holds no training run"),
      (lambda: predict(decoder, input="a", checkpoint="5"), "no checkpoint of step 5"),
  ]
  for fn, *fragments in cases:
    _user_error(capsys, fn, *fragments)


def test_command_line_error_is_one_line_exit_2(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "jaxformer.predict", f"--workdir={tmp_path}", "--input=x"],
      capture_output=True, text=True, cwd=ROOT, timeout=240,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert result.returncode == cli.EXIT_USER_ERROR, result.stderr[-2000:]
  lines = result.stderr.strip().splitlines()
  assert "Traceback" not in result.stderr and lines[-1].startswith("error: ")
  assert "holds no training run" in lines[-1]


@pytest.mark.slow
def test_command_line_generate_equals_sample_and_scores_as_jsonl(runs, tmp_path):
  """Greedy text through `predict` equals `sample`'s (and `inference.sample_text`'s)."""
  run = runs("decoder")
  config, params, tok = inference.load_run(run)
  mode, [record] = predict(run, input="ROMEO:", temperature=0.0, max_new_tokens=10)
  assert mode is lib.GENERATE
  assert record["output"] == inference.sample_text(config, params, tok, prompt="ROMEO:",
                                                   max_new_tokens=10, temperature=0)
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  cmd = lambda *a: subprocess.run([sys.executable, "-m", *a], capture_output=True, text=True,
                                  cwd=ROOT, timeout=240, env=env)
  args = [f"--workdir={run}", "--temperature=0", "--max_new_tokens=10"]
  predicted = cmd("jaxformer.predict", "--input=ROMEO:", *args)
  sampled = cmd("jaxformer.sample", "--prompt=ROMEO:", *args)
  assert predicted.returncode == 0 == sampled.returncode, predicted.stderr[-2000:]
  assert predicted.stdout == sampled.stdout == record["output"] + "\n"
  scored = cmd("jaxformer.predict", "--mode=score",
               f"--input_file={_lines_file(run, ['ab', 'cde'])}", f"--workdir={run}",
               f"--output={tmp_path / 'scores.jsonl'}")
  assert scored.returncode == 0, scored.stderr[-2000:]
  records = [json.loads(line) for line in open(tmp_path / "scores.jsonl")]
  assert [r["input"] for r in records] == ["ab", "cde"]
