"""`python -m jaxformer.evaluate`: perplexity and bits per byte on a text source (training's
windows and readers), multiple-choice JSONL, the lm-evaluation-harness adapter (against
jaxformer's own scoring, and through lm-eval's `simple_evaluate` on local task files) and the
linear probe of encoders; user mistakes are one line before anything compiles.

One tiny decoder run is written once per module (config, char tokenizer, a checkpoint of its
initial params: `tests.runs.write_run`) and shared by the tests."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import bert_mlm_shakespeare, electra, vit_tiny
from jaxformer import inference, models, run_settings, tasks
from jaxformer.data import tokenizers
from jaxformer.data.text import make_text_pipeline
from jaxformer.data import pipeline as data_pipeline
from jaxformer.evaluate import choices, perplexity, probe, scoring
from jaxformer.posttrain.score import response_logps
from tests import drawn
from tests.runs import tiny_run_config, write_run
from tests.repo_root import REPO

ROOT = str(REPO)
TEXT = open(os.path.join(ROOT, "jaxformer", "data", "assets", "tinyshakespeare.txt"),
            encoding="utf-8").read()
CHARS = tokenizers.CharTokenizer(TEXT)
ITEMS = [  # one line per format; the right answers are plain English, the wrong ones noise
    {"ctx": "ROMEO: I do love", "endings": ["thee, fair Juliet.", "zxqv kkk jjj."],
     "label": 0},
    {"question": "What does the king wear?",
     "choices": {"text": ["qqq zzz", "a crown"], "label": ["A", "B"]}, "answerKey": "B"},
    {"goal": "To speak to the duke,", "sol1": "go to his court.", "sol2": "xq zv jk",
     "label": "0"},
    {"context": "KING:", "choices": [" I am", " qz"], "answer": " I am"},
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(workdir, config, params, tokenizer) of a tiny char decoder run."""
  workdir = str(tmp_path_factory.mktemp("evaluate") / "run")
  params = write_run(workdir, tiny_run_config(), CHARS)[8]
  config, loaded, tokenizer = inference.load_run(workdir)
  jax.tree.map(np.testing.assert_array_equal, params, loaded)
  return workdir, config, loaded, tokenizer


def _scorer(run, **kw):
  _, config, params, tokenizer = run
  return scoring.Scorer(config, params, vocab_limit=tokenizer.vocab_size, **kw)


@pytest.mark.parametrize("n,width,prefix", [(1, 4, None), (5, 4, None), (9, 4, 7),
                                            (8, 4, 7), (3, 8, 7), (13, 5, None)])
def test_rolling_rows_score_every_token_once_with_full_context(n, width, prefix):
  tokens = list(range(100, 100 + n))
  rows = scoring.rolling_rows(tokens, width, prefix)
  seq = ([prefix] if prefix is not None else []) + tokens
  predicted = []
  for row in rows:
    assert 2 <= len(row.tokens) <= width + 1
    start = seq.index(row.tokens[0]) if row.tokens[0] != prefix else 0
    assert list(row.tokens) == seq[start:start + len(row.tokens)]   # contiguous
    predicted += list(row.tokens[row.first:])
    if row is rows[-1] and len(seq) > width + 1:
      assert len(row.tokens) == width + 1                          # the last: full context
  assert predicted == (tokens if prefix is not None else tokens[1:])


