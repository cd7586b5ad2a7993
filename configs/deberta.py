"""DeBERTa-v3 (He et al., 2021/2023; v2/v3 layout): `--config=configs/deberta.py:{v3_small,v3_base,tiny}`.

Post-norm encoder with disentangled attention (content-to-content, content-to-position,
position-to-content) over 256 log buckets of relative position (max 512), one relative table
shared by all layers with its LayerNorm, positions projected with each layer's own query/key
projections; no absolute position embeddings and no token types; LayerNorm eps 1e-7, exact
GELU; SentencePiece vocabulary 128100. The MLM head is Hugging Face's DebertaV2ForMaskedLM
(dense + GELU + LayerNorm + tied decoder + bias), fed by the paper's enhanced mask decoder
(`model.emd_layers=2`: the last layer run twice more on absolute positions + the
second-to-last layer's output, as the reference's masked-LM pre-training does; see
jaxformer/models/deberta.py). `reference.hf_params` is the Hugging Face DebertaV2ForMaskedLM
`num_parameters()` of the same configuration (tied decoder counted once), which has no
decoder; `reference.params` adds the decoder's one new parameter, its 512 x 768 absolute
position table (set model.emd_layers=0 for the Hugging Face model itself, e.g. to export);
`reference.backbone` is DebertaV2Model's (the paper's "86M backbone + 98M embedding" for base).

The released v3 models were pre-trained with ELECTRA-style replaced-token detection, which
this family does not implement; the optim/train sections are a masked-LM recipe in the style
of DeBERTa v1/v2 (AdamW with linear decay after 10k warmup steps, weight decay 0.01, dropout
0.1, 15% masking, batch 2048 x 512), a starting point rather than a published schedule.

`tiny`: character-level MLM on the bundled tiny Shakespeare ([MASK] appended: vocab 66),
64-character windows, 16 log buckets over 64 positions, 2 layers of width 64, with the
enhanced mask decoder (its 2 passes double the layer work of this 2-layer model); 600 steps
train on a laptop CPU in a few minutes. Measured on a shared 2-core CPU: eval loss 1.780,
masked-token accuracy 0.507 at step 600 (emd_layers=0: 1.777, 0.498; the decoder starts
slower, 0.24 vs 0.31 at step 100, and has caught up by step 300).
"""

from configs import common

# name: (num_layers, d_model, num_heads, mlp_dim, HF DebertaV2ForMaskedLM, HF DebertaV2Model)
SIZES = {
    "v3_small": (6, 768, 12, 3072, 142_024_548, 141_304_320),
    "v3_base": (12, 768, 12, 3072, 184_551_780, 183_831_552),
    "tiny": (2, 64, 4, 256, None, None),
}


def get_config(arg=None):
  name, (num_layers, d_model, num_heads, mlp_dim, params, backbone) = common.select(
      "deberta", arg, SIZES)
  tiny = name == "tiny"
  label = f"deberta-{name.replace('_', '-')}"
  model = common.model(
      "deberta", label, vocab_size=66 if tiny else 128100, d_model=d_model,
      num_layers=num_layers, num_heads=num_heads, mlp_dim=mlp_dim,
      max_len=64 if tiny else 512, type_vocab_size=None, position_biased_input=False,
      position_buckets=16 if tiny else 256, max_relative_positions=None, rel_embed_norm=True,
      emd_layers=2,
      norm_eps=1e-7, activation="gelu_exact", dropout_rate=0.0 if tiny else 0.1,
      attention_dropout_rate=0.0 if tiny else 0.1, dtype="float32" if tiny else "bfloat16")
  if tiny:
    return common.config(
        model=model,
        data=common.data("tinyshakespeare", "char", 64, mask_rate=0.15, eval_batches=10),
        train=common.train(600, 16, eval_every=100, log_every=20, checkpoint_every=300),
        optim=common.optim(2e-3, warmup_steps=50, b2=0.99, weight_decay=0.01,
                           min_lr_ratio=0.1))
  return common.config(
      model=model,
      data=common.data("wikipedia", "microsoft/deberta-v3-base", 512, mask_rate=0.15),
      train=common.train(1_000_000, 2048, eval_every=10_000, log_every=100,
                         checkpoint_every=10_000),
      optim=common.optim(1e-4, schedule="linear", warmup_steps=10_000, weight_decay=0.01,
                         b2=0.999, eps=1e-6, min_lr_ratio=0.0),
      reference=common.reference(params + 512 * d_model, source=(
          f"Hugging Face DebertaV2ForMaskedLM (microsoft/deberta-{name.replace('_', '-')} "
          "config) + the enhanced mask decoder's 512 x d_model position table"),
                                 params_key="total", hf_params=params, backbone=backbone))
