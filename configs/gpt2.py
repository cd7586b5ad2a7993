"""GPT-2 (Radford et al., 2019): `--config=configs/gpt2.py:{small,medium,large,xl,tiny}`.

Pre-norm decoder, learned positions (1024), LayerNorm eps 1e-5, tanh-approximate GELU (the
Mlp default, `activation=None`), biases everywhere, output head tied to the token embedding,
mlp_dim = 4 * d_model, vocab 50257. `reference.params` is the Hugging Face GPT2LMHeadModel
parameter count (tied head counted once). The optimizer follows the nanoGPT reproduction
(0.5M-token batches, lr 6e-4, cosine to 6e-5, AdamW b2 0.95, wd 0.1).

Data for the published sizes: TFDS `lm1b` (prepare it once with
`tfds build lm1b --file_format=array_record`), a 50257-piece SentencePiece BPE vocabulary
trained locally on it, documents packed into 1024-token rows with segment ids. Point
`--config.data.source=tfds:<name>` at any prepared TFDS text dataset (and `data.text_field`).

`tiny` is a character-level model of tiny Shakespeare (vocab 65) that trains on a laptop CPU.
"""

from configs import common

# name: (num_layers, d_model, num_heads, HF parameter count)
SIZES = {
    "small": (12, 768, 12, 124_439_808),
    "medium": (24, 1024, 16, 354_823_168),
    "large": (36, 1280, 20, 774_030_080),
    "xl": (48, 1600, 25, 1_557_611_200),
    "tiny": (2, 64, 4, None),
}


def get_config(arg=None):
  name, (num_layers, d_model, num_heads, params) = common.select("gpt2", arg, SIZES)
  tiny = name == "tiny"
  model = common.model(
      "decoder", f"gpt2-{name}", vocab_size=65 if tiny else 50257, d_model=d_model,
      num_layers=num_layers, num_heads=num_heads, mlp_dim=4 * d_model,
      max_len=256 if tiny else 1024, positions="learned", norm="layernorm", norm_eps=1e-5,
      ffn="mlp", activation=None, use_bias=True, tie_embeddings=True,
      dropout_rate=0.0 if tiny else 0.1, attention_dropout_rate=0.0 if tiny else 0.1,
      dtype="float32" if tiny else "bfloat16")
  if tiny:
    return common.config(
        model=model,
        data=common.data("tinyshakespeare", "char", 128),
        train=common.train(2000, 32, eval_every=200, log_every=20, checkpoint_every=500),
        optim=common.optim(1e-3, warmup_steps=100, b2=0.99))
  return common.config(
      model=model,
      data=common.data("tfds:lm1b", "spm:bpe:50257", 1024, text_field="text",
                       packing="packed", eval_batches=50),
      train=common.train(600_000, 512, eval_every=2000, log_every=50, checkpoint_every=5000),
      optim=common.optim(6e-4, warmup_steps=2000, weight_decay=0.1, b2=0.95),
      reference=common.reference(params, source="Hugging Face transformers GPT2LMHeadModel "
                                 f"('gpt2{'' if name == 'small' else '-' + name}')",
                                 params_key="total"))
