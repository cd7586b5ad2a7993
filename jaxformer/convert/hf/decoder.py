"""family='decoder' <-> GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM.

GPT-2 (transformers' models/gpt2/modeling_gpt2.py): Conv1D weights are already [in, out];
`c_attn` [E, 3E] reshapes straight to our fused qkv [E, 3, H, D]. Llama/Mistral/Mixtral
(models/{llama,mistral,mixtral}/modeling_*.py): torch Linear q/k/v/o, SwiGLU gate/up/down, and
Mixtral's experts w1 (gate), w3 (up), w2 (down) stacked into [X, ...]. q/k rows are not
permuted: HF checkpoints already use the rotate-half RoPE of `ops.positions.apply_rope`.
"""

from __future__ import annotations

import numpy as np

from jaxformer.convert.hf import core
from jaxformer.convert.hf.core import Rule

ARCHITECTURES = {"GPT2LMHeadModel": "gpt2", "LlamaForCausalLM": "llama",
                 "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral"}
MODEL_TYPES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
               "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM"}
PREFIXES = {"gpt2": "transformer.", "llama": "model.", "mistral": "model.", "mixtral": "model."}
RENAMES = ()
STACK = "decoder"
KEEP = ()
# Block settings no HF decoder architecture varies (see core.FIXED); the others are mapped.
FIXED = dict(pre_norm=True)

_GPT2_END_OF_TEXT = 50256
# GPT-2 Conv1D [E, 3*H*D] -> [E, 3, H, D]; c_proj [H*D, E] -> [H, D, E]
_CONV_QKV = dict(to_ours=lambda s, w: w.reshape(s), to_hf=lambda k: (k.reshape(k.shape[0], -1),))
_CONV_OUT = dict(to_ours=lambda s, w: w.reshape(s), to_hf=lambda k: (k.reshape(-1, k.shape[-1]),))
# X torch Linears [out, in] -> [X, in, out]
_EXPERTS = dict(to_ours=lambda s, *ws: np.stack([w.T for w in ws]),
                to_hf=lambda k: tuple(k[i].T for i in range(k.shape[0])))


def unused(name: str, tensors: dict, config: dict) -> str | None:
  if name == "lm_head.weight" and config.get("tie_embeddings"):
    return ""                           # tied: transformers uses the embedding, as we do
  return None


# ----------------------------------------------------------------------------------------
# Tensors
# ----------------------------------------------------------------------------------------

def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  return (_gpt2_rules if kind == "gpt2" else _llama_rules)(c, flags)


def _gpt2_rules(c: dict, flags: dict) -> list[Rule]:
  e, h, f, v = c["d_model"], c["num_heads"], c["mlp_dim"], c["vocab_size"]
  d = e // h
  rules = [Rule("embed/embedding", (v, e), ("transformer.wte.weight",), **core.SAME),
           Rule("pos_embed/embedding", (c["max_len"], e), ("transformer.wpe.weight",),
                **core.SAME)]
  for i in range(c["num_layers"]):
    p, t = f"decoder/layers_{i}/block", f"transformer.h.{i}"
    rules += core.norm_rules(f"{p}/self_attention_norm", f"{t}.ln_1", e)
    rules += [
        Rule(f"{p}/self_attention/qkv/kernel", (e, 3, h, d), (f"{t}.attn.c_attn.weight",),
             **_CONV_QKV),
        Rule(f"{p}/self_attention/qkv/bias", (3, h, d), (f"{t}.attn.c_attn.bias",),
             **core.HEADS_BIAS),
        Rule(f"{p}/self_attention/out/kernel", (h, d, e), (f"{t}.attn.c_proj.weight",),
             **_CONV_OUT),
        Rule(f"{p}/self_attention/out/bias", (e,), (f"{t}.attn.c_proj.bias",), **core.SAME)]
    rules += core.norm_rules(f"{p}/ffn_norm", f"{t}.ln_2", e)
    for ours, theirs, shape in (("wi", "c_fc", (e, f)), ("wo", "c_proj", (f, e))):
      rules += [Rule(f"{p}/ffn/{ours}/kernel", shape, (f"{t}.mlp.{theirs}.weight",),
                     **core.SAME),
                Rule(f"{p}/ffn/{ours}/bias", shape[1:], (f"{t}.mlp.{theirs}.bias",),
                     **core.SAME)]
  rules += core.norm_rules("final_norm", "transformer.ln_f", e)
  rules.append(Rule("lm_head/kernel", (e, v), ("lm_head.weight",), **core.LINEAR,
                    hf_has=not c["tie_embeddings"]))
  return rules


