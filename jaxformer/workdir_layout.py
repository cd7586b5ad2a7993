"""The names of what a training run writes in its workdir, in one place: training writes them,
inference and the sweep driver read them, and `--fresh` removes them (`train.workdir`). The
tokenizer's own files are named by `jaxformer.data.tokenizers`, which also saves elsewhere."""

CONFIG = "config.json"                 # the run's config, as JSON
CHECKPOINTS = "checkpoints"            # Orbax checkpoints of the latest steps
BEST = "best"                          # params of the best evals
METRICS = "metrics.jsonl"              # one JSON record per logged step and eval
SAMPLES = "samples.txt"                # text sampled at evals and at the end
CURVES = "curves.png"                  # loss curves plotted at the end
ATTENTION = "attention"                # attention-map heatmaps, one PNG per eval
HEADS = "heads"                        # train.evaluators 'heads': per-head arrays, a JSON per eval
PROFILE = "profile"                    # jax.profiler traces
BRANCH = "branched_from.json"          # a cooldown branch: the run and step it started from
DATA = "data.json"                     # the fingerprint of the data the run trains on
TRACKERS = "trackers.json"             # the W&B / MLflow run ids a resume continues
POSTTRAIN_SOURCE = "posttrain_source.json"   # SFT/DPO: the source run's config, for resumes
LOGS = "logs"                          # process i > 0: its console output
LOCK = ".lock"                         # the advisory lock of the training that owns it
TENSORBOARD_PREFIX = "events.out.tfevents"

# The members that are directories (every other member is a file): `train.workdir` refuses a
# workdir holding one of the other kind before any work.
DIRECTORIES = (CHECKPOINTS, BEST, ATTENTION, HEADS, PROFILE, LOGS)
EVAL = "eval"                          # python -m jaxformer.evaluate: one JSON of results per name
