"""The model-family registry: every family through init, counts, one train step (where no
other test trains it) and (where it has one) a Hugging Face round trip; a new family added
through the registry alone."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import common
from jaxformer import models, scaling, tasks
from jaxformer.state import train_state
from jaxformer.train import step as step_lib
from tests import drawn

SMALL = {
    "decoder": dict(vocab_size=37, d_model=16, num_layers=1, num_heads=2, mlp_dim=32, max_len=16,
                    tie_embeddings=False),
    "bert": dict(vocab_size=37, d_model=16, num_layers=1, num_heads=2, mlp_dim=32, max_len=16,
                 nsp=True),                     # every head present (nsp_head too)
    "roberta": dict(vocab_size=37, d_model=16, num_layers=1, num_heads=2, mlp_dim=32,
                    max_len=16, with_pooler=True),
    "seq2seq": dict(vocab_size=37, d_model=16, num_encoder_layers=1, num_decoder_layers=1,
                    num_heads=2, mlp_dim=32),
    "vit": dict(num_classes=5, patch_size=4, image_size=8, d_model=16, num_layers=1,
                num_heads=2, mlp_dim=32),
    "rnn_seq2seq": dict(vocab_size=37, embed_dim=8, hidden_dim=16),
    "bart": dict(vocab_size=37, d_model=16, num_encoder_layers=1, num_decoder_layers=1,
                 num_heads=2, mlp_dim=32, max_len=16, logits_bias=True),
    "t5": dict(vocab_size=37, d_model=16, num_encoder_layers=1, num_decoder_layers=1,
               num_heads=2, mlp_dim=32, tie_embeddings=False),
    "deberta": dict(vocab_size=37, d_model=16, num_layers=1, num_heads=2, mlp_dim=32, max_len=16,
                    position_buckets=4, position_biased_input=True, type_vocab_size=2),
    "electra": dict(vocab_size=37, d_model=16, num_layers=1, num_heads=2, mlp_dim=32, max_len=16,
                    embedding_size=8, generator_d_model=8, generator_num_heads=1),
    "captioner": dict(vocab_size=37, max_len=6, image_size=8, patch_size=4, d_model=16,
                      num_heads=2, mlp_dim=32, encoder_layers=1, decoder_layers=1),
}
# Embedding/head names SMALL cannot have: DeBERTa's enhanced-mask-decoder table excludes its
# absolute input positions (pos_embed); test_family_deberta counts the decoder's table.
ABSENT = {"deberta": ("emd_pos_embed",)}
# What a Hugging Face round trip changes of SMALL (ELECTRA's joint pretraining model is two
# HF models; its discriminator is one).
HF_SMALL = {"electra": dict(role="discriminator", generator_d_model=None,
                            generator_num_heads=None)}


def batch_for(task: str, rng: np.random.Generator, cfg: dict) -> dict:
  """A random batch in the layout of `task` (what the data pipeline yields)."""
  b, t = 2, 6
  tokens = lambda: rng.integers(0, cfg.get("vocab_size", 2), (b, t)).astype(np.int32)
  if task == "classification":
    size = cfg["image_size"]
    return {"images": rng.normal(size=(b, size, size, cfg.get("channels", 3))).astype(
        np.float32), "labels": rng.integers(0, cfg["num_classes"], (b,)).astype(np.int32)}
  if task == "captioning":
    size = cfg["image_size"]
    return {"images": rng.normal(size=(b, size, size, cfg.get("channels", 1))).astype(
        np.float32), "tgt_in": tokens(), "tgt_out": tokens(),
        "weights": np.ones((b, t), np.float32)}
  if task in ("seq2seq", "bart_denoising", "span_corruption"):
    return {"src": tokens(), "tgt_in": tokens(), "tgt_out": tokens(),
            "src_mask": np.ones((b, t), np.int32)}
  batch = {"inputs": tokens(), "targets": tokens()}
  if task in ("mlm", "mlm_nsp", "rtd"):           # rtd: ELECTRA on the mlm batches
    batch["weights"] = (rng.random((b, t)) < 0.5).astype(np.float32)
  if task == "mlm_nsp":
    batch["nsp_labels"] = rng.integers(0, 2, (b,)).astype(np.int32)
  return batch


def run_config(family: str, model: dict) -> ConfigDict:
  return ConfigDict(dict(model=dict(model, family=family), train=common.train(10, 2),
                         optim=common.optim(1e-2, schedule="constant")))


def one_step(config: ConfigDict) -> dict:
  """Init through the shared train-state builder (jitted: one compile, not one per eager op),
  then one jitted train step."""
  module, tx, init_boxed = train_state.train_state_fns(config)
  state = nn.unbox(jax.jit(init_boxed)())
  task = tasks.task_for(config.model)
  batch = batch_for(task.name, np.random.default_rng(0), config.model.to_dict())
  fn = jax.jit(step_lib.make_train_step(module, tx, task))
  new_state, metrics = fn(state, batch, jax.random.key(1))
  assert bool(metrics["finite"]) and np.isfinite(float(metrics["loss"]))
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.any(a != b)),
                                       state["params"], new_state["params"]))
  assert any(moved), "one step must change the parameters"
  return state["params"]


def test_every_registered_family_is_tested_here():
  assert set(models.names()) == set(SMALL)
  # every registered task is some family's (mlm_nsp: bert with model.nsp=True), or chosen by
  # a config's posttrain section (sft, dpo, grpo: tasks.task_for_run)
  trained = {tasks.task_for(dict(SMALL[f], family=f)).name for f in SMALL}
  assert trained | {"sft", "dpo", "grpo"} == set(tasks.names())


# Families whose training through `loop.train` (the same train-state builder, task and train
# step as `one_step`) another test runs: here they are initialised (abstractly) and counted
# only; the others also take one step here.
TRAINED_ELSEWHERE = {
    "decoder": "tests/e2e/test_train.py (shakespeare_char:tiny runs)",
    "bert": "tests/unit/models/test_family_roberta_nsp.py::test_bert_nsp_trains_next_sentence_accuracy_rises",
    "roberta": "tests/unit/models/test_family_roberta_nsp.py::test_roberta_trains_and_its_dynamic_masking_"
               "resumes_exactly",
    "seq2seq": "tests/e2e/test_readme_configs.py (seq2seq_synthetic rows)",
    "vit": "tests/e2e/test_train.py::test_vit_on_digits_trains_keeps_best_and_writes_observability_"
           "files",
    "bart": "tests/unit/models/test_family_bart.py::test_tiny_config_learns_to_denoise",
    "t5": "tests/unit/models/test_family_t5.py::test_span_corruption_trains_with_falling_eval_loss",
    "deberta": "tests/unit/models/test_family_deberta.py::test_tiny_mlm_trains",
    "electra": "tests/unit/models/test_family_electra.py::test_tiny_config_trains_sharded_and_reports_"
               "detection_metrics",
}


@pytest.mark.parametrize("family", [
    f if f in TRAINED_ELSEWHERE else pytest.param(f, marks=pytest.mark.slow)
    for f in sorted(SMALL)])
def test_family_inits_counts_and_trains_one_step(family):
  """Every family's params (every embedding and head present) are what `count_params` counts;
  a family no other test trains takes one train step here."""
  entry = models.get(family)
  config = run_config(family, SMALL[family])
  if family in TRAINED_ELSEWHERE:
    _, _, init_boxed = train_state.train_state_fns(config)
    params = nn.unbox(jax.eval_shape(init_boxed))["params"]
  else:
    params = one_step(config)
  top = set(params)
  for name in entry.embeddings + entry.heads:   # SMALL configs have all of them (untied head)
    assert name in top or name in ABSENT.get(family, ()), (family, name)
  counts = scaling.count_params(dict(SMALL[family], family=family))
  sizes = {k: sum(math.prod(x.shape) for x in jax.tree.leaves(v)) for k, v in params.items()}
  assert counts["total"] == sum(sizes.values())
  assert counts["non_embedding"] == counts["total"] - sum(sizes.get(k, 0)
                                                         for k in entry.embeddings)
  assert counts["backbone"] == counts["total"] - sum(sizes.get(k, 0) for k in entry.heads)


@pytest.mark.parametrize("family", [f for f in sorted(SMALL) if models.get(f).hf_converter])
def test_family_with_a_converter_round_trips_through_hugging_face(family, tmp_path):
  """Params of the family's shapes (drawn at random: the init is not what a round trip
  checks, and its eager ops were most of this test) saved and loaded back unchanged."""
  from jaxformer.convert import hf
  cfg = dict(SMALL[family], family=family, **HF_SMALL.get(family, {}))
  params = drawn.params(models.build(cfg), *scaling.dummy_inputs(cfg))
  hf.save(cfg, params, tmp_path)
  loaded_cfg, loaded = hf.load(tmp_path)
  assert loaded_cfg.family == family
  jax.tree.map(np.testing.assert_array_equal, loaded, jax.tree.map(np.asarray, params))


class Toy(nn.Module):
  """A bigram LM: the smallest model the lm task can train."""
  vocab_size: int
  d_model: int

  @nn.compact
  def __call__(self, tokens, *, deterministic: bool = True):
    x = nn.Embed(self.vocab_size, self.d_model, name="embed")(tokens)
    return nn.Dense(self.vocab_size, name="head")(x)


TOY = dict(name="toy", module=Toy, task="lm", example_inputs=models.token_inputs(1),
           embeddings=("embed",), heads=("head",))


@pytest.fixture
def toy_family():
  entry = models.register(models.Family(**TOY))
  yield entry
  models.unregister("toy")


def test_a_new_family_through_the_registry_alone_counts_and_trains(toy_family):
  cfg = dict(family="toy", vocab_size=11, d_model=4)
  assert set(models.config_fields("toy")) == {"vocab_size", "d_model"}
  counts = scaling.count_params(cfg)
  assert counts["total"] == 11 * 4 + 4 * 11 + 11
  assert counts["non_embedding"] == 4 * 11 + 11 and counts["backbone"] == 11 * 4
  one_step(run_config("toy", cfg))
  with pytest.raises(ValueError, match=r"model.vocab_size is required .*'toy'"):
    models.build(dict(family="toy", d_model=4))
  with pytest.raises(ValueError, match="Hugging Face conversion supports"):
    from jaxformer.convert import hf
    hf.save(cfg, {}, "/nonexistent")


@pytest.mark.parametrize("missing, match", [
    ("example_inputs", "example_inputs is missing"),
    ("embeddings", "embeddings=None must be a tuple"),
    ("heads", "heads=None must be a tuple"),
    ("task", "task=None must be the name of a registered task"),
    ("module", "module=None must be a flax.linen.Module subclass"),
])
def test_an_incomplete_entry_is_refused_naming_what_is_missing(missing, match):
  with pytest.raises(ValueError, match=f"model family 'toy': {match}"):
    models.Family(**{k: v for k, v in TOY.items() if k != missing})


def test_registry_refuses_duplicates_bad_defaults_and_unknown_families(toy_family):
  with pytest.raises(ValueError, match="'toy' is already registered"):
    models.register(models.Family(**TOY))
  with pytest.raises(ValueError, match="no `block: BlockSettings` field"):
    models.Family(**dict(TOY, block_defaults=dict(norm_eps=1e-6)))
  with pytest.raises(ValueError, match=r"unknown keys \['layers'\]"):
    dataclasses.replace(models.get("bert"), block_defaults=dict(layers=2))
  with pytest.raises(ValueError, match="model.family='toy2' is not one of"):
    models.build(dict(family="toy2"))


def test_block_settings_reach_every_transformer_family():
  """One typed object: a block key set on any Transformer family reaches its layers."""
  for family in ("decoder", "bert", "seq2seq", "vit"):
    cfg = dict(SMALL[family], family=family, ffn="swiglu", norm="rmsnorm", num_kv_heads=1,
               num_experts=4, experts_per_token=1, moe_grouped_matmul="blocked")
    module = models.build(cfg)
    assert module.block.moe.grouped_matmul == "blocked" and module.block.num_kv_heads == 1
    shapes = scaling.param_shapes(cfg)
    flat = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]}
    assert any("['ffn']['wi_gate']" in p for p in flat), family       # experts
    assert any("['kv']['kernel']" in p for p in flat), family       # GQA projections
    assert not any("attention_norm']['bias']" in p for p in flat), family   # RMSNorm: no bias


def test_moe_config_keys_name_every_moe_setting_once():
  """The `model.moe_*` keys are written out (grep finds them), one per MoESettings field."""
  import dataclasses
  from jaxformer.layers import block_settings as settings
  fields = [f.name for f in dataclasses.fields(settings.MoESettings)]
  assert sorted(settings._MOE_KEYS.values()) == sorted(fields)
  assert all(k == f or k == f"moe_{f}" for k, f in settings._MOE_KEYS.items())
