"""experiments/posttrain.py's pieces without training: the checker, the prompts (alphabet,
train/held-out separation), the DPO pairs built from scored samples, the response scorer
(jaxformer/posttrain/score.py) against a plain forward pass, and the sampler's determinism."""

import functools

import jax
import numpy as np
import pytest

from configs import shakespeare_char
from experiments import posttrain
from jaxformer.scaling import stats
from jaxformer import models
from jaxformer.data.corpus import sources
from jaxformer.data.tokenizers import CharTokenizer
from jaxformer.posttrain.score import response_logps


def _tokenizer():
  return CharTokenizer(sources.BUNDLED["tinyshakespeare"].read_text())


def test_the_checker_reads_the_first_line_and_wants_the_exact_word():
  assert posttrain.accepts("love", " love\n")
  assert posttrain.accepts("love", " love")             # cut by MAX_NEW before the newline
  assert posttrain.accepts("love", "love  \nROMEO: more")
  assert not posttrain.accepts("love", " Love\n")        # case counts
  assert not posttrain.accepts("love", " loved\n")
  assert not posttrain.accepts("love", " love.\n")
  assert not posttrain.accepts("love", " my love\n")
  assert not posttrain.accepts("love", "\nlove\n")       # the first line is empty
  assert not posttrain.accepts("love", "")


def test_an_example_asks_for_the_last_word_without_its_punctuation():
  ex = posttrain.example("  Shall I compare thee to a summer's day?  ")
  assert ex == {"prompt": "Shall I compare thee to a summer's day?\nLAST WORD:",
                "response": " day\n", "word": "day"}
  assert posttrain.example("And so, farewell.'") ["word"] == "farewell"
  assert posttrain.example("ROMEO:")["word"] == "ROMEO"
  for line in ("", "   ", "Is it so, o'er", "Ay, I", "What, 1?"):
    assert posttrain.example(line) is None, line


def test_corpus_lines_split_where_pretraining_split_and_share_no_line():
  text = "alpha one\nbeta two\ngamma three\nbeta two\ndelta four\nepsilon five\n"
  train, held_out = posttrain.corpus_lines(text, 0.5)
  cut = int(len(text) * 0.5)
  assert all(line in text[:cut] for line in train)
  assert "beta two" not in held_out and "delta four" in held_out
  assert not set(train) & set(held_out)


def test_the_task_data_fits_the_model_and_keeps_held_out_prompts_unseen():
  tok = _tokenizer()
  train, held_out = posttrain.task_data(tok, 64, num_eval=200, seed=0)
  assert len(held_out) == 200 and len(train) > 5000
  assert not {e["prompt"] for e in train} & {e["prompt"] for e in held_out}
  train_lines = {e["prompt"].split("\n")[0] for e in train}
  assert not train_lines & {e["prompt"].split("\n")[0] for e in held_out}
  for e in train[:500] + held_out:
    text = e["prompt"] + e["response"]
    assert set(text) <= set(tok.chars)
    assert len(e["prompt"]) + posttrain.MAX_NEW <= 64 and len(e["response"]) <= posttrain.MAX_NEW
    assert e["prompt"].endswith(posttrain.QUESTION) and posttrain.accepts(e["word"],
                                                                          e["response"])
  again = posttrain.task_data(tok, 64, num_eval=200, seed=0)
  assert again == (train, held_out)


def test_pairs_take_an_accepted_sample_or_the_gold_one_and_skip_all_accepted_prompts():
  examples = [posttrain.example(line) for line in ("O happy dagger", "Good night, sweet prince",
                                                    "To be or not to be")]
  samples = [[" dagger\n", " knife\n", " dagger\n"],      # one of each: a pair
             [" night\n", " sweet\n", " Prince\n"],        # none accepted: gold chosen
             [" be\n", " be\n", "be\n"]]                    # all accepted: no pair
  records, counts = posttrain.build_pairs(examples, samples)
  assert records == [
      {"prompt": examples[0]["prompt"], "chosen": " dagger\n", "rejected": " knife\n"},
      {"prompt": examples[1]["prompt"], "chosen": " prince\n", "rejected": " night\n"}]
  assert counts == {"prompts": 3, "all_accepted": 1, "none_accepted": 1, "samples": 9,
                    "accepted_samples": 5, "pairs": 2}
  with pytest.raises(ValueError):
    posttrain.build_pairs(examples, samples[:2])
  logps = [[-1.0, -5.0, -2.0], [-4.0, -3.0, -9.0], [-1.0, -1.0, -1.0]]
  records, _ = posttrain.build_pairs(examples, samples, logps)
  assert [r["rejected"] for r in records] == [" knife\n", " sweet\n"]     # the likeliest


