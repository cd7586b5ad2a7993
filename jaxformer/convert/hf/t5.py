"""family='t5' <-> T5ForConditionalGeneration (T5 v1.0 and v1.1).

transformers' models/t5/modeling_t5.py: `shared` is the token embedding of both stacks;
`{encoder,decoder}.block.{i}.layer.{j}` are the sub-layers (self-attention, then in the
decoder cross-attention `EncDecAttention`, then the FFN `DenseReluDense` with `wi`/`wo`, or
`wi_0` (gated, our `wi_gate`) / `wi_1` (our `wi_up`) / `wo` for gated activations), each with
its `layer_norm`; torch Linears without biases. The relative position table of each stack
lives in its block 0 (`...block.0.layer.0.SelfAttention.relative_attention_bias`) and is our
`{encoder,decoder}_relative_bias/embedding` [num_buckets, heads].

Heads: a config with `tie_word_embeddings` true (v1.0) scales the decoder output by
d_model^-1/2 and reads out with `shared` (our `tie_embeddings=True`); false (v1.1) reads out
with its own `lm_head` and no scaling (`tie_embeddings=False`). transformers 5 keeps the
saved value as `scale_decoder_outputs` and ties every embedding whose tensor the checkpoint
lacks or holds equal to `shared`; `lm_head.weight` differing from `shared` stays untied, so a
v1.1 checkpoint loads with its own head. A checkpoint without `lm_head.weight` under v1.1
settings reads out with `shared` unscaled, which our untied head reproduces with a copy.
"""

from __future__ import annotations

import numpy as np

from jaxformer.convert.hf import core
from jaxformer.convert.hf.core import Rule

ARCHITECTURES = {"T5ForConditionalGeneration": "t5"}
MODEL_TYPES = {"t5": "T5ForConditionalGeneration"}
PREFIXES = {"t5": ""}
RENAMES = ()
STACK = {"encoder": "num_encoder_layers", "decoder": "num_decoder_layers"}
KEEP = ("shared.weight",)
# Block settings T5 has no option for (see core.FIXED).
FIXED = dict(pre_norm=True, use_bias=False, qkv_bias=False, norm="rmsnorm", num_kv_heads=None,
             window=None, num_experts=0, attention_scale=1.0)
_TIED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _same_as_shared(name: str, tensors: dict) -> bool:
  shared = tensors.get("shared.weight")
  return (shared is not None and tensors[name].shape == shared.shape
          and np.array_equal(tensors[name], shared))


def unused(name: str, tensors: dict, config: dict) -> str | None:
  if name in _TIED_COPIES or name == "lm_head.weight":
    return "" if _same_as_shared(name, tensors) else None
  if name.endswith("EncDecAttention.relative_attention_bias.weight"):
    return ""                           # transformers ignores it too (cross-attention has none)
  return None


