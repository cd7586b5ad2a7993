"""Published, measured training throughput of our published-model configs on Cloud TPUs, to set
beside our own estimates (`jaxformer.scaling`) and runs.

These numbers were measured by others, with MaxText (Google's JAX LLM trainer), on synthetic
data, with their own sharding, rematerialisation, kernels and XLA flags tuned per model and
slice. They are not our measurements, and comparing them with jaxformer (untuned) is a rough
comparison, not like-for-like. Every number below was read from one of these stored sources,
and the comment above each record quotes the row or log line it came from:

- MaxText's "Optimized models tiering" table: github.com/AI-Hypercomputer/maxtext,
  docs/reference/models/tiering.md at commit e591f30cbbf217ed67ef71263ec0538239f9c3b8 (the
  file last changed in 66266787a6ca847790a3b36f90d8e5338af656f5; also published as
  maxtext.readthedocs.io/en/latest/reference/models/tiering.html). MFU and "Approx
  tokens/sec/device" per row.
- MaxText's Mixtral page: tests/end_to_end/tpu/mixtral/Run_Mixtral.md in the same commit.
- The TPU recipes (github.com/AI-Hypercomputer/tpu-recipes at commit
  c8cfe2f689081d36701a101cd73a70965d80926b, training/{trillium,v5p}/<model>/README.md): each
  quotes one MaxText log line, "completed step: N, seconds: S, TFLOP/s/device: F,
  Tokens/s/device: T, total_weights: W", and the workload's settings (per_device_batch_size,
  max_target_length). Here seconds x Tokens/s/device = tokens per chip per step, and
  total_weights / that = the number of chips; both were checked against the stated slice and
  batch (one log line disagrees with its listed batch: see the note on that record).

Units and conventions (theirs):
- `chips`: TPU chips. v6e-N names N chips. v5p-N names N TensorCores, 2 per chip, so v5p-1024
  is 512 chips (Cloud TPU v5p docs, cloud.google.com/tpu/docs/v5p-training: topology 4x4x8 =
  256 cores = 128 chips). MaxText's "per device" is per chip on both (the v5p-1024 log line's
  total_weights give 512 devices).
- `tflops_per_chip`: MaxText's model FLOPs per step / step time (the matmuls of one training
  step; attention FLOPs halved for causal masking since their PR #1988, July 2025, so older
  runs count more attention: the tiering page's footnote 2). Model, not hardware, FLOPs:
  rematerialisation is not counted.
- `mfu`: tflops_per_chip / the chip's bf16 peak, as a fraction (0.438 = 43.8%). Peaks in
  PEAK_BF16_TFLOPS.
- `tokens_per_s_per_chip`: trained tokens per second per chip.
- `per_chip_batch`: MaxText's per_device_batch_size (sequences per chip per step); None where
  the source does not give it.

The model names are the sources' own; CONFIGS maps each to our config and says how theirs
differs.
"""

from __future__ import annotations

import dataclasses

MAXTEXT = ("github:AI-Hypercomputer/maxtext@e591f30cbbf217ed67ef71263ec0538239f9c3b8"
           ":docs/reference/models/tiering.md")
MAXTEXT_MIXTRAL = ("github:AI-Hypercomputer/maxtext@e591f30cbbf217ed67ef71263ec0538239f9c3b8"
                   ":tests/end_to_end/tpu/mixtral/Run_Mixtral.md")
RECIPES = "github:AI-Hypercomputer/tpu-recipes@c8cfe2f689081d36701a101cd73a70965d80926b:training/"
RECIPES_2024 = ("github:AI-Hypercomputer/tpu-recipes@79401cc8586178b357985a58f2320dc2f4329d38"
                ":training/")

# bf16 peak per chip, TFLOP/s, with where it is stated.
PEAK_BF16_TFLOPS = {
    # MaxText docs/reference/performance_metrics.md: "dividing this number by the peak tflops
    # of the hardware (e.g., $918e^{12}$ FLOPS/s for Trillium)"
    "v6e": 918.0,
    # cloud.google.com/tpu/docs/v5p-training: "Peak compute per chip (bf16) | 459 TFLOPs"
    "v5p": 459.0,
}

