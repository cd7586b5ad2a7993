"""Image captioning with and without attention: accuracy vs the number of digits in the image.

    python -m experiments.captioning --mnist=/path/to/mnist [--workdir=runs/captioning]
        [--models=cnn_lstm,cnn_lstm_pooled,vit_transformer,vit_transformer_pooled]

Trains each `configs/captioning.py` model with `jaxformer.train.loop.train` on composites of
2 to 6 MNIST digits (`jaxformer.data.images.captions`: captions such as "seven left of three
above five"; one workdir per model, a finished run is reused), then captions held-out
composites (digit images from MNIST's test split) of exactly n digits for each n, greedily
and with beam search, and scores them: exact-caption accuracy, position-aligned token
accuracy and corpus BLEU-4 (sacrebleu). The `_pooled` models see the image as one pooled
vector (the bottleneck); the others re-read the feature grid for every word (additive
attention for the RNN decoders, cross-attention for the Transformer). Writes `<out>.md`,
`<out>.json`, `<out>.png` (accuracy vs number of digits) and `<out>_attention.png` (per-word
attention over the image, the Show, Attend and Tell figure).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from configs import captioning  # noqa: E402
from experiments import report_check  # noqa: E402
from jaxformer import cli  # noqa: E402
from jaxformer.data.images import captions  # noqa: E402
from jaxformer.inference import load_run  # noqa: E402
from jaxformer.inference import captions as caption_inference  # noqa: E402
from jaxformer.scaling import stats  # noqa: E402
from jaxformer.train import loop  # noqa: E402

DEFAULT_MODELS = ("cnn_lstm", "cnn_lstm_pooled", "vit_transformer", "vit_transformer_pooled")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "captioning")


def experiment_configs(mnist: str, names, steps: int | None = None) -> dict:
  """{model name: training config} of `configs/captioning.py` on `mnist:<dir>`."""
  if not mnist:
    raise ValueError("--mnist is required: the directory holding MNIST's IDX files "
                     "(train-images-idx3-ubyte[.gz], ...), or set $MNIST_DIR")
  if steps is not None and steps < 1:
    raise ValueError(f"--steps={steps} must be >= 1 (or left out for the configs' steps)")
  configs = {}
  for name in names:
    config = captioning.get_config(name)
    config.data.source = f"mnist:{mnist}"
    if steps is not None:
      config.train.steps = config.train.checkpoint_every = steps
      config.train.eval_every = min(config.train.eval_every, steps)
    configs[name] = config
  return configs


def eval_set(config, num_digits: int, num_examples: int) -> list[dict]:
  """`num_examples` held-out composites of exactly `num_digits` digits (MNIST test digits)."""
  task = captions.CaptionTask(config.data, seed=config.train.seed,
                                data_dir=config.data.get("data_dir"))
  return [task.example("eval", i, num_digits=num_digits) for i in range(num_examples)]


def caption(config, params, images: np.ndarray, beam_size: int, batch: int = 250):
  """Caption words of each image, decoded in batches."""
  out = []
  for start in range(0, len(images), batch):
    tokens, _ = caption_inference.caption_images(config.model, params, images[start:start + batch],
                                                 beam_size=beam_size)
    out.extend(captions.decode(t) for t in np.asarray(tokens))
  return out


def evaluate(config, params, sets: dict[int, list[dict]], beams) -> dict:
  """{decoding: {num_digits: metrics}} for greedy (beam 1) and each beam size."""
  images = np.stack([e["image"] for n in sets for e in sets[n]])
  refs = [e["words"] for n in sets for e in sets[n]]
  groups = [n for n in sets for _ in sets[n]]
  out = {}
  for beam in beams:
    hyps = caption(config, params, images, beam)
    by_n = caption_inference.caption_metrics(hyps, refs, by=groups)
    out[f"beam{beam}"] = {str(n): by_n[n] for n in sets}
    out[f"beam{beam}"]["all"] = caption_inference.caption_metrics(hyps, refs)
  return out


def train_and_evaluate(configs: dict, workdir: str, sets: dict, beams) -> dict:
  results = {}
  for name, config in configs.items():
    run_dir = os.path.join(workdir, name)
    start = time.perf_counter()
    loop.train(config, run_dir)
    seconds = time.perf_counter() - start
    config, params, _ = load_run(run_dir)
    results[name] = {
        "label": captioning.label(name), "attention": config.model.attention,
        "steps": config.train.steps, "batch_size": config.train.batch_size,
        "params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
        "train_seconds_this_call": round(seconds, 1),
        "metrics": evaluate(config, params, sets, beams)}
  return results


def render(report: dict) -> str:
  """The markdown report, from the JSON alone (experiments/report_check.py)."""
  results, digits = report["models"], report["digits"]
  num_examples, beams = report["examples_per_count"], report["beams"]
  greedy = f"beam{beams[0]}"
  lines = [f"Captioning {num_examples} held-out composites per digit count (digit images from "
           "MNIST's test split). Exact-caption accuracy / token accuracy / corpus BLEU-4 "
           f"(sacrebleu), decoding with beam size {beams[0]}.", "",
           "| model | params | steps | " + " | ".join(f"{n} digits" for n in digits)
           + " | all |", "|---|---:|---:|" + "---:|" * (len(digits) + 1)]
  for r in results.values():
    m = r["metrics"][greedy]
    cells = [f"{m[str(n)]['exact']:.3f} / {m[str(n)]['token_accuracy']:.3f} / "
             f"{m[str(n)]['bleu']:.1f}" for n in digits]
    cells.append(f"{m['all']['exact']:.3f} / {m['all']['token_accuracy']:.3f} / "
                 f"{m['all']['bleu']:.1f}")
    lines.append(f"| {r['label']} | {r['params']:,} | {r['steps']} | " + " | ".join(cells)
                 + " |")
  lines += ["", f"Exact-caption accuracy with its 95% Wilson interval (beam size {beams[0]}):",
            "", "| model | " + " | ".join(f"{n} digits" for n in digits) + " |",
            "|---|" + "---:|" * len(digits)]
  for r in results.values():
    m = r["metrics"][greedy]
    lines.append(f"| {r['label']} | " + " | ".join(
        _with_interval(m[str(n)]) for n in digits) + " |")
  if len(beams) > 1:
    lines += ["", "Exact-caption accuracy over all digit counts, by beam size:", "",
              "| model | " + " | ".join(f"beam {b}" for b in beams) + " |",
              "|---|" + "---:|" * len(beams)]
    for r in results.values():
      lines.append(f"| {r['label']} | " + " | ".join(
          f"{r['metrics'][f'beam{b}']['all']['exact']:.3f}" for b in beams) + " |")
  return "\n".join(lines) + "\n"


def _with_interval(m: dict) -> str:
  low, high = stats.wilson_interval(round(m["exact"] * m["count"]), m["count"])
  return f"{m['exact']:.3f} [{low:.3f}, {high:.3f}]"


def refit(report: dict) -> dict:
  """No fitted estimates in this report (report_check compares none)."""
  del report
  return {}


stored = refit


def plot(report: dict, path: str) -> None:
  """Exact-caption accuracy and BLEU-4 vs number of digits; dashed lines: no attention."""
  results, digits, beam = report["models"], report["digits"], report["beams"][0]
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
  for r in results.values():
    m = r["metrics"][f"beam{beam}"]
    style = "o-" if r["attention"] else "s--"
    axes[0].plot(digits, [m[str(n)]["exact"] for n in digits], style, label=r["label"])
    axes[1].plot(digits, [m[str(n)]["bleu"] for n in digits], style, label=r["label"])
  axes[0].set(xlabel="digits in the image", ylabel="exact-caption accuracy", ylim=(-0.02, 1.02))
  axes[1].set(xlabel="digits in the image", ylabel="corpus BLEU-4", ylim=(-2, 102))
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.set_xticks(digits)
  axes[1].legend(fontsize=8, loc="lower left")      # BLEU's lower band is empty
  fig.suptitle("attention (solid) vs one pooled image vector (dashed)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_attention(config, params, examples: list[dict], path: str, title: str) -> None:
  """One row per example: the image, then each generated word's attention over the grid
  (`jaxformer.inference.captions.draw_attention`)."""
  images = np.stack([e["image"] for e in examples])
  tokens, _ = caption_inference.caption_images(config.model, params, images, beam_size=1)
  tokens = np.asarray(tokens)
  maps = caption_inference.attention_maps(config.model, params, images, tokens)
  caption_inference.draw_attention(images, [captions.decode(t) for t in tokens], maps, path,
                                   title=title)


@cli.user_errors
def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mnist", default=os.environ.get("MNIST_DIR", ""),
                      help="directory of MNIST's IDX files (default $MNIST_DIR)")
  parser.add_argument("--workdir", default="runs/captioning")
  parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
  parser.add_argument("--examples", type=int, default=200, help="eval composites per count")
  parser.add_argument("--beams", default="1,5", help="beam sizes; the first is the table's")
  parser.add_argument("--steps", type=int, default=None, help="override the configs' steps")
  parser.add_argument("--out", default=RESULTS, help="results prefix")
  parser.add_argument("--report_only", action="store_true",
                      help="rewrite OUT.md and OUT.png from OUT.json (no training)")
  args = parser.parse_args(argv)
  if args.report_only:
    return report_check.report_only(args.out, render, plot)
  names = [n for n in args.models.split(",") if n]
  configs = experiment_configs(args.mnist, names, args.steps)
  if args.examples < 1:
    raise ValueError(f"--examples={args.examples} must be >= 1")
  beams = [int(b) for b in args.beams.split(",")]
  if not beams or min(beams) < 1:
    raise ValueError(f"--beams={args.beams!r} must be beam sizes >= 1, e.g. 1,5")
  first = next(iter(configs.values()))
  digits = list(range(first.data.min_digits, first.data.max_digits + 1))
  start = time.perf_counter()
  sets = {n: eval_set(first, n, args.examples) for n in digits}
  results = train_and_evaluate(configs, args.workdir, sets, beams)
  figures, shown = {}, [sets[n][0] for n in digits[1:4]]
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  for name in configs:
    if results[name]["attention"]:
      config, params, _ = load_run(os.path.join(args.workdir, name))
      figures[name] = f"{args.out}_attention_{name}.png"
      plot_attention(config, params, shown, figures[name],
                     f"{results[name]['label']}: attention per generated word")
  report = {"examples_per_count": args.examples, "digits": digits, "beams": beams,
            "models": results,
            "attention_figures": {k: os.path.basename(v) for k, v in figures.items()}}
  print(report_check.write(args.out, report, render, plot))
  print(f"total wall time {time.perf_counter() - start:.0f} s; wrote {args.out}.*")
  return 0


if __name__ == "__main__":
  main()
