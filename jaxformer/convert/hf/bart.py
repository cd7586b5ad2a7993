"""family='bart' <-> BartForConditionalGeneration, BartModel.

transformers' models/bart/modeling_bart.py: `model.shared` is the one token embedding
(encoder, decoder and the tied `lm_head`); each stack has `embed_positions` of
max_position_embeddings + 2 rows (BART's offset of 2) and `layernorm_embedding`; post-LN layers
of torch Linears `self_attn.{q,k,v,out}_proj`, `encoder_attn.*` (decoder), `fc1`, `fc2`, with
norms `self_attn_layer_norm`, `encoder_attn_layer_norm`, `final_layer_norm` (our
`self_attention_norm`, `cross_attention_norm`, `ffn_norm`).

`final_logits_bias` is a buffer ([1, vocab], zeros in published checkpoints, not counted by
`num_parameters()`): a zero one loads as `logits_bias=False` (no parameter), any other as
`logits_bias=True` (a [vocab] parameter); saving writes zeros when there is none. A model
with `logits_bias=True` is saved with `"jaxformer_logits_bias": true` in config.json
(transformers keeps unknown keys), so it loads back with its parameter even while that is
still all zeros (as `init` makes it). Copies of
the shared embedding (`encoder/decoder.embed_tokens`, `lm_head`, in older checkpoints) must
equal it and are dropped. Token ids (pad 1, bos 0, eos 2, decoder start 2) do not change the
computation and are not model fields: saving writes BART's. `activation_dropout` (dropout on
the FFN's hidden units while training) has no jaxformer equivalent and is not read.
"""

from __future__ import annotations

import numpy as np

from jaxformer.convert.hf import core
from jaxformer.convert.hf.core import Rule

ARCHITECTURES = {"BartForConditionalGeneration": "bart", "BartModel": "bart"}
MODEL_TYPES = {"bart": "BartForConditionalGeneration"}
PREFIXES = {"bart": "model."}
# final_logits_bias sits outside `model.`; a name without the prefix was given it on reading.
RENAMES = ((r"^model\.final_logits_bias$", "final_logits_bias"),)
STACK = {"encoder": "num_encoder_layers", "decoder": "num_decoder_layers"}
KEEP = ("model.shared.weight",)
# Block settings BART has no option for (see core.FIXED).
FIXED = dict(num_kv_heads=None, head_dim=None, window=None, use_bias=True, qkv_bias=True,
             ffn="mlp", norm="layernorm", pre_norm=False, num_experts=0)
_LOGITS_BIAS_KEY = "jaxformer_logits_bias"      # config.json: final_logits_bias is a param
_COPIES = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
           "lm_head.weight")


def unused(name: str, tensors: dict, config: dict) -> str | None:
  if name in _COPIES:                  # tied copies of the shared embedding
    shared = tensors.get("model.shared.weight")
    ok = shared is not None and shared.shape == tensors[name].shape and np.array_equal(
        shared, tensors[name])
    return "" if ok else None
  return None