def _llama_rules(c: dict, flags: dict) -> list[Rule]:
  e, h, f, v = c["d_model"], c["num_heads"], c["mlp_dim"], c["vocab_size"]
  hkv, d, x = c["num_kv_heads"] or h, c["head_dim"] or e // h, c["num_experts"]
  rules = [Rule("embed/embedding", (v, e), ("model.embed_tokens.weight",), **core.SAME)]
  for i in range(c["num_layers"]):
    p, t = f"decoder/layers_{i}/block", f"model.layers.{i}"
    rules += core.norm_rules(f"{p}/self_attention_norm", f"{t}.input_layernorm", e,
                             hf_bias=False)
    rules += core.attention_rules(f"{p}/self_attention",
                                  tuple(f"{t}.self_attn.{n}_proj" for n in "qkvo"), e=e, h=h,
                                  hkv=hkv, d=d, qkv_bias=flags["attention_bias"],
                                  out_bias=flags["attention_bias"])
    rules += core.norm_rules(f"{p}/ffn_norm", f"{t}.post_attention_layernorm", e,
                             hf_bias=False)
    if x:
      m = f"{t}.block_sparse_moe"
      rules.append(Rule(f"{p}/ffn/router/kernel", (e, x), (f"{m}.gate.weight",),
                        **core.LINEAR))
      for ours, theirs, shape in (("wi_gate", "w1", (x, e, f)), ("wi_up", "w3", (x, e, f)),
                                  ("wo", "w2", (x, f, e))):
        rules.append(Rule(f"{p}/ffn/{ours}", shape,
                          tuple(f"{m}.experts.{j}.{theirs}.weight" for j in range(x)),
                          **_EXPERTS))
    else:
      for ours, theirs, (n_in, n_out) in (("wi_gate", "gate_proj", (e, f)),
                                          ("wi_up", "up_proj", (e, f)),
                                          ("wo", "down_proj", (f, e))):
        rules += core.linear_rules(f"{p}/ffn/{ours}", f"{t}.mlp.{theirs}", n_in, n_out,
                                   bias=flags["mlp_bias"])
  rules += core.norm_rules("final_norm", "model.norm", e, hf_bias=False)
  rules.append(Rule("lm_head/kernel", (e, v), ("lm_head.weight",), **core.LINEAR,
                    hf_has=not c["tie_embeddings"]))
  return rules


# ----------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------

