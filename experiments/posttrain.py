"""Post-training on CPU, checked by a program: SFT, DPO, then RLVR (GRPO with the checker as
the reward) teach the README's char-level Shakespeare GPT to answer "<line>\\nLAST WORD:" with
" <the line's last word>\\n".

    python -m experiments.posttrain [--pretrained=WORKDIR] [--workdir=runs/posttrain]
    python -m experiments.posttrain --report_only       # the report again from its JSON

Stages, each a workdir under --workdir; a finished one is reused, an interrupted one resumes:
1. `pretrain`: configs/shakespeare_char.py (the README's first command), unless --pretrained.
2. Prompts from the bundled tiny Shakespeare, split as pretraining split it (the first
   data.train_fraction of the characters are train): train prompts from train-split lines,
   held-out eval prompts from validation-split lines whose text never occurs as a train line.
   The checker (`accepts`) takes the text before the first newline, stripped, and wants it to
   be exactly the word. The pretrained model's base rate is ~0: it has never seen the
   "LAST WORD:" format, and continues with Shakespeare-like text that only by chance is one
   word (the right one) followed by a newline.
3. `sft`: configs/sft.py on every train prompt with its gold response (loss on the response).
4. `pairs.jsonl` (rebuilt deterministically each run from the SFT checkpoint): k responses per
   train prompt sampled from the SFT model at temperature 1; chosen = one the checker accepts
   (the gold response where none does), rejected = the likeliest (under the SFT model) of
   those it rejects (prompts with none dropped).
   `dpo`: configs/dpo.py from the SFT run on those pairs.
5. `rlvr`: configs/grpo.py from the DPO run (Tulu 3's order: SFT, DPO, RLVR) on
   --grpo_prompts train prompts ({"prompt", "answer": the word}), reward `first_line_exact`
   (the checker, jaxformer/posttrain/rewards.py), completions ended by "\\n", --k_rl samples
   per prompt; its logged reward is the reward curve.
6. The same held-out prompts scored for the pretrained, SFT, DPO and RLVR models, greedy and sampled
   at temperature 1 (several samples per prompt), with Wilson 95% intervals (the samples of
   one prompt are correlated, so the sampled intervals are somewhat too narrow); the KL of the
   DPO policy from its reference (the SFT model) as the on-policy Monte-Carlo estimate
   mean_y~pi [log pi(y|x) - log ref(y|x)] per response (y = the sampled tokens up to the
   first newline, or all of them; the same for SFT against the pretrained model, and RLVR
   against the SFT model); DPO's logged reward accuracy and margins.
Writes experiments/results/posttrain.{md,json,png}; every number is measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from configs import dpo as dpo_config  # noqa: E402
from configs import grpo as grpo_config  # noqa: E402
from configs import sft as sft_config  # noqa: E402
from configs import shakespeare_char  # noqa: E402
from experiments import report_check  # noqa: E402
from jaxformer import models  # noqa: E402
from jaxformer.data.corpus import sources  # noqa: E402
from jaxformer.inference import load_run  # noqa: E402
from jaxformer.posttrain import rewards  # noqa: E402
from jaxformer.posttrain.score import response_logps  # noqa: E402
from jaxformer.scaling import stats  # noqa: E402
from jaxformer.train import loop  # noqa: E402
from jaxformer.train.metrics import read as read_metrics  # noqa: E402

OUT = report_check.RESULTS / "posttrain"
FORMAT = 2
QUESTION = "\nLAST WORD:"
MODELS = ("pretrained", "sft", "dpo", "rlvr")
MAX_NEW = 12              # tokens sampled per response: a 10-letter word, its space and newline
WORD = re.compile(r"[A-Za-z]+")
TRAIL = ".,;:!?'\"-)"


# ---------------------------------------------------------------- the task and its checker

def last_word(line: str) -> str | None:
  """The line's last whitespace-separated token without trailing punctuation, if it is a word
  of letters only (else None: the line gives no prompt)."""
  tokens = line.split()
  if not tokens:
    return None
  word = tokens[-1].rstrip(TRAIL)
  return word if len(word) >= 2 and WORD.fullmatch(word) else None


def example(line: str) -> dict | None:
  """{'prompt', 'response', 'word'} of one corpus line (None: no usable last word)."""
  line = line.strip()
  word = last_word(line)
  if word is None:
    return None
  return {"prompt": line + QUESTION, "response": " " + word + "\n", "word": word}


def answer(response: str) -> str:
  """What the checker reads: the response before its first newline, stripped."""
  return rewards.first_line(response)


def accepts(word: str, response: str) -> bool:
  """The checker: the answer is exactly the word (case included); the library's reward
  `first_line_exact` on the record {'answer': word}."""
  return rewards.first_line_exact(response, {"answer": word}) == 1.0


def corpus_lines(text: str, train_fraction: float) -> tuple[list[str], list[str]]:
  """(train lines, validation lines) of the text split where pretraining split it (the first
  `train_fraction` of its characters are train); the line cut by the split is dropped, and a
  validation line whose text is also a train line too (held-out prompts are never trained on).
  """
  cut = int(len(text) * train_fraction)
  train = text[:cut].split("\n")[:-1]
  validation = text[cut:].split("\n")[1:]
  seen = {line.strip() for line in train}
  return train, [line for line in validation if line.strip() not in seen]


def build_examples(lines: list[str], tokenizer, max_tokens: int) -> list[dict]:
  """The distinct usable examples of `lines`, in corpus order: a response of at most MAX_NEW
  characters, a prompt + MAX_NEW sampled tokens within `max_tokens` (the position table),
  every character in the tokenizer's alphabet."""
  out, seen = [], set()
  alphabet = set(tokenizer.chars) if hasattr(tokenizer, "chars") else None
  for line in lines:
    ex = example(line)
    if ex is None or ex["prompt"] in seen:
      continue
    text = ex["prompt"] + ex["response"]
    fits = len(ex["response"]) <= MAX_NEW and len(ex["prompt"]) + MAX_NEW <= max_tokens
    if not fits or (alphabet is not None and not set(text) <= alphabet):
      continue
    seen.add(ex["prompt"])
    out.append(ex)
  return out