def test_perplexity_equals_training_eval_on_the_same_windows(run):
  """The run's own source, scored on the first 6 windows of the validation split, gives the
  eval loss of the training task (`eval_sums`) on the windows training's eval reads with
  data.eval_batches=None; char text is 1 byte a token, so bits per byte = loss / ln 2."""
  workdir, config, params, tokenizer = run
  seq_len, windows = config.data.seq_len, 6
  got = perplexity.evaluate(config, params, tokenizer, workdir,
                            max_tokens=windows * seq_len, batch_size=4)
  cfg = ConfigDict(config.to_dict())
  cfg.data.eval_batches = None
  settings = run_settings.parse(cfg)
  pipe = make_text_pipeline(cfg.data, "lm", **data_pipeline.pipeline_kwargs(
      settings, workdir=workdir))
  batch = next(iter(pipe.eval_batches()))
  batch = {k: v[:windows] for k, v in batch.items()}
  sums = tasks.task_for_run(cfg).eval_sums(models.build(cfg.model), params, batch)
  want = float(sums["nll"]) / float(sums["count"])
  assert got["tokens"] == windows * seq_len and got["layout"] == "one text"
  np.testing.assert_allclose(got["loss"], want, rtol=1e-5)
  assert got["bytes"] == got["tokens"]
  np.testing.assert_allclose(got["bits_per_byte"], want / math.log(2), rtol=1e-5)
  np.testing.assert_allclose(got["perplexity"], math.exp(want), rtol=1e-5)


def test_bits_per_byte_counts_the_utf8_bytes_of_the_decoded_text(run):
  """Tokens of 1, 2 and 4 UTF-8 bytes: the denominator is the text's bytes, not its
  tokens, and the numerator the nll of the same tokens."""
  tok = tokenizers.CharTokenizer("aé😀\n")
  scorer = _scorer(run, batch_size=4)
  seq = np.array([3, 0, 1, 2, 2, 0, 1, 3, 0] * 9)
  got = perplexity.score_tokens(scorer, tok, [seq])
  text = tok.decode(seq[1:])
  assert got["bytes"] == len(text.encode("utf-8")) > got["tokens"] == len(seq) - 1
  nll = -scorer.score_sequence(seq).logprobs.sum()
  np.testing.assert_allclose(got["bits_per_byte"], nll / math.log(2) / got["bytes"], rtol=1e-6)


def test_perplexity_of_another_source_and_split(run, tmp_path):
  """Any data.source form (here a JSONL of documents) with the run's tokenizer: documents
  are scored one by one; nothing is written in the workdir but the token cache elsewhere."""
  workdir, config, params, tokenizer = run
  docs = tmp_path / "docs.jsonl"
  docs.write_text("".join(json.dumps({"text": TEXT[i:i + 300]}) + "\n"
                          for i in range(0, 30_000, 300)))
  before = sorted(os.listdir(workdir))
  got = perplexity.evaluate(config, params, tokenizer, workdir, source=str(docs), split="train",
                            max_tokens=2000)
  assert sorted(os.listdir(workdir)) == before
  assert got["layout"] == "documents" and got["tokens"] == 2000 and got["split"] == "train"
  assert 0 < got["bits_per_byte"] < 8


def test_multiple_choice_formats_and_scores(run, tmp_path):
  """Each format's context and continuations; each choice's score is jaxformer's
  log p(response | prompt) (posttrain.score); acc and acc_norm follow from them."""
  _, config, params, tokenizer = run
  path = tmp_path / "items.jsonl"
  path.write_text("\n".join(json.dumps(i) for i in ITEMS) + "\n\n")
  items = choices.read_items(str(path))
  assert [i.label for i in items] == [0, 1, 0, 0]
  assert items[1].context == "Question: What does the king wear?\nAnswer:"
  assert items[0].choices == (" thee, fair Juliet.", " zxqv kkk jjj.")
  assert items[3].choices == (" I am", " qz") and items[2].where == f"{path}:3"
  scorer = _scorer(run, batch_size=4)
  got = choices.evaluate(scorer, tokenizer, items, scoring.start_token(tokenizer))
  correct = correct_norm = 0
  for item in items:      # a context longer than the model's is cut on the left
    ll = response_logps(config.model, params, tokenizer,
                        [item.context[-(scorer.width + 1 - len(c)):] for c in item.choices],
                        list(item.choices))
    correct += int(np.argmax(ll) == item.label)
    correct_norm += int(np.argmax(ll / [len(c) for c in item.choices]) == item.label)
  assert got["items"] == 4 and got["chance"] == 0.5
  assert got["acc"] == correct / 4 and got["acc_norm"] == correct_norm / 4
  lo, hi = got["acc_interval"]
  assert lo <= got["acc"] <= hi


