"""The settings of one Transformer block, as one typed, validated, hashable object.

Every Transformer model (decoder, BERT, encoder-decoder, ViT) builds its layers from a
`BlockSettings`; `models.build` makes it from the flat `model.*` config keys (`num_heads`,
`ffn`, `moe_dispatch`, ...) once, with the family's defaults, and it travels whole through
`BlockStack` -> `TransformerBlock` -> `MultiHeadAttention` / FFN / `MoE`. So a block option is
declared once (here), validated once (`__post_init__`, messages name the `model.*` key) and
reaches every model. What is wiring rather than a setting (causal or not, cross-attention,
rotary/ALiBi positions, decoding, dtypes) is passed by the model that owns the wiring.

Frozen dataclasses: linen module fields must hash (and scanned stacks compare them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxformer.layers.mlp import ACTIVATIONS, FFNS
from jaxformer.layers.norms import NORMS
from jaxformer.layers.parametrization import PARAMETRIZATIONS
from jaxformer.ops import masks
from jaxformer.ops.attention import IMPLS, check_block_sizes
from jaxformer.ops.attention_variants import VARIANTS

# Activations the layers tag with `jax.ad_checkpoint.checkpoint_name`, for the named policies
# below (a tag outside a rematerialised stack does nothing):
#   query_proj, key_proj, value_proj   attention's q / k / v projections (before RoPE)
#   attention_context                  attention's output, before its out projection
#   attention_out                      attention's out projection
#   mlp_in                             the FFN's input projections (both halves when gated)
#   mlp_out                            the FFN's output projection (kept where the backward
#                                      needs it: a post-norm block's, not a pre-norm one's)
#   layer_input                        a block's input (models/stack.py)
ACTIVATION_NAMES = ("query_proj", "key_proj", "value_proj", "attention_context",
                    "attention_out", "mlp_in", "mlp_out", "layer_input")
_QKV = ("query_proj", "key_proj", "value_proj")
_ATTENTION = _QKV + ("attention_context", "attention_out")
_PROJECTIONS = _ATTENTION + ("mlp_in", "mlp_out")


def _saved(names):
  return jax.checkpoint_policies.save_only_these_names(*names)


def _offloaded(names):
  """Keep `names` in host memory (pinned_host) between the forward and the backward pass,
  recompute everything else: device memory of `full`, less recompute, plus host transfers."""
  return jax.checkpoint_policies.save_and_offload_only_these_names(
      names_which_can_be_saved=[], names_which_can_be_offloaded=list(names),
      offload_src="device", offload_dst="pinned_host")


@dataclasses.dataclass(frozen=True)
class RematPolicy:
  """What a block keeps for its backward pass, with the two figures the planner's search
  orders candidates by before it compiles any (`plan.search`; never reported as results).

  checkpoint: the `jax.checkpoint` policy (None: no rematerialisation).
  saved: activation memory per token and layer in 16-bit words, after Korthikanti et al.
    ("Reducing activation recomputation", sec. 4: d (10 + 24 / t) + 5 a s / t with tensor
    parallelism t; its 10 d of norms, residuals and dropout masks are not split by t) as
    (x d kept whole, x d split over t, x heads x seq split over t): `none`
    keeps all of it; `dots` the matmul outputs, attention's float32 scores included;
    `dots_no_batch` the projections only; `full` each layer's input; q/k/v ~3 d (fewer with
    GQA), attention's output and out projection 2 d, the FFN's in and out ~8 d; an offloaded
    set keeps nothing in device memory.
  recompute: training FLOPs relative to no rematerialisation (`full` runs the forward twice:
    4 / 3)."""
  checkpoint: Any
  saved: tuple[int, int, int]
  recompute: float


# `model.remat_policy`: what each block keeps for the backward pass (the rest is recomputed).
REMAT_POLICIES = {
    "none": RematPolicy(None, (10, 24, 5), 1.0),          # no rematerialisation
    "full": RematPolicy(jax.checkpoint_policies.nothing_saveable, (2, 0, 0), 4 / 3),
    "dots": RematPolicy(jax.checkpoint_policies.checkpoint_dots, (2, 12, 4), 1.1),
    "dots_no_batch": RematPolicy(jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
                                 (2, 12, 0), 1.15),
    "save_qkv": RematPolicy(_saved(_QKV), (2, 3, 0), 1.25),     # keep q/k/v projections
    # + attention's output and out projection
    "save_attention": RematPolicy(_saved(_ATTENTION), (2, 5, 0), 1.2),
    # + the FFN's in/out projections: every matmul output but attention's own
    "save_projections": RematPolicy(_saved(_PROJECTIONS), (2, 13, 0), 1.05),
    # the same three sets, kept in host memory
    "offload_qkv": RematPolicy(_offloaded(_QKV), (2, 0, 0), 1.25),
    "offload_attention": RematPolicy(_offloaded(_ATTENTION), (2, 0, 0), 1.2),
    "offload_projections": RematPolicy(_offloaded(_PROJECTIONS), (2, 0, 0), 1.05),
    # `full` with each block's input in host memory
    "offload_layer_input": RematPolicy(_offloaded(("layer_input",)), (0, 0, 0), 4 / 3),
    # each block's input and q/k/v (+ the out projection) in host memory, the rest
    # recomputed: MaxText's published Llama-3.1 70B (and 8B, Mixtral) recipes on v6e
    # ("custom" with decoder_layer_input, query/key/value_proj (, out_proj) offloaded)
    "offload_layer_input_qkv": RematPolicy(_offloaded(("layer_input",) + _QKV), (0, 0, 0),
                                           1.25),
    "offload_layer_input_qkv_out": RematPolicy(
        _offloaded(("layer_input",) + _QKV + ("attention_out",)), (0, 0, 0), 1.2),
}
# The policies that move activations to host memory: refused where the devices have none
# (`jaxformer.parallel.offload.check`).
OFFLOADED_REMAT_POLICIES = frozenset(k for k in REMAT_POLICIES if k.startswith("offload_"))
DISPATCHES = ("dropless", "capacity")
GROUPED_MATMULS = ("auto", "ragged", "megablox", "blocked")


def _fail(message: str):
  raise ValueError(message)


def check_positive_int(value, key: str, *, optional: bool = False, zero: str | None = None):
  """A ValueError naming `model.<key>` unless value is an int > 0 (or None if optional; or 0
  where `zero` says what 0 means, e.g. 'off')."""
  if optional and value is None:
    return
  if zero is not None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      _fail(f"model.{key}={value!r} must be an int >= 0 (0: {zero})")
    return
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    _fail(f"model.{key}={value!r} must be an int > 0" + (" (or None for the default)"
                                                         if optional else ""))


def _choice(value, key: str, allowed):
  if value not in allowed:
    _fail(f"model.{key}={value!r} is not one of {sorted(allowed)}")


def _rate(value, key: str):
  if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
    _fail(f"model.{key}={value} must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class MoESettings:
  """A mixture-of-experts FFN (see layers/moe.py). Config keys: `model.num_experts`,
  `model.experts_per_token` and `model.moe_<field>` for the others."""
  num_experts: int
  experts_per_token: int = 2
  dispatch: str = "dropless"          # "dropless" (Mixtral) | "capacity" (GShard/Switch)
  capacity_factor: float = 1.25       # capacity dispatch: expert slots = ceil(cf * T * k / E)
  router_jitter: float = 0.0          # training noise on the router input (Switch: 0.01)
  renormalize: bool = True            # top-k gates sum to 1 (Mixtral); False: Switch
  gated: bool = True                  # SwiGLU-style experts; False: act(x W_in) W_out
  grouped_matmul: str = "auto"        # dropless: "ragged" | "megablox" | "blocked" | "auto"
                                      # (megablox on TPU, ragged on GPU, blocked on CPU)
  load_balance_weight: float = 0.01   # aux-loss weights of the training objective
  z_loss_weight: float = 0.001

  def __post_init__(self):
    check_positive_int(self.num_experts, "num_experts")
    if not 0 < self.experts_per_token <= self.num_experts:
      _fail(f"model.experts_per_token={self.experts_per_token} must be in "
            f"[1, model.num_experts={self.num_experts}]: lower the top-k or add experts")
    _choice(self.dispatch, "moe_dispatch", DISPATCHES)
    _choice(self.grouped_matmul, "moe_grouped_matmul", GROUPED_MATMULS)
    if not self.capacity_factor > 0:
      _fail(f"model.moe_capacity_factor={self.capacity_factor} must be > 0 (1.0-2.0 is usual; "
            "dropless dispatch ignores it)")
    if not 0 <= self.router_jitter < 1:
      _fail(f"model.moe_router_jitter={self.router_jitter} must be in [0, 1) (Switch uses "
            "0.01; 0 turns it off)")
    if self.load_balance_weight < 0:
      _fail(f"model.moe_load_balance_weight={self.load_balance_weight} must be >= 0")
    if self.z_loss_weight < 0:
      _fail(f"model.moe_z_loss_weight={self.z_loss_weight} must be >= 0")


@dataclasses.dataclass(frozen=True)
class BlockSettings:
  """Attention, FFN (or MoE) and norm settings shared by every block of a model, and how the
  stack of blocks runs (scanned, rematerialised)."""
  num_heads: int
  mlp_dim: int
  num_kv_heads: int | None = None     # None: num_heads (MHA); 1: multi-query
  head_dim: int | None = None         # None: d_model // num_heads
  attention_impl: str = "auto"        # see ops.attention
  attention_block_sizes: tuple[int, int] | None = None   # (block_q, block_k): pallas/blocked
  # sliding window (Mistral): keys to the left, or a (left, right) pair; typed int here so a
  # config placeholder parses `--config.model.window=4096`
  window: int | None = None
  use_bias: bool = True               # attention output, FFN and norm biases
  qkv_bias: bool | None = None        # None: same as use_bias
  dropout_rate: float = 0.0           # residual (and embedding) dropout
  attention_dropout_rate: float = 0.0
  ffn: str = "mlp"                    # "mlp" | "swiglu"; replaced by experts when moe is set
  activation: str | None = None       # None: the FFN's default (gelu for mlp, silu for swiglu)
  norm: str = "layernorm"             # "layernorm" | "rmsnorm"
  norm_eps: float = 1e-5
  pre_norm: bool = True               # False: post-norm (Vaswani, BERT)
  moe: MoESettings | None = None
  scan_layers: bool = False           # nn.scan over layers: one compiled body (models/stack.py)
  remat_policy: str = "none"          # a key of REMAT_POLICIES
  # "standard" | "mup" (layers/parametrization.py): how init, LRs and multipliers follow width
  parametrization: str = "standard"
  mup_base_width: int | None = None   # μP: the d_model whose tuned hyperparameters transfer
  # a fixed attention logit multiplier (T5: 1.0, no 1/sqrt(d_head)); None: 1/sqrt(d_head)
  # (μP: its width rule). When set, the query projection's init is multiplied by
  # 1/(sqrt(d_head) * attention_scale), so the logits start as with the default scale.
  attention_scale: float | None = None
  # a learned scalar per head and layer multiplying that head's q.k logits (not additive
  # biases: ALiBi, T5's relative bias), initialised to 1 so the model starts exactly as
  # without gates; read, folded and pruned by models/heads.py
  head_gates: bool = False
  # what self-attention computes (ops/attention_variants.py): "softmax" over the sequence (with
  # `window`: sliding-window), "linear" (causal linear attention, phi = elu + 1, the same
  # parameters as softmax), "routing_cache" (softmax over `routing_slots` learned key/value
  # slots instead of the sequence: no information from other tokens), "routing_prefix" (softmax
  # over `routing_slots` slots written from the prefix by learned write queries). Cross-
  # attention stays softmax.
  attention_variant: str = "softmax"
  routing_slots: int = 16             # M: the slots of the routing variants

  def __post_init__(self):
    check_positive_int(self.num_heads, "num_heads")
    check_positive_int(self.mlp_dim, "mlp_dim")
    check_positive_int(self.num_kv_heads, "num_kv_heads", optional=True)
    check_positive_int(self.head_dim, "head_dim", optional=True)
    if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
      _fail(f"model.num_kv_heads={self.num_kv_heads} must divide model.num_heads="
            f"{self.num_heads}")
    _choice(self.attention_impl, "attention_impl", IMPLS)
    _choice(self.ffn, "ffn", FFNS)
    _choice(self.norm, "norm", NORMS)
    _choice(self.remat_policy, "remat_policy", REMAT_POLICIES)
    _choice(self.parametrization, "parametrization", PARAMETRIZATIONS)
    check_positive_int(self.mup_base_width, "mup_base_width", optional=True)
    if self.parametrization == "mup" and self.mup_base_width is None:
      _fail("model.parametrization='mup' needs model.mup_base_width: the d_model of the "
            "narrow proxy whose learning rate you tuned (e.g. 64)")
    if self.activation is not None:
      _choice(self.activation, "activation", ACTIVATIONS)
    if self.attention_scale is not None:
      if isinstance(self.attention_scale, bool) or not isinstance(
          self.attention_scale, (int, float)) or not self.attention_scale > 0:
        _fail(f"model.attention_scale={self.attention_scale!r} must be a float > 0 (or None "
              "for 1/sqrt(head_dim))")
      if self.parametrization == "mup":
        _fail(f"model.attention_scale={self.attention_scale} is set, but model.parametrization="
              "'mup' sets the attention scale by its width rule; unset one of them (T5 "
              "needs attention_scale=1.0: the t5 family has no μP)")
    if not isinstance(self.head_gates, bool):
      _fail(f"model.head_gates={self.head_gates!r} must be True or False")
    _choice(self.attention_variant, "attention_variant", VARIANTS)
    check_positive_int(self.routing_slots, "routing_slots")
    if self.attention_variant != "softmax":
      if self.window is not None:
        _fail(f"model.window={self.window!r} is a sliding window of softmax attention; "
              f"model.attention_variant={self.attention_variant!r} has none: unset one of them")
      if self.attention_dropout_rate:
        _fail(f"model.attention_dropout_rate={self.attention_dropout_rate} drops softmax "
              f"attention probabilities; model.attention_variant={self.attention_variant!r} has "
              "none: set it to 0")
    _rate(self.dropout_rate, "dropout_rate")
    _rate(self.attention_dropout_rate, "attention_dropout_rate")
    if not self.norm_eps > 0:
      _fail(f"model.norm_eps={self.norm_eps} must be > 0")
    w = self.window
    if isinstance(w, list):           # JSON and ConfigDict give lists back
      object.__setattr__(self, "window", w := tuple(w))
    if w is not None:
      if not ((isinstance(w, int) and not isinstance(w, bool) and w >= 0)
              or (isinstance(w, tuple) and len(w) == 2)):
        _fail(f"model.window={w!r} must be an int >= 0 (keys to the left) or a (left, right) "
              "pair")
      try:
        masks.normalize_window(w)
      except ValueError as e:
        _fail(f"model.{e}")
    if self.attention_block_sizes is not None:
      sizes = check_block_sizes(self.attention_block_sizes, name="model.attention_block_sizes")
      object.__setattr__(self, "attention_block_sizes", sizes)
      if self.attention_impl == "pallas" and not all(b & (b - 1) == 0 for b in sizes if b):
        _fail(f"model.attention_block_sizes={sizes} must be powers of two for "
              "attention_impl='pallas' (e.g. (128, 64))")
      if self.attention_impl == "splash" and any(b % 128 for b in sizes):
        _fail(f"model.attention_block_sizes={sizes} must be multiples of 128 for "
              "attention_impl='splash' (e.g. (512, 512))")

  @property
  def qkv_bias_or_default(self) -> bool:
    return self.use_bias if self.qkv_bias is None else self.qkv_bias

  def check_width(self, d_model: int):
    """Errors that need the model width (the settings alone cannot know it)."""
    if self.head_dim is None and d_model % self.num_heads:
      _fail(f"model.num_heads={self.num_heads} does not divide model.d_model={d_model} (set "
            "model.head_dim, or pick a divisor)")
    if (self.parametrization == "mup" and self.head_dim is None
        and self.mup_base_width % self.num_heads):
      _fail(f"model.mup_base_width={self.mup_base_width} is not divisible by model.num_heads="
            f"{self.num_heads}: the base model needs a whole head dim (pick a multiple, or set "
            "model.head_dim to grow the number of heads instead)")


# The flat `model.*` config key of each MoESettings field, written out so that grep finds
# every key (tests/unit/layers/test_layers_basic.py checks that it names each field once).
_MOE_KEYS = {"num_experts": "num_experts", "experts_per_token": "experts_per_token",
             "moe_dispatch": "dispatch", "moe_capacity_factor": "capacity_factor",
             "moe_router_jitter": "router_jitter", "moe_renormalize": "renormalize",
             "moe_gated": "gated", "moe_grouped_matmul": "grouped_matmul",
             "moe_load_balance_weight": "load_balance_weight",
             "moe_z_loss_weight": "z_loss_weight"}
# Every block config key: the BlockSettings fields, then the MoE keys.
CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(BlockSettings) if f.name != "moe") + (
    tuple(_MOE_KEYS))


def config_fields(overrides: dict | None = None) -> dict[str, tuple[Any, Any]]:
  """Every block config key -> (default, type annotation), after a family's `overrides` of the
  defaults; the default is `dataclasses.MISSING` when required, and `num_experts` = 0 means a
  dense FFN."""
  out = {f.name: (f.default, f.type) for f in dataclasses.fields(BlockSettings)
         if f.name != "moe"}
  moe = {f.name: f for f in dataclasses.fields(MoESettings)}
  for key, name in _MOE_KEYS.items():
    out[key] = (0, "int") if name == "num_experts" else (moe[name].default, moe[name].type)
  for key, value in (overrides or {}).items():
    out[key] = (value, out[key][1])
  return out


def from_config(values: dict, overrides: dict | None = None) -> BlockSettings:
  """BlockSettings from flat config keys (`CONFIG_KEYS`; others are an error for the caller
  to have removed) over the family's `overrides` of the defaults."""
  cfg = {k: default for k, (default, _) in config_fields(overrides).items()
         if default is not dataclasses.MISSING}
  cfg.update(values)
  for key in ("num_heads", "mlp_dim"):
    if key not in cfg:
      _fail(f"model.{key} is required")
  moe = {name: cfg.pop(key) for key, name in _MOE_KEYS.items()}
  experts = moe["num_experts"]
  check_positive_int(experts, "num_experts", zero="a dense FFN")
  if experts:
    cfg["moe"] = MoESettings(**moe)
  return BlockSettings(**cfg)
