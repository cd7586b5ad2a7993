"""IsoFLOP sweep: character-level GPTs of >= 5 sizes at each of several FLOP budgets.

    python -m jaxformer.sweep --workdir=DIR \\
        --config='configs/sweeps/isoflop.py:source=/path/corpus.txt,budgets=6e11/2e12/6e12,lr=3e-3'

Arguments (comma-separated key=value; `source` is required):
  source    a UTF-8 text file (split 90/10 into train/validation by characters), or
            `tinyshakespeare`, the bundled text: too small for 5 sizes at any budget; with
            sizes=3 the budgets from 5.4e10 work (`budgets=5.4e10/2.2e11/8.6e11`, 9 runs; a
            budget that does not work is refused with the smallest that does, computed)
  budgets   FLOP budgets C, '/'-separated (default 6e11/2e12/6e12)
  lr        peak learning rate of every run (default 3e-3: see experiments/scaling_chinchilla.py,
            which picks it by a sweep at the smallest budget)
  sizes     model sizes per budget (default 5), spacing: ratio of neighbouring sizes (default 2)
  mup_base_width  train every size under μP (`model.parametrization=mup`) with this base
            width: `lr` is then the LR tuned on a narrow proxy of that width, and it holds for
            every width (experiments/mup_transfer.py measures how well). μP transfers over
            width only; this family also changes depth (1-8 layers), which it does not cover.

Model family (`gpt_candidates`): the README's nanoGPT-style char GPT (learned positions,
LayerNorm, no biases, tied embeddings, no dropout), head_dim 16, mlp 4x, widths 16..320 in
steps of 16 with depth floor or ceil of width / 40 (aspect ratio ~20..64), at least
MIN_LAYERS = 2 layers (a 1-layer model is no Transformer stack; Kaplan et al. exclude them). N is the *total*
parameter count (embeddings included, as Hoffmann et al. 2022 count it); the budget C is
their exact count (Appendix F: embeddings, logits and attention included,
`flops_per_token(method="hoffmann")`), D = steps x 1024 tokens (batch 16 x context 64). For
these small character models 6 N undercounts by 10% (4 layers x 128) to 42% (1 x 32): the
vocabulary terms 4 V d are large next to N. Each run: warmup 5% of its
steps, cosine to 10% of the peak ending at its last step, one final eval on 40 validation
batches (41K tokens, the same windows for every run), ~200 training-loss records.
"""

from __future__ import annotations

import functools
import math
import pathlib

from jaxformer import scaling
from configs import shakespeare_char

BASE = "configs/shakespeare_char.py:nanogpt_cpu"
BATCH_SIZE, SEQ_LEN = 16, 64
TOKENS_PER_STEP = BATCH_SIZE * SEQ_LEN
TRAIN_FRACTION = 0.9
MAX_EPOCHS = 2
DEFAULTS = dict(budgets="6e11/2e12/6e12", lr="3e-3", sizes="5", spacing="2", mup_base_width="")
WIDTHS = tuple(range(16, 321, 16))
HEAD_DIM = 16
MIN_LAYERS = 2


def parse_key_values(sweep: str, arg: str | None, defaults: dict[str, str]) -> dict[str, str]:
  """A corpus sweep's 'source=PATH,key=value,...' argument -> `defaults` updated (strings);
  source is required. ValueError naming the sweep and the key on a bad one."""
  values = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in (*defaults, "source"):
      raise ValueError(f"{sweep} sweep arg {item!r}: expected key=value with key one of "
                       f"source, {', '.join(defaults)}")
    values[key] = value
  if not values.get("source"):
    raise ValueError(f"{sweep} sweep needs source=PATH (a text corpus), e.g. "
                     f"'configs/sweeps/{sweep}.py:source=/data/corpus.txt'")
  return values


def parse_arg(arg: str | None) -> dict[str, str]:
  """'key=value,...' -> dict with defaults; ValueError naming the key on a bad one."""
  return parse_key_values("isoflop", arg, DEFAULTS)


@functools.lru_cache(maxsize=4)
def corpus_info(source: str) -> tuple[int, int]:
  """(distinct characters, training characters) of a text corpus: a file, or a bundled one
  by its `data.source` name ('tinyshakespeare')."""
  from jaxformer.data.corpus.sources import BUNDLED
  path = pathlib.Path(BUNDLED[source] if source in BUNDLED else source).expanduser()
  if not path.is_file():
    raise ValueError(f"isoflop sweep source={source!r}: no such file")
  text = path.read_text(encoding="utf-8")
  return len(set(text)), int(len(text) * TRAIN_FRACTION)


