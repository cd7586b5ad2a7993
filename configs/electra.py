"""ELECTRA (Clark et al., 2020) pretraining: `--config=configs/electra.py:{small,base,tiny}`.

A generator and a discriminator sharing the token / position / type embeddings and the
embedding LayerNorm (`model.role='pretraining'`), trained jointly by replaced-token detection
(task 'rtd', `jaxformer/train/rtd.py`): generator MLM loss + λ (`model.disc_weight`, 50) x the
discriminator's per-token sigmoid loss. Post-norm BERT blocks, exact GELU, LayerNorm eps
1e-12, learned positions (512), 2 token types, WordPiece vocab 30522 (uncased).

Sizes as released on Hugging Face (the config.json of google/electra-{small,base}-
{discriminator,generator}; the generator shares the discriminator's embedding size):

  name   discriminator (layers, hidden, heads, ffn)   generator (layers, hidden, heads, ffn)   embedding
  small  12, 256, 4, 1024                             12, 256, 4, 1024                          128
  base   12, 768, 12, 3072                            12, 256, 4, 1024                          768

(The paper's ELECTRA-Small trained a generator 1/4 of the discriminator's width; the released
small generator has the discriminator's width.) `reference` holds the exact Hugging Face
`num_parameters()` of ElectraForPreTraining (`discriminator_params`) and ElectraForMaskedLM
(`generator_params`, its LM head tied to the embeddings); `models.electra.role_config`
gives either half of the model config, and `reference.params` is the joint model (the
generator's copy of the shared embeddings counted once). Pretraining recipe from the paper's
Table 6: Adam, lr 5e-4 (small) / 2e-4 (base), weight decay 0.01, 10k warmup steps then
linear decay, batch 128 (small) / 256 (base), 1M / 766k steps, mask 15%, λ = 50, sequence
length 128 (small) / 512 (base).

`tiny`: a CPU run on the bundled tiny Shakespeare (characters; vocab 65 + [MASK] = 66,
64-character windows, batch 16, 1500 steps, lr 1e-3): a 2-layer discriminator of width 64 and
a 2-layer generator of width 32 over 32-wide embeddings; eval reports the detection accuracy
against the all-original baseline (`eval_accuracy`, `eval_disc_baseline`), recall and
precision on the replaced tokens, the detection loss next to the constant guess's
(`eval_disc_loss`, `eval_disc_prior_loss`) and the generator's MLM accuracy. Measured (2
shared CPU cores, ~4 min): generator MLM accuracy 0.147 -> 0.20, detection loss below the
prior's throughout (0.402 vs 0.411 at step 250, 0.399 vs 0.401 at 1500) with accuracy a hair
above the baseline (0.8597 vs 0.8564 at 250, 0.8625 vs 0.8623 at 1500) and replaced-token
recall 0.029 -> 0.002 at precision 0.75-1. That is all a context-free discriminator can do: the generator learns the
unigram distribution within ~200 steps, and a unigram-sampled replacement is exactly as likely
for every token, so only context (neighbouring characters) tells it; these tiny
absolute-position encoders do not learn to use context in this budget (the generator's ~0.2
accuracy is the context-free optimum under 80/10/10 masking, as for RoBERTa's tiny). The
wiring is checked: on uniform-random replacements the same discriminator alone beats the
baseline within 50 steps (0.88 vs 0.854); on a synthetic sequence where only the neighbours
tell (x_i = s + i mod 65) it reaches 0.94 vs 0.83 in 300 steps at 16 positions and is still
at the baseline after 300 at 64 (the learned-position plateau). lr 4e-3 (the first tiny
config) never left the baseline, not even while the generator was still below unigram.
"""

from configs import common

# name: discriminator (layers, hidden, heads, ffn), generator (layers, hidden, heads, ffn),
# embedding size, (HF ElectraForPreTraining, ElectraForMaskedLM, joint) parameter counts
SIZES = {
    "small": ((12, 256, 4, 1024), (12, 256, 4, 1024), 128,
              (13_549_057, 13_546_682, 23_122_875)),
    "base": ((12, 768, 12, 3072), (12, 256, 4, 1024), 768,
             (109_483_009, 33_740_602, 119_386_427)),
    "tiny": ((2, 64, 4, 256), (2, 32, 2, 128), 32, None),
}


def get_config(arg=None):
  name, (disc, gen, embedding, counts) = common.select("electra", arg, SIZES)
  tiny = name == "tiny"
  model = common.model(
      "electra", f"electra-{name}", vocab_size=66 if tiny else 30522, d_model=disc[1],
      num_layers=disc[0], num_heads=disc[2], mlp_dim=disc[3], embedding_size=embedding,
      role="pretraining", generator_num_layers=gen[0], generator_d_model=gen[1],
      generator_num_heads=gen[2], generator_mlp_dim=gen[3], disc_weight=50.0,
      max_len=64 if tiny else 512, type_vocab_size=2, norm_eps=1e-12,
      activation="gelu_exact", dropout_rate=0.0 if tiny else 0.1,
      attention_dropout_rate=0.0 if tiny else 0.1, dtype="float32" if tiny else "bfloat16")
  if tiny:
    return common.config(
        model=model,
        data=common.data("tinyshakespeare", "char", 64, mask_rate=0.15, eval_batches=10),
        train=common.train(1500, 16, eval_every=250, log_every=50, checkpoint_every=500),
        optim=common.optim(1e-3, schedule="linear", warmup_steps=50, weight_decay=0.01,
                           b2=0.999, min_lr_ratio=0.0))
  small = name == "small"
  return common.config(
      model=model,
      data=common.data("wikipedia", "bert-base-uncased", 128 if small else 512,
                       mask_rate=0.15),
      train=common.train(1_000_000 if small else 766_000, 128 if small else 256,
                         eval_every=10_000, log_every=100, checkpoint_every=10_000),
      optim=common.optim(5e-4 if small else 2e-4, schedule="linear", warmup_steps=10_000,
                         weight_decay=0.01, b2=0.999, eps=1e-6, min_lr_ratio=0.0),
      reference=common.reference(
          counts[2], source=f"Hugging Face google/electra-{name}-discriminator and "
          f"-generator (ElectraForPreTraining, ElectraForMaskedLM num_parameters())",
          params_key="total", discriminator_params=counts[0], generator_params=counts[1]))
