"""μP (`model.parametrization="mup"`): init, learning-rate groups against a float64 AdamW,
multipliers, the coordinate check, sharding, and the width tools."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import shakespeare_char
from jaxformer import models, parallel, scaling
from jaxformer.layers import parametrization
from jaxformer.scaling import mup
from jaxformer.state import train_state as state_lib
from jaxformer.train import coord_check
from tests import drawn, sharded_gpt


def tiny(parametrization="mup", base=16, **model):
  """shakespeare_char:tiny (2 layers, width 32, 4 heads, tied embeddings) under μP."""
  cfg = shakespeare_char.get_config("tiny")
  cfg.model.update(parametrization=parametrization, mup_base_width=base, **model)
  return cfg


def multipliers(cfg):
  module = models.build(cfg.model)
  return state_lib.lr_multipliers(
      module, lambda: module.init(jax.random.key(0), *state_lib.init_inputs(cfg.model))["params"])


def flat(tree):
  return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def tokens(cfg, batch=2, length=8, seed=0):
  return jax.random.randint(jax.random.key(seed), (batch, length), 0, cfg.model.vocab_size)


# --- the base width is the standard parametrization -------------------------------------------

def test_mup_at_the_base_width_is_standard_bit_for_bit():
  """m = 1: the same init (`test_init_statistics...` compares inits at m = 8), no LR groups
  (`test_lr_groups...`), and the same logits bit for bit."""
  std, mu = (models.build(tiny(kind, base=32, num_layers=1).model)
             for kind in ("standard", "mup"))
  x = tokens(tiny())
  params = jax.jit(std.init)(jax.random.key(0), x)["params"]
  got, want = jax.jit(lambda p: (mu.apply({"params": p}, x), std.apply({"params": p}, x)))(
      params)
  np.testing.assert_array_equal(got, want)


# --- init --------------------------------------------------------------------------------------

def test_init_statistics_of_a_two_layer_model():
  """μP keeps the standard init (it is width-independent where it must be): kernels have
  variance 1/fan_in, embeddings std 0.02, norms 1; checked against float64 sample statistics
  at width 256 (base 32) with 5-sigma bounds."""
  inits = [state_lib.train_state_fns(tiny(kind, base=32, d_model=256, mlp_dim=1024))[2]
           for kind in ("mup", "standard")]
  mu, standard = jax.jit(lambda: [nn.unbox(init()["params"]) for init in inits])()
  jax.tree.map(np.testing.assert_array_equal, mu, standard)
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), mu)

  def check_std(x, want):
    n = x.size
    got = np.sqrt(np.mean(x ** 2))            # zero-mean init
    assert abs(got / want - 1) < 5 * math.sqrt(1 / (2 * n)) + 1e-3, (got, want, x.shape)

  for i in range(2):
    block = p["decoder"][f"layers_{i}"]["block"]
    check_std(block["self_attention"]["qkv"]["kernel"], 256 ** -0.5)   # fan-in 256
    check_std(block["self_attention"]["out"]["kernel"], 256 ** -0.5)   # fan-in 4 heads x 64
    check_std(block["ffn"]["wi"]["kernel"], 256 ** -0.5)
    check_std(block["ffn"]["wo"]["kernel"], 1024 ** -0.5)
    np.testing.assert_array_equal(block["ffn_norm"]["scale"], np.ones(256))
  check_std(p["embed"]["embedding"], 0.02)
  check_std(p["pos_embed"]["embedding"], 0.02)


# --- learning-rate groups ----------------------------------------------------------------------

def test_lr_groups_of_a_two_layer_decoder_by_hand():
  m = 4.0                                             # width 64, base 16
  hidden = {f"['decoder']['layers_{i}']['block']['{k}']['kernel']": 1 / m for i in range(2)
            for k in ("self_attention']['qkv", "self_attention']['out", "ffn']['wi",
                      "ffn']['wo")}
  want = {**hidden, **{f"['decoder']['layers_{i}']['block']['{n}']['scale']": 1.0
                       for i in range(2) for n in ("self_attention_norm", "ffn_norm")},
          "['embed']['embedding']": 1.0, "['pos_embed']['embedding']": 1.0,
          "['final_norm']['bias']": 1.0, "['final_norm']['scale']": 1.0}
  assert flat(multipliers(tiny(d_model=64, mlp_dim=128))) == want
  # untied readout, GQA projections, gated FFN, biases
  got = flat(multipliers(tiny(d_model=64, mlp_dim=128, tie_embeddings=False, num_kv_heads=2,
                              ffn="swiglu", use_bias=True, num_layers=1)))
  block = "['decoder']['layers_0']['block']"
  for key, value in {"['lm_head']['kernel']": 1.0, "['embed']['embedding']": 1.0,
                     f"{block}['self_attention']['query']['kernel']": 0.25,
                     f"{block}['self_attention']['kv']['kernel']": 0.25,
                     f"{block}['self_attention']['query']['bias']": 1.0,
                     f"{block}['self_attention']['out']['bias']": 1.0,
                     f"{block}['ffn']['wi_gate']['kernel']": 0.25,
                     f"{block}['ffn']['wi_up']['kernel']": 0.25,
                     f"{block}['ffn']['wo']['bias']": 1.0}.items():
    assert got[key] == value, key
  assert multipliers(tiny("standard", d_model=64, mlp_dim=128)) is None
  assert multipliers(tiny(base=32)) is None                 # m = 1: nothing to scale


def test_lr_groups_of_bert_moe_and_scanned_layers():
  bert = {"family": "bert", "vocab_size": 40, "d_model": 64, "num_layers": 1, "num_heads": 4,
          "mlp_dim": 128, "max_len": 16, "parametrization": "mup", "mup_base_width": 32}
  cfg = tiny()
  cfg.model = bert
  got = flat(multipliers(cfg))
  assert got["['pooler']['kernel']"] == got["['mlm_transform']['kernel']"] == 0.5
  assert got["['type_embed']['embedding']"] == got["['mlm_bias']"] == 1.0
  moe = flat(multipliers(tiny(d_model=64, mlp_dim=128, num_experts=4, num_layers=1)))
  ffn = "['decoder']['layers_0']['block']['ffn']"
  assert moe[f"{ffn}['wi_gate']"] == moe[f"{ffn}['wo']"] == 0.25          # [experts, in, out]
  assert moe[f"{ffn}['router']['kernel']"] == 1.0                      # an output weight
  scanned = flat(multipliers(tiny(d_model=64, mlp_dim=128, scan_layers=True)))
  assert scanned["['decoder']['layers']['block']['ffn']['wo']['kernel']"] == 0.25


def adamw_reference(params, grads_seq, mult, decays, *, lr, warmup, b1, b2, eps, wd, clip):
  """Float64 AdamW with global-norm clipping, linear warmup and per-parameter LR multipliers
  (written from the algorithm, not from optax)."""
  p = {k: v.astype(np.float64) for k, v in params.items()}
  mu = {k: np.zeros_like(v) for k, v in p.items()}
  nu = {k: np.zeros_like(v) for k, v in p.items()}
  for t, grads in enumerate(grads_seq, start=1):
    g = {k: v.astype(np.float64) for k, v in grads.items()}
    norm = math.sqrt(sum(np.sum(v ** 2) for v in g.values()))
    g = {k: v * min(1.0, clip / norm) for k, v in g.items()}
    rate = lr * t / warmup                            # warmup: lr * (step + 1) / warmup
    for k in p:
      mu[k] = b1 * mu[k] + (1 - b1) * g[k]
      nu[k] = b2 * nu[k] + (1 - b2) * g[k] ** 2
      update = (mu[k] / (1 - b1 ** t)) / (np.sqrt(nu[k] / (1 - b2 ** t)) + eps)
      if decays[k]:
        update = update + wd * p[k]
      p[k] = p[k] - rate * mult[k] * update
  return p


def test_adamw_groups_match_a_float64_reference():
  cfg = tiny(d_model=64, mlp_dim=128)                 # m = 4
  cfg.optim.update(lr=3e-2, warmup_steps=10, weight_decay=0.1, clip=0.5, b1=0.9, b2=0.99)
  _, tx, init_boxed = state_lib.train_state_fns(cfg)
  rng = np.random.default_rng(0)
  normal = lambda tree: jax.tree.map(
      lambda x: rng.normal(size=x.shape).astype(np.float32), nn.unbox(tree))
  params = normal(jax.eval_shape(init_boxed)["params"])
  grads_seq = [normal(params) for _ in range(3)]

  @jax.jit
  def train(params, grads_seq):
    opt_state = tx.init(params)
    for grads in grads_seq:
      updates, opt_state = tx.update(grads, opt_state, params)
      params = jax.tree.map(lambda p, u: p + u, params, updates)
    return params
  got = train(params, grads_seq)
  hidden = ("qkv", "out", "wi", "wo")                 # by hand: the 2-width-axis kernels
  mult = {k: 0.25 if any(f"['{h}']['kernel']" in k for h in hidden) else 1.0
          for k in flat(params)}
  decays = {k: v.ndim >= 2 and "embedding" not in k for k, v in flat(params).items()}
  want = adamw_reference(flat(params), [flat(g) for g in grads_seq], mult, decays, lr=3e-2,
                         warmup=10, b1=0.9, b2=0.99, eps=1e-8, wd=0.1, clip=0.5)
  for k, v in flat(got).items():
    np.testing.assert_allclose(np.asarray(v, np.float64), want[k], rtol=1e-5, atol=1e-7,
                               err_msg=k)
  assert sum(m == 0.25 for m in mult.values()) == 8


# --- forward multipliers -----------------------------------------------------------------------

def test_attention_scale_by_hand():
  s = lambda kind="mup", **kw: models.build(tiny(kind, **kw).model).block
  assert parametrization.attention_scale(s(base=16), 64) == pytest.approx(2 / 16)  # sqrt(4)/16
  assert parametrization.attention_scale(s(base=32), 32) is None            # m = 1: default
  assert parametrization.attention_scale(s("standard"), 64) is None
  # head_dim fixed: the heads grow, d_head does not, so the scale stays 1/sqrt(d_head)
  assert parametrization.attention_scale(s(base=16, head_dim=8), 64) == pytest.approx(8 ** -0.5)


def test_models_pass_the_attention_scale_and_divide_the_logits(monkeypatch):
  """At one position the softmax is 1 whatever the scale, so μP's logits are the standard
  model's (same params) times 1/m, for every family with a readout; and every attention layer
  is called with sqrt(d_base)/d."""
  from jaxformer.layers import attention as attention_layer
  seen = []
  real = attention_layer.dot_product_attention
  monkeypatch.setattr(attention_layer, "dot_product_attention",
                      lambda *a, **kw: seen.append(kw["scale"]) or real(*a, **kw))
  vit = {"family": "vit", "num_classes": 5, "patch_size": 4, "image_size": 4, "channels": 1,
         "num_layers": 1, "num_heads": 4, "mlp_dim": 128, "pool": "gap"}
  bert = {"family": "bert", "vocab_size": 40, "num_layers": 1, "num_heads": 4, "mlp_dim": 128,
          "max_len": 16}
  for overrides in ({}, bert, vit):             # (an untied lm_head: scaled by the same line)
    cfg = {**tiny().model.to_dict(), "num_layers": 1, "d_model": 64, "mlp_dim": 128,
           **overrides}
    cfg = {k: v for k, v in cfg.items() if k in models.config_fields(cfg["family"])
           or k == "family"}
    std, mu = models.build({**cfg, "parametrization": "standard"}), models.build(cfg)
    x = (jnp.ones((2, 4, 4, 1)) if cfg["family"] == "vit" else
         jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 1)), jnp.int32))
    # any params will do (the same for both; drawn, so ViT's head is not the init's zeros);
    # each apply jitted: one compile instead of one per op (the scale is seen while tracing)
    params = drawn.params(std, x)
    seen.clear()
    got = jax.jit(mu.apply)({"params": params}, x)
    assert seen == [pytest.approx(2 / 16)]            # base 16 / 4 heads = 4; d_head 16
    want = jax.jit(std.apply)({"params": params}, x)
    if cfg["family"] == "bert":                       # the MLM bias is added after
      bias = params["mlm_bias"]
      np.testing.assert_allclose(got - bias, (want - bias) / 4, rtol=1e-5, atol=1e-6)
    else:
      np.testing.assert_allclose(got, want / 4, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model, match", [
    ({"parametrization": "mu"}, r"model.parametrization='mu' is not one of"),
    ({"parametrization": "mup", "mup_base_width": None}, "needs model.mup_base_width"),
    ({"parametrization": "mup", "mup_base_width": 0}, "model.mup_base_width=0"),
    ({"parametrization": "mup", "mup_base_width": 18}, "mup_base_width=18 is not divisible"),
])
def test_bad_parametrization_configs_name_the_field(model, match):
  cfg = tiny().model.to_dict()
  cfg.update(model)
  with pytest.raises(ValueError, match=match):
    models.build(cfg)


def test_seq2seq_refuses_mup_with_the_reason():
  cfg = {"family": "seq2seq", "vocab_size": 32, "d_model": 32, "num_encoder_layers": 1,
         "num_decoder_layers": 1, "num_heads": 4, "mlp_dim": 64, "parametrization": "mup",
         "mup_base_width": 16}
  with pytest.raises(ValueError, match="not available for the encoder-decoder family"):
    models.build(cfg)


# --- coordinate check ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def coord_checks():
  out = {}
  for kind in ("standard", "mup"):
    cfg = tiny(kind, base=16, num_layers=1)
    cfg.optim.update(lr=1e-2, warmup_steps=1, schedule="constant", clip=0.0)
    out[kind] = coord_check.coordinate_check(cfg, (16, 32, 64), steps=2, batch_size=4,
                                             seq_len=16)
  return out


@pytest.mark.slow
def test_coordinate_check_is_flat_under_mup_and_grows_under_standard(coord_checks):
  layer, step, slope = coord_checks["mup"].max_growth()
  assert slope < 0.3, (layer, step, slope)
  layer, step, slope = coord_checks["standard"].max_growth()
  assert slope > 0.6, (layer, step, slope)
  # where it grows: the readout and the residual stream after an update (Adam: ~ width^1)
  slopes = coord_checks["standard"].slopes()
  assert slopes["logits"][2] > 0.5
  check = coord_checks["mup"]
  assert set(check.sizes) == {16, 32, 64}
  assert all(len(v) == 3 for v in check.sizes[16].values())      # init + 2 updates
  assert {"embed", "logits", "decoder/layers_0/block/self_attention/out"} <= set(check.layers)
  assert check.to_json()["slopes"] == check.slopes()


# --- sharding --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_mup_sharded_training_matches_one_device():
  cfg = sharded_gpt.constant_lr(tiny(d_model=64, mlp_dim=128, num_heads=8, vocab_size=64,
                                     max_len=16, num_layers=1, attention_impl="xla"))
  rng = np.random.default_rng(0)
  tokens = [rng.integers(0, 64, (8, 17)).astype(np.int32) for _ in range(2)]
  batches = [{"inputs": b[:, :-1], "targets": b[:, 1:]} for b in tokens]
  runs = []
  for shape, fsdp in (((1, 1, 1), False), ((2, 4, 1), True)):
    devices = jax.devices()[:math.prod(shape)]
    plan = parallel.ShardingPlan.from_config(dict(zip(("data", "model", "expert"), shape),
                                                  fsdp=fsdp), devices)
    runs.append(sharded_gpt.train(plan, cfg, batches))
  # μP's LR multipliers are <= 1 (hidden matrices lr / m): the bound at the peak LR holds.
  sharded_gpt.assert_runs_close(runs[1], runs[0], cfg)


# --- width tools -----------------------------------------------------------------------------------

def test_with_width_scales_mlp_and_heads_or_head_dim():
  model = tiny().model
  wide = mup.with_width(model, 128)
  assert (wide.d_model, wide.mlp_dim, wide.num_heads, wide.mup_base_width) == (128, 256, 4, 16)
  assert model.d_model == 32                                   # a copy
  fixed = dict(model.to_dict(), head_dim=8, num_kv_heads=2)
  wide = mup.with_width(fixed, 128)
  assert (wide["num_heads"], wide["num_kv_heads"], wide["head_dim"]) == (16, 8, 8)
  with pytest.raises(ValueError, match="model.mlp_dim=48 does not scale evenly"):
    mup.with_width(dict(model.to_dict(), mlp_dim=48), 33)
  with pytest.raises(ValueError, match="not divisible by model.num_heads=4"):
    mup.with_width(model, 34)


def test_lr_optimum_and_transfer_slope():
  rates = [1e-3, 2e-3, 4e-3, 8e-3]
  # a parabola in log LR with its vertex at 3e-3
  losses = [(math.log(r) - math.log(3e-3)) ** 2 + 1 for r in rates]
  got = scaling.lr_optimum(rates, losses)
  assert got["lr"] == pytest.approx(3e-3, rel=1e-9) and got["best_grid_lr"] == 4e-3
  assert not got["edge"]
  edge = scaling.lr_optimum(rates, [1.0, 2.0, 3.0, float("nan")])
  assert edge["edge"] and edge["lr"] == 1e-3                   # flagged, not extrapolated
  assert scaling.lr_optimum(rates, [3.0, float("nan"), 1.0, 2.0])["best_grid_lr"] == 4e-3
  with pytest.raises(ValueError, match="needs >= 3 rates"):
    scaling.lr_optimum(rates[:2], [1.0, 2.0])
  widths = [32, 64, 128, 256]
  exact = scaling.lr_width_rule(widths, [0.1 / w for w in widths])
  assert exact["slope"] == pytest.approx(-1) and exact["ci"][0] == pytest.approx(-1)
  assert exact["k"] == pytest.approx(0.1)
  noisy = scaling.lr_width_rule(widths, [1e-2, 1.3e-2, 0.9e-2, 1.1e-2])
  assert noisy["ci"][0] < noisy["slope"] < noisy["ci"][1] and noisy["ci"][0] < 0 < noisy["ci"][1]
  assert exact["shift_factor"] == pytest.approx(8)
