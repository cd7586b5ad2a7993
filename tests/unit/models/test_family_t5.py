"""T5 (family 't5'): relative position buckets against a float64 reference, logits and
Hugging Face round trips against transformers' T5ForConditionalGeneration (v1.0 and v1.1),
published parameter counts, the span-corruption objective and its data, config errors."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from configs import t5 as t5_configs
from jaxformer import models, scaling
from jaxformer.data import span_corruption as sc
from jaxformer.models.stack import stack_layers
from jaxformer.ops.positions import relative_position_buckets
from tests import drawn

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


# ----------------------------------------------------------------------------- buckets

def buckets_reference(rel, bidirectional, num_buckets, max_distance):
  """T5's bucketing in float64 NumPy, written from the paper's description."""
  rel = np.asarray(rel, np.int64)
  out = np.zeros(rel.shape, np.int64)
  n = num_buckets
  if bidirectional:
    n //= 2
    out += (rel > 0) * n
    dist = np.abs(rel)
  else:
    dist = np.maximum(-rel, 0)
  exact = n // 2
  with np.errstate(divide="ignore"):
    far = exact + np.floor(np.log(dist / exact) / math.log(max_distance / exact) * (n - exact))
  return out + np.where(dist < exact, dist, np.minimum(far, n - 1)).astype(np.int64)


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (16, 64), (6, 10)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_match_float64_reference(num_buckets, max_distance, bidirectional):
  q, k = np.arange(300), np.arange(300)
  got = np.asarray(relative_position_buckets(q, k, bidirectional=bidirectional,
                                             num_buckets=num_buckets,
                                             max_distance=max_distance))
  want = buckets_reference(k[None] - q[:, None], bidirectional, num_buckets, max_distance)
  np.testing.assert_array_equal(got, want)
  assert got.min() >= 0 and got.max() == num_buckets - 1


def test_relative_buckets_known_values():
  b = lambda rel, bi: int(relative_position_buckets(np.array([0]), np.array([rel]),
                                                    bidirectional=bi)[0, 0])
  # encoder: 16 buckets per direction, 8 exact; keys after the query in the upper half
  assert [b(r, True) for r in (0, -1, -7, 1, 7, 16, -128, 500)] == [0, 1, 7, 17, 23, 26, 15, 31]
  # decoder: 32 buckets for r <= 0, 16 exact; future keys share bucket 0
  assert [b(r, False) for r in (0, -1, -15, -16, -127, -128, 5)] == [0, 1, 15, 16, 31, 31, 0]


# ----------------------------------------------------------------------------- HF parity

HF_SMALL = dict(vocab_size=50, d_model=32, d_kv=12, d_ff=48, num_layers=2, num_decoder_layers=3,
                num_heads=3, relative_attention_num_buckets=8,
                relative_attention_max_distance=20, dropout_rate=0.0)


def reference_model(v1_1: bool):
  """A random transformers T5 as a published checkpoint of that variant loads: v1.0 tied
  and scaled; v1.1 gated-gelu with its own lm_head (transformers 5 ties the head unless the
  checkpoint's lm_head differs from `shared`, so it is given one)."""
  from transformers import T5Config, T5ForConditionalGeneration
  torch.manual_seed(1 if v1_1 else 0)
  if v1_1:
    config = T5Config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **HF_SMALL)
  else:
    config = T5Config(feed_forward_proj="relu", **HF_SMALL)
  model = T5ForConditionalGeneration(config).eval()
  if v1_1:
    model.lm_head.weight = torch.nn.Parameter(torch.randn(50, 32) * 0.2)
  return model


def hf_logits(model, src, tgt, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                 decoder_input_ids=torch.tensor(tgt)).logits.numpy()


@pytest.fixture(scope="module")
def inputs():
  rng = np.random.default_rng(0)
  src, tgt = rng.integers(0, 50, (2, 23)), rng.integers(0, 50, (2, 9))
  mask = np.ones((2, 23), np.int64)
  mask[1, 15:] = 0                                   # a padded source row
  return src, tgt, mask


@pytest.fixture(scope="module", params=["v1_0", "v1_1"])
def loaded(request, tmp_path_factory, inputs):
  from jaxformer.convert import hf
  model = reference_model(request.param == "v1_1")
  path = tmp_path_factory.mktemp(request.param)
  model.save_pretrained(path)
  cfg, params = hf.load(path)
  return request.param, model, cfg, params, hf_logits(model, *inputs)


