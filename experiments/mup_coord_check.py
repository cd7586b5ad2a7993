"""μP coordinate check: every layer's activation size over the first steps, widths 32..512.

    python -m experiments.mup_coord_check [--widths 32 64 128 256 512] [--steps 4]
        [--lr 1e-2] [--out=experiments/results/mup_coord_check]

The README's character GPT (2 layers, 4 heads, mlp 4x, tied embeddings) on one fixed batch
of 8 x 64 characters of the bundled tiny Shakespeare, trained `steps` AdamW steps at a
constant LR (no warmup, no clipping: the first updates are the ones that blow up) at each
width, under `standard` and under `mup` (base width = the narrowest). Each layer's output is
recorded as its mean |x| before the first update and after each (`train.coord_check.
coordinate_check`); the slope is the exponent p of |x| ~ width^p. Under μP every slope
after an update should be ~0; under standard, the logits and the residual stream grow
(Adam's update of a width-n matrix moves its output by ~ lr x n).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

import numpy as np  # noqa: E402

from configs import shakespeare_char  # noqa: E402
from jaxformer.data.corpus import sources  # noqa: E402
from jaxformer.data.tokenizers import CharTokenizer  # noqa: E402
from jaxformer.scaling import mup  # noqa: E402
from jaxformer.train import coord_check  # noqa: E402

PARAMETRIZATIONS = ("standard", "mup")
BATCH, SEQ_LEN = 8, 64


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256, 512])
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--lr", type=float, default=1e-2)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--out", default=str(REPO_ROOT / "experiments/results/mup_coord_check"))
  args = parser.parse_args(argv)
  if len(args.widths) < 3 or sorted(set(args.widths)) != args.widths or any(
      w % 4 for w in args.widths):
    parser.error(f"--widths {args.widths}: give >= 3 increasing multiples of 4 (the heads)")
  if args.steps < 1:
    parser.error(f"--steps={args.steps} must be >= 1")
  return args


def shakespeare_batch(seed: int = 0) -> tuple[np.ndarray, int]:
  """[BATCH, SEQ_LEN + 1] character ids of random windows of the bundled corpus, vocab."""
  text = sources.BUNDLED["tinyshakespeare"].read_text(encoding="utf-8")
  tokenizer = CharTokenizer(text)
  ids = tokenizer.encode(text[:200_000])
  starts = np.random.default_rng(seed).integers(0, ids.size - SEQ_LEN - 1, BATCH)
  return np.stack([ids[s:s + SEQ_LEN + 1] for s in starts]), tokenizer.vocab_size


def run(args) -> dict:
  tokens, vocab = shakespeare_batch()
  out = {}
  for kind in PARAMETRIZATIONS:
    cfg = shakespeare_char.get_config("nanogpt_cpu")
    cfg.model.update(parametrization=kind, mup_base_width=args.widths[0],
                     num_layers=args.layers, num_heads=4, vocab_size=vocab, max_len=SEQ_LEN)
    cfg.optim.update(lr=args.lr, warmup_steps=0, schedule="constant", clip=0.0)
    start = time.perf_counter()
    out[kind] = coord_check.coordinate_check(cfg, args.widths, steps=args.steps, tokens=tokens)
    print(f"{kind}: {time.perf_counter() - start:.1f}s", flush=True)
  return out


def shown_layers(check: mup.CoordCheck) -> list[str]:
  """The embedding, each block's attention and FFN outputs and the block itself, the logits
  (the other recorded modules repeat these or are norms, flat by construction)."""
  keep = ("embed", "logits")
  ends = ("block/self_attention", "block/ffn", "block")
  return [n for n in check.layers if n in keep or any(n.endswith(e) for e in ends)]


def table(checks: dict, steps: int) -> str:
  widths = checks["mup"].widths
  lines = ["| layer | parametrization | " + " | ".join(f"width {w}" for w in widths) +
           f" | slope at step {steps} | steepest slope, steps 1-{steps} |",
           "|---|---|" + "---:|" * (len(widths) + 2)]
  for name in shown_layers(checks["mup"]):
    for kind, check in checks.items():
      slopes = check.slopes()[name]
      sizes = [check.sizes[w][name][steps] for w in widths]
      lines.append(f"| {name} | {kind} | " + " | ".join(f"{s:.3g}" for s in sizes) +
                   f" | {slopes[steps]:+.2f} | {max(slopes[1:]):+.2f} |")
  return "\n".join(lines)


def plot(path: pathlib.Path, checks: dict, steps: int):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(2, steps + 1, figsize=(3.2 * (steps + 1), 6.4), sharey="row")
  for row, (kind, check) in enumerate(checks.items()):
    names = shown_layers(check)
    colors = plt.cm.tab20(np.linspace(0, 1, len(names)))
    for t in range(steps + 1):
      ax = axes[row, t]
      for color, name in zip(colors, names):
        ax.loglog(check.widths, [check.sizes[w][name][t] for w in check.widths], "o-",
                  color=color, ms=3, label=name)
      ax.set_title(f"{'μP' if kind == 'mup' else 'standard'}, t = {t}")
      ax.set_xscale("log", base=2)
      ax.set_xticks(check.widths, [str(w) for w in check.widths])
      ax.minorticks_off()
      ax.set_xlabel("width")
      ax.grid(alpha=0.3, which="both")
    axes[row, 0].set_ylabel("mean |activation|")
  axes[0, -1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1))
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_report(args, checks: dict, wall_s: float):
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  growth = {kind: check.max_growth() for kind, check in checks.items()}
  data = {"widths": args.widths, "steps": args.steps, "lr": args.lr, "layers": args.layers,
          "batch": [BATCH, SEQ_LEN], "checks": {k: c.to_json() for k, c in checks.items()},
          "steepest_growth": {k: {"layer": g[0], "step": g[1], "slope": g[2]}
                              for k, g in growth.items()},
          "wall_time_s": round(wall_s, 1), "written": time.strftime("%Y-%m-%d %H:%M:%S")}
  out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
  plot(out.with_suffix(".png"), checks, args.steps)
  text = [
      "# μP coordinate check", "",
      f"The README's char GPT ({args.layers} layers, 4 heads, mlp 4x, tied embeddings) on "
      f"one fixed batch of {BATCH} x {SEQ_LEN} characters of tiny Shakespeare, {args.steps} "
      f"AdamW steps at a constant LR {args.lr:g} (no warmup, no clipping), widths "
      f"{args.widths}; μP base width {args.widths[0]}. Size: mean |x| of each layer's output "
      "before the first update (t = 0) and after each; slope: least-squares exponent p of "
      f"size ~ width^p. Reproduce: `python -m experiments.mup_coord_check` ({wall_s:.0f} s "
      "on a 2-core CPU).", "",
      "| parametrization | steepest growth after an update (layer, step) | slope |",
      "|---|---|---:|",
      *[f"| {k} | {g[0]}, t = {g[1]} | {g[2]:+.2f} |" for k, g in growth.items()], "",
      f"![coordinate check]({out.name}.png)", "",
      f"## Sizes after {args.steps} updates", "", table(checks, args.steps), ""]
  out.with_suffix(".md").write_text("\n".join(text))
  print("\n".join(text))


def main(argv=None) -> int:
  args = parse_args(argv)
  start = time.perf_counter()
  checks = run(args)
  write_report(args, checks, time.perf_counter() - start)
  return 0


if __name__ == "__main__":
  sys.exit(main())