def task_data(tokenizer, max_tokens: int, *, num_eval: int, seed: int,
              train_fraction: float = 0.9) -> tuple[list[dict], list[dict]]:
  """(train examples, `num_eval` held-out eval examples) from the bundled tiny Shakespeare."""
  text = sources.BUNDLED["tinyshakespeare"].read_text()
  train_lines, eval_lines = corpus_lines(text, train_fraction)
  train = build_examples(train_lines, tokenizer, max_tokens)
  held_out = build_examples(eval_lines, tokenizer, max_tokens)
  rng = np.random.default_rng(seed)
  train = [train[i] for i in rng.permutation(len(train))]
  held_out = [held_out[i] for i in rng.permutation(len(held_out))[:num_eval]]
  return train, held_out


# ---------------------------------------------------------------- sampling

@functools.partial(jax.jit, static_argnames=("module", "steps", "greedy"))
def _sample(module, params, tokens, lengths, rows, temperature, seed, *, steps, greedy):
  """tokens [B, W] right-padded prompts of `lengths`; `steps` tokens appended to each row by
  full forward passes (no cache: every row has its own length and one shape compiles once).
  The key of a token is fold_in(fold_in(key(seed), step), row id): a row's sample does not
  depend on the batch it is in."""
  key = jax.random.key(seed)

  def body(s, tokens):
    logits = module.apply({"params": params}, tokens, deterministic=True)
    at = lengths + s - 1
    last = jnp.take_along_axis(logits, at[:, None, None], axis=1)[:, 0].astype(jnp.float32)
    if greedy:
      new = jnp.argmax(last, -1)
    else:
      keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.fold_in(key, s), rows)
      new = jax.vmap(jax.random.categorical)(keys, last / temperature)
    return tokens.at[jnp.arange(tokens.shape[0]), at + 1].set(new.astype(tokens.dtype))

  return jax.lax.fori_loop(0, steps, body, tokens)


def sample_responses(model_config, params, tokenizer, prompts: list[str], *, max_new: int,
                     temperature: float, seed: int, batch_size: int = 256) -> list[str]:
  """One response of `max_new` tokens per prompt (temperature 0: greedy), cut after its first
  newline (a response ends there; the char tokenizer has no eos)."""
  cfg = models.with_defaults(model_config)
  width, module = int(cfg["max_len"]), models.build(cfg)
  params = nn.unbox(params)
  encoded = [tokenizer.encode(p) for p in prompts]
  if max(len(e) for e in encoded) + max_new > width:
    raise ValueError(f"a prompt + {max_new} new tokens is longer than model.max_len={width}")
  out = []
  for start in range(0, len(encoded), batch_size):
    chunk = encoded[start:start + batch_size]
    tokens = np.zeros((batch_size, width), np.int32)
    lengths = np.ones(batch_size, np.int32)
    for r, ids in enumerate(chunk):
      tokens[r, :len(ids)], lengths[r] = ids, len(ids)
    rows = np.arange(start, start + batch_size, dtype=np.uint32)
    got = np.asarray(_sample(module, params, tokens, lengths, rows,
                             jnp.float32(max(temperature, 1e-6)), jnp.uint32(seed),
                             steps=max_new, greedy=temperature == 0))
    for r, ids in enumerate(chunk):
      text = tokenizer.decode(got[r, len(ids):len(ids) + max_new])
      out.append(text[:text.index("\n") + 1] if "\n" in text else text)
  return out