def _stack_rules(stack: str, c: dict, decoder: bool) -> list[Rule]:
  e, h, f = c["d_model"], c["num_heads"], c["mlp_dim"]
  d = c["head_dim"] or e // h
  layers = c["num_decoder_layers" if decoder else "num_encoder_layers"]
  gated = c["ffn"] == "swiglu"
  rules = [Rule(f"{stack}_relative_bias/embedding", (c["relative_buckets"], h),
                (f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",),
                **core.SAME)]
  for i in range(layers):
    p, t = f"{stack}/layers_{i}/block", f"{stack}.block.{i}.layer"
    a = f"{t}.0.SelfAttention"
    rules += core.attention_rules(f"{p}/self_attention", tuple(f"{a}.{n}" for n in "qkvo"),
                                  e=e, h=h, hkv=h, d=d, qkv_bias=False, out_bias=False)
    rules += core.norm_rules(f"{p}/self_attention_norm", f"{t}.0.layer_norm", e, hf_bias=False)
    j = 1
    if decoder:
      x = f"{t}.1.EncDecAttention"
      rules += [Rule(f"{p}/cross_attention/query/kernel", (e, h, d), (f"{x}.q.weight",),
                     **core.HEADS_IN),
                Rule(f"{p}/cross_attention/kv/kernel", (e, 2, h, d),
                     (f"{x}.k.weight", f"{x}.v.weight"), **core.FUSED_IN),
                Rule(f"{p}/cross_attention/out/kernel", (h, d, e), (f"{x}.o.weight",),
                     **core.HEADS_OUT)]
      rules += core.norm_rules(f"{p}/cross_attention_norm", f"{t}.1.layer_norm", e,
                               hf_bias=False)
      j = 2
    ff = f"{t}.{j}.DenseReluDense"
    names = (("wi_gate", "wi_0", e, f), ("wi_up", "wi_1", e, f)) if gated else (
        ("wi", "wi", e, f),)
    for ours, theirs, n_in, n_out in names + (("wo", "wo", f, e),):
      rules += core.linear_rules(f"{p}/ffn/{ours}", f"{ff}.{theirs}", n_in, n_out, bias=False)
    rules += core.norm_rules(f"{p}/ffn_norm", f"{t}.{j}.layer_norm", e, hf_bias=False)
  rules += core.norm_rules(f"{stack}_norm", f"{stack}.final_layer_norm", e, hf_bias=False)
  return rules


def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  e, v = c["d_model"], c["vocab_size"]
  rules = [Rule("embed/embedding", (v, e), ("shared.weight",), **core.SAME)]
  rules += _stack_rules("encoder", c, decoder=False)
  rules += _stack_rules("decoder", c, decoder=True)
  head = "lm_head.weight" if flags["lm_head"] else "shared.weight"
  rules.append(Rule("lm_head/kernel", (e, v), (head,), **core.LINEAR,
                    hf_has=not c["tie_embeddings"]))
  return rules


def _ffn_from_hf(arch: str, value) -> tuple[str, str]:
  """feed_forward_proj ('relu', 'gated-gelu', ...) -> (model.ffn, model.activation)."""
  parts = str(value).split("-")
  if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
    core.unsupported(arch, "feed_forward_proj", value)
  if len(parts) == 2:
    # transformers runs 'gated-gelu' with gelu_new (T5 v1.1), any other gated-X with X
    act = "gelu_new" if parts[1] == "gelu" else parts[1]
    return "swiglu", core.act_from_hf(act, "feed_forward_proj")
  return "mlp", core.act_from_hf(parts[0], "feed_forward_proj")


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  core.require_values(arch, hc, (("is_encoder_decoder", True),))
  e, h = hc.get("d_model", 512), hc.get("num_heads", 8)
  ffn, activation = _ffn_from_hf(arch, hc.get("feed_forward_proj", "relu"))
  scaled = hc.get("scale_decoder_outputs", hc.get("tie_word_embeddings", True))
  has_head = "lm_head.weight" in tensors
  if scaled and has_head and not _same_as_shared("lm_head.weight", tensors):
    core.unsupported(arch, "tie_word_embeddings", hc.get("tie_word_embeddings", True),
                     " with an lm_head.weight that differs from shared.weight: jaxformer's "
                     "T5 scales the decoder output by d_model^-1/2 only with the tied head "
                     "(v1.0) and reads out unscaled with its own lm_head (v1.1)")
  for name in _TIED_COPIES:
    if name in tensors and not _same_as_shared(name, tensors):
      core.unsupported(arch, name, "(differs from shared.weight)",
                       ": jaxformer's T5 has one token embedding for both stacks")
  layers = hc.get("num_layers", 6)
  cfg = dict(vocab_size=hc.get("vocab_size", 32128), d_model=e, num_encoder_layers=layers,
             num_decoder_layers=hc.get("num_decoder_layers") or layers, num_heads=h,
             head_dim=hc.get("d_kv", 64), mlp_dim=hc.get("d_ff", 2048),
             relative_buckets=hc.get("relative_attention_num_buckets", 32),
             relative_max_distance=hc.get("relative_attention_max_distance", 128),
             norm_eps=float(hc.get("layer_norm_epsilon", 1e-6)), ffn=ffn,
             activation=activation, tie_embeddings=bool(scaled),
             dropout_rate=float(hc.get("dropout_rate", 0.1)),
             attention_dropout_rate=float(hc.get("dropout_rate", 0.1)))
  return cfg, dict(lm_head=has_head and not scaled)


def _ffn_to_hf(c: dict) -> str:
  act = c.get("activation") or ("gelu" if c["ffn"] == "mlp" else "silu")
  if c["ffn"] == "mlp":
    return core.act_to_hf(act)
  if act == "gelu_exact":
    raise ValueError("model.ffn='swiglu' with model.activation='gelu_exact' has no T5 "
                     "equivalent: transformers runs feed_forward_proj='gated-gelu' with the "
                     "tanh approximation; use model.activation='gelu'")
  return "gated-" + {"gelu": "gelu"}.get(act, core.act_to_hf(act))


def to_hf(c: dict) -> tuple[str, dict, dict]:
  tie = bool(c["tie_embeddings"])
  hc = dict(architectures=["T5ForConditionalGeneration"], model_type="t5",
            vocab_size=c["vocab_size"], d_model=c["d_model"],
            d_kv=c["head_dim"] or c["d_model"] // c["num_heads"], d_ff=c["mlp_dim"],
            num_layers=c["num_encoder_layers"], num_decoder_layers=c["num_decoder_layers"],
            num_heads=c["num_heads"], relative_attention_num_buckets=c["relative_buckets"],
            relative_attention_max_distance=c["relative_max_distance"],
            dropout_rate=c["dropout_rate"], layer_norm_epsilon=c["norm_eps"],
            initializer_factor=1.0, feed_forward_proj=_ffn_to_hf(c), is_encoder_decoder=True,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=tie,
            torch_dtype="float32", dtype="float32")
  return "T5ForConditionalGeneration", hc, dict(lm_head=not tie)