# Source model name -> (our config, how the source's model differs from it).
CONFIGS = {
    "Llama 2 70B": ("llama.py:llama2-70b", ""),
    "Llama 3.1 70B": ("llama.py:llama3-70b", "Llama 3.1 = the Llama 3 architecture and "
                      "parameter count plus RoPE frequency scaling (128K context); trained here "
                      "at 8192 tokens"),
    "Llama 3.1 8B": ("llama.py:llama3-8b", "as Llama 3.1 70B"),
    "Mistral 7B": ("llama.py:mistral-7b", "MaxText's mistral-7b has rope_max_timescale 1e6 and "
                   "no sliding window (Mistral v0.2+); ours is v0.1 (theta 1e4, window 4096)"),
    "Mixtral 8X7B": ("mixtral.py:8x7b", "the v6e recipe drops tokens (capacity_factor 1.25, "
                     "megablox off); ours is dropless"),
    "GPT3-175B": ("gpt3.py:175b", "MaxText's gpt3-175b pads the vocabulary to 50304 (ours "
                  "50257); see each record's precision"),
}


@dataclasses.dataclass(frozen=True)
class PublishedRun:
  """One published number: `metric` = `value` for `model` on `chips` chips of `chip`."""
  model: str                    # as the source names it (CONFIGS maps it to ours)
  chip: str                     # TPU generation: "v5p", "v6e"
  chips: int                    # chips in the run (all slices)
  seq_len: int | None           # tokens per sequence
  per_chip_batch: int | None    # sequences per chip per step
  metric: str                   # "tflops_per_chip", "mfu" or "tokens_per_s_per_chip"
  value: float
  source: str                   # repository@commit:path (or URL)
  precision: str = "bf16"       # matmul precision of the run
  note: str = ""


METRICS = ("tflops_per_chip", "mfu", "tokens_per_s_per_chip")


def _run(model, chip, chips, seq_len, per_chip_batch, source, *, precision="bf16", note="",
         **metrics) -> list[PublishedRun]:
  """One record per metric given (keyword = metric name) of one published run."""
  assert set(metrics) <= set(METRICS), metrics
  return [PublishedRun(model, chip, chips, seq_len, per_chip_batch, metric, float(value),
                       source, precision, note) for metric, value in metrics.items()]