# ---------------------------------------------------------------- pairs and scores

def build_pairs(examples: list[dict], samples: list[list[str]],
                logps: list[list[float]] | None = None) -> tuple[list[dict], dict]:
  """DPO records from k scored samples per prompt: chosen = the first accepted sample (the
  gold response if none is); rejected = the rejected sample the model found likeliest (its
  `logps`; the first one without them): the mistake greedy decoding is closest to making,
  rather than a low-probability typo of temperature-1 sampling. Prompts whose samples all
  pass give no pair. Returns (records, counts)."""
  records, counts = [], {"prompts": len(examples), "all_accepted": 0, "none_accepted": 0,
                         "samples": 0, "accepted_samples": 0}
  if logps is None:
    logps = [[0.0] * len(s) for s in samples]
  for ex, responses, scores in zip(examples, samples, logps, strict=True):
    ok = [accepts(ex["word"], r) for r in responses]
    counts["samples"] += len(ok)
    counts["accepted_samples"] += sum(ok)
    good = [r for r, k in zip(responses, ok) if k]
    bad = [(-score, i) for i, (score, k) in enumerate(zip(scores, ok)) if not k]
    if not bad:
      counts["all_accepted"] += 1
      continue
    if not good:
      counts["none_accepted"] += 1
    records.append({"prompt": ex["prompt"], "chosen": good[0] if good else ex["response"],
                    "rejected": responses[min(bad)[1]]})
  counts["pairs"] = len(records)
  return records, counts


def rate(successes: int, n: int) -> dict:
  low, high = stats.wilson_interval(successes, n)
  return {"accepted": successes, "n": n, "rate": successes / n, "ci95": [low, high]}


