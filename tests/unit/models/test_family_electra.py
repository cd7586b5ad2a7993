"""ELECTRA (`family='electra'`): Hugging Face parity of the discriminator
(ElectraForPreTraining) and generator (ElectraForMaskedLM), exact published parameter
counts, the joint pretraining model and its replaced-token-detection objective, and a short
CPU training run."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import electra as electra_configs
from jaxformer import models, scaling, tasks
from jaxformer.models.electra import role_config, split_pretraining
from jaxformer.train import step as step_lib

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

TOL = 1e-4
VOCAB, T = 100, 10
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, T))
MASK = np.ones((2, T), np.int64)
MASK[1, 6:] = 0                                       # padding in the second sequence
TYPES = np.zeros((2, T), np.int64)
TYPES[:, 5:] = 1
EAGER = dict(attn_implementation="eager")
# (HF class, config): embeddings projected (24 -> 32, 24 -> 16) and not (32 = 32)
HF_CASES = {
    "discriminator": ("ElectraForPreTraining", dict(embedding_size=24, hidden_size=32,
                                                    num_attention_heads=4,
                                                    intermediate_size=64)),
    "discriminator_same_width": ("ElectraForPreTraining", dict(
        embedding_size=32, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        hidden_act="gelu_new")),
    "generator": ("ElectraForMaskedLM", dict(embedding_size=24, hidden_size=16,
                                             num_attention_heads=2, intermediate_size=32)),
}
PRETRAIN = dict(family="electra", vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4,
                mlp_dim=64, embedding_size=24, generator_d_model=16, generator_num_heads=2,
                generator_mlp_dim=32, generator_num_layers=1, max_len=16, dropout_rate=0.0,
                attention_dropout_rate=0.0)


def _hf_model(kind):
  cls, kw = HF_CASES[kind]
  torch.manual_seed(0)
  model = getattr(transformers, cls)(transformers.ElectraConfig(
      vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=16, **kw, **EAGER))
  with torch.no_grad():                   # non-trivial norms and biases (HF inits 1 / 0)
    for _, p in model.named_parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def _theirs(model):
  with torch.no_grad():
    return model(torch.tensor(TOKENS), token_type_ids=torch.tensor(TYPES),
                 attention_mask=torch.tensor(MASK)).logits.numpy()


def _ours(config, params):
  module = models.build(config)
  fn = jax.jit(lambda p: module.apply({"params": p}, jnp.asarray(TOKENS, jnp.int32),
                                      token_type_ids=jnp.asarray(TYPES, jnp.int32),
                                      attention_mask=jnp.asarray(MASK)))
  return np.asarray(fn(params))


@pytest.mark.parametrize("kind", sorted(HF_CASES))
def test_logits_match_transformers_and_round_trip(kind, tmp_path):
  from jaxformer.convert import hf
  model = _hf_model(kind)
  model.save_pretrained(tmp_path / "hf")
  config, params = hf.load(tmp_path / "hf")
  assert config.role == kind.split("_")[0]
  theirs, ours = _theirs(model), _ours(config, params)
  assert ours.shape == theirs.shape == ((2, T) if "disc" in kind else (2, T, VOCAB))
  assert float(np.abs(ours - theirs).max()) < TOL

  hf.save(config, params, tmp_path / "ours")
  reloaded = type(model).from_pretrained(tmp_path / "ours", **EAGER).eval()
  assert float(np.abs(ours - _theirs(reloaded)).max()) < TOL
  config2, params2 = hf.load(tmp_path / "ours")
  assert config2.to_dict() == config.to_dict()
  jax.tree.map(np.testing.assert_array_equal, params, params2)


@pytest.mark.parametrize("name", ["small", "base"])
def test_published_counts_equal_transformers_exactly(name):
  """Both halves of configs/electra.py:<name> against transformers built from the same
  values on the meta device, and the joint model = both less the shared embeddings."""
  cfg = electra_configs.get_config(name)
  counts = {}
  for role, cls in (("discriminator", "ElectraForPreTraining"),
                    ("generator", "ElectraForMaskedLM")):
    ours = role_config(cfg.model, role)
    with torch.device("meta"):
      theirs = getattr(transformers, cls)(transformers.ElectraConfig(
          vocab_size=ours["vocab_size"], embedding_size=ours["embedding_size"],
          hidden_size=ours["d_model"], num_hidden_layers=ours["num_layers"],
          num_attention_heads=ours["num_heads"], intermediate_size=ours["mlp_dim"],
          max_position_embeddings=ours["max_len"]))
    counts[role] = scaling.count_params(ours)["total"]
    assert counts[role] == theirs.num_parameters()
    assert counts[role] == cfg.reference[f"{role}_params"]
  e, m = cfg.model.embedding_size, cfg.model
  shared = (m.vocab_size + m.max_len + m.type_vocab_size + 2) * e
  joint = scaling.count_params(cfg.model)["total"]
  assert joint == counts["discriminator"] + counts["generator"] - shared == cfg.reference.params


@pytest.fixture(scope="module")
def pretraining():
  """(module, params, pretrain): `pretrain` is the jitted (params, batch, key) -> outputs."""
  module = models.build(PRETRAIN)
  params = nn.unbox(jax.jit(module.init)(jax.random.key(0), jnp.zeros((2, T), jnp.int32)))
  pretrain = jax.jit(lambda p, b, key: module.apply(
      {"params": p}, b["inputs"], b["targets"], b["weights"], key, method="pretrain"))
  return module, params["params"], pretrain


def test_pretraining_shares_embeddings_and_splits_into_hf_models(pretraining, tmp_path):
  from jaxformer.convert import hf
  module, params, _ = pretraining
  assert {"embed", "pos_embed", "type_embed", "embed_norm", "embed_proj", "encoder",
          "gen_embed_proj", "gen_encoder", "gen_dense", "gen_norm", "gen_bias", "disc_dense",
          "disc_out"} == set(params)
  assert params["embed"]["embedding"].shape == (VOCAB, 24)        # one table, both models
  tokens = jnp.asarray(TOKENS, jnp.int32)
  kw = dict(token_type_ids=jnp.asarray(TYPES, jnp.int32), attention_mask=jnp.asarray(MASK))
  disc, gen = jax.jit(lambda p: (module.apply({"params": p}, tokens, **kw), module.apply(
      {"params": p}, tokens, method="generator", **kw)))(params)
  assert disc.shape == (2, T) and gen.shape == (2, T, VOCAB)
  with pytest.raises(ValueError, match="split_pretraining"):
    hf.save(PRETRAIN, params, tmp_path / "joint")
  for role, (cfg, half), want in zip(("discriminator", "generator"),
                                     split_pretraining(PRETRAIN, params).values(), (disc, gen)):
    assert cfg["role"] == role
    np.testing.assert_allclose(_ours(cfg, half), want, atol=1e-6)
    hf.save(cfg, half, tmp_path / role)
    arch = "ElectraForPreTraining" if role == "discriminator" else "ElectraForMaskedLM"
    theirs = getattr(transformers, arch).from_pretrained(tmp_path / role, **EAGER).eval()
    assert float(np.abs(_theirs(theirs) - np.asarray(want)).max()) < TOL


def _batch(seed=0, b=4, t=T):
  rng = np.random.default_rng(seed)
  targets = rng.integers(0, VOCAB - 1, (b, t)).astype(np.int32)
  weights = (rng.random((b, t)) < 0.3).astype(np.float32)
  weights[:, 0] = 1
  inputs = np.where(weights > 0, VOCAB - 1, targets).astype(np.int32)     # [MASK] = 99
  return {"inputs": inputs, "targets": targets, "weights": weights}


def test_pretrain_samples_with_the_key_and_labels_replacements(pretraining):
  _, params, pretrain = pretraining
  b = _batch()
  run = lambda key: pretrain(params, b, key)
  one, same, other = run(jax.random.key(1)), run(jax.random.key(1)), run(jax.random.key(2))
  np.testing.assert_array_equal(one["corrupted"], same["corrupted"])
  assert np.any(np.asarray(one["corrupted"]) != np.asarray(other["corrupted"]))
  keep = b["weights"] == 0
  np.testing.assert_array_equal(np.asarray(one["corrupted"])[keep], b["targets"][keep])
  np.testing.assert_array_equal(one["replaced"], np.asarray(one["corrupted"]) != b["targets"])
  assert one["mlm_logits"].shape == (4, T, VOCAB) and one["rtd_logits"].shape == (4, T)


def _sums(s: tasks.LossSums):
  """A task's LossSums as the train step's (total, (nll, correct, metrics))."""
  return s.weighted, (s.nll, s.correct, s.metrics)


def test_rtd_objective_is_mlm_plus_lambda_detection_and_trains_both(pretraining):
  """The step's loss is MLM mean + λ x BCE mean (float64 NumPy from the same forward pass,
  the same sample) and its accuracy the detection accuracy; the generator and the
  discriminator both get gradients."""
  module, params, pretrain = pretraining
  task = tasks.task_for(PRETRAIN)
  assert task.name == "rtd" and task.kind == "mlm"        # the mlm batches
  b = _batch()
  rng = jax.random.key(5)
  value_and_grad = jax.jit(jax.value_and_grad(
      lambda p: _sums(task.loss(tasks.LossContext(module, p, rng), b)), has_aux=True))
  (total, (nll, correct, metrics)), grads = value_and_grad(params)
  out = pretrain(params, b, jax.random.fold_in(rng, 1))
  logits = np.asarray(out["mlm_logits"], np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  mlm = -(np.take_along_axis(logp, b["targets"][..., None], -1)[..., 0] * b["weights"]).sum()
  mlm /= b["weights"].sum()
  z, y = np.asarray(out["rtd_logits"], np.float64), np.asarray(out["replaced"], np.float64)
  bce = np.mean(np.log1p(np.exp(-z)) * y + np.log1p(np.exp(z)) * (1 - y))
  np.testing.assert_allclose(float(total) / b["weights"].sum(), mlm + 50 * bce, rtol=1e-5)
  np.testing.assert_allclose(float(nll), float(total))       # the step's loss: the objective
  np.testing.assert_allclose(float(correct) / b["weights"].sum(),
                             np.mean((z > 0) == (y > 0)), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["disc_loss"]), bce, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["mlm_loss"]), mlm, rtol=1e-5)
  norm = lambda tree: float(sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(tree)))
  for name in ("gen_encoder", "gen_dense", "gen_bias", "encoder", "disc_out", "embed"):
    assert norm(grads[name]) > 0, name


def test_eval_reports_detection_accuracy_and_its_baseline(pretraining):
  module, params, _ = pretraining
  task = tasks.task_for(PRETRAIN)
  step = jax.jit(step_lib.make_eval_step(module, task))
  b = _batch(1)
  totals = jax.tree.map(jnp.add, step(params, b), step(params, _batch(2)))
  record = task.finalize(jax.device_get(totals))
  assert set(record) >= {"eval_loss", "eval_accuracy", "eval_disc_baseline", "eval_disc_loss",
                         "eval_mlm_loss", "eval_mlm_accuracy", "eval_replaced_recall",
                         "eval_replaced_precision", "eval_disc_prior_loss"}
  # the prior-proof pair and the constant guess's loss, from the outputs in NumPy
  outs = [pretraining[2](params, bb, jax.random.key(0)) for bb in (b, _batch(2))]
  z = np.concatenate([np.ravel(o["rtd_logits"]) for o in outs]) > 0
  y = np.concatenate([np.ravel(o["replaced"]) for o in outs])
  np.testing.assert_allclose(record["eval_replaced_recall"], (z & y).sum() / y.sum(), rtol=1e-6)
  np.testing.assert_allclose(record["eval_replaced_precision"], (z & y).sum() / z.sum(),
                             rtol=1e-6)
  np.testing.assert_allclose(record["eval_disc_baseline"], 1 - y.mean(), rtol=1e-6)
  p = y.mean()
  np.testing.assert_allclose(record["eval_disc_prior_loss"],
                             -(p * np.log(p) + (1 - p) * np.log(1 - p)), rtol=1e-6)
  np.testing.assert_allclose(record["eval_loss"],
                             record["eval_mlm_loss"] + 50 * record["eval_disc_loss"], rtol=1e-6)
  np.testing.assert_array_equal(step(params, b)["disc_correct"], step(params, b)["disc_correct"])
  assert 0 < record["eval_disc_baseline"] < 1


@pytest.mark.parametrize("change, match", [
    (dict(role="critic"), r"model.role='critic' is not one of"),
    (dict(role="discriminator"), r"model.generator_d_model=16 sizes the generator"),
    (dict(generator_num_heads=3), r"model.generator_num_heads=3 does not divide "
                                  r"model.generator_d_model=16"),
    (dict(parametrization="mup", mup_base_width=32), r"model.parametrization='mup' is not "
                                                     r"available for model.role='pretraining'"),
    (dict(disc_weight=0.0), r"model.disc_weight=0.0 must be > 0"),
    (dict(num_experts=2), r"model.num_experts=2: ELECTRA's blocks are dense"),
])
def test_bad_config_names_the_field(change, match):
  with pytest.raises(ValueError, match=match):
    models.build(dict(PRETRAIN, **change))


def test_pretrain_refuses_single_roles():
  cfg = role_config(PRETRAIN, "discriminator")
  module = models.build(cfg)
  params = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  b = _batch()
  with pytest.raises(ValueError, match="model.role='discriminator'.*'pretraining'"):
    jax.eval_shape(lambda p: module.apply(p, b["inputs"], b["targets"], b["weights"],
                                          jax.random.key(0), method="pretrain"), params)


@pytest.mark.slow
def test_tiny_config_trains_sharded_and_reports_detection_metrics(tmp_path):
  """configs/electra.py:tiny, narrower and short, on a (data 4, model 2) FSDP mesh: the
  joint loss falls from its initial value (MLM ~ln 66, detection BCE ~ln 2), the MLM loss
  below the uniform generator's, the detection loss below the constant guess's (accuracy alone proves
  nothing: calling every token original scores the baseline), and eval reports detection
  accuracy next to that baseline."""
  from jaxformer.train import loop
  from jaxformer.train.metrics import read
  cfg = electra_configs.get_config("tiny")
  cfg.model.update(d_model=32, num_heads=2, mlp_dim=64, embedding_size=16, generator_d_model=16,
                   generator_mlp_dim=32, max_len=32)
  cfg.data.update(seq_len=32, eval_batches=2)
  cfg.train.update(steps=60, batch_size=8, eval_every=30, log_every=10, checkpoint_every=60,
                   attention_maps=False)
  cfg.optim.update(warmup_steps=10)
  cfg.mesh.update(data=-1, model=2, fsdp=True)
  workdir = str(tmp_path / "electra")
  last = loop.train(cfg, workdir)
  records = read(os.path.join(workdir, "metrics.jsonl"))
  evals = [r for r in records if "eval_loss" in r]
  assert [r["step"] for r in evals] == [30, 60]
  assert last["eval_mlm_loss"] < np.log(66) - 0.1 and last["eval_disc_loss"] < 0.6
  assert last["eval_loss"] < np.log(66) + 50 * 0.6
  assert 0.7 < last["eval_disc_baseline"] < 1 and last["eval_accuracy"] > 0.7
  assert last["eval_disc_loss"] < last["eval_disc_prior_loss"]
  assert last["eval_replaced_precision"] > 0