def test_wilson_interval():
  lo, hi = choices.wilson(8, 10)
  np.testing.assert_allclose([lo, hi], [0.4902, 0.9433], atol=1e-4)
  assert choices.wilson(0, 5)[0] == 0.0 and choices.wilson(5, 5)[1] == 1.0


@pytest.mark.parametrize("line,expected", [
    ('{"ctx": "a", "endings": ["b", "c"]}', "missing key 'label'"),
    ('{"prompt": "a", "completion": "b"}', "match no multiple-choice format"),
    ('{"context": "a", "choices": ["b", "c"], "answer": 2}', "answer=2 must be a choice index"),
    ('{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, '
     '"answerKey": "C"}', "answerKey='C' is not one of"),
    ("not json", "not JSON"),
])
def test_a_bad_jsonl_line_is_named_with_the_expected_keys(tmp_path, line, expected):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(ITEMS[0]) + "\n" + line + "\n")
  with pytest.raises(ValueError, match=expected) as e:
    choices.read_items(str(path))
  assert f"{path}:2:" in str(e.value)


def test_characters_outside_the_vocabulary_name_the_item(run, tmp_path):
  path = tmp_path / "items.jsonl"
  path.write_text(json.dumps({"context": "a", "choices": [" b", " ü"], "answer": 0}) + "\n")
  items = choices.read_items(str(path))
  with pytest.raises(ValueError, match=f"{path}:1: characters"):
    choices.encode_items(items, run[3], 0)


# --- the lm-evaluation-harness adapter -------------------------------------------------------

def _requests(kind, args):
  from lm_eval.api.instance import Instance
  return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def adapter(run):
  pytest.importorskip("lm_eval")
  from jaxformer.evaluate.harness import JaxformerLM
  _, config, params, tokenizer = run
  return JaxformerLM(run=(config, params, tokenizer), batch_size=4)


def test_loglikelihood_equals_jaxformers_own_scoring(run, adapter):
  _, config, params, tokenizer = run
  pairs = [("ROMEO:", " I do love thee"), ("KING: What say", " you?"),
           (TEXT[:200], " the end"), ("", "JULIET:")]       # a long context is cut on the left
  got = adapter.loglikelihood(_requests("loglikelihood", pairs))
  start = tokenizer.decode([scoring.start_token(tokenizer)])
  prompts = [p[-(adapter.max_length + 1 - len(c)):] or start for p, c in pairs]
  want = response_logps(config.model, params, tokenizer, prompts, [c for _, c in pairs])
  np.testing.assert_allclose([g[0] for g in got], want, rtol=1e-5, atol=1e-4)
  assert all(isinstance(g[1], bool) for g in got)


def test_loglikelihood_rolling_equals_the_perplexity_path(run, adapter):
  """lm-eval's rolling log-likelihood of a text is the perplexity path's sum over the same
  tokens (the start token then the text), and for a text that fits one window, one forward
  pass of the model."""
  _, config, params, tokenizer = run
  texts = [TEXT[1000:1100], TEXT[5000:5020]]
  got = adapter.loglikelihood_rolling(_requests("loglikelihood_rolling", [(t,) for t in texts]))
  start = scoring.start_token(tokenizer)
  for text, value in zip(texts, got):
    seq = np.concatenate([[start], tokenizer.encode(text)])
    metrics = perplexity.score_tokens(_scorer(run, batch_size=4), tokenizer, [seq])
    np.testing.assert_allclose(value, -metrics["loss"] * metrics["tokens"], rtol=1e-5)
  seq = np.concatenate([[start], tokenizer.encode(texts[1])])
  logits = models.build(config.model).apply({"params": params}, seq[None, :-1])
  want = np.take_along_axis(jax.nn.log_softmax(logits[0]), seq[1:, None], -1).sum()
  np.testing.assert_allclose(got[1], want, rtol=1e-5)


