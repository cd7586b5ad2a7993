"""ELECTRA (Clark et al., 2020): a generator and a discriminator sharing their embeddings.

Both are BERT encoders (post-norm blocks of `BlockStack`, learned positions, token types,
exact GELU) over embeddings of their own width `embedding_size` (ELECTRA-Small: 128 under
hidden 256), projected to the encoder width by `embed_proj` where the two differ. One module,
three roles (`model.role`):

- "discriminator" (HF `ElectraForPreTraining`): dense + activation + dense to one logit per
  token -> [B, T] (> 0: the token was replaced).
- "generator" (HF `ElectraForMaskedLM`): dense to `embedding_size` + GELU + LayerNorm, then
  logits against the tied word embeddings plus a bias -> [B, T, vocab].
- "pretraining" (the default; what `configs/electra.py` trains with task "rtd"): both, the
  token / position / type embeddings and the embedding LayerNorm shared, each encoder with
  its own `embed_proj`; the generator is sized by `model.generator_*` (None: the
  discriminator's value). `__call__` is the discriminator (the model kept after
  pretraining); `pretrain` runs the generator on the masked tokens, samples replacements from
  its softmax with an explicit key (no gradient through the sample), and runs the
  discriminator on the corrupted tokens. `split_pretraining` gives either half as a
  single-role config + params (e.g. for `hf.save`), `role_config` its config alone.

In the single roles the model's own sizes (`d_model`, `num_layers`, `num_heads`, `mlp_dim`)
are that network's, as in a Hugging Face config.json. Parameter names: shared `embed`,
`pos_embed`, `type_embed`, `embed_norm`; the role's encoder `embed_proj` + `encoder` (the
discriminator's in "pretraining", whose generator encoder is `gen_embed_proj` +
`gen_encoder`); heads `disc_dense`, `disc_out` and `gen_dense`, `gen_norm`, `gen_bias`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.layers import Embed, LayerNorm, LearnedPositionEmbedding
from jaxformer.layers.dense import dense
from jaxformer.layers.mlp import activation_fn
from jaxformer.layers.parametrization import scale_output
from jaxformer.layers.block_settings import BlockSettings
from jaxformer.models.family import Family, token_inputs
from jaxformer.models.stack import BlockStack

ROLES = ("pretraining", "discriminator", "generator")
GENERATOR_FIELDS = ("generator_d_model", "generator_num_layers", "generator_num_heads",
                    "generator_mlp_dim")


class Electra(nn.Module):
  vocab_size: int
  d_model: int
  num_layers: int
  block: BlockSettings                 # post-norm, gelu_exact, dropout 0.1: see FAMILY
  embedding_size: int | None = None    # None: d_model (no embed_proj)
  role: str = "pretraining"            # "pretraining" | "discriminator" | "generator"
  generator_d_model: int | None = None     # role "pretraining" only; None: the discriminator's
  generator_num_layers: int | None = None
  generator_num_heads: int | None = None
  generator_mlp_dim: int | None = None
  disc_weight: float = 50.0            # λ of the pretraining loss MLM + λ * detection BCE
  max_len: int = 512
  type_vocab_size: int = 2
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @property
  def embed_dim(self) -> int:
    return self.embedding_size or self.d_model

  def generator_sizes(self) -> tuple[int, int, BlockSettings]:
    """(d_model, num_layers, block settings) of the generator."""
    if self.role == "generator":
      return self.d_model, self.num_layers, self.block
    block = dataclasses.replace(self.block,
                                num_heads=self.generator_num_heads or self.block.num_heads,
                                mlp_dim=self.generator_mlp_dim or self.block.mlp_dim)
    return (self.generator_d_model or self.d_model,
            self.generator_num_layers or self.num_layers, block)

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    e, eps = self.embed_dim, self.block.norm_eps
    self.dropout = nn.Dropout(self.block.dropout_rate)
    self.embed = Embed(self.vocab_size, e, name="embed", **kw)
    self.pos_embed = LearnedPositionEmbedding(self.max_len, e, name="pos_embed", **kw)
    self.type_embed = Embed(self.type_vocab_size, e, name="type_embed", **kw)
    self.embed_norm = LayerNorm(eps, name="embed_norm", **kw)
    if self.role != "generator":
      if e != self.d_model:
        self.embed_proj = dense(self.d_model, ("embed", "mlp"), use_bias=True,
                                name="embed_proj", **kw)
      self.encoder = BlockStack(self.num_layers, self.block, kw, name="encoder")
      self.disc_dense = dense(self.d_model, ("embed", "mlp"), use_bias=True, name="disc_dense",
                              **kw)
      self.disc_out = dense(1, ("embed", None), use_bias=True, name="disc_out", **kw)
    if self.role != "discriminator":
      width, layers, block = self.generator_sizes()
      own = "" if self.role == "generator" else "gen_"
      if e != width:
        self.gen_proj = dense(width, ("embed", "mlp"), use_bias=True, name=f"{own}embed_proj",
                              **kw)
      self.gen_encoder = BlockStack(layers, block, kw, name=f"{own}encoder")
      self.gen_dense = dense(e, ("embed", "mlp"), use_bias=True, name="gen_dense", **kw)
      self.gen_norm = LayerNorm(eps, name="gen_norm", **kw)
      self.gen_bias = self.param("gen_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("vocab",)), (self.vocab_size,), self.param_dtype)

  def embeddings(self, tokens, token_type_ids, deterministic):
    """The shared embeddings [B, T, embedding_size] (after LayerNorm and dropout)."""
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [batch, length]; got shape {tokens.shape}")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(tokens)
    x = (self.embed(tokens) + self.pos_embed(jnp.arange(tokens.shape[1])[None])
         + self.type_embed(token_type_ids))
    return self.dropout(self.embed_norm(x), deterministic=deterministic)

  @staticmethod
  def _mask(attention_mask):
    return None if attention_mask is None else attention_mask.astype(bool)[:, None, None, :]

  def encode(self, tokens, *, token_type_ids=None, attention_mask=None,
             deterministic: bool = True):
    """The discriminator's encoder output [B, T, d_model]: the model ELECTRA fine-tunes
    (and `evaluate`'s linear probe reads)."""
    x = self.embeddings(tokens, token_type_ids, deterministic)
    if self.embed_dim != self.d_model:
      x = self.embed_proj(x)
    return self.encoder(x, mask=self._mask(attention_mask), deterministic=deterministic)

  def discriminator(self, tokens, *, token_type_ids=None, attention_mask=None,
                    deterministic: bool = True):
    """Replaced-token logits [B, T] (float32)."""
    x = self.encode(tokens, token_type_ids=token_type_ids, attention_mask=attention_mask,
                    deterministic=deterministic)
    h = activation_fn(self.block.activation or "gelu_exact")(self.disc_dense(x))
    return scale_output(self.disc_out(h)[..., 0], self.block, self.d_model).astype(jnp.float32)

  def generator(self, tokens, *, token_type_ids=None, attention_mask=None,
                deterministic: bool = True):
    """Masked-LM logits [B, T, vocab] (float32)."""
    width, _, block = self.generator_sizes()
    x = self.embeddings(tokens, token_type_ids, deterministic)
    if self.embed_dim != width:
      x = self.gen_proj(x)
    x = self.gen_encoder(x, mask=self._mask(attention_mask), deterministic=deterministic)
    h = self.gen_norm(activation_fn("gelu_exact")(self.gen_dense(x)))   # HF: always GELU
    logits = scale_output(self.embed.attend(h), block, width) + self.gen_bias
    return logits.astype(jnp.float32)

  def __call__(self, tokens, *, token_type_ids=None, attention_mask=None,
               deterministic: bool = True):
    """tokens [B, T]; attention_mask [B, T] (1 = real token) -> the generator's MLM logits
    [B, T, vocab] (role "generator"), else the discriminator's logits [B, T]."""
    kw = dict(token_type_ids=token_type_ids, attention_mask=attention_mask,
              deterministic=deterministic)
    if self.role == "generator":
      return self.generator(tokens, **kw)
    if self.role == "pretraining" and self.is_initializing():
      self.generator(tokens, **kw)                  # create the generator's params too
    return self.discriminator(tokens, **kw)

  def pretrain(self, tokens, targets, selected, key, *, token_type_ids=None,
               attention_mask=None, deterministic: bool = True) -> dict:
    """One replaced-token-detection pass (role "pretraining").

    tokens [B, T]: the masked input of the generator; targets [B, T]: the original tokens;
    selected [B, T]: 1 at the positions the generator predicts; key: the PRNG key of the
    replacements, sampled from the generator's softmax without gradient. Returns
    {'mlm_logits' [B, T, vocab], 'rtd_logits' [B, T], 'corrupted' [B, T] (the
    discriminator's input: the sample at selected positions, the original elsewhere),
    'replaced' [B, T] bool (corrupted != original: a sample equal to the original counts
    as original, as in the paper)}.
    """
    if self.role != "pretraining":
      raise ValueError(f"model.role={self.role!r}: replaced-token detection trains "
                       "model.role='pretraining' (generator + discriminator)")
    kw = dict(token_type_ids=token_type_ids, attention_mask=attention_mask,
              deterministic=deterministic)
    mlm_logits = self.generator(tokens, **kw)
    sample = jax.random.categorical(key, jax.lax.stop_gradient(mlm_logits), axis=-1)
    corrupted = jnp.where(selected > 0, sample.astype(targets.dtype), targets)
    replaced = corrupted != targets
    rtd_logits = self.discriminator(corrupted, **kw)
    return {"mlm_logits": mlm_logits, "rtd_logits": rtd_logits, "corrupted": corrupted,
            "replaced": replaced}


_SHARED = ("embed", "pos_embed", "type_embed", "embed_norm")


def role_config(model_config, role: str) -> dict:
  """The single-role model config ('discriminator' or 'generator') of one half of a
  role='pretraining' config: the generator's sizes become its d_model, num_layers,
  num_heads and mlp_dim."""
  from jaxformer.models import registry
  cfg = registry.with_defaults(model_config)
  if cfg.get("family") != "electra" or cfg["role"] != "pretraining":
    raise ValueError("role_config takes a model.family='electra' config with "
                     f"model.role='pretraining'; got family={cfg.get('family')!r}, "
                     f"role={cfg.get('role')!r}")
  if role not in ("discriminator", "generator"):
    raise ValueError(f"role={role!r} must be 'discriminator' or 'generator'")
  off = dict.fromkeys(GENERATOR_FIELDS)
  if role == "discriminator":
    return dict(cfg, role=role, **off)
  sizes = {k: cfg[f] or cfg[k] for k, f in zip(("d_model", "num_layers", "num_heads",
                                                "mlp_dim"), GENERATOR_FIELDS)}
  return dict(cfg, role=role, **sizes, **off)


def split_pretraining(model_config, params) -> dict[str, tuple[dict, dict]]:
  """A role='pretraining' config + params -> {'discriminator': (config, params),
  'generator': (config, params)}, each a single-role model (both holding the shared
  embeddings), e.g. for `hf.save` as ElectraForPreTraining / ElectraForMaskedLM."""
  configs = {role: role_config(model_config, role) for role in ("discriminator", "generator")}
  params = nn.unbox(params)
  if set(params) == {"params"}:
    params = params["params"]
  disc = {k: v for k, v in params.items() if k in _SHARED or k in (
      "embed_proj", "encoder", "disc_dense", "disc_out")}
  generator = {k: v for k, v in params.items() if k in _SHARED or k in (
      "gen_dense", "gen_norm", "gen_bias")}
  for name in ("embed_proj", "encoder"):
    if f"gen_{name}" in params:
      generator[name] = params[f"gen_{name}"]
  return {"discriminator": (configs["discriminator"], disc),
          "generator": (configs["generator"], generator)}


def _attention_flops(cfg: dict, seq_len: int) -> tuple[int, int, int]:
  """Discriminator layers (and, pretraining, the generator's) at width heads * head_dim:
  the generator's attention term counts at the discriminator's width (an upper bound)."""
  width = cfg["num_heads"] * (cfg.get("head_dim") or cfg["d_model"] // cfg["num_heads"])
  layers = cfg["num_layers"]
  if cfg["role"] == "pretraining":
    layers += cfg["generator_num_layers"] or cfg["num_layers"]
  return layers, seq_len, width


def _validate(c: dict):
  role = c["role"]
  if role not in ROLES:
    raise ValueError(f"model.role={role!r} is not one of {ROLES}")
  given = [k for k in GENERATOR_FIELDS if c.get(k) is not None]
  if role != "pretraining" and given:
    raise ValueError(f"model.{given[0]}={c[given[0]]} sizes the generator of "
                     f"model.role='pretraining'; with model.role={role!r} the model's own "
                     "d_model/num_layers/num_heads/mlp_dim are its sizes: unset it")
  if role == "pretraining":
    heads = c["generator_num_heads"] or c["num_heads"]
    width = c["generator_d_model"] or c["d_model"]
    if c.get("head_dim") is None and width % heads:
      raise ValueError(f"model.generator_num_heads={heads} does not divide "
                       f"model.generator_d_model={width}")
    if c["parametrization"] != "standard":
      raise ValueError(f"model.parametrization={c['parametrization']!r} is not available for "
                       "model.role='pretraining': μP's one width multiplier cannot serve a "
                       "generator and a discriminator of different widths; use 'standard' "
                       "(μP works for role 'discriminator' or 'generator' alone)")
  if not isinstance(c["disc_weight"], (int, float)) or not c["disc_weight"] > 0:
    raise ValueError(f"model.disc_weight={c['disc_weight']!r} must be > 0 (the paper's λ: 50)")
  if c["num_experts"]:
    raise ValueError(f"model.num_experts={c['num_experts']}: ELECTRA's blocks are dense "
                     "(the pretraining objective has no MoE auxiliary losses); set it to 0")


FAMILY = Family(
    name="electra", module=Electra, task="rtd", example_inputs=token_inputs(1),
    embeddings=("embed", "pos_embed", "type_embed"),
    heads=("disc_dense", "disc_out", "gen_dense", "gen_norm", "gen_bias"),
    block_defaults=dict(pre_norm=False, qkv_bias=True, norm_eps=1e-12, activation="gelu_exact",
                        dropout_rate=0.1, attention_dropout_rate=0.1),
    embedding_lookups=1, attention_flops=_attention_flops, validate=_validate,
    hf_converter="jaxformer.convert.hf.electra")