RUNS: list[PublishedRun] = [
    # ---- MaxText tiering table (MAXTEXT), "## Trillium (v6e)" ----
    # | Llama 2 70B | [Link](.../tpu-recipes/tree/main/training/trillium/Llama2-70B-MaxText) |
    #   256, BF16, SL=4096 | 43.8% | 900 |
    *_run("Llama 2 70B", "v6e", 256, 4096, None, MAXTEXT, mfu=0.438, tokens_per_s_per_chip=900,
          note="Gold tier; the linked recipe's log line is the tpu-recipes v6e-256 record"),
    # | Llama 3.1 8B | [Link](.../Llama3.1-8B-MaxText/v6e-256) | 256 Chips, BF16, SL=8192 |
    #   45.46% | 7,207 |
    *_run("Llama 3.1 8B", "v6e", 256, 8192, 4, MAXTEXT, mfu=0.4546,
          tokens_per_s_per_chip=7207,
          note="Gold tier; per_chip_batch from the linked recipe (per_device_batch_size 4)"),
    # | Llama 3.1 70B | [Link](.../maxtext/blob/92e59fdf547421f647590087f50fea5729da42d8/
    #   benchmarks/maxtext_trillium_model_configs.py#L959) | 256 Chips, BF16, SL=8192 |
    #   50.33% | 960 |
    *_run("Llama 3.1 70B", "v6e", 256, 8192, 5, MAXTEXT, mfu=0.5033,
          tokens_per_s_per_chip=960,
          note="Gold tier; per_chip_batch from the linked config llama3_1_70b_8192 "
               "(per_device_batch_size 5)"),
    # | Mixtral 8X7B | [Link](.../tpu-recipes/tree/main/training/trillium/Mixtral-8x7B-MaxText) |
    #   256 Chips, BF16, SL=4096 | 35.23% | 3,899 |
    *_run("Mixtral 8X7B", "v6e", 256, 4096, None, MAXTEXT, mfu=0.3523,
          tokens_per_s_per_chip=3899,
          note="Silver tier; the linked recipe's log line today shows 3645.203 tokens/s"),
    # ---- MaxText tiering table (MAXTEXT), "## v5p" ----
    # | Llama 2 70B | [Link](.../maxtext/blob/92e59fdf547421f647590087f50fea5729da42d8/
    #   benchmarks/maxtext_v5p_model_configs.py#L156) | 512 Chips, BF16, SL=4096 | 65.4% | 692 |
    *_run("Llama 2 70B", "v5p", 512, 4096, 4, MAXTEXT, mfu=0.654, tokens_per_s_per_chip=692,
          note="Gold tier. '512 Chips' as written; the table's naming is loose (its v5p "
               "Mixtral row says '256 Chips(8x4x4)', a 128-chip topology), so this may be "
               "v5p-512 = 256 chips. per_chip_batch from the linked config llama2_70b_v5p_128 "
               "(per_device_batch_size 4)"),
    # | Mixtral 8X7B | [Link](.../tpu-recipes/tree/main/training/v5p/Mixtral-8X7B-Maxtext) |
    #   256 Chips(8x4x4), bf16, SL=4096 | 52.56% | 2,909 |
    *_run("Mixtral 8X7B", "v5p", 128, 4096, None, MAXTEXT, mfu=0.5256,
          tokens_per_s_per_chip=2909,
          note="Silver tier. Written '256 Chips(8x4x4)': topology 8x4x4 is 128 chips (256 "
               "TensorCores, i.e. v5p-256), so chips=128"),

    # ---- MaxText Run_Mixtral.md (MAXTEXT_MIXTRAL) ----
    # "Model Flop utilization for training on v5p TPUs."
    # | Mixtral 8X7B | v5p-128       | 251.94 | 54.89% |   (TFLOP/chip/sec, MFU)
    *_run("Mixtral 8X7B", "v5p", 64, None, None, MAXTEXT_MIXTRAL, tflops_per_chip=251.94,
          mfu=0.5489, note="v5p-128 = 64 chips; batch and sequence length not stated"),

    # ---- TPU recipes, Trillium (v6e) ----
    # training/trillium/Llama2-70B-MaxText/README.md: --device_type=v6e-256 --num_slices=1,
    # model llama2-70b-4096-sc: "per_device_batch_size": 3, "max_target_length": 4096;
    # "completed step: 16, seconds: 9.052, TFLOP/s/device: 402.274, Tokens/s/device: 905.021,
    #  total_weights: 2097152, loss: 1.104"
    *_run("Llama 2 70B", "v6e", 256, 4096, 2, RECIPES + "trillium/Llama2-70B-MaxText/README.md",
          tflops_per_chip=402.274, tokens_per_s_per_chip=905.021,
          note="The README lists per_device_batch_size 3, but its log line is of batch 2: "
               "9.052 s x 905.021 tokens/s = 8192 tokens per chip = 2 x 4096, and "
               "total_weights 2,097,152 = 256 chips x 8192"),
    # Same README in its first version (tpu-recipes commit 79401cc, 2024-11-01; MaxText
    # e7292a3a, model llama2-70b-4096: "per_device_batch_size": 4, "max_target_length": 4096):
    # "completed step: 17, seconds: 17.373, TFLOP/s/device: 419.193, Tokens/s/device: 943.086,
    #  total_weights: 4194304, loss: -0.004"   (17.373 x 943.086 = 16384 = 4 x 4096)
    *_run("Llama 2 70B", "v6e", 256, 4096, 4,
          RECIPES_2024 + "trillium/Llama2-70B-MaxText/README.md",
          tflops_per_chip=419.193, tokens_per_s_per_chip=943.086,
          note="libtpu-nightly 20241028: before MaxText halved causal attention FLOPs"),
    # training/trillium/Llama3.1-70B-MaxText/v6e-32/README.md ("per_device_batch_size": 2,
    # "max_target_length": 8192): "completed step: 34, seconds: 17.790, TFLOP/s/device:
    # 443.385, Tokens/s/device: 920.965, total_weights: 524288, loss: 11.457"
    *_run("Llama 3.1 70B", "v6e", 32, 8192, 2,
          RECIPES + "trillium/Llama3.1-70B-MaxText/v6e-32/README.md",
          tflops_per_chip=443.385, tokens_per_s_per_chip=920.965,
          note="bfloat16 weights (weight_dtype), no collective matmul"),
    # .../v6e-64/README.md ("per_device_batch_size": 2, "max_target_length": 8192):
    # "completed step: 14, seconds: 18.688, TFLOP/s/device: 422.091, Tokens/s/device: 876.736,
    #  total_weights: 1048576, loss: 0.865"
    *_run("Llama 3.1 70B", "v6e", 64, 8192, 2,
          RECIPES + "trillium/Llama3.1-70B-MaxText/v6e-64/README.md",
          tflops_per_chip=422.091, tokens_per_s_per_chip=876.736),
    # .../v6e-128/README.md ("per_device_batch_size": 4, "max_target_length": 8192):
    # "completed step: 14, seconds: 34.786, TFLOP/s/device: 453.500, Tokens/s/device: 941.976,
    #  total_weights: 4194304, loss: 4.174"
    *_run("Llama 3.1 70B", "v6e", 128, 8192, 4,
          RECIPES + "trillium/Llama3.1-70B-MaxText/v6e-128/README.md",
          tflops_per_chip=453.5, tokens_per_s_per_chip=941.976),
    # .../v6e-256/README.md ("per_device_batch_size": 5, "max_target_length": 8192):
    # "completed step: 14, seconds: 42.656, TFLOP/s/device: 462.297, Tokens/s/device: 960.248,
    #  total_weights: 10485760, loss: 6.658"
    *_run("Llama 3.1 70B", "v6e", 256, 8192, 5,
          RECIPES + "trillium/Llama3.1-70B-MaxText/v6e-256/README.md",
          tflops_per_chip=462.297, tokens_per_s_per_chip=960.248),
    # training/trillium/Llama3.1-8B-MaxText/v6e-8/README.md ("per_device_batch_size": 3,
    # "max_target_length": 8192): "completed step: 14, seconds: 3.443, TFLOP/s/device: 413.433,
    # Tokens/s/device: 7138.890, total_weights: 196608, loss: 2.136"
    *_run("Llama 3.1 8B", "v6e", 8, 8192, 3,
          RECIPES + "trillium/Llama3.1-8B-MaxText/v6e-8/README.md",
          tflops_per_chip=413.433, tokens_per_s_per_chip=7138.89),
    # .../v6e-16/README.md (3, 8192): "completed step: 14, seconds: 3.393, TFLOP/s/device:
    # 419.485, Tokens/s/device: 7243.378, total_weights: 393216, loss: 3.974"
    *_run("Llama 3.1 8B", "v6e", 16, 8192, 3,
          RECIPES + "trillium/Llama3.1-8B-MaxText/v6e-16/README.md",
          tflops_per_chip=419.485, tokens_per_s_per_chip=7243.378),
    # .../v6e-32/README.md (3, 8192): "completed step: 14, seconds: 3.495, TFLOP/s/device:
    # 407.225, Tokens/s/device: 7031.689, total_weights: 786432, loss: 5.864"
    *_run("Llama 3.1 8B", "v6e", 32, 8192, 3,
          RECIPES + "trillium/Llama3.1-8B-MaxText/v6e-32/README.md",
          tflops_per_chip=407.225, tokens_per_s_per_chip=7031.689),
    # .../v6e-64/README.md (5, 8192): "completed step: 14, seconds: 5.652, TFLOP/s/device:
    # 419.701, Tokens/s/device: 7247.111, total_weights: 2621440, loss: 8.534"
    *_run("Llama 3.1 8B", "v6e", 64, 8192, 5,
          RECIPES + "trillium/Llama3.1-8B-MaxText/v6e-64/README.md",
          tflops_per_chip=419.701, tokens_per_s_per_chip=7247.111),
    # .../v6e-128/README.md (4, 8192): "completed step: 14, seconds: 4.602, TFLOP/s/device:
    # 412.319, Tokens/s/device: 7119.648, total_weights: 4194304, loss: 9.285"
    *_run("Llama 3.1 8B", "v6e", 128, 8192, 4,
          RECIPES + "trillium/Llama3.1-8B-MaxText/v6e-128/README.md",
          tflops_per_chip=412.319, tokens_per_s_per_chip=7119.648),
    # .../v6e-256/README.md (4, 8192): "completed step: 14, seconds: 4.546, TFLOP/s/device:
    # 417.397, Tokens/s/device: 7207.336, total_weights: 8388608, loss: 10.131"
    *_run("Llama 3.1 8B", "v6e", 256, 8192, 4,
          RECIPES + "trillium/Llama3.1-8B-MaxText/v6e-256/README.md",
          tflops_per_chip=417.397, tokens_per_s_per_chip=7207.336),
    # training/trillium/Mistral-7B-MaxText/README.md (--device_type=v6e-8,
    # "per_device_batch_size": 6, "max_target_length": 8192): "completed step: 6, seconds:
    # 6.320, TFLOP/s/device: 431.981, Tokens/s/device: 7776.813, total_weights: 393216,
    # loss: 7.378"
    *_run("Mistral 7B", "v6e", 8, 8192, 6, RECIPES + "trillium/Mistral-7B-MaxText/README.md",
          tflops_per_chip=431.981, tokens_per_s_per_chip=7776.813),
    # training/trillium/Mixtral-8x7B-MaxText/README.md (--device_type=v6e-256,
    # mixtral_8x7b_dropped: "per_device_batch_size": 12, "max_target_length": 4096,
    # "capacity_factor": 1.25): "completed step: 11, seconds: 13.484, TFLOP/s/device: 302.311,
    # Tokens/s/device: 3645.203, total_weights: 12582912, loss: 10.546"
    *_run("Mixtral 8X7B", "v6e", 256, 4096, 12,
          RECIPES + "trillium/Mixtral-8x7B-MaxText/README.md",
          tflops_per_chip=302.311, tokens_per_s_per_chip=3645.203,
          note="token dropping, capacity factor 1.25"),
    # training/trillium/GPT3-175B-MaxText/bf16/README.md (--device_type=v6e-256,
    # gpt-3-175b-bf16: "per_device_batch_size": 3, no max_target_length, so MaxText's default
    # 2048): "completed step: 15, seconds: 17.182, TFLOP/s/device: 384.891, Tokens/s/device:
    # 357.580, total_weights: 1572864, loss: 388.622"   (17.182 x 357.580 = 6144 = 3 x 2048)
    *_run("GPT3-175B", "v6e", 256, 2048, 3,
          RECIPES + "trillium/GPT3-175B-MaxText/bf16/README.md",
          tflops_per_chip=384.891, tokens_per_s_per_chip=357.58),
    # training/trillium/GPT3-175B-MaxText/fp8/README.md (--device_type=v6e-256, MaxText
    # e7292a3a model gpt-3-175b: "per_device_batch_size": 3, "quantization": "int8"):
    # "step: 100, seconds: 14.245, TFLOP/s/device: 464.261, Tokens/s/device: 431.318,
    #  total_weights: 1572864, loss: 0.000"
    *_run("GPT3-175B", "v6e", 256, 2048, 3, RECIPES + "trillium/GPT3-175B-MaxText/fp8/README.md",
          precision="int8", tflops_per_chip=464.261, tokens_per_s_per_chip=431.318,
          note="the folder is named fp8 but the config it runs sets quantization int8"),

    # ---- TPU recipes, v5p ----
    # training/v5p/GPT3-175B-MaxText/README.md (first listed: TPU_TYPE=v5p-1024, script
    # MaxText/configs/v5p/gpt3_175b/v5p_1024.sh: per-device batch 4, quantization=int8):
    # "completed step: 2, seconds: 22.197, TFLOP/s/device: 397.246, Tokens/s/device: 369.059,
    #  total_weights: 4194304, loss: 0.000"   (22.197 x 369.059 = 8192 = 4 x 2048; 4194304 /
    #  8192 = 512 chips = v5p-1024)
    *_run("GPT3-175B", "v5p", 512, 2048, 4, RECIPES + "v5p/GPT3-175B-MaxText/README.md",
          precision="int8", tflops_per_chip=397.246, tokens_per_s_per_chip=369.059,
          note="int8 (AQT) matmuls: 397 TFLOP/s is 86.5% of the v5p bf16 peak"),
]