def test_generate_until_is_greedy_decoding_cut_at_until(run, adapter):
  _, config, params, tokenizer = run
  prompts = ["ROMEO:", "KING: ", "ROMEO:"]          # one length: one compilation
  got = adapter.generate_until(_requests("generate_until", [
      (prompts[0], {"until": ["\n"], "max_gen_toks": 12}),
      (prompts[1], {"until": [], "max_gen_toks": 12}),
      (prompts[2], {"until": ["e", "\n"], "max_gen_toks": 12})]))
  for prompt, text, until in zip(prompts, got, (["\n"], [], ["e", "\n"])):
    ids = tokenizer.encode(prompt)
    full = tokenizer.decode(inference.generate(config.model, params, ids, max_new_tokens=12,
                                               temperature=0)[len(ids):])
    cut = min([full.index(u) for u in until if u in full], default=len(full))
    assert text == full[:cut]


@pytest.mark.slow
def test_lm_evals_simple_evaluate_scores_a_jaxformer_run_on_local_tasks(run, adapter, tmp_path,
                                                                        monkeypatch):
  """lm-eval's own `simple_evaluate`, the model given by its registered name, on tasks
  defined from local JSONL files (no download): a multiple-choice task scores as
  `jaxformer.evaluate.choices` does, a rolling log-likelihood task and a generation task
  run."""
  for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    monkeypatch.setenv(var, "1")
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
  import lm_eval
  from lm_eval.tasks import TaskManager
  workdir, _, _, tokenizer = run
  generic = [{"context": i["ctx"], "choices": i["endings"], "answer": i["label"]}
             for i in ITEMS[:1]] + [
      {"context": "KING: What", "choices": ["say you?", "qqq zzz"], "answer": 0},
      {"context": "JULIET: O", "choices": ["Romeo, Romeo!", "xjq vvv"], "answer": 1}]
  files = {"mc": generic, "docs": [{"text": TEXT[i:i + 90]} for i in (0, 3000)],
           "gen": [{"question": "ROMEO:"}, {"question": "KING:"}]}
  for name, rows in files.items():
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

  def task(name, file, **kw):
    return {"task": name, "dataset_path": "json", "test_split": "test",
            "dataset_kwargs": {"data_files": {"test": str(tmp_path / f"{file}.jsonl")}}, **kw}
  defs = [task("tiny_mc", "mc", output_type="multiple_choice", doc_to_text="{{context}}",
               doc_to_choice="{{choices}}", doc_to_target="{{answer}}",
               metric_list=[{"metric": "acc"}, {"metric": "acc_norm"}]),
          task("tiny_ppl", "docs", output_type="loglikelihood_rolling", doc_to_text="",
               doc_to_target="{{text}}", metric_list=[{"metric": "bits_per_byte"}]),
          task("tiny_gen", "gen", output_type="generate_until", doc_to_text="{{question}}",
               doc_to_target=" I", generation_kwargs={"until": ["\n"], "max_gen_toks": 8},
               metric_list=[{"metric": "exact_match"}])]
  out = lm_eval.simple_evaluate(model="jaxformer",
                                model_args={"workdir": workdir, "batch_size": 4},
                                tasks=defs, task_manager=TaskManager(), log_samples=True)
  res = out["results"]
  items = [choices.Item(g["context"], tuple(" " + c for c in g["choices"]), g["answer"], "")
           for g in generic]
  ours = choices.evaluate(adapter.scorer, tokenizer, items, scoring.start_token(tokenizer))
  assert res["tiny_mc"]["acc,none"] == pytest.approx(ours["acc"])
  assert res["tiny_mc"]["acc_norm,none"] == pytest.approx(ours["acc_norm"])
  text_ll = adapter.loglikelihood_rolling(_requests("loglikelihood_rolling",
                                                    [(d["text"],) for d in files["docs"]]))
  n_bytes = sum(len(d["text"].encode()) for d in files["docs"])
  assert res["tiny_ppl"]["bits_per_byte,none"] == pytest.approx(
      -sum(text_ll) / n_bytes / math.log(2), rel=1e-5)
  generated = [s["resps"][0][0] for s in out["samples"]["tiny_gen"]]
  assert generated == adapter.generate_until(_requests("generate_until", [
      (q["question"], {"until": ["\n"], "max_gen_toks": 8}) for q in files["gen"]]))