def _rope_theta(arch: str, hc: dict, default: float) -> float:
  params = hc.get("rope_parameters")
  for key in ("rope_parameters", "rope_scaling"):
    p = hc.get(key)
    if p is None:
      continue
    if not isinstance(p, dict) or any(isinstance(val, dict) for val in p.values()):
      core.unsupported(arch, key, p, " (per-layer RoPE parameters)")
    kind = p.get("rope_type", p.get("type", "default"))
    if kind != "default":
      core.unsupported(arch, key, p, f": RoPE scaling {kind!r}; only plain RoPE "
                       "(rope_type='default') is implemented")
  factor = (params or {}).get("partial_rotary_factor", hc.get("partial_rotary_factor"))
  if factor not in (None, 1.0):
    core.unsupported(arch, "partial_rotary_factor", factor,
                     "; only full rotary embeddings are implemented")
  return float((params or {}).get("rope_theta", hc.get("rope_theta") or default))


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  if kind == "gpt2":
    core.require_values(arch, hc, (("scale_attn_weights", True),
                                   ("scale_attn_by_inverse_layer_idx", False),
                                   ("add_cross_attention", False)))
    e, h = core.width_and_heads(arch, hc, "n_embd", "n_head")
    cfg = dict(vocab_size=hc.get("vocab_size", 50257), d_model=e,
               num_layers=hc.get("n_layer", 12), num_heads=h, num_kv_heads=h, head_dim=None,
               mlp_dim=hc.get("n_inner") or 4 * e, max_len=hc.get("n_positions", 1024),
               positions="learned", rope_theta=10_000.0, norm="layernorm",
               norm_eps=float(hc.get("layer_norm_epsilon", 1e-5)), ffn="mlp",
               activation=core.act_from_hf(hc.get("activation_function", "gelu_new"),
                                           "activation_function"),
               use_bias=True, qkv_bias=True,
               tie_embeddings=bool(hc.get("tie_word_embeddings", True)), window=None,
               num_experts=0, experts_per_token=2,
               dropout_rate=float(hc.get("resid_pdrop", 0.1)),
               attention_dropout_rate=float(hc.get("attn_pdrop", 0.1)))
    return cfg, {}
  defaults = {"llama": dict(intermediate_size=11008, max_position_embeddings=2048,
                            rms_norm_eps=1e-6, rope_theta=10_000.0, sliding_window=None),
              "mistral": dict(intermediate_size=14336, max_position_embeddings=131072,
                              rms_norm_eps=1e-6, rope_theta=10_000.0, sliding_window=4096,
                              num_key_value_heads=8),
              "mixtral": dict(intermediate_size=14336, max_position_embeddings=131072,
                              rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None,
                              num_key_value_heads=8)}[kind]
  get = lambda key, default=None: hc.get(key, defaults.get(key, default))
  e, h = get("hidden_size", 4096), get("num_attention_heads", 32)
  hkv = get("num_key_value_heads") or h
  d = hc.get("head_dim") or e // h
  if not hc.get("head_dim") and e % h:
    raise ValueError(f"{arch}: num_attention_heads={h} does not divide hidden_size={e} "
                     "and config.json has no head_dim")
  window = None
  if kind != "llama":                # LlamaForCausalLM ignores sliding_window
    sw = get("sliding_window")
    if sw is not None:
      if not isinstance(sw, int) or sw < 1:
        core.unsupported(arch, "sliding_window", sw)
      window = sw - 1                # HF: key j visible from i iff i - sliding_window < j <= i
  attention_bias = bool(hc.get("attention_bias", False))
  mlp_bias = bool(hc.get("mlp_bias", False))
  if kind != "llama":
    for key in ("attention_bias", "mlp_bias"):
      if hc.get(key):
        core.unsupported(arch, key, hc[key])
  num_experts = hc.get("num_local_experts", 8) if kind == "mixtral" else 0
  cfg = dict(vocab_size=get("vocab_size", 32000), d_model=e,
             num_layers=get("num_hidden_layers", 32), num_heads=h, num_kv_heads=hkv,
             head_dim=None if (e % h == 0 and d == e // h) else d,
             mlp_dim=get("intermediate_size"), max_len=get("max_position_embeddings"),
             positions="rope", rope_theta=_rope_theta(arch, hc, defaults["rope_theta"]),
             norm="rmsnorm", norm_eps=float(get("rms_norm_eps")), ffn="swiglu",
             activation=core.act_from_hf(get("hidden_act", "silu"), "hidden_act"),
             use_bias=attention_bias or mlp_bias, qkv_bias=attention_bias,
             tie_embeddings=bool(hc.get("tie_word_embeddings", False)), window=window,
             num_experts=num_experts,
             experts_per_token=hc.get("num_experts_per_tok", 2) if num_experts else 2,
             dropout_rate=0.0, attention_dropout_rate=float(get("attention_dropout", 0.0)))
  return cfg, dict(attention_bias=attention_bias, mlp_bias=mlp_bias)


def to_hf(c: dict) -> tuple[str, dict, dict]:
  if c.get("num_experts") and (c.get("moe_dispatch", "dropless") != "dropless"
                               or not c.get("moe_renormalize", True)
                               or not c.get("moe_gated", True)):
    raise ValueError("hf.save writes Mixtral checkpoints, whose routing is dropless top-k "
                     "with renormalised gates and SwiGLU experts; this model has "
                     f"moe_dispatch={c.get('moe_dispatch')!r}, moe_renormalize="
                     f"{c.get('moe_renormalize')}, moe_gated={c.get('moe_gated')}")
  e, h = c["d_model"], c["num_heads"]
  hkv, d = c.get("num_kv_heads") or h, c.get("head_dim") or e // h
  use_bias = c.get("use_bias", True)
  qkv_bias = use_bias if c.get("qkv_bias") is None else c["qkv_bias"]
  tie = c.get("tie_embeddings", True)
  positions, norm = c.get("positions", "learned"), c.get("norm", "layernorm")
  ffn, experts = c.get("ffn", "mlp"), c.get("num_experts", 0)
  window = c.get("window")
  base = dict(vocab_size=c["vocab_size"], tie_word_embeddings=tie, torch_dtype="float32",
              dtype="float32")
  if positions == "learned" and norm == "layernorm":
    why = ("GPT2LMHeadModel (positions='learned', norm='layernorm') has no "
           "{}; got model.{}={!r}")
    for key, ok in (("num_kv_heads", hkv == h), ("head_dim", d * h == e),
                    ("window", window is None), ("num_experts", not experts),
                    ("ffn", ffn == "mlp")):
      if not ok:
        raise ValueError(why.format({"num_kv_heads": "grouped-query attention",
                                     "head_dim": "head_dim != d_model / num_heads",
                                     "window": "sliding window", "num_experts": "experts",
                                     "ffn": "gated FFN"}[key], key, c.get(key)))
    hc = dict(base, architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=e, n_head=h,
              n_layer=c["num_layers"], n_inner=c["mlp_dim"], n_positions=c.get("max_len", 1024),
              activation_function=core.act_to_hf(c.get("activation") or "gelu"),
              layer_norm_epsilon=c.get("norm_eps", 1e-5),
              resid_pdrop=c.get("dropout_rate", 0.0), embd_pdrop=c.get("dropout_rate", 0.0),
              attn_pdrop=c.get("attention_dropout_rate", 0.0))
    # GPT2Config's bos/eos default to 50256 (<|endoftext|>), an id only a GPT-2 vocabulary has
    end = _GPT2_END_OF_TEXT if c["vocab_size"] > _GPT2_END_OF_TEXT else None
    hc.update(bos_token_id=end, eos_token_id=end)
    return "GPT2LMHeadModel", hc, {}
  if positions == "rope" and norm == "rmsnorm" and (ffn == "swiglu" or experts):
    sliding_window = None
    if window is not None:
      left, right = (window, 0) if isinstance(window, int) else tuple(window)
      if right != 0 or left is None:
        raise ValueError(f"model.window={window!r}: Hugging Face sliding windows are causal "
                         "(left, 0) windows with a finite left")
      sliding_window = left + 1
    arch = ("MixtralForCausalLM" if experts else "MistralForCausalLM" if window is not None
            else "LlamaForCausalLM")
    theta = float(c.get("rope_theta", 10_000.0))
    hc = dict(base, architectures=[arch], model_type=arch[:-len("ForCausalLM")].lower(),
              hidden_size=e, intermediate_size=c["mlp_dim"],
              num_hidden_layers=c["num_layers"], num_attention_heads=h,
              num_key_value_heads=hkv, head_dim=d,
              hidden_act=core.act_to_hf(c.get("activation") or "silu"),
              max_position_embeddings=c.get("max_len", 1024),
              rms_norm_eps=c.get("norm_eps", 1e-5), rope_theta=theta,
              rope_parameters={"rope_type": "default", "rope_theta": theta},
              attention_dropout=c.get("attention_dropout_rate", 0.0))
    flags = dict(attention_bias=False, mlp_bias=False)
    if arch == "LlamaForCausalLM":
      flags = dict(attention_bias=bool(qkv_bias or use_bias), mlp_bias=bool(use_bias))
      hc.update(flags)
    else:
      hc["sliding_window"] = sliding_window
    if experts:
      hc.update(num_local_experts=experts, num_experts_per_tok=c.get("experts_per_token", 2))
    return arch, hc, flags
  raise ValueError(
      f"a decoder with model.positions={positions!r}, model.norm={norm!r}, model.ffn={ffn!r} "
      "has no Hugging Face equivalent: GPT-2 needs positions='learned', norm='layernorm', "
      "ffn='mlp'; Llama/Mistral/Mixtral need positions='rope', norm='rmsnorm', ffn='swiglu' "
      "(or num_experts > 0)")