def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  e, f, v, h = c["d_model"], c["mlp_dim"], c["vocab_size"], c["num_heads"]
  rows = c["max_len"] + 2
  rules = [Rule("embed/embedding", (v, e), ("model.shared.weight",), **core.SAME),
           Rule("final_logits_bias", (v,), ("final_logits_bias",),
                to_ours=lambda s, b: b.reshape(s), to_hf=lambda k: (k.reshape(1, -1),),
                hf_has=flags["final_logits_bias"])]
  for stack in ("encoder", "decoder"):
    t = f"model.{stack}"
    rules.append(Rule(f"{stack}_pos_embed/embedding", (rows, e),
                      (f"{t}.embed_positions.weight",), **core.SAME))
    rules += core.norm_rules(f"{stack}_embed_norm", f"{t}.layernorm_embedding", e)
    sublayers = [("self_attention", "self_attn")]
    if stack == "decoder":
      sublayers.append(("cross_attention", "encoder_attn"))
    for i in range(c[f"num_{stack}_layers"]):
      p, l = f"{stack}/layers_{i}/block", f"{t}.layers.{i}"
      for ours, theirs in sublayers:
        if ours == "self_attention":
          rules += core.attention_rules(
              f"{p}/{ours}", tuple(f"{l}.{theirs}.{n}_proj" for n in ("q", "k", "v", "out")),
              e=e, h=h, hkv=h, d=e // h, qkv_bias=True, out_bias=True)
        else:
          rules += _cross_rules(f"{p}/{ours}", f"{l}.{theirs}", e, h)
        rules += core.norm_rules(f"{p}/{ours}_norm", f"{l}.{theirs}_layer_norm", e)
      rules += core.linear_rules(f"{p}/ffn/wi", f"{l}.fc1", e, f)
      rules += core.linear_rules(f"{p}/ffn/wo", f"{l}.fc2", f, e)
      rules += core.norm_rules(f"{p}/ffn_norm", f"{l}.final_layer_norm", e)
  return rules


def _cross_rules(p: str, t: str, e: int, h: int) -> list[Rule]:
  """Cross-attention: our MultiHeadAttention with a context has a query projection and a
  fused key/value one (`core.attention_rules` maps self-attention's fused qkv when the head
  counts are equal), then the output projection."""
  d, w, b = e // h, lambda n: f"{t}.{n}_proj.weight", lambda n: f"{t}.{n}_proj.bias"
  return [Rule(f"{p}/query/kernel", (e, h, d), (w("q"),), **core.HEADS_IN),
          Rule(f"{p}/query/bias", (h, d), (b("q"),), **core.HEADS_BIAS),
          Rule(f"{p}/kv/kernel", (e, 2, h, d), (w("k"), w("v")), **core.FUSED_IN),
          Rule(f"{p}/kv/bias", (2, h, d), (b("k"), b("v")), **core.FUSED_BIAS),
          Rule(f"{p}/out/kernel", (h, d, e), (w("out"),), **core.HEADS_OUT),
          Rule(f"{p}/out/bias", (e,), (b("out"),), **core.SAME)]


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  core.require_values(arch, hc, (("tie_word_embeddings", True), ("is_decoder", False),
                                 ("add_cross_attention", False)))
  for encoder_key, decoder_key, default in (
      ("encoder_attention_heads", "decoder_attention_heads", 16),
      ("encoder_ffn_dim", "decoder_ffn_dim", 4096)):       # transformers' defaults
    if hc.get(decoder_key, default) != hc.get(encoder_key, default):
      core.unsupported(arch, decoder_key, hc.get(decoder_key, default),
                       f" (jaxformer's BART has one num_heads and one mlp_dim for both stacks: "
                       f"it must equal {encoder_key}={hc.get(encoder_key, default)})")
  e, h = hc.get("d_model", 1024), hc.get("encoder_attention_heads", 16)
  if e % h:
    raise ValueError(f"{arch}: encoder_attention_heads={h} does not divide d_model={e}")
  bias = tensors.get("final_logits_bias")
  cfg = dict(vocab_size=hc.get("vocab_size", 50265), d_model=e,
             num_encoder_layers=hc.get("encoder_layers", 12),
             num_decoder_layers=hc.get("decoder_layers", 12), num_heads=h,
             mlp_dim=hc.get("encoder_ffn_dim", 4096),
             max_len=hc.get("max_position_embeddings", 1024),
             scale_embedding=bool(hc.get("scale_embedding", False)),
             logits_bias=bool(hc.get(_LOGITS_BIAS_KEY, False)) or (
                 bias is not None and bool(np.any(bias != 0))),
             activation=core.act_from_hf(hc.get("activation_function", "gelu"),
                                         "activation_function"),
             dropout_rate=float(hc.get("dropout", 0.1)),
             attention_dropout_rate=float(hc.get("attention_dropout", 0.0)))
  return cfg, dict(final_logits_bias=bias is not None)


def to_hf(c: dict) -> tuple[str, dict, dict]:
  hc = dict(architectures=["BartForConditionalGeneration"], model_type="bart",
            vocab_size=c["vocab_size"], d_model=c["d_model"],
            encoder_layers=c["num_encoder_layers"], decoder_layers=c["num_decoder_layers"],
            encoder_attention_heads=c["num_heads"], decoder_attention_heads=c["num_heads"],
            encoder_ffn_dim=c["mlp_dim"], decoder_ffn_dim=c["mlp_dim"],
            max_position_embeddings=c["max_len"], scale_embedding=c["scale_embedding"],
            activation_function=core.act_to_hf(c["activation"]),
            dropout=c["dropout_rate"], attention_dropout=c["attention_dropout_rate"],
            activation_dropout=0.0, init_std=0.02, encoder_layerdrop=0.0,
            decoder_layerdrop=0.0, is_encoder_decoder=True, tie_word_embeddings=True,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
            forced_eos_token_id=2, torch_dtype="float32", dtype="float32")
  if c["logits_bias"]:
    hc[_LOGITS_BIAS_KEY] = True
  return "BartForConditionalGeneration", hc, dict(final_logits_bias=True)
