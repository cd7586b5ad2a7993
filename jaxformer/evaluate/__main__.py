"""python -m jaxformer.evaluate --workdir=DIR --task=perplexity|multiple_choice|lm_eval|linear_probe

Scores a checkpoint of a training run (--checkpoint=latest|best|STEP) and writes the result
as DIR/eval/<name>.json (see `jaxformer.evaluate`); a short table goes to stdout, the step it
loaded to stderr.

    --task=perplexity [--source=...] [--split=validation|train] [--max_tokens=N]
    --task=multiple_choice --data=items.jsonl [--limit=N]
    --task=lm_eval --tasks=name,... [--include_path=DIR] [--num_fewshot=K] [--limit=N]
    --task=linear_probe [--data=train.jsonl [--test_data=test.jsonl]] [--source=...]
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags

from jaxformer import cli, compilation, models
from jaxformer.evaluate import results

TASKS = ("perplexity", "multiple_choice", "lm_eval", "linear_probe")

flags.DEFINE_string("workdir", None, "Training run directory.")
flags.DEFINE_string("task", "perplexity", f"What to evaluate: one of {', '.join(TASKS)}.")
flags.DEFINE_string("checkpoint", "latest", "latest | best (the params of the best eval) | a "
                    "step number (a kept checkpoint of that step).")
flags.DEFINE_string("name", None, "Results file stem: DIR/eval/<name>.json (default: from the "
                    "task and its data).")
flags.DEFINE_integer("batch_size", 16, "Rows scored per forward pass.")
flags.DEFINE_integer("max_length", None, "Context of the scoring windows (default: the run's "
                     "data.seq_len, at most model.max_len).")
flags.DEFINE_string("source", None, "perplexity, linear_probe (ViT): a data.source in any form "
                    "training takes (default: the run's).")
flags.DEFINE_string("split", "validation", "perplexity: the split of the source, train | "
                    "validation.")
flags.DEFINE_integer("max_tokens", None, "perplexity: score at most this many tokens (default: "
                     "the whole split).")
flags.DEFINE_string("data", None, "multiple_choice: a JSONL of items; linear_probe (BERT "
                    "family): a JSONL of {text, label} lines.")
flags.DEFINE_string("test_data", None, "linear_probe (BERT family): the test JSONL (default: "
                    "a seeded 20%% of --data).")
flags.DEFINE_integer("limit", None, "multiple_choice, lm_eval: at most this many items per task.")
flags.DEFINE_list("tasks", None, "lm_eval: lm-evaluation-harness task names (or groups).")
flags.DEFINE_string("include_path", None, "lm_eval: a directory of task YAML files of your own.")
flags.DEFINE_integer("num_fewshot", None, "lm_eval: few-shot examples per prompt.")
flags.DEFINE_integer("max_examples", None, "linear_probe: at most this many examples per split.")
flags.DEFINE_float("l2", 1e-2, "linear_probe: the weight decay of the logistic regression.")
cli.define_compilation_cache_flag()
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def default_name() -> str:
  task = FLAGS.task
  if task == "perplexity":
    name = "perplexity" + (f"-{results.stem(FLAGS.source)}" if FLAGS.source else "")
    return name + ("" if FLAGS.split == "validation" else f"-{FLAGS.split}")
  if task == "multiple_choice":
    return f"multiple_choice-{results.stem(FLAGS.data)}"
  if task == "lm_eval":
    return "lm_eval-" + "_".join(results.stem(t) for t in FLAGS.tasks)[:80]
  return "linear_probe" + (f"-{results.stem(FLAGS.data)}" if FLAGS.data else "")


def check_request(config) -> dict:
  """Everything that can be checked before loading params or compiling: the task fits the
  family, the flags it needs are given, its JSONL parses. Returns what was read."""
  if FLAGS.task not in TASKS:
    raise ValueError(f"--task={FLAGS.task!r} must be one of {', '.join(TASKS)}")
  family = models.settings_of(config).family
  task = models.get(family).task
  read = {}
  if FLAGS.task in ("perplexity", "multiple_choice", "lm_eval"):
    if task != "lm":
      raise ValueError(f"--task={FLAGS.task} scores text with a decoder LM; this run is "
                       f"model.family={family!r} (task {task!r})" + (
                           "; use --task=linear_probe" if family in ("bert", "roberta",
                                                                     "deberta", "vit")
                           else ""))
    if FLAGS.task == "perplexity":
      from jaxformer.evaluate import perplexity
      perplexity.check_args(FLAGS.split, FLAGS.max_tokens)
    if FLAGS.task == "multiple_choice":
      if not FLAGS.data:
        raise ValueError("--task=multiple_choice needs --data=<a JSONL file of items>")
      from jaxformer.evaluate import choices
      read["items"] = choices.read_items(FLAGS.data, FLAGS.limit)
    if FLAGS.task == "lm_eval":
      if not FLAGS.tasks:
        raise ValueError("--task=lm_eval needs --tasks=<lm-evaluation-harness task names>")
      from jaxformer.extras import require
      try:
        require("lm_eval", extra="eval", needed_for="--task=lm_eval")
      except ImportError as e:
        raise ValueError(str(e)) from None
      from jaxformer.evaluate import harness
      read["task_manager"] = harness.task_manager(FLAGS.tasks, FLAGS.include_path)
  else:
    from jaxformer.evaluate import probe
    probe.check_family(config)
    if family in probe.TEXT_FAMILIES:
      if not FLAGS.data:
        raise ValueError(f"--task=linear_probe on a {family!r} run needs --data=<JSONL of "
                         '{"text": ..., "label": ...} lines> (and optionally --test_data)')
      for path in (FLAGS.data, FLAGS.test_data):
        if path:
          probe.read_labelled(path)
  if FLAGS.limit is not None and FLAGS.limit < 1:
    raise ValueError(f"--limit={FLAGS.limit} must be >= 1")
  return read


def run_task(config, params, tokenizer, read: dict) -> dict:
  from jaxformer.evaluate import scoring
  if FLAGS.task == "perplexity":
    from jaxformer.evaluate import perplexity
    scoring.check_vocab(config, tokenizer)
    return perplexity.evaluate(config, params, tokenizer, FLAGS.workdir, source=FLAGS.source,
                               split=FLAGS.split, max_tokens=FLAGS.max_tokens,
                               batch_size=FLAGS.batch_size, max_length=FLAGS.max_length)
  if FLAGS.task == "multiple_choice":
    from jaxformer.evaluate import choices
    scoring.check_vocab(config, tokenizer)
    scorer = scoring.Scorer(config, params, batch_size=FLAGS.batch_size, width=FLAGS.max_length,
                            vocab_limit=tokenizer.vocab_size)
    out = choices.evaluate(scorer, tokenizer, read["items"], scoring.start_token(tokenizer))
    return {"data": FLAGS.data, **out}
  if FLAGS.task == "lm_eval":
    from jaxformer.evaluate import harness
    return harness.run(read["task_manager"], config, params, tokenizer, tasks=FLAGS.tasks,
                       num_fewshot=FLAGS.num_fewshot, limit=FLAGS.limit,
                       batch_size=FLAGS.batch_size, max_length=FLAGS.max_length)
  from jaxformer.evaluate import probe
  return probe.evaluate(config, params, tokenizer, source=FLAGS.source, data=FLAGS.data,
                        test_data=FLAGS.test_data, max_examples=FLAGS.max_examples, l2=FLAGS.l2)


def main(argv):
  del argv
  from ml_collections import ConfigDict

  from jaxformer import workdir_layout
  from jaxformer.inference import load_run
  from jaxformer.inference.restore import checkpoint_choice, checkpoint_step
  from jaxformer.state import train_state

  workdir = FLAGS.workdir
  if not os.path.isdir(workdir) and "://" not in workdir:
    raise ValueError(f"--workdir={workdir!r} does not exist; give the directory of a training "
                     "run")
  saved = train_state.read_config(workdir)
  if saved is None:
    raise ValueError(f"--workdir={workdir!r} holds no training run (no "
                     f"{workdir_layout.CONFIG})")
  checkpoint_choice(FLAGS.checkpoint)
  read = check_request(ConfigDict(saved))
  name = results.check_name(FLAGS.name or default_name())
  compilation.enable_cache(FLAGS.compilation_cache)
  config, params, tokenizer = load_run(workdir, which=FLAGS.checkpoint)
  step = checkpoint_step(workdir, FLAGS.checkpoint)
  print(f"evaluating the params of step {step} (--checkpoint={FLAGS.checkpoint})",
        file=sys.stderr, flush=True)
  metrics = run_task(config, params, tokenizer, read)
  record = {"task": FLAGS.task, "workdir": workdir, "checkpoint": FLAGS.checkpoint,
            "step": step, "results": metrics}
  target = results.write(workdir, name, json.loads(json.dumps(record, default=str)))
  print(f"{FLAGS.task} of step {step}:")
  print(results.table(metrics))
  print(f"wrote {target}")


if __name__ == "__main__":
  cli.run_absl(main)