def write_jsonl(path: str, records: list[dict]) -> None:
  with open(path, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")


# ---------------------------------------------------------------- the stages

def pretrain(args) -> str:
  if args.pretrained:
    return args.pretrained
  run_dir = os.path.join(args.workdir, "pretrain")
  loop.train(shakespeare_char.get_config(), run_dir)
  return run_dir


def finetune(args, pretrained: str, train: list[dict]) -> str:
  data = os.path.join(args.workdir, "sft_train.jsonl")
  write_jsonl(data, [{"prompt": e["prompt"], "response": e["response"]} for e in train])
  cfg = sft_config.get_config(pretrained)
  cfg.data.source, cfg.data.eval_batches = data, 10
  cfg.train.update(steps=args.sft_steps, batch_size=args.sft_batch, eval_every=args.sft_steps // 4,
                   checkpoint_every=args.sft_steps // 4, log_every=max(args.sft_steps // 20, 1))
  cfg.optim.update(lr=args.sft_lr, warmup_steps=min(20, args.sft_steps // 4))
  run_dir = os.path.join(args.workdir, "sft")
  loop.train(cfg, run_dir)
  return run_dir


def preference_pairs(args, sft_dir: str, train: list[dict], max_new: int) -> tuple[str, dict]:
  config, params, tokenizer = load_run(sft_dir)
  chosen = train[:args.pair_prompts]
  prompts = [e["prompt"] for e in chosen for _ in range(args.k)]
  flat = sample_responses(config.model, params, tokenizer, prompts, max_new=max_new,
                          temperature=1.0, seed=args.seed + 1)
  samples = [flat[i * args.k:(i + 1) * args.k] for i in range(len(chosen))]
  logps = None
  if args.rejected == "likeliest":
    scores = response_logps(config.model, params, tokenizer, prompts, flat)
    logps = [scores[i * args.k:(i + 1) * args.k].tolist() for i in range(len(chosen))]
  records, counts = build_pairs(chosen, samples, logps)
  path = os.path.join(args.workdir, "pairs.jsonl")
  write_jsonl(path, records)
  return path, {**counts, "k": args.k, "rejected": args.rejected}


def preference_tune(args, sft_dir: str, pairs: str, *, beta: float, lr: float,
                    name: str = "dpo") -> str:
  cfg = dpo_config.get_config(sft_dir)
  cfg.data.source, cfg.data.eval_batches = pairs, 10
  cfg.posttrain.beta = beta
  cfg.train.update(steps=args.dpo_steps, batch_size=args.dpo_batch,
                   eval_every=args.dpo_steps // 4, checkpoint_every=args.dpo_steps // 4,
                   log_every=max(args.dpo_steps // 20, 1))
  cfg.optim.update(lr=lr, warmup_steps=min(20, args.dpo_steps // 4))
  run_dir = os.path.join(args.workdir, name)
  loop.train(cfg, run_dir)
  return run_dir


def reinforce(args, dpo_dir: str, train: list[dict]) -> str:
  """GRPO from the DPO run on train prompts, the checker as the reward (module docstring)."""
  data = os.path.join(args.workdir, "grpo_prompts.jsonl")
  write_jsonl(data, [{"prompt": e["prompt"], "answer": e["word"]}
                     for e in train[-args.grpo_prompts:]])
  cfg = grpo_config.get_config(dpo_dir)
  cfg.data.source, cfg.data.eval_batches = data, 2
  if args.grpo_seq_len is not None:
    cfg.data.seq_len = args.grpo_seq_len
  cfg.posttrain.update(reward="first_line_exact", stop="\n", max_new_tokens=MAX_NEW,
                       num_generations=args.k_rl, beta=args.rl_beta, temperature=1.0)
  cfg.train.update(steps=args.rl_steps, batch_size=args.rl_batch,
                   eval_every=max(args.rl_steps // 4, 1), checkpoint_every=max(args.rl_steps // 8, 1),
                   log_every=max(args.rl_steps // 40, 1))
  cfg.optim.update(lr=args.rl_lr, warmup_steps=min(10, args.rl_steps // 4))
  run_dir = os.path.join(args.workdir, "rlvr")
  loop.train(cfg, run_dir)
  return run_dir


def rlvr_logged(run_dir: str) -> dict:
  """The RLVR run's reward curve: train records (reward, kl, completion length) and evals."""
  records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
  train = [{k: r[k] for k in ("step", "reward", "kl", "completion_length",
                              "frac_reward_zero_std", "loss") if k in r}
           for r in records if "reward" in r]
  evals = [{k: r[k] for k in ("step", "eval_reward", "eval_kl", "eval_completion_length")
            if k in r} for r in records if "eval_reward" in r]
  return {"train": train, "eval": evals}


def parse_sweep(text: str) -> list[tuple[float, float]]:
  """'0.1:1e-5,0.5:5e-6' -> [(beta, lr), ...]; a ValueError names the bad entry."""
  out = []
  for entry in filter(None, text.split(",")):
    try:
      beta, lr = (float(x) for x in entry.split(":"))
    except ValueError:
      raise ValueError(f"--sweep entry {entry!r} must be beta:lr, e.g. 0.1:1e-5") from None
    if beta <= 0 or lr <= 0:
      raise ValueError(f"--sweep entry {entry!r}: beta and lr must be > 0")
    out.append((beta, lr))
  return out


def responses_and_rates(args, run, prompts: list[str], words: list[str], max_new: int):
  """(greedy responses, sampled responses, {'greedy', 'sampled'} checker rates) of a loaded
  run on the held-out prompts (the same seeds for every model)."""
  config, params, tokenizer = run
  greedy = sample_responses(config.model, params, tokenizer, prompts, max_new=max_new,
                            temperature=0.0, seed=0)
  sampled = sample_responses(config.model, params, tokenizer,
                             [p for p in prompts for _ in range(args.eval_samples)],
                             max_new=max_new, temperature=1.0, seed=args.seed + 2)
  return greedy, sampled, {
      "greedy": rate(sum(accepts(w, r) for w, r in zip(words, greedy)), len(words)),
      "sampled": rate(sum(accepts(words[i // args.eval_samples], r)
                          for i, r in enumerate(sampled)), len(sampled))}


def on_policy_kl(args, policy, reference, prompts: list[str], sampled: list[str]) -> dict:
  """KL(pi || ref) per response, estimated on pi's own samples (module docstring)."""
  xs = [p for p in prompts for _ in range(args.eval_samples)]
  pi = response_logps(policy[0].model, policy[1], policy[2], xs, sampled)
  ref = response_logps(reference[0].model, reference[1], policy[2], xs, sampled)
  diff = pi - ref
  return {"mean": float(diff.mean()), "sem": float(diff.std(ddof=1) / math.sqrt(len(diff))),
          "n": int(len(diff)), "mean_response_logp": float(pi.mean())}


def evaluate(args, runs: dict, held_out: list[dict], max_new: int) -> dict:
  """Checker scores of every model (greedy and sampled), the KLs and a few examples."""
  loaded = {name: load_run(d) for name, d in runs.items()}
  prompts = [e["prompt"] for e in held_out]
  words = [e["word"] for e in held_out]
  out, responses = {}, {}
  for name, run in loaded.items():
    greedy, sampled, out[name] = responses_and_rates(args, run, prompts, words, max_new)
    responses[name] = (greedy, sampled)
  for policy, reference in (("sft", "pretrained"), ("dpo", "sft"), ("rlvr", "sft")):
    out[policy]["kl_to_" + reference] = on_policy_kl(
        args, loaded[policy], loaded[reference], prompts, responses[policy][1])
  shown = [{"prompt": prompts[i], "word": words[i],
            **{name: responses[name][0][i] for name in loaded}} for i in range(args.show)]
  return {"scores": out, "examples": shown}


def sweep(args, sft_dir: str, pairs: str, held_out: list[dict], max_new: int,
          points: list[tuple[float, float]]) -> list[dict]:
  """DPO at other (beta, lr) on the same pairs and steps, each scored like the main run."""
  prompts = [e["prompt"] for e in held_out]
  words = [e["word"] for e in held_out]
  reference = load_run(sft_dir)
  out = []
  for beta, lr in points:
    run_dir = preference_tune(args, sft_dir, pairs, beta=beta, lr=lr,
                              name=f"dpo_beta{beta:g}_lr{lr:g}")
    run = load_run(run_dir)
    _, sampled, rates = responses_and_rates(args, run, prompts, words, max_new)
    out.append({"beta": beta, "lr": lr, "steps": args.dpo_steps, **rates,
                "kl_to_sft": on_policy_kl(args, run, reference, prompts, sampled)})
  return out


def dpo_logged(dpo_dir: str) -> dict:
  """The DPO run's last logged train metrics and its first and last evals."""
  records = read_metrics(os.path.join(dpo_dir, "metrics.jsonl"))
  train = [r for r in records if "dpo_rewards_margin" in r]
  evals = [r for r in records if "eval_accuracy" in r]
  keep = lambda r, keys: {k: r[k] for k in keys if k in r}
  eval_keys = ("step", "eval_loss", "eval_accuracy", "eval_rewards_margin",
               "eval_rewards_chosen", "eval_rewards_rejected", "eval_logratio")
  return {"train_first": keep(train[0], ("step", "loss", "dpo_rewards_margin", "dpo_logratio")),
          "train_last": keep(train[-1], ("step", "loss", "dpo_rewards_margin", "dpo_logratio")),
          "eval_first": keep(evals[0], eval_keys), "eval_last": keep(evals[-1], eval_keys)}


def sft_logged(sft_dir: str) -> dict:
  records = read_metrics(os.path.join(sft_dir, "metrics.jsonl"))
  evals = [r for r in records if "eval_loss" in r]
  return {"eval_first": {k: evals[0][k] for k in ("step", "eval_loss") if k in evals[0]},
          "eval_last": {k: evals[-1][k] for k in ("step", "eval_loss") if k in evals[-1]}}


# ---------------------------------------------------------------- the report

def _pct(r: dict) -> str:
  low, high = r["ci95"]
  return f"{100 * r['rate']:.1f}% [{100 * low:.1f}, {100 * high:.1f}] ({r['accepted']}/{r['n']})"


def _quote(text: str) -> str:
  return "`" + text.replace("\n", "\\n").replace("`", "'").replace("|", "/") + "`"


def render(results: dict) -> str:
  """The markdown report, from the JSON alone."""
  s, setup, pairs = results["scores"], results["setup"], results["pairs"]
  kl_dpo, kl_sft = s["dpo"]["kl_to_sft"], s["sft"]["kl_to_pretrained"]
  logged = results["dpo_logged"]
  lines = [
      "# Post-training on CPU: SFT, DPO, then RLVR, checked by a program", "",
      f"Task: `<line>{QUESTION.encode('unicode_escape').decode()}` -> ` <last word>\\n` on "
      f"tiny Shakespeare lines; the checker accepts a response whose text before its first "
      f"newline, stripped, is exactly the line's last word. {setup['eval_prompts']} held-out "
      f"prompts from validation-split lines (never a train line); {setup['train_prompts']} "
      "train prompts from train-split lines. Model: the README's char-level GPT "
      f"({setup['params']:,} params, {setup['pretrain_steps']} pretraining steps).", "",
      f"SFT: {setup['sft_steps']} steps, batch {setup['sft_batch']}, lr {setup['sft_lr']:g}. "
      f"DPO: {pairs['pairs']} pairs from {pairs['prompts']} train prompts x {pairs['k']} SFT "
      f"samples at temperature 1, rejected = the {pairs['rejected']} rejected sample "
      f"({pairs['accepted_samples']}/{pairs['samples']} samples "
      f"accepted; {pairs['all_accepted']} prompts had no rejected sample and were dropped; "
      f"{pairs['none_accepted']} had no accepted one and use the gold response as chosen), "
      f"{setup['dpo_steps']} steps, batch {setup['dpo_batch']}, lr {setup['dpo_lr']:g}, "
      f"beta {setup['beta']:g}. RLVR: GRPO from the DPO model on {setup['grpo_prompts']} train "
      f"prompts, reward = the checker (`first_line_exact`), {setup['k_rl']} completions per "
      f"prompt at temperature 1 (ended by a newline, at most {setup['max_new_tokens']} tokens), "
      f"{setup['rl_steps']} steps of {setup['rl_batch']} completions, lr {setup['rl_lr']:g}, "
      f"KL weight beta {setup['rl_beta']:g} (k3, to the DPO model), loss_type dapo.", "",
      f"Checker pass rate with Wilson 95% intervals; sampled = temperature 1, "
      f"{setup['eval_samples']} samples per prompt (correlated within a prompt, so its "
      "interval is somewhat too narrow).", "",
      "| model | greedy | sampled (T=1) |", "|---|---|---|"]
  for name in MODELS:
    lines.append(f"| {name} | {_pct(s[name]['greedy'])} | {_pct(s[name]['sampled'])} |")
  lines += [
      "", "KL per response, the on-policy Monte-Carlo estimate of KL(pi || ref): the mean over "
      "responses sampled from pi (T=1, cut after the first newline) on the held-out prompts "
      "of log pi(y|x) - log ref(y|x), summed over response tokens (± one standard error):", "",
      f"- DPO policy vs its reference (the SFT model): {kl_dpo['mean']:.3f} ± "
      f"{kl_dpo['sem']:.3f} nats (n={kl_dpo['n']})",
      f"- SFT model vs the pretrained model: {kl_sft['mean']:.3f} ± {kl_sft['sem']:.3f} nats "
      f"(n={kl_sft['n']})",
      f"- RLVR policy vs the SFT model: {s['rlvr']['kl_to_sft']['mean']:.3f} ± "
      f"{s['rlvr']['kl_to_sft']['sem']:.3f} nats (n={s['rlvr']['kl_to_sft']['n']})", "",
      *_rlvr_lines(results),
      "DPO as logged by the trainer (its eval = the pairs' hash-held-out 10%; its `logratio` is the "
      "log-ratio monitor on offline pairs, not an on-policy KL):", "",
      "| | step | reward accuracy | rewards margin | logratio (monitor) |", "|---|---:|---:|---:|---:|"]
  for key in ("eval_first", "eval_last"):
    e = logged[key]
    lines.append(f"| eval | {e['step']} | {e['eval_accuracy']:.3f} | "
                 f"{e['eval_rewards_margin']:.3f} | {e['eval_logratio']:.3f} |")
  t = logged["train_last"]
  lines += [f"| train (last logged) | {t['step']} | | {t['dpo_rewards_margin']:.3f} | "
            f"{t['dpo_logratio']:.3f} |", "",
            *_sweep_lines(results),
            "Greedy responses on the first held-out prompts:", "",
            "| prompt | word | " + " | ".join(MODELS) + " |",
            "|---|---|" + "---|" * len(MODELS)]
  for ex in results["examples"]:
    lines.append(f"| {_quote(ex['prompt'])} | {ex['word']} | "
                 + " | ".join(_quote(ex[m]) for m in MODELS) + " |")
  lines += ["", f"Command: `{results['command']}`; wall time {results['wall_s']:.0f} s on "
            f"{results['device']}.", ""]
  return "\n".join(lines)


def _rlvr_lines(results: dict) -> list[str]:
  """The reward curve as a table (first, middle and last logged steps) and the evals."""
  logged = results["rlvr_logged"]
  train = logged["train"]
  picks = sorted({0, len(train) // 4, len(train) // 2, 3 * len(train) // 4, len(train) - 1})
  lines = ["RLVR as logged by the trainer (train reward = the mean checker score of the step's "
           "completions, sampled from the policy being trained; the figure plots every logged "
           "step; kl = token mean of k3 to the DPO model):", "",
           "| step | train reward | completions with no signal (group all equal) | kl |",
           "|---:|---:|---:|---:|"]
  for i in picks:
    r = train[i]
    lines.append(f"| {r['step']} | {r['reward']:.3f} | {r['frac_reward_zero_std']:.2f} | "
                 f"{r['kl']:.4f} |")
  lines += ["", "| eval step | eval reward (train-split prompts held out by hash) | eval kl |",
            "|---:|---:|---:|"]
  lines += [f"| {e['step']} | {e['eval_reward']:.3f} | {e['eval_kl']:.4f} |"
            for e in logged["eval"]]
  return lines + [""]


def _sweep_lines(results: dict) -> list[str]:
  """The DPO settings table (only in a report run with --sweep)."""
  if "sweep" not in results:
    return []
  setup = results["setup"]
  lines = [f"DPO at other settings: the same pairs, {setup['dpo_steps']} steps, batch "
           f"{setup['dpo_batch']}, each scored like the main run (KL to the SFT model on the "
           "policy's own samples):", "",
           "| beta | lr | greedy | sampled (T=1) | KL to SFT (nats) |", "|---:|---:|---|---|---:|"]
  for r in results["sweep"]:
    main = (r["beta"], r["lr"]) == (setup["beta"], setup["dpo_lr"])
    lines.append(f"| {r['beta']:g} | {r['lr']:g}{' (main)' if main else ''} | "
                 f"{_pct(r['greedy'])} | {_pct(r['sampled'])} | "
                 f"{r['kl_to_sft']['mean']:.3f} ± {r['kl_to_sft']['sem']:.3f} |")
  return lines + [""]


def plot(results: dict, path: str) -> None:
  """Pass rate (with its interval) per model, greedy and sampled; the RLVR reward curve."""
  fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
  x = np.arange(len(MODELS))
  for j, mode in enumerate(("greedy", "sampled")):
    r = [results["scores"][m][mode] for m in MODELS]
    rates = np.array([e["rate"] for e in r])
    err = np.array([[e["rate"] - e["ci95"][0], e["ci95"][1] - e["rate"]] for e in r]).T
    ax.bar(x + (j - 0.5) * 0.38, rates, 0.38, yerr=err, capsize=3,
           label="greedy" if mode == "greedy" else "sampled, T=1")
  ax.set(xticks=x, xticklabels=MODELS, ylabel="checker pass rate", ylim=(0, 1.05),
         title="LAST WORD task, held-out prompts")
  ax.legend()
  ax.grid(axis="y", alpha=0.3)
  logged = results["rlvr_logged"]
  steps = [r["step"] for r in logged["train"]]
  ax2.plot(steps, [r["reward"] for r in logged["train"]], ".-", alpha=0.6,
           label="train reward (step's samples)")
  if logged["eval"]:
    ax2.plot([e["step"] for e in logged["eval"]], [e["eval_reward"] for e in logged["eval"]],
             "o-", label="eval reward (hash-held-out train prompts)")
  dpo = results["scores"]["dpo"]["sampled"]["rate"]
  ax2.axhline(dpo, color="gray", ls="--", lw=1, label="DPO, sampled, held-out")
  ax2.set(xlabel="GRPO step", ylabel="reward (checker pass rate)", ylim=(0, 1.05),
          title="RLVR reward curve")
  ax2.legend(fontsize=8)
  ax2.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def refit(results: dict) -> dict:
  """Every pass rate and interval recomputed from its counts."""
  return {f"{m}_{mode}": _estimate(rate(r["accepted"], r["n"]))
          for m, modes in results["scores"].items() for mode, r in modes.items()
          if mode in ("greedy", "sampled")}


def stored(results: dict) -> dict:
  return {f"{m}_{mode}": _estimate(r) for m, modes in results["scores"].items()
          for mode, r in modes.items() if mode in ("greedy", "sampled")}


def _estimate(r: dict) -> dict:
  return {"rate": r["rate"], "low": r["ci95"][0], "high": r["ci95"][1]}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pretrained", default=None, help="a trained shakespeare_char workdir")
  parser.add_argument("--workdir", default="runs/posttrain")
  parser.add_argument("--sft_steps", type=int, default=200)
  parser.add_argument("--sft_batch", type=int, default=32)
  parser.add_argument("--sft_lr", type=float, default=1e-3)
  parser.add_argument("--pair_prompts", type=int, default=1024)
  parser.add_argument("--k", type=int, default=4, help="SFT samples per train prompt")
  parser.add_argument("--rejected", default="likeliest", choices=("likeliest", "first"),
                      help="which rejected sample of a prompt makes its pair")
  parser.add_argument("--dpo_steps", type=int, default=200)
  parser.add_argument("--dpo_batch", type=int, default=32)
  parser.add_argument("--dpo_lr", type=float, default=5e-6)
  parser.add_argument("--beta", type=float, default=0.5)
  parser.add_argument("--grpo_prompts", type=int, default=2048,
                      help="train prompts of the RLVR stage (the last ones of the train set)")
  parser.add_argument("--grpo_seq_len", type=int, default=None,
                      help="RLVR rows: prompt + completion tokens (longer prompts dropped); "
                      "default the DPO run's data.seq_len (the model's max_len here)")
  parser.add_argument("--k_rl", type=int, default=8, help="GRPO completions per prompt")
  parser.add_argument("--rl_steps", type=int, default=160)
  parser.add_argument("--rl_batch", type=int, default=64, help="completions per GRPO step")
  parser.add_argument("--rl_lr", type=float, default=2e-5)
  parser.add_argument("--rl_beta", type=float, default=0.04)
  parser.add_argument("--sweep", default="",
                      help="more DPO settings on the same pairs, beta:lr,... (e.g. 0.1:1e-5)")
  parser.add_argument("--eval_prompts", type=int, default=200)
  parser.add_argument("--eval_samples", type=int, default=4)
  parser.add_argument("--show", type=int, default=8, help="example prompts in the report")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=str(OUT), help="results prefix (.md, .json, .png)")
  parser.add_argument("--report_only", action="store_true")
  args = parser.parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  points = parse_sweep(args.sweep)
  start = time.perf_counter()
  os.makedirs(args.workdir, exist_ok=True)
  pretrained = pretrain(args)
  config, params, tokenizer = load_run(pretrained)
  width = int(models.with_defaults(config.model)["max_len"])
  train, held_out = task_data(tokenizer, width, num_eval=args.eval_prompts, seed=args.seed,
                              train_fraction=config.data.get("train_fraction") or 0.9)
  max_new = MAX_NEW
  print(f"{len(train)} train prompts, {len(held_out)} held-out prompts, max_new {max_new}")
  sft_dir = finetune(args, pretrained, train)
  pairs_path, pairs = preference_pairs(args, sft_dir, train, max_new)
  print(f"pairs: {pairs}")
  dpo_dir = preference_tune(args, sft_dir, pairs_path, beta=args.beta, lr=args.dpo_lr)
  rlvr_dir = reinforce(args, dpo_dir, train)
  evaluated = evaluate(args, {"pretrained": pretrained, "sft": sft_dir, "dpo": dpo_dir,
                              "rlvr": rlvr_dir}, held_out, max_new)
  main_point = {"beta": args.beta, "lr": args.dpo_lr, "steps": args.dpo_steps,
                **{k: evaluated["scores"]["dpo"][k] for k in ("greedy", "sampled")},
                "kl_to_sft": evaluated["scores"]["dpo"]["kl_to_sft"]}
  points = [p for p in points if p != (args.beta, args.dpo_lr)]     # the main run is one
  swept = sweep(args, sft_dir, pairs_path, held_out, max_new, points) if points else []
  results = {
      "format": FORMAT,
      "setup": {"params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
                "pretrain_steps": int(config.train.steps), "train_prompts": len(train),
                "eval_prompts": len(held_out), "max_new_tokens": max_new,
                "sft_steps": args.sft_steps, "sft_batch": args.sft_batch,
                "sft_lr": args.sft_lr, "dpo_steps": args.dpo_steps,
                "dpo_batch": args.dpo_batch, "dpo_lr": args.dpo_lr, "beta": args.beta,
                "eval_samples": args.eval_samples, "seed": args.seed,
                "grpo_prompts": args.grpo_prompts, "k_rl": args.k_rl,
                "rl_steps": args.rl_steps, "rl_batch": args.rl_batch, "rl_lr": args.rl_lr,
                "rl_beta": args.rl_beta},
      "pairs": pairs, **evaluated,
      **({"sweep": sorted([main_point, *swept], key=lambda r: (r["beta"], r["lr"]))}
         if swept else {}),
      "sft_logged": sft_logged(sft_dir), "dpo_logged": dpo_logged(dpo_dir),
      "rlvr_logged": rlvr_logged(rlvr_dir),
      "command": " ".join(["python -m experiments.posttrain",
                           *(argv if argv is not None else sys.argv[1:])]),
      "wall_s": time.perf_counter() - start, "device": f"{jax.devices()[0].platform} "
      f"({os.cpu_count()} cores)"}
  text = report_check.write(args.out, results, render, plot)
  print(text)
  return 0


if __name__ == "__main__":
  main()