def test_wilson_interval():
  low, high = stats.wilson_interval(0, 200)
  assert low == 0.0 and 0.015 < high < 0.02
  low, high = stats.wilson_interval(100, 200)
  assert low == pytest.approx(1 - high) and 0.43 < low < 0.44
  assert posttrain.refit({"scores": {"m": {"greedy": posttrain.rate(3, 10), "kl": {}}}}) == \
      posttrain.stored({"scores": {"m": {"greedy": posttrain.rate(3, 10)}}})


@functools.cache
def _tiny_model():
  """shakespeare_char:tiny's model, initialised once (jitted) for this module's tests."""
  cfg = models.with_defaults(shakespeare_char.get_config("tiny").model)
  module = models.build(cfg)
  params = jax.jit(lambda key: module.init(key, np.zeros((1, cfg["max_len"]), np.int32),
                                           deterministic=True)["params"])(jax.random.key(0))
  return cfg, module, params


def test_response_logps_is_the_sum_of_the_response_tokens_log_probs():
  cfg, module, params = _tiny_model()
  tok = _tokenizer()
  prompts, responses = ["To be, or not", "Ay"], [" to be\n", " me!"]
  got = response_logps(cfg, params, tok, prompts, responses, batch_size=1)
  encoded = [tok.encode(p + r) for p, r in zip(prompts, responses)]
  rows = np.zeros((len(encoded), max(map(len, encoded)) - 1), np.int32)  # causal: padding
  for row, ids in zip(rows, encoded):                                    # after is unseen
    row[:len(ids) - 1] = ids[:-1]
  all_logits = jax.jit(lambda x: module.apply({"params": params}, x, deterministic=True))(rows)
  for prompt, ids, logits, value in zip(prompts, encoded, all_logits, got):
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)
    want = sum(logp[t - 1, ids[t]] for t in range(len(prompt), len(ids)))
    assert value == pytest.approx(float(want), abs=1e-4)
  assert np.allclose(response_logps(cfg, params, tok, prompts, responses, batch_size=2), got,
                     atol=1e-5)                  # two records in one batch
  with pytest.raises(ValueError, match="max_len"):
    response_logps(cfg, params, tok, ["x" * 40], ["y"])


def test_sampling_is_deterministic_per_row_and_greedy_is_the_argmax():
  cfg, module, params = _tiny_model()
  tok = _tokenizer()
  prompts = ["ROMEO:", "To be or", "JULIET: Ay"]
  one = posttrain.sample_responses(cfg, params, tok, prompts, max_new=6, temperature=1.0,
                                   seed=3, batch_size=2)
  assert one == posttrain.sample_responses(cfg, params, tok, prompts, max_new=6,
                                           temperature=1.0, seed=3, batch_size=2)
  assert all(len(r) <= 6 and ("\n" not in r[:-1]) for r in one)
  greedy = posttrain.sample_responses(cfg, params, tok, prompts[:1], max_new=1,
                                      temperature=0.0, seed=0)[0]
  ids = tok.encode(prompts[0])
  logits = module.apply({"params": params}, ids[None], deterministic=True)[0, -1]
  assert greedy == tok.decode([int(np.argmax(logits))])


def test_sweep_points_parse_and_render_as_a_table():
  assert posttrain.parse_sweep("0.1:1e-5,0.5:5e-6,") == [(0.1, 1e-5), (0.5, 5e-6)]
  for bad in ("0.1", "0.1:x", "0:1e-5"):
    with pytest.raises(ValueError, match="--sweep entry"):
      posttrain.parse_sweep(bad)
  point = lambda beta, lr, ok: {"beta": beta, "lr": lr, "steps": 200,
                                "greedy": posttrain.rate(ok, 200),
                                "sampled": posttrain.rate(2 * ok, 800),
                                "kl_to_sft": {"mean": 0.5, "sem": 0.04, "n": 800}}
  results = {"setup": {"beta": 0.5, "dpo_lr": 5e-6, "dpo_steps": 200, "dpo_batch": 32},
             "sweep": [point(0.1, 1e-5, 111), point(0.5, 5e-6, 152)]}
  lines = posttrain._sweep_lines(results)
  assert "| 0.1 | 1e-05 | 55.5% " in "\n".join(lines)
  assert "| 0.5 | 5e-06 (main) | 76.0% " in "\n".join(lines)
  assert posttrain._sweep_lines({"setup": results["setup"]}) == []
