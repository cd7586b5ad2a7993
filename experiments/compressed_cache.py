"""Compressed KV caches at inference on full-attention checkpoints: perplexity and copy-needle
retrieval against the cache budget, and one mitigation of the train/inference mismatch.

    python -m jaxformer.train --config=configs/shakespeare_char.py --workdir=WORKDIR  # first
    python -m experiments.compressed_cache --workdir=WORKDIR
    python -m experiments.compressed_cache --report_only      # the report again from its JSON

Models (all 4 layers x 4 heads, width 128, context 64, learned positions):
- `readme`: the README's checkpoint (configs/shakespeare_char.py, 2000 steps, full attention);
- `needle_tuned`: `readme` + NEEDLE_STEPS steps (AdamW, lr NEEDLE_LR) of the same LM loss on
  training-split windows each holding a copy needle (evaluate/needle.py, training text, other
  seeds): the README model cannot copy a random string at all (below), so retrieval vs
  budget needs a checkpoint that can; still full attention. (Measured: 300 steps at lr 3e-4
  with needles in half the rows left it at chance, 0.141; 600 at 1e-3 in every row cross
  the induction phase change between steps 300 and 600.)
- `window_tuned` (the mitigation): `needle_tuned` + MITIGATION_STEPS steps on the same data
  with model.window = MITIGATION_BUDGET - 1, the pattern a window cache of that budget
  imposes (tests/unit/layers/test_kv_cache.py: they are equal);
- `full_tuned` (its control): the same steps with full attention (more training alone).

Every model is scored teacher-forced through each cache (inference/streaming.py: the rows fed
token by token through the cache) on ROWS validation windows of 64 tokens (perplexity; the
NLL of every predicted token, and of the "tail" ones, those predicted after the cache has
evicted) and on ROWS needle rows (validation text, needle of NEEDLE_LEN rare characters, cue
CUE_LEN, depths 0, 1/3, 2/3, 1: teacher-forced and greedy answer accuracy). Intervals: 95%
bootstrap over rows (paired with the full cache for differences). CPU, float32.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

import numpy as np

from experiments import report_check

OUT = report_check.RESULTS / "compressed_cache"
FORMAT = 1
ROWS = 64
BUDGETS = (8, 16, 32)
KINDS = ("window", "sinks", "heavy_hitter")
SINKS = 4
NEEDLE_LEN, CUE_LEN, ALPHABET_SIZE = 6, 2, 8
DEPTHS = (0.0, 1 / 3, 2 / 3, 1.0)
NEEDLE_STEPS, MITIGATION_STEPS, MITIGATION_BUDGET = 600, 200, 16
BATCH, NEEDLE_LR, LR = 12, 1e-3, 3e-4
BOOTSTRAP = 1000
TRAIN_FRACTION = 0.9                   # the stream split of configs/shakespeare_char.py
LABELS = {"full": "full", "int8": "full, int8", "window": "window", "sinks": f"sinks ({SINKS}) + window",
          "heavy_hitter": "heavy hitter (H2O)"}


def policy_of(name: str):
  """'full' | 'int8' | '<kind>/<budget>' -> KVCachePolicy or None."""
  from jaxformer.inference import KVCachePolicy
  if name == "full":
    return None
  if name == "int8":
    return KVCachePolicy("full", dtype="int8")
  kind, budget = name.split("/")
  return KVCachePolicy(kind, int(budget), sinks=SINKS if kind == "sinks" else None)


def budget_of(name: str) -> int | None:
  return int(name.split("/")[1]) if "/" in name else None


def all_caches():
  return ["full", "int8"] + [f"{k}/{b}" for k in KINDS for b in BUDGETS]


def mitigation_caches():
  return ["full"] + [f"{k}/{MITIGATION_BUDGET}" for k in KINDS] + [
      f"window/{b}" for b in BUDGETS if b != MITIGATION_BUDGET]


# ------------------------------------------------------------------------------- measuring

def corpus(tokenizer):
  from jaxformer.data.corpus import sources
  ids = np.asarray(tokenizer.encode(sources.BUNDLED["tinyshakespeare"].read_text()), np.int32)
  cut = int(len(ids) * TRAIN_FRACTION)
  return ids[:cut], ids[cut:]


def eval_rows(val, seq_len, seed=0):
  starts = np.random.default_rng(seed).integers(0, len(val) - seq_len, ROWS)
  return np.stack([val[s:s + seq_len] for s in starts])


def evaluate(model_config, params, rows, needles, caches, *, greedy: bool) -> dict:
  from jaxformer.evaluate import needle
  from jaxformer.inference import stream_logits_fn
  out = {}
  for name in caches:
    start = time.time()
    fn = stream_logits_fn(model_config, params, kv_cache=policy_of(name))
    logits = fn(rows).astype(np.float64)[:, :-1]
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    nll = -np.take_along_axis(logp, rows[:, 1:, None].astype(np.int64), -1)[..., 0]
    budget = budget_of(name)
    tail = nll[:, budget:] if budget else nll[:, :0]     # query position p >= budget: evicted
    entry = {"row_nll": nll.mean(1).tolist(),
             "row_nll_tail": tail.mean(1).tolist() if tail.size else None,
             "needle_tf": needle.score_needles(fn, needles)["row_accuracy"]}
    if name == "full":                  # its NLL on each budget's tail positions, for pairing
      entry["tail_by_budget"] = {str(b): nll[:, b:].mean(1).tolist() for b in BUDGETS}
    if greedy:
      entry["needle_greedy"] = needle.score_needles(fn, needles, scoring="greedy")[
          "row_accuracy"]
    out[name] = entry
    print(f"  {name:>16}: ppl {math.exp(np.mean(entry['row_nll'])):.3f}  needle "
          f"{np.mean(entry['needle_tf']):.3f}  ({time.time() - start:.0f} s)", flush=True)
  return out


def needle_batches(train, seq_len, alphabet, seed):
  """Training batches of needle rows (random depths) of the training split."""
  from jaxformer.evaluate import needle
  rng = np.random.default_rng(seed)
  step = 0
  while True:
    step += 1
    yield needle.make_needles(train, context_len=seq_len, alphabet=alphabet,
                              depths=rng.uniform(0, 1, BATCH), count=1,
                              needle_len=NEEDLE_LEN, cue_len=CUE_LEN,
                              seed=seed * 100_003 + step).tokens


def finetune(model_config, params, batches, steps, *, window=None, lr=LR):
  """`steps` AdamW steps (constant `lr`) of the LM loss, with model.window = window."""
  import jax
  import jax.numpy as jnp
  import optax
  from jaxformer import models
  cfg = models.config_as_dict(model_config)
  cfg["window"] = window
  model = models.build(cfg)
  opt = optax.adamw(lr, b2=0.99, weight_decay=0.1)

  @jax.jit
  def step(params, state, tokens):
    def loss(p):
      logits = model.apply({"params": p}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    value, grads = jax.value_and_grad(loss)(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value

  state = opt.init(params)
  losses = []
  for _ in range(steps):
    params, state, value = step(params, state, jnp.asarray(next(batches)))
    losses.append(float(value))
  return params, losses


def run(workdir: str) -> dict:
  import flax.linen as nn
  from jaxformer import inference
  from jaxformer.evaluate import needle
  config, params, tokenizer = inference.load_run(workdir)
  params = nn.unbox(params)
  train, val = corpus(tokenizer)
  seq_len = int(config.data.seq_len)
  alphabet = needle.rare_tokens(train, ALPHABET_SIZE)
  rows = eval_rows(val, seq_len)
  needles = needle.make_needles(val, context_len=seq_len, alphabet=alphabet, depths=DEPTHS,
                                count=ROWS // len(DEPTHS), needle_len=NEEDLE_LEN,
                                cue_len=CUE_LEN, seed=1)
  results = {"format": FORMAT, "workdir_config": config.model.name, "seq_len": seq_len,
             "rows": ROWS, "budgets": list(BUDGETS), "sinks": SINKS,
             "alphabet": "".join(tokenizer.decode([a]) for a in alphabet),
             "needle_len": NEEDLE_LEN, "cue_len": CUE_LEN, "depths": list(DEPTHS),
             "needle_depth_rows": needles.depth.tolist(),
             "needle_distance": needles.distance.tolist(),
             "needle_steps": NEEDLE_STEPS, "mitigation_steps": MITIGATION_STEPS,
             "mitigation_budget": MITIGATION_BUDGET, "batch": BATCH, "lr": LR,
             "needle_lr": NEEDLE_LR,
             "bootstrap": BOOTSTRAP, "models": {}}
  # a control for needle retrieval: the first copy replaced by text (nothing to copy)
  control = dataclasses.replace(needles, tokens=_without_first_copy(needles, val))

  def measure(name, p, caches, note, losses=None):
    print(f"{name}: {note}", flush=True)
    start = time.time()
    evals = evaluate(config.model, p, rows, needles, caches, greedy=name != "readme")
    fn = needle.forward_logits_fn(config.model, p)
    results["models"][name] = {
        "note": note, "evals": evals, "finetune_losses": losses,
        "needle_control": needle.score_needles(fn, control)["row_accuracy"],
        "seconds": time.time() - start}
    save()

  import json
  raw = os.environ.get("COMPRESSED_CACHE_RAW")      # a copy of the raw results as they come

  def save():
    if raw:
      with open(raw, "w") as f:
        json.dump(results, f)

  measure("readme", params, all_caches(), "the README checkpoint (full attention)")
  tuned, losses = finetune(config.model, params, needle_batches(train, seq_len, alphabet, 1),
                           NEEDLE_STEPS, lr=NEEDLE_LR)
  measure("needle_tuned", tuned, all_caches(), f"readme + {NEEDLE_STEPS} steps (lr "
          f"{NEEDLE_LR}) on rows holding a needle (full attention)", losses)
  for name, window in (("window_tuned", MITIGATION_BUDGET - 1), ("full_tuned", None)):
    p, losses = finetune(config.model, tuned, needle_batches(train, seq_len, alphabet, 2),
                         MITIGATION_STEPS, window=window)
    note = (f"needle_tuned + {MITIGATION_STEPS} steps with model.window={window}"
            if window else f"needle_tuned + {MITIGATION_STEPS} steps, full attention (control)")
    measure(name, p, mitigation_caches(), note, losses)
  summarize_into(results)
  return results


def _without_first_copy(needles, val):
  tokens = needles.tokens.copy()
  n = needles.needle_len
  for r, start in enumerate(needles.needle_start):
    tokens[r, start:start + n] = val[1000 + 7 * r:1000 + 7 * r + n]
  return tokens


# ----------------------------------------------------------------------------- summarizing

def _boot_idx(n, seed=0):
  return np.random.default_rng(seed).integers(0, n, (BOOTSTRAP, n))


def _ci(samples):
  lo, hi = np.percentile(samples, [2.5, 97.5])
  return [float(lo), float(hi)]


def summarize_into(results: dict) -> None:
  """results["summary"][model][cache]: point estimates and 95% bootstrap intervals (paired
  with the model's full cache for the differences), from the per-row values."""
  summary = {}
  for model, r in results["models"].items():
    evals = r["evals"]
    full = np.asarray(evals["full"]["row_nll"])
    idx = _boot_idx(len(full))
    out = {}
    for name, e in evals.items():
      nll = np.asarray(e["row_nll"])
      acc = np.asarray(e["needle_tf"])
      s = {"ppl": float(math.exp(nll.mean())), "ppl_ci": _ci(np.exp(nll[idx].mean(1))),
           "dnll": float((nll - full).mean()), "dnll_ci": _ci((nll - full)[idx].mean(1)),
           "needle": float(acc.mean()), "needle_ci": _ci(acc[idx].mean(1))}
      if e.get("row_nll_tail") is not None:
        tail = np.asarray(e["row_nll_tail"])
        full_tail = _full_tail(evals, name, results)
        s["tail_dnll"] = float((tail - full_tail).mean())
        s["tail_dnll_ci"] = _ci((tail - full_tail)[idx].mean(1))
      if "needle_greedy" in e:
        g = np.asarray(e["needle_greedy"])
        s["needle_greedy"] = float(g.mean())
        s["needle_greedy_ci"] = _ci(g[idx].mean(1))
      out[name] = s
    ctl = np.asarray(r["needle_control"])
    out["_control"] = {"needle": float(ctl.mean()), "needle_ci": _ci(ctl[idx].mean(1))}
    dist = np.asarray(results["needle_distance"])
    for name, e in evals.items():        # needle accuracy with the needle within / beyond
      b = budget_of(name)                # the budget (distance <= budget - 1: still cached
      if b is not None:                  # by a window of that budget)
        acc = np.asarray(e["needle_tf"])
        inside = dist <= b - 1
        out[name]["needle_within"] = float(acc[inside].mean()) if inside.any() else None
        out[name]["needle_beyond"] = float(acc[~inside].mean()) if (~inside).any() else None
    for other in ("sinks", "heavy_hitter"):     # paired: other policy - window
      for b in BUDGETS:
        a, w = f"{other}/{b}", f"window/{b}"
        if a in evals and w in evals:
          d = np.asarray(evals[a]["row_nll"]) - np.asarray(evals[w]["row_nll"])
          out[f"_{other}-window/{b}"] = {"dnll": float(d.mean()), "dnll_ci": _ci(d[idx].mean(1))}
    summary[model] = out
  if "window_tuned" in results["models"] and "full_tuned" in results["models"]:
    wt, ft = (results["models"][m]["evals"] for m in ("window_tuned", "full_tuned"))
    mit = {}
    for name in wt:
      d = np.asarray(wt[name]["row_nll"]) - np.asarray(ft[name]["row_nll"])
      # the mismatch (this cache - the full cache) of window_tuned minus that of full_tuned
      dm = d - (np.asarray(wt["full"]["row_nll"]) - np.asarray(ft["full"]["row_nll"]))
      idx = _boot_idx(len(d))
      mit[name] = {"dnll": float(d.mean()), "dnll_ci": _ci(d[idx].mean(1)),
                   "dmismatch": float(dm.mean()), "dmismatch_ci": _ci(dm[idx].mean(1))}
    summary["_mitigation"] = mit
  results["summary"] = summary


def _full_tail(evals, name, results):
  """The full cache's per-row NLL on the tail positions of `name`'s budget."""
  return np.asarray(evals["full"]["tail_by_budget"][str(budget_of(name))])


def refit(results: dict) -> dict:
  """Every summary point estimate recomputed from the per-row values."""
  copy = {k: v for k, v in results.items() if k != "summary"}
  summarize_into(copy)
  return stored(copy)


def stored(results: dict) -> dict:
  return {f"{m}/{c}": {k: v for k, v in s.items() if not k.endswith("_ci") and v is not None}
          for m, caches in results["summary"].items() for c, s in caches.items()}


# ------------------------------------------------------------------------------- reporting

def verdict(ci, *, below: float = 0.0) -> str:
  """'holds' when the whole 95% interval is below `below`, 'fails' when it is wholly above,
  'unresolved' otherwise."""
  if ci[1] < below:
    return "holds"
  if ci[0] > below:
    return "fails"
  return "unresolved"


def claims(results: dict) -> list[dict]:
  """The report's hypotheses, each with its measured interval and verdict."""
  sm = results["summary"]
  out = []
  for model in ("readme", "needle_tuned"):
    for other, label in (("sinks", "StreamingLLM: sinks + window beat a window"),
                         ("heavy_hitter", "H2O: heavy hitters beat a window")):
      for b in results["budgets"]:
        c = sm[model][f"_{other}-window/{b}"]
        out.append({"id": f"{model}/{other}-window/{b}", "claim": f"{label} ({model}, budget {b}: "
                    "perplexity)", "value": c["dnll"], "ci": c["dnll_ci"],
                    "verdict": verdict(c["dnll_ci"])})
    c = sm[model]["int8"]
    out.append({"id": f"{model}/int8", "claim": f"int8 costs < 0.01 nats/token ({model})",
                "value": c["dnll"], "ci": c["dnll_ci"], "verdict": verdict(c["dnll_ci"],
                                                                           below=0.01)})
  ctl, full = sm["readme"]["_control"], sm["readme"]["full"]
  d = full["needle"] - ctl["needle"]
  out.append({"id": "readme/needle", "claim": "the README model copies the needle (full cache "
              "beats the no-needle control by > 0.05)", "value": d, "ci": None,
              "verdict": "holds" if d > 0.05 else "fails"})
  control = sm["needle_tuned"]["_control"]["needle"]
  for kind in KINDS:
    for b in results["budgets"]:
      c = sm["needle_tuned"][f"{kind}/{b}"]
      if c.get("needle_beyond") is None:
        continue
      beyond = c["needle_beyond"]
      if kind == "window":             # what a window cannot see, it cannot copy
        claim, ok = "needles beyond the budget are lost (accuracy <= control + 0.05)", (
            beyond <= control + 0.05)
      else:                            # sinks / heavy hitters keep old tokens: some needles?
        claim, ok = "some needles beyond the budget are kept (accuracy > control + 0.05)", (
            beyond > control + 0.05)
      out.append({"id": f"needle_tuned/{kind}/{b}/beyond",
                  "claim": f"{LABELS[kind]} {b}: {claim}", "value": beyond, "ci": None,
                  "verdict": "holds" if ok else "fails"})
  if "_mitigation" in sm:
    b = results["mitigation_budget"]
    for name in results["models"]["window_tuned"]["evals"]:
      c = sm["_mitigation"][name]
      if name != "full":
        out.append({"id": f"mitigation/{name}/mismatch", "claim": "window fine-tune shrinks "
                    f"the mismatch (NLL on {name} - NLL on full) against the control",
                    "value": c["dmismatch"], "ci": c["dmismatch_ci"],
                    "verdict": verdict(c["dmismatch_ci"])})
      out.append({"id": f"mitigation/{name}", "claim": f"window fine-tune beats the control "
                  f"on cache {name} (NLL)", "value": c["dnll"], "ci": c["dnll_ci"],
                  "verdict": verdict(c["dnll_ci"])})
  return out


def _fmt_ci(v, ci, digits=3):
  return f"{v:+.{digits}f} [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"


def render(results: dict) -> str:
  sm = results["summary"]
  b = results["budgets"]
  lines = ["# Compressed KV caches on a full-attention checkpoint", "",
           f"Character-level Shakespeare models (context {results['seq_len']}, learned "
           f"positions; `{results['workdir_config']}`) decoded teacher-forced through a "
           "compressed cache (`jaxformer.inference.streaming`: every token fed through the "
           "cache, as generation does). Perplexity: "
           f"{results['rows']} validation windows of {results['seq_len']} tokens; dNLL: nats "
           "per token against the same model's full cache (paired, per row), 'tail': only the "
           "tokens predicted after eviction began (query position >= budget). Needle: "
           f"{results['rows']} validation rows with a needle of {results['needle_len']} "
           f"of the {len(results['alphabet'])} rarest training characters "
           f"(`{results['alphabet']}`), cue {results['cue_len']}, depths "
           + ", ".join(f"{d:.2f}" for d in results["depths"]) + " (distance from the cue: "
           + ", ".join(str(x) for x in sorted(set(results["needle_distance"]), reverse=True))
           + " tokens); accuracy of the answer characters, teacher-forced. Brackets: 95% "
           f"bootstrap intervals over rows ({results['bootstrap']} resamples). Sinks: "
           f"{results['sinks']}; heavy hitter: H2O with budget // 2 recent slots. Regenerate: "
           "`python -m experiments.compressed_cache --workdir=WORKDIR` (report only: "
           "`--report_only`).", ""]
  if "needle_tuned" in sm:
    lines += [f"The README model cannot copy (needle {sm['readme']['full']['needle']:.3f} with "
              "the full cache, as its no-needle control), so `needle_tuned` was tuned on needle "
              "rows only; that costs plain-text perplexity "
              f"({sm['readme']['full']['ppl']:.2f} -> {sm['needle_tuned']['full']['ppl']:.2f}), "
              "so its perplexities are a damaged LM's: compare caches within a model (dNLL), "
              "and read the clean perplexity effects from `readme`.", ""]
  for model, r in results["models"].items():
    s = sm[model]
    lines += [f"## `{model}`: {r['note']}", "",
              f"Full cache: perplexity {s['full']['ppl']:.3f} [{s['full']['ppl_ci'][0]:.3f}, "
              f"{s['full']['ppl_ci'][1]:.3f}], needle {s['full']['needle']:.3f}"
              + (f" (greedy {s['full']['needle_greedy']:.3f})" if "needle_greedy" in s["full"]
                 else "")
              + f"; no-needle control {s['_control']['needle']:.3f}."
              + (f" int8 cache: dNLL {_fmt_ci(s['int8']['dnll'], s['int8']['dnll_ci'], 4)}, "
                 f"needle {s['int8']['needle']:.3f}." if "int8" in s else ""), ""]
    budgets = [x for x in b if any(f"{k}/{x}" in s for k in KINDS)]
    lines += ["| cache | " + " | ".join(f"budget {x}" for x in budgets) + " |",
              "|---|" + "---:|" * len(budgets)]
    for k in KINDS:
      row = [s.get(f"{k}/{x}") for x in budgets]
      if not any(row):
        continue
      lines.append(f"| {LABELS[k]}: perplexity | " + " | ".join(
          "" if c is None else f"{c['ppl']:.3f}" for c in row) + " |")
      lines.append(f"| {LABELS[k]}: dNLL | " + " | ".join(
          "" if c is None else _fmt_ci(c["dnll"], c["dnll_ci"]) for c in row) + " |")
      lines.append(f"| {LABELS[k]}: tail dNLL | " + " | ".join(
          "" if c is None else _fmt_ci(c["tail_dnll"], c["tail_dnll_ci"]) for c in row) + " |")
      lines.append(f"| {LABELS[k]}: needle (within / beyond budget) | " + " | ".join(
          "" if c is None else f"{c['needle']:.3f} ({_opt(c['needle_within'])} / "
          f"{_opt(c['needle_beyond'])})" for c in row) + " |")
      if any(c is not None and "needle_greedy" in c for c in row):
        lines.append(f"| {LABELS[k]}: needle, greedy | " + " | ".join(
            "" if c is None else f"{c['needle_greedy']:.3f}" for c in row) + " |")
    lines.append("")
  if "_mitigation" in sm:
    mb = results["mitigation_budget"]
    lines += [f"## Mitigation: fine-tuning with `model.window = {mb - 1}` (a window cache of "
              f"{mb})", "",
              f"Both start from `needle_tuned` and take {results['mitigation_steps']} more "
              f"steps (batch {results['batch']}, AdamW lr {results['lr']}) on the same data; "
              "`full_tuned` keeps full attention (the control: more training alone). dNLL: "
              "within each model against its own full cache; 'window - control': the NLL of "
              "`window_tuned` minus that of `full_tuned` on the same cache and rows.", "",
              "| cache | window_tuned ppl | its dNLL | full_tuned ppl | its dNLL | window - "
              "control (nats) | mismatch: window - control | needle w / c |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    wt, ft = sm["window_tuned"], sm["full_tuned"]
    for name in results["models"]["window_tuned"]["evals"]:
      m = sm["_mitigation"][name]
      lines.append(f"| {name} | {wt[name]['ppl']:.3f} | {wt[name]['dnll']:+.3f} | "
                   f"{ft[name]['ppl']:.3f} | {ft[name]['dnll']:+.3f} | "
                   f"{_fmt_ci(m['dnll'], m['dnll_ci'])} | "
                   f"{_fmt_ci(m['dmismatch'], m['dmismatch_ci'])} | {wt[name]['needle']:.3f} / "
                   f"{ft[name]['needle']:.3f} |")
    lines.append("")
  lines += ["## Hypotheses", "",
            "Verdicts from the 95% intervals (holds: the whole interval on the hypothesis's "
            "side; fails: wholly on the other; unresolved: it straddles).", "",
            "| hypothesis | measured | verdict |", "|---|---:|---|"]
  for c in claims(results):
    value = _fmt_ci(c["value"], c["ci"]) if c["ci"] else f"{c['value']:.3f}"
    lines.append(f"| {c['claim']} | {value} | {c['verdict']} |")
  lines.append("")
  return "\n".join(lines)


def _opt(v):
  return "-" if v is None else f"{v:.2f}"


def plot(results: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  sm = results["summary"]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for model, style in (("readme", "--"), ("needle_tuned", "-")):
    s = sm[model]
    for k, color in zip(KINDS, ("C0", "C1", "C2")):
      xs = [b for b in results["budgets"] if f"{k}/{b}" in s]
      axes[0].plot(xs, [s[f"{k}/{b}"]["ppl"] for b in xs], style, color=color, marker="o",
                   label=f"{LABELS[k]} ({model})")
      axes[1].plot(xs, [s[f"{k}/{b}"]["needle"] for b in xs], style, color=color, marker="o",
                   label=f"{LABELS[k]} ({model})")
    axes[0].axhline(s["full"]["ppl"], ls=style, color="k", lw=0.8, label=f"full ({model})")
    axes[1].axhline(s["full"]["needle"], ls=style, color="k", lw=0.8, label=f"full ({model})")
  axes[1].axhline(sm["needle_tuned"]["_control"]["needle"], ls=":", color="gray",
                  label="no-needle control")
  for ax, title in zip(axes, ("validation perplexity", "needle accuracy (teacher-forced)")):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cache budget (slots per layer)")
    ax.set_title(title)
  axes[0].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", help="the trained configs/shakespeare_char.py run")
  parser.add_argument("--out", default=str(OUT))
  parser.add_argument("--report_only", action="store_true")
  args = parser.parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  if not args.workdir:
    from jaxformer import cli
    cli.fail("--workdir is required: the run of configs/shakespeare_char.py to decode")
  results = run(args.workdir)
  print(report_check.write(args.out, results, render, plot))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