def model_fields(num_layers: int, d_model: int) -> dict:
  return {"model.num_layers": num_layers, "model.d_model": d_model,
          "model.num_heads": d_model // HEAD_DIM, "model.mlp_dim": 4 * d_model}


def gpt_candidates(vocab_size: int) -> list[scaling.Candidate]:
  """The model family: one candidate per (depth, width), N = total parameters (counted by
  building the model), exact FLOPs/token by Hoffmann et al.'s Appendix F count."""
  out = []
  for d in WIDTHS:
    for layers in sorted({max(d // 40, MIN_LAYERS), max(-(-d // 40), MIN_LAYERS)}):
      model = shakespeare_char.get_config("nanogpt_cpu").model
      model.update(vocab_size=vocab_size, **{k.split(".")[1]: v
                                             for k, v in model_fields(layers, d).items()})
      out.append(scaling.Candidate(
          name=f"L{layers}_d{d}", params=scaling.count_params(model)["total"],
          overrides=model_fields(layers, d),
          flops_per_token=scaling.flops_per_token(model, SEQ_LEN, method="hoffmann")))
  return out


def common_overrides(source: str, vocab_size: int) -> dict:
  return {"data.source": source, "model.vocab_size": vocab_size,
          "train.batch_size": BATCH_SIZE, "data.seq_len": SEQ_LEN, "model.max_len": SEQ_LEN,
          "data.eval_batches": 40, "train.sample_tokens": 0, "train.keep_best": 0,
          "train.attention_maps": False}


def plan(source: str, budgets, *, sizes: int = 5, spacing: float = 2.0, optimum=None):
  """The planned runs (`scaling.PlannedRun`) of this family on `source`."""
  vocab_size, train_chars = corpus_info(source)
  return scaling.plan_isoflop(budgets, gpt_candidates(vocab_size),
                              tokens_per_step=TOKENS_PER_STEP, sizes_per_budget=sizes,
                              spacing=spacing, optimum=optimum, flops="exact",
                              max_tokens=MAX_EPOCHS * train_chars)


def ladder(vocab_size: int, spacing: float = 2.0) -> list:
  """Candidates about `spacing` x apart in N, smallest to largest of the family: one fixed set
  of sizes for every budget, so each size's runs at several budgets share one trunk."""
  family = sorted({c.params: c for c in gpt_candidates(vocab_size)}.values(),
                  key=lambda c: c.params)
  chosen = [family[0]]
  for candidate in family[1:]:
    if candidate.params >= chosen[-1].params * spacing / 1.15:
      chosen.append(candidate)
  return chosen


def plan_window(source: str, budgets, *, half_width: int = 3, spacing: float = 2.0,
                min_steps: int = 100, optimum=None) -> list:
  """Per budget, the `ladder` sizes within spacing^±half_width (x 1.2) of N* (from `optimum`,
  default D = 20 N), keeping the runs `scaling.plan_run` accepts (>= min_steps, <= MAX_EPOCHS
  of the corpus): at the ends of the family or of the data a budget gets fewer sizes instead
  of an error. For studies of cooldown branches, where every budget need not be centred."""
  vocab_size, train_chars = corpus_info(source)
  optimum = optimum or scaling.isoflop.rule_of_thumb_optimum
  reach = half_width * math.log(spacing) + math.log(1.2)
  runs = []
  for budget in sorted(float(b) for b in budgets):
    for candidate in ladder(vocab_size, spacing):
      if abs(math.log(candidate.params / optimum(budget))) > reach:
        continue
      try:
        runs.append(scaling.plan_run(budget, candidate, tokens_per_step=TOKENS_PER_STEP,
                                     flops="exact", max_tokens=MAX_EPOCHS * train_chars,
                                     min_steps=min_steps))
      except ValueError:
        continue
  return runs


def get_sweep(arg=None):
  values = parse_arg(arg)
  try:
    budgets = [float(b) for b in values["budgets"].split("/")]
    lr, sizes, spacing = float(values["lr"]), int(values["sizes"]), float(values["spacing"])
    base_width = int(values["mup_base_width"]) if values["mup_base_width"] else None
  except ValueError as e:
    raise ValueError(f"isoflop sweep arg {arg!r}: {e}; budgets are '/'-separated numbers "
                     "(6e11/2e12/6e12), lr and spacing numbers, sizes and mup_base_width "
                     "ints") from e
  runs = plan(values["source"], budgets, sizes=sizes, spacing=spacing)
  vocab_size, _ = corpus_info(values["source"])
  overrides = common_overrides(values["source"], vocab_size)
  if base_width is not None:
    # heads of HEAD_DIM grow in number with the width: head_dim set says so to μP
    overrides.update({"model.parametrization": "mup", "model.mup_base_width": base_width,
                      "model.head_dim": HEAD_DIM})
  return scaling.to_sweep(runs, BASE, lr=lr, overrides=overrides,
                          name="L{model.num_layers}_d{model.d_model}_s{train.steps}")