def runs(model: str | None = None, chip: str | None = None, metric: str | None = None
         ) -> list[PublishedRun]:
  """The records matching every filter given."""
  return [r for r in RUNS if (model is None or r.model == model)
          and (chip is None or r.chip == chip) and (metric is None or r.metric == metric)]


def metrics(model: str, chip: str, chips: int, per_chip_batch: int, precision: str = "bf16"
            ) -> dict[str, float]:
  """{metric: value} of the one published run of `model` on `chips` chips of `chip` at that
  per-chip batch and precision; {} where there is none."""
  return {r.metric: r.value for r in RUNS
          if (r.model, r.chip, r.chips, r.per_chip_batch, r.precision)
          == (model, chip, chips, per_chip_batch, precision)}


def table() -> str:
  """A Markdown table of every record."""
  lines = ["| model | our config | chip | chips | seq | batch/chip | metric | value | "
           "precision | source |", "|---" * 10 + "|"]
  for r in RUNS:
    value = f"{r.value:.2%}" if r.metric == "mfu" else f"{r.value:,.3f}".rstrip("0").rstrip(".")
    lines.append(f"| {r.model} | {CONFIGS[r.model][0]} | {r.chip} | {r.chips} | "
                 f"{r.seq_len or ''} | {r.per_chip_batch or ''} | {r.metric} | {value} | "
                 f"{r.precision} | {r.source} |")
  return "\n".join(lines)


if __name__ == "__main__":
  print(table())