# --- linear probes ---------------------------------------------------------------------------

def _init(config):
  """Random params of config.model (what the probe reads of a run; no train state), drawn on
  the host at its init's shapes (tests/drawn.py; no compiled init)."""
  from jaxformer.state import train_state
  return drawn.params(models.build(config.model), *train_state.init_inputs(config.model))


def test_linear_probe_of_a_vit_on_digits(tmp_path):
  """Random ViT features of the bundled digits, probed: well above chance on both splits."""
  config = vit_tiny.get_config("digits")
  got = probe.evaluate(config, _init(config), None, max_examples=200)
  assert got["train_examples"] == got["test_examples"] == 200 and got["classes"] == 10
  assert got["test_accuracy"] > 2.5 * got["majority_class"]
  assert got["train_accuracy"] >= got["test_accuracy"]


@pytest.mark.parametrize("family", ["bert", "electra"])
def test_linear_probe_of_a_text_encoder_on_labelled_text(family, tmp_path):
  """Mean-pooled features of a (random) tiny BERT, or ELECTRA's discriminator, separate texts
  of two kinds."""
  config = (bert_mlm_shakespeare.get_config("tiny") if family == "bert"
            else electra.get_config("tiny"))
  params, tokenizer = _init(config), CHARS
  rng = np.random.default_rng(0)
  lines = [json.dumps({"text": "".join(rng.choice(list("aeiou" if k else "XYZQW"), 12)),
                       "label": ["consonant", "vowel"][k]}) for k in rng.integers(0, 2, 40)]
  data = tmp_path / "labelled.jsonl"
  data.write_text("\n".join(lines) + "\n")
  got = probe.evaluate(config, params, tokenizer, data=str(data))
  assert got["labels"] == ["consonant", "vowel"] and got["test_examples"] == 8
  assert got["train_accuracy"] == got["test_accuracy"] == 1.0


def test_probe_refuses_a_decoder_and_bad_lines(run, tmp_path):
  with pytest.raises(ValueError, match="probes encoders .* model.family='decoder'"):
    probe.check_family(run[1])
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "a", "label": 1}\n{"text": "b"}\n')
  with pytest.raises(ValueError, match=f"{bad}:2: expected the keys text"):
    probe.read_labelled(str(bad))


# --- the command line --------------------------------------------------------------------------

def _cli(*args, env=None):
  return subprocess.run([sys.executable, "-m", "jaxformer.evaluate", *args], cwd=ROOT,
                        capture_output=True, text=True, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_cli_writes_results_and_refuses_mistakes_in_one_line(run, tmp_path):
  """Perplexity through the command line: a table and <workdir>/eval/<name>.json; a missing
  workdir, a task the family cannot do and a bad JSONL line: one line, exit 2, before
  anything compiles (the compilation cache stays empty)."""
  workdir = run[0]
  done = _cli(f"--workdir={workdir}", "--max_tokens=64", "--name=smoke", "--compilation_cache=")
  assert done.returncode == 0, done.stderr[-2000:]
  saved = json.loads(open(os.path.join(workdir, "eval", "smoke.json")).read())
  assert saved["task"] == "perplexity" and saved["step"] == 8
  assert saved["results"]["tokens"] == 64 and "bits_per_byte" in done.stdout
  vit = str(tmp_path / "vit")
  os.makedirs(vit)
  with open(os.path.join(vit, "config.json"), "w") as f:
    f.write(vit_tiny.get_config("digits").to_json())
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"goal": "g", "sol1": "a"}\n')
  cache = tmp_path / "xla"
  for args, message in [
      ([f"--workdir={tmp_path / 'nope'}"], "does not exist"),
      ([f"--workdir={vit}"], "--task=perplexity scores text with a decoder LM; this run is "
                             "model.family='vit'"),
      ([f"--workdir={workdir}", "--task=multiple_choice", f"--data={bad}"],
       f"{bad}:1: missing key 'sol2'; expected the keys of one format")]:
    done = _cli(*args, f"--compilation_cache={cache}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
  assert not cache.exists() or not any(cache.iterdir())
