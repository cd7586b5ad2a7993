"""Why attention: accuracy vs source length for an RNN encoder-decoder without attention
(Cho et al., 2014), the same with additive attention (Bahdanau et al., 2015), and a Transformer.

    python -m experiments.bottleneck [--task=copy|reverse] [--workdir=runs/bottleneck]

Trains the three `configs/bottleneck.py` models with `jaxformer.train.loop.train` on one synthetic
task (sources of 5..100 symbols; one workdir per model under `<workdir>/<task>/`; a finished run
is not retrained, only re-evaluated), then scores each with teacher forcing on fresh examples of
exactly each source length: token accuracy (EOS included) and whole-sequence accuracy. Writes
`<out>.md` (table), `<out>.json` and `<out>.png` (accuracy vs source length, one line per
model). The fixed context vector must carry the whole source, so the model without attention
should fall off with length while both attention models stay high.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from configs import bottleneck  # noqa: E402
from jaxformer import models, tasks  # noqa: E402
from jaxformer.data.synthetic import SyntheticTask, pad_example  # noqa: E402
from jaxformer.inference import load_run  # noqa: E402
from jaxformer.train import loop  # noqa: E402

MODELS = tuple(bottleneck.MODELS)
TASKS = ("copy", "reverse")
LENGTHS = (5, 10, 20, 30, 50, 70, 100)
LABELS = {"rnn": "RNN, no attention (fixed context)", "rnn_attention": "RNN + additive attention",
          "transformer": "Transformer"}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bottleneck")


def experiment_configs(task: str, names=MODELS, steps: int | None = None) -> dict:
  """{model name: training config} of `configs/bottleneck.py` on `synthetic:<task>`."""
  if task not in TASKS:
    raise ValueError(f"--task={task!r} must be one of {TASKS}")
  unknown = [n for n in names if n not in MODELS]
  if unknown:
    raise ValueError(f"--models has unknown names {unknown}; choose from {MODELS}")
  if steps is not None and steps < 1:
    raise ValueError(f"--steps={steps} must be >= 1 (or left out for the configs' steps)")
  configs = {}
  for name in names:
    config = bottleneck.get_config(name)
    config.data.source = f"synthetic:{task}"
    if steps is not None:
      config.train.steps = config.train.eval_every = config.train.checkpoint_every = steps
    configs[name] = config
  return configs


def check_lengths(config, lengths) -> None:
  """Every evaluated length must be a source length the model was trained on."""
  low, high = config.data.min_len, config.data.max_len
  bad = [n for n in lengths if not low <= n <= high]
  if not lengths or bad:
    raise ValueError(f"--lengths {list(lengths)}: need at least one, all within the trained "
                     f"source lengths data.min_len={low}..data.max_len={high}")


def length_batch(config, length: int, num_examples: int) -> dict[str, np.ndarray]:
  """`num_examples` eval examples whose source has exactly `length` symbols, padded to the
  training shapes (src [N, max_len], targets [N, max_len + 1])."""
  data = config.data
  task = SyntheticTask(data.source.partition(":")[2], vocab_size=data.vocab_size,
                       min_len=length, max_len=length, seed=config.train.seed)
  padded = [pad_example(*task.example("eval", i), src_len=data.max_len,
                        tgt_len=data.max_len + 1) for i in range(num_examples)]
  return {key: np.stack([p[key] for p in padded]) for key in padded[0]}


def make_length_eval(config):
  """jitted (params, batch) -> eval sums of teacher-forced predictions (`Task.eval_sums`)."""
  module, task = models.build(config.model), tasks.task_for(config.model)
  return jax.jit(lambda params, batch: task.eval_sums(module, params, batch))


def evaluate_by_length(config, params, lengths, num_examples: int) -> dict[int, dict]:
  """{length: {'token_accuracy', 'sequence_accuracy', 'loss'}} with teacher forcing."""
  check_lengths(config, lengths)
  if num_examples < 1:
    raise ValueError(f"--examples={num_examples} must be >= 1")
  eval_fn, task = make_length_eval(config), tasks.task_for(config.model)
  out = {}
  for length in lengths:
    totals = jax.device_get(eval_fn(params, length_batch(config, length, num_examples)))
    metrics = task.finalize(totals)
    out[int(length)] = {"token_accuracy": metrics["eval_accuracy"],
                        "sequence_accuracy": metrics["eval_sequence_accuracy"],
                        "loss": metrics["eval_loss"]}
  return out


def train_and_evaluate(configs: dict, workdir: str, lengths, num_examples: int) -> dict:
  """Train each config in `<workdir>/<name>` (skipped when finished) and score it per length."""
  results = {}
  for name, config in configs.items():
    check_lengths(config, lengths)
    run_dir = os.path.join(workdir, name)
    loop.train(config, run_dir)
    config, params, _ = load_run(run_dir)
    results[name] = {
        "label": LABELS[name], "steps": config.train.steps,
        "params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
        "by_length": evaluate_by_length(config, params, lengths, num_examples)}
  return results


def markdown_table(results: dict, task: str, num_examples: int) -> str:
  """Token accuracy (sequence accuracy) per source length, one row per model."""
  lengths = list(next(iter(results.values()))["by_length"])
  lines = [f"Bottleneck experiment, task `{task}`: teacher-forced token accuracy "
           f"(sequence accuracy) on {num_examples} fresh examples per source length.", "",
           "| model | params | steps | " + " | ".join(f"len {n}" for n in lengths) + " |",
           "|---|---:|---:|" + "---:|" * len(lengths)]
  for r in results.values():
    cells = [f"{m['token_accuracy']:.3f} ({m['sequence_accuracy']:.2f})"
             for m in r["by_length"].values()]
    lines.append(f"| {r['label']} | {r['params']:,} | {r['steps']} | " + " | ".join(cells)
                 + " |")
  return "\n".join(lines) + "\n"


def plot(results: dict, task: str, path: str) -> None:
  """Token and sequence accuracy vs source length, one line per model."""
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
  for r in results.values():
    lengths = list(r["by_length"])
    for ax, key in zip(axes, ("token_accuracy", "sequence_accuracy")):
      ax.plot(lengths, [r["by_length"][n][key] for n in lengths], "o-", label=r["label"])
  for ax, title in zip(axes, ("token accuracy", "sequence accuracy")):
    ax.set(xlabel="source length", ylabel=title, ylim=(-0.02, 1.02), title=f"{task}: {title}")
    ax.grid(alpha=0.3)
  axes[0].legend(loc="lower left", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_results(results: dict, task: str, num_examples: int, out: str) -> None:
  """<out>.md, <out>.json and <out>.png."""
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + ".md", "w") as f:
    f.write(markdown_table(results, task, num_examples))
  with open(out + ".json", "w") as f:
    json.dump({"task": task, "examples_per_length": num_examples, "models": results}, f,
              indent=2)
  plot(results, task, out + ".png")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", default="copy", choices=TASKS)
  parser.add_argument("--workdir", default="runs/bottleneck")
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
  parser.add_argument("--examples", type=int, default=200, help="eval examples per length")
  parser.add_argument("--steps", type=int, default=None, help="override the configs' steps")
  parser.add_argument("--out", default=RESULTS, help="results prefix (.md, .json, .png)")
  args = parser.parse_args(argv)
  configs = experiment_configs(args.task, args.models.split(","), args.steps)
  lengths = [int(n) for n in args.lengths.split(",")]
  start = time.perf_counter()
  results = train_and_evaluate(configs, os.path.join(args.workdir, args.task), lengths,
                               args.examples)
  write_results(results, args.task, args.examples, args.out)
  print(markdown_table(results, args.task, args.examples))
  print(f"total wall time {time.perf_counter() - start:.0f} s; wrote {args.out}.{{md,json,png}}")


if __name__ == "__main__":
  main()