def test_hf_load_gives_transformers_logits_with_padding(loaded, inputs):
  variant, _, cfg, params, want = loaded
  assert cfg.family == "t5" and cfg.tie_embeddings == (variant == "v1_0")
  assert (cfg.ffn, cfg.activation) == (("mlp", "relu") if variant == "v1_0" else
                                       ("swiglu", "gelu"))
  src, tgt, mask = inputs
  got = jax.jit(models.build(cfg).apply)({"params": params}, jnp.asarray(src),
                                         jnp.asarray(tgt), src_mask=jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)
  # the scanned layout computes the same
  scanned = {k: stack_layers(v, cfg[f"num_{k}_layers"]) if k in ("encoder", "decoder") else v
             for k, v in params.items()}
  got_scanned = jax.jit(models.build(dict(cfg, scan_layers=True)).apply)(
      {"params": scanned}, jnp.asarray(src), jnp.asarray(tgt), src_mask=jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(got_scanned), np.asarray(got), atol=1e-5)


def test_hf_save_loads_back_into_transformers_with_equal_logits(loaded, inputs, tmp_path):
  from transformers import T5ForConditionalGeneration
  from jaxformer.convert import hf
  variant, model, cfg, params, want = loaded
  hf.save(cfg, params, tmp_path)
  back = T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
  np.testing.assert_allclose(hf_logits(back, *inputs), want, atol=1e-5)
  assert back.num_parameters() == model.num_parameters() == scaling.count_params(cfg)["total"]
  untied = back.lm_head.weight.data_ptr() != back.shared.weight.data_ptr()
  assert untied == (variant == "v1_1")


def test_hf_refuses_what_t5_cannot_hold(tmp_path):
  from jaxformer.convert import hf
  cfg = dict(family="t5", vocab_size=20, d_model=16, num_encoder_layers=1,
             num_decoder_layers=1, num_heads=2, mlp_dim=32, activation="gelu_exact",
             ffn="swiglu")
  # both are refused from the config, before the params are read
  with pytest.raises(ValueError, match="gated-gelu.*model.activation='gelu'"):
    hf.save(cfg, {}, tmp_path / "a")
  with pytest.raises(ValueError, match="model.use_bias=True"):
    hf.save(dict(cfg, use_bias=True), {}, tmp_path / "b")


# ----------------------------------------------------------------------------- counts

@pytest.mark.parametrize("name", [n for n, s in t5_configs.SIZES.items() if s[-1]])
def test_published_counts_equal_transformers_num_parameters(name):
  """Every published size, built on torch's meta device (no memory), counts as ours."""
  from transformers import T5Config, T5ForConditionalGeneration
  cfg = t5_configs.get_config(name)
  m = models.with_defaults(cfg.model)
  v1_1 = not m["tie_embeddings"]
  hc = T5Config(vocab_size=m["vocab_size"], d_model=m["d_model"], d_kv=m["head_dim"],
                d_ff=m["mlp_dim"], num_layers=m["num_encoder_layers"], num_heads=m["num_heads"],
                feed_forward_proj="gated-gelu" if v1_1 else "relu", tie_word_embeddings=not v1_1)
  with torch.device("meta"):
    model = T5ForConditionalGeneration(hc)
    if v1_1:    # a v1.1 checkpoint's own lm_head (see reference_model)
      model.lm_head.weight = torch.nn.Parameter(torch.empty(m["vocab_size"], m["d_model"]))
  assert scaling.count_params(cfg.model)["total"] == model.num_parameters() == \
      cfg.reference.params


def test_count_categories():
  cfg = t5_configs.get_config("small").model
  counts = scaling.count_params(cfg)
  tables = 32128 * 512 + 2 * 32 * 8
  assert counts["non_embedding"] == counts["total"] - tables
  assert counts["backbone"] == counts["total"]              # tied head: T5Model's count
  v11 = scaling.count_params(t5_configs.get_config("v1_1_small").model)
  assert v11["backbone"] == v11["total"] - 32128 * 512
  assert scaling.flops_per_token(cfg, 512) > 6 * counts["non_embedding"]


# ----------------------------------------------------------------------------- config errors

TINY = dict(family="t5", vocab_size=40, d_model=32, num_encoder_layers=2, num_decoder_layers=2,
            num_heads=4, head_dim=8, mlp_dim=64, relative_buckets=8, relative_max_distance=16,
            dropout_rate=0.0, attention_dropout_rate=0.0)


