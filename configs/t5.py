"""T5 (Raffel et al., 2020): `--config=configs/t5.py:{small,base,large,v1_1_small,v1_1_base,
v1_1_large,tiny}` (default `tiny`, the CPU run).

Family 't5': pre-norm encoder-decoder with RMS norms, no biases, relative position bias
(32 buckets, max distance 128) shared by the layers of each stack, unscaled attention logits,
head dim d_kv = 64 at every published size, SentencePiece vocabulary 32128 (32000 + 100
sentinels + padding to a multiple of 128).
- v1.0 (`small`, `base`, `large`; the paper's Table 14 sizes): ReLU FFN, output head tied to
  the embedding with the decoder output scaled by d_model^-1/2.
- v1.1 (`v1_1_*`, the released "T5.1.1" checkpoints): gated-GELU FFN (smaller d_ff), untied
  lm_head, no output scaling; small has 8 layers of 6 heads, large d_ff 2816.
`reference.params` is Hugging Face `T5ForConditionalGeneration.num_parameters()` of the
published configuration (v1.1 with its untied lm_head), equal to
`scaling.count_params(...)['total']` (tests/unit/models/test_family_t5.py builds them on torch's meta
device).

Pre-training recipe (paper, Sec. 3.1.2 and 3.7): span corruption (15% noise, mean span 3) on
C4, inputs of 512 tokens (568 text tokens per example, targets 114), batch 128, 2^19 steps
(the scaled-up models 1M steps of batch 2048), Adafactor with an inverse-sqrt schedule 0.01
(peak) over 10^4 warmup steps, dropout 0.1 (v1.1: 0 in pre-training). jaxformer trains with
AdamW, so the optimiser is a stand-in ("rsqrt" schedule); the C4 source is the TFDS one
(`tfds:c4/en`) with a 32000-piece SentencePiece unigram model trained on it (pad 0, EOS 3)
and the 100 sentinels appended above it (32100 ids of the 32128).

`tiny`: span corruption on tiny Shakespeare (characters: 65 + pad + EOS + 8 sentinels = 75
ids), a 2+2-layer v1.1-style model (d_model 64, d_kv 16), a few minutes on a laptop CPU.
"""

from configs import common

# name: (layers per stack, d_model, heads, d_kv, d_ff, v1.1, HF num_parameters())
SIZES = {
    "small": (6, 512, 8, 64, 2048, False, 60_506_624),
    "base": (12, 768, 12, 64, 3072, False, 222_903_552),
    "large": (24, 1024, 16, 64, 4096, False, 737_668_096),
    "v1_1_small": (8, 512, 6, 64, 1024, True, 76_961_152),
    "v1_1_base": (12, 768, 12, 64, 2048, True, 247_577_856),
    "v1_1_large": (24, 1024, 16, 64, 2816, True, 783_150_080),
    "tiny": (2, 64, 4, 16, 128, True, None),
}
VOCAB = 32128
CPU_SENTINELS = 8


def variant(v1_1: bool) -> dict:
  """The model keys that differ between T5 v1.0 and v1.1."""
  if v1_1:
    return dict(ffn="swiglu", activation="gelu", tie_embeddings=False)
  return dict(ffn="mlp", activation="relu", tie_embeddings=True)


def get_config(arg=None):
  name, (layers, d_model, heads, d_kv, d_ff, v1_1, params) = common.select(
      "t5", arg, SIZES, default="tiny")
  cpu = name == "tiny"
  model = common.model(
      "t5", f"t5-{name}", vocab_size=65 + 2 + CPU_SENTINELS if cpu else VOCAB,
      d_model=d_model, num_encoder_layers=layers, num_decoder_layers=layers, num_heads=heads,
      head_dim=d_kv, mlp_dim=d_ff, relative_buckets=32, relative_max_distance=128,
      dropout_rate=0.0 if cpu or v1_1 else 0.1, attention_dropout_rate=0.0 if cpu or v1_1
      else 0.1, dtype="float32" if cpu else "bfloat16", **variant(v1_1))
  if cpu:
    return common.config(
        model=model,
        data=common.data("tinyshakespeare", "char", 128, noise_density=0.15,
                         mean_noise_span_length=3.0, num_sentinels=CPU_SENTINELS,
                         eval_batches=8),
        train=common.train(200, 32, eval_every=50, log_every=25, checkpoint_every=1000,
                           eval_batch_size=64),
        optim=common.optim(3e-3, schedule="cosine", warmup_steps=50, weight_decay=0.0,
                           clip=1.0, b2=0.99, min_lr_ratio=0.1))
  return common.config(
      model=model,
      data=common.data("tfds:c4/en", "spm:unigram:32000", 568, noise_density=0.15,
                       mean_noise_span_length=3.0, num_sentinels=100),
      train=common.train(2 ** 19, 128, eval_every=10_000, log_every=100,
                         checkpoint_every=10_000),
      optim=common.optim(1e-2, schedule="rsqrt", warmup_steps=10_000, weight_decay=0.0,
                         clip=1.0),
      reference=common.reference(params, source=f"Hugging Face T5ForConditionalGeneration "
                                 f"({'google/t5-v1_1-' + name[5:] if v1_1 else 't5-' + name})",
                                 params_key="total"))