@pytest.mark.parametrize("field, value, match", [
    ("parametrization", "mup", "model.attention_scale=1.0 is set, but model.parametrization="
     "'mup' .* the t5 family has no μP"),
    ("attention_scale", None, "model.parametrization='mup' is not available for the t5"),
    ("pre_norm", False, "model.pre_norm=False: T5 is pre-norm"),
    ("relative_max_distance", 4, "model.relative_buckets=8, model.relative_max_distance=4"),
    ("attention_scale", -1.0, "model.attention_scale=-1.0 must be a float > 0"),
    ("tie_embeddings", "yes", "model.tie_embeddings='yes' must be True"),
])
def test_bad_config_fails_naming_the_field(field, value, match):
  extra = dict(mup_base_width=32, parametrization="mup") if value in ("mup", None) else {}
  with pytest.raises(ValueError, match=match):
    models.build(dict(TINY, **{**extra, field: value}))


def test_attention_scale_keeps_initial_logits_and_refuses_mup():
  """scale 1 with q's init / sqrt(d): q.k starts as 1/sqrt(d)-scaled logits would."""
  from jaxformer.layers.block_settings import BlockSettings
  with pytest.raises(ValueError, match="model.attention_scale=1.0 is set, but"):
    BlockSettings(num_heads=2, mlp_dim=8, attention_scale=1.0, parametrization="mup",
                  mup_base_width=8)
  params = jax.jit(models.build(TINY).init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32),
                                            jnp.zeros((1, 4), jnp.int32))["params"]
  qkv = params["encoder"]["layers_0"]["block"]["self_attention"]["qkv"]["kernel"].value
  q_std, k_std = float(jnp.std(qkv[:, 0])), float(jnp.std(qkv[:, 1]))
  assert q_std / k_std == pytest.approx(8 ** -0.5, rel=0.15)
  cross = params["decoder"]["layers_0"]["block"]["cross_attention"]
  assert float(jnp.std(cross["query"]["kernel"].value)) / float(
      jnp.std(cross["kv"]["kernel"].value)) == pytest.approx(8 ** -0.5, rel=0.15)


# ----------------------------------------------------------------------------- span corruption

def test_random_segmentation_is_uniform_over_compositions():
  rng = np.random.default_rng(0)
  seen = {}
  for _ in range(6000):
    parts = sc.random_segmentation(6, 3, rng)
    assert parts.sum() == 6 and (parts > 0).all()
    seen[tuple(parts)] = seen.get(tuple(parts), 0) + 1
  assert len(seen) == math.comb(5, 2)                  # every composition of 6 into 3
  assert max(seen.values()) / min(seen.values()) < 1.3


def test_noise_density_span_length_and_reconstruction():
  rng = np.random.default_rng(1)
  vocab, sentinels, eos = 120, 30, 1
  fractions, span_lengths = [], []
  for length in (128, 200, 568):
    noise, spans = sc.span_counts(length)
    src_len, tgt_len = sc.lengths(length)
    for _ in range(60):
      tokens = rng.integers(2, vocab - sentinels, length)
      mask = sc.noise_mask(length, rng)
      assert not mask[0] and mask[-1]                 # non-noise first, noise last (T5)
      starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
      ends = np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]]))
      assert mask.sum() == noise and len(starts) == spans
      fractions.append(mask.mean())
      span_lengths += list(ends - starts + 1)
      inputs, targets = sc.corrupt(tokens, mask, vocab_size=vocab, eos_id=eos)
      assert (len(inputs), len(targets)) == (src_len, tgt_len)
      assert inputs[-1] == targets[-1] == eos
      # sentinels from the top of the vocabulary, in order, in both
      top = lambda a: a[a >= vocab - sentinels].tolist()
      assert top(inputs) == top(targets) == list(range(vocab - 1, vocab - 1 - spans, -1))
      np.testing.assert_array_equal(
          sc.reconstruct(inputs, targets, vocab_size=vocab, num_sentinels=sentinels,
                         eos_id=eos), tokens)
  assert np.mean(fractions) == pytest.approx(0.15, abs=0.005)
  assert np.mean(span_lengths) == pytest.approx(3.0, abs=0.15)
  assert sc.lengths(568) == (512, 114)                 # T5's input / target lengths


def test_corrupt_on_the_papers_example():
  words = "Thank you for inviting me to your party last week".split()
  ids = np.arange(len(words))
  mask = np.isin(ids, [2, 3, 8])
  inputs, targets = sc.corrupt(ids, mask, vocab_size=100, eos_id=-1)
  name = lambda i: words[i] if 0 <= i < 10 else {99: "<X>", 98: "<Y>", -1: "</s>"}[i]
  assert " ".join(map(name, inputs)) == "Thank you <X> me to your party <Y> week </s>"
  assert " ".join(map(name, targets)) == "<X> for inviting <Y> last </s>"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
  from jaxformer import run_settings, tasks
  cfg = t5_configs.get_config("tiny")
  cfg.data.seq_len = 64
  cfg.train.update(batch_size=4, eval_batch_size=4)
  settings = run_settings.parse(cfg)
  return cfg, settings, tasks.get("span_corruption").make_pipeline(
      cfg, settings, workdir=str(tmp_path_factory.mktemp("run")))


def test_pipeline_batches_match_the_layout_and_are_a_function_of_step(pipeline):
  from jaxformer import tasks
  cfg, settings, p = pipeline
  assert p.info["vocab_size"] == 65 + 2 + t5_configs.CPU_SENTINELS == cfg.model.vocab_size
  batch = p.train_batch(3)
  spec = tasks.get("span_corruption").batch_spec(cfg, settings, models.with_defaults(cfg.model))
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == spec
  np.testing.assert_array_equal(p.train_batch(3)["src"], batch["src"])
  assert not np.array_equal(p.train_batch(4)["src"], batch["src"])
  np.testing.assert_array_equal(batch["tgt_in"][:, 1:], batch["tgt_out"][:, :-1])
  assert (batch["tgt_in"][:, 0] == p.pad_id).all()
  for src, tgt in zip(batch["src"], batch["tgt_out"]):
    text = sc.reconstruct(src, tgt, vocab_size=p.vocab_size, num_sentinels=p.num_sentinels,
                          eos_id=p.eos_id)
    assert len(text) == 64 and text.max() < 65
  first = next(iter(p.eval_batches()))
  assert first["src"].shape == batch["src"].shape and (first["valid"] == 1).all()


def test_too_few_sentinels_is_refused(tmp_path):
  from jaxformer import run_settings, tasks
  cfg = t5_configs.get_config("tiny")
  cfg.data.num_sentinels = 3
  with pytest.raises(ValueError, match="data.num_sentinels=3 is fewer than the 6 noise spans"):
    tasks.get("span_corruption").make_pipeline(cfg, run_settings.parse(cfg),
                                               workdir=str(tmp_path))


# ----------------------------------------------------------------------------- training

@pytest.mark.slow
def test_span_corruption_trains_with_falling_eval_loss(tmp_path, monkeypatch):
  from jaxformer.train import loop
  from tests.runs import on_one_device
  on_one_device(monkeypatch)
  cfg = t5_configs.get_config("tiny")
  cfg.model.update(d_model=32, num_heads=2, mlp_dim=64, num_encoder_layers=1,
                   num_decoder_layers=1)
  cfg.data.update(seq_len=40, eval_batches=2)
  cfg.train.update(steps=60, batch_size=16, eval_batch_size=16, eval_every=30, log_every=10,
                   checkpoint_every=60, attention_maps=False)
  cfg.optim.update(warmup_steps=10)
  loop.train(cfg, str(tmp_path))
  import json
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    evals = [r for r in map(json.loads, f) if "eval_loss" in r]
  assert [r["step"] for r in evals] == [30, 60]
  assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] < math.log(cfg.model.vocab_size)


# ----------------------------------------------------------------------------- sharding

def test_sharded_over_data_and_model_matches_single_device():
  import flax.linen as nn
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  from jaxformer.parallel.rules import MESH_AXES, logical_axis_rules
  mesh = jax.make_mesh((4, 2, 1), MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  rules = logical_axis_rules()
  module = models.build(dict(TINY, tie_embeddings=False, ffn="swiglu", activation="gelu"))
  rng = np.random.default_rng(0)
  src = jnp.asarray(rng.integers(0, 40, (4, 12)), jnp.int32)
  tgt = jnp.asarray(rng.integers(0, 40, (4, 6)), jnp.int32)
  mask = jnp.asarray(np.arange(12)[None] < np.array([[12], [9], [5], [12]]))
  # params drawn at the init's shapes (the init is not what is tested; compiling it costs more
  # than the applies), the abstract init's boxes give the partition specs
  boxed = jax.eval_shape(module.init, jax.random.key(0), src, tgt)
  params = drawn.params(module, src, tgt)
  apply = jax.jit(lambda p, s, t, m: module.apply({"params": p}, s, t, src_mask=m))
  want = apply(params, src, tgt, mask)
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)["params"]
  assert shardings["encoder_relative_bias"]["embedding"].spec == P(None, "model")

  @jax.jit
  def sharded_apply(p, s, t, m):
    with nn.logical_axis_rules(rules):
      return module.apply({"params": p}, s, t, src_mask=m)

  with jax.set_mesh(mesh):
    data = NamedSharding(mesh, P("data"))
    got = sharded_apply(jax.device_put(params, shardings), jax.device_put(src, data),
                        jax.device_put(tgt, data), jax.device_put(mask, data))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
