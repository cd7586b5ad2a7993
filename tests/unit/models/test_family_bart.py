"""BART (family='bart'): the denoising noise (text infilling + sentence permutation), the model
against transformers' BartForConditionalGeneration (logits, save/load, exact counts of the
published sizes), the variants and refusals, and a short CPU training run."""

import json
import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import bart as bart_configs
from jaxformer import models, scaling
from jaxformer.data import denoising
from jaxformer.models.stack import stack_layers
from jaxformer import tasks
from jaxformer.train import config_checks

TOL = 1e-4
VOCAB = 100
SMALL = dict(family="bart", vocab_size=VOCAB, d_model=32, num_encoder_layers=2,
             num_decoder_layers=2, num_heads=4, mlp_dim=64, max_len=16, dropout_rate=0.0)
RNG = np.random.default_rng(0)
SRC = RNG.integers(3, VOCAB, (2, 10))
TGT = RNG.integers(3, VOCAB, (2, 7))
SRC_MASK = np.ones((2, 10), np.int64)
SRC_MASK[1, 6:] = 0                                    # padding in the second source


# --- the noise -----------------------------------------------------------------------------

def test_span_lengths_are_poisson_and_sum_to_the_masked_count():
  rng = np.random.default_rng(0)
  for m in (0, 1, 7, 300):
    assert denoising.span_lengths(rng, m, 3.0).sum() == m
  # Poisson(3) before the cut: a long draw is Poisson-distributed (mean 3, P(0) = e^-3)
  lengths = denoising.span_lengths(rng, 300_000, 3.0)[:-1]
  assert abs(lengths.mean() - 3.0) < 0.03
  assert abs((lengths == 0).mean() - math.exp(-3)) < 0.004
  assert abs((lengths == 3).mean() - 4.5 * math.exp(-3)) < 0.006     # 3^3 / 3! e^-3


def _runs(masked):
  """Lengths of the runs of True in a bool array."""
  edges = np.diff(np.concatenate([[0], masked.astype(int), [0]]))
  return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def test_text_infilling_masks_30_percent_in_spans_one_mask_each():
  rng = np.random.default_rng(1)
  mask_id, n = 999, 200
  tokens = np.arange(n)
  run_lengths, insertions = [], 0
  for _ in range(200):
    out, masked = denoising.text_infilling(tokens, rng, mask_id=mask_id, mask_ratio=0.3,
                                           lam=3.0)
    assert masked.sum() == 60                              # exactly round(0.3 * n)
    assert len(out) <= n
    np.testing.assert_array_equal(out[out != mask_id], tokens[~masked])   # order kept
    runs = _runs(masked)
    num_masks = int((out == mask_id).sum())
    assert num_masks >= len(runs)                          # one mask per span (+ insertions)
    assert not np.any((out[1:] == mask_id) & (out[:-1] == mask_id))   # spans never touch
    run_lengths += list(runs)
    insertions += num_masks - len(runs)
  # span lengths >= 1 follow Poisson(3) given >= 1 (mean 3 / (1 - e^-3)); the cut last span
  # of each example pulls the mean down a little
  assert abs(np.mean(run_lengths) - 3 / (1 - math.exp(-3))) < 0.15
  # zero-length spans insert a mask: ~e^-3 of ~20 spans per example
  assert 0.5 < insertions / 200 < 1.6
  out, masked = denoising.text_infilling(tokens, rng, mask_id=mask_id, mask_ratio=0.0)
  np.testing.assert_array_equal(out, tokens)


def test_sentence_permutation_is_a_permutation_of_the_sentences():
  rng = np.random.default_rng(2)
  text = np.frombuffer(b"One. Two! Three? Four. Tail", np.uint8)
  delims = [ord("."), ord("!"), ord("?")]
  pieces = [b"One.", b" Two!", b" Three?", b" Four.", b" Tail"]    # each ends a sentence
  orders = set()
  for _ in range(30):
    out = bytes(denoising.permute_sentences(text, rng, delims))
    order, rest = [], out
    while rest:                          # out is the pieces, each once, in some order
      piece = next(p for p in pieces if rest.startswith(p) and p not in order)
      order.append(piece)
      rest = rest[len(piece):]
    assert sorted(order) == sorted(pieces)
    orders.add(out)
  assert len(orders) > 10                # shuffled (5! = 120 orders)
  no_delimiter = np.frombuffer(b"no end", np.uint8)
  np.testing.assert_array_equal(denoising.permute_sentences(no_delimiter, rng, delims),
                                no_delimiter)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
  cfg = bart_configs.get_config("tiny")
  cfg.train.batch_size = 4
  cfg.data.seq_len = 48
  settings = config_checks.validate(cfg)
  task = tasks.task_for(cfg.model)
  pipe = task.make_pipeline(cfg, settings,
                       workdir=str(tmp_path_factory.mktemp("bart_run")))
  return cfg, settings, task, pipe


def test_denoising_batches_are_corrupted_text_in_original_out(pipeline):
  cfg, settings, task, pipe = pipeline
  assert task.name == "bart_denoising" and pipe.info == {"vocab_size": 68}
  assert (pipe.mask_id, pipe.start_id, pipe.pad_id) == (65, 66, 67)
  batch = pipe.train_batch(3)
  spec = task.batch_spec(cfg, settings, models.with_defaults(cfg.model))
  assert spec == {k: (tuple(v.shape), np.asarray(v).dtype) for k, v in batch.items()}
  src, mask, tgt_in, tgt_out = batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_out"]
  np.testing.assert_array_equal(tgt_in[:, 0], 66)
  np.testing.assert_array_equal(tgt_in[:, 1:], tgt_out[:, :-1])
  assert np.all(batch["weights"] == 1)
  for s, m, t in zip(src, mask, tgt_out):
    real = s[m]
    assert np.all(s[~m] == 67) and np.all(t < 65)
    assert (real == 65).any()                                 # masks
    kept = real[real != 65]
    assert len(kept) == round(0.7 * 48)                       # 30 % masked
    assert sorted(kept) != sorted(t) and set(kept) <= set(t)
  again = pipe.train_batch(3)
  for k in batch:                                             # a function of (seed, step)
    np.testing.assert_array_equal(batch[k], again[k])
  assert not np.array_equal(pipe.train_batch(4)["src"], src)
  evals = list(pipe.eval_batches())
  assert len(evals) == cfg.data.eval_batches and np.all(evals[0]["valid"] == 1)


def test_denoising_options_are_checked():
  with pytest.raises(ValueError, match=r"data.mask_ratio=0.6 must be in \[0, 0.5\]"):
    denoising.noise_options({"source": "tinyshakespeare", "mask_ratio": 0.6})
  with pytest.raises(ValueError, match=r"data.poisson_lambda=0(\.0)? must be > 0"):
    denoising.noise_options({"source": "tinyshakespeare", "poisson_lambda": 0})
  with pytest.raises(ValueError, match="data.sentence_delimiters=3 must be a string"):
    denoising.noise_options({"source": "tinyshakespeare", "sentence_delimiters": 3})


# --- the model against transformers ----------------------------------------------------------

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def _hf_config(**kw):
  return transformers.BartConfig(
      vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
      decoder_ffn_dim=64, max_position_embeddings=16, attn_implementation="eager", **kw)


def _theirs(model):
  with torch.no_grad():
    return model(input_ids=torch.tensor(SRC), attention_mask=torch.tensor(SRC_MASK),
                 decoder_input_ids=torch.tensor(TGT)).logits.numpy()


_APPLY = {}


def _ours(config, params, src_mask=SRC_MASK):
  """Logits of our model; one jitted function per config (compiled once per shape)."""
  cfg = models.config_as_dict(config)
  key = json.dumps(cfg, sort_keys=True, default=str)
  if key not in _APPLY:
    module = models.build(cfg)
    _APPLY[key] = jax.jit(lambda p, s, t, m: module.apply({"params": p}, s, t, src_mask=m))
  return np.asarray(_APPLY[key](params, jnp.asarray(SRC, jnp.int32), jnp.asarray(TGT, jnp.int32),
                                jnp.asarray(src_mask)))


@pytest.fixture(scope="module")
def hf_bart(tmp_path_factory):
  """A random BartForConditionalGeneration with scaled embeddings, non-trivial norms and
  biases and a non-zero final_logits_bias, saved and loaded."""
  torch.manual_seed(0)
  model = transformers.BartForConditionalGeneration(_hf_config(scale_embedding=True)).eval()
  with torch.no_grad():
    for _, p in model.named_parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
    model.final_logits_bias.add_(0.1 * torch.randn_like(model.final_logits_bias))
  path = tmp_path_factory.mktemp("hf_bart")
  model.save_pretrained(path / "hf")
  from jaxformer.convert import hf
  config, params = hf.load(path / "hf")
  return model, path, config, params


def test_logits_match_transformers_with_padding_and_round_trip(hf_bart):
  from jaxformer.convert import hf
  model, path, config, params = hf_bart
  assert config.family == "bart" and config.scale_embedding and config.logits_bias
  assert params["encoder_pos_embed"]["embedding"].shape == (16 + 2, 32)
  theirs, ours = _theirs(model), _ours(config, params)
  assert ours.shape == (2, 7, VOCAB)
  assert float(np.abs(ours - theirs).max()) < TOL
  hf.save(config, params, path / "ours")
  reloaded = transformers.BartForConditionalGeneration.from_pretrained(
      path / "ours", attn_implementation="eager").eval()
  assert float(np.abs(_theirs(reloaded) - ours).max()) < TOL
  config2, params2 = hf.load(path / "ours")
  assert config2.to_dict() == config.to_dict()
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  # the padding matters: without the mask the second row's logits change, not the first's
  unmasked = _ours(config, params, np.ones_like(SRC_MASK))
  assert float(np.abs(unmasked[1] - ours[1]).max()) > 1e-3
  np.testing.assert_allclose(unmasked[0], ours[0], atol=1e-6)


def test_bart_model_checkpoint_and_zero_logits_bias_load_without_the_bias(hf_bart, tmp_path):
  """BartModel (facebook/bart-base's architecture) has no final_logits_bias: it loads as
  logits_bias=False, with the logits of BartForConditionalGeneration on the same weights."""
  from jaxformer.convert import hf
  model, _, _, _ = hf_bart
  model.model.save_pretrained(tmp_path / "base")
  config, params = hf.load(tmp_path / "base")
  assert not config.logits_bias and "final_logits_bias" not in params
  with torch.no_grad():
    model.final_logits_bias.zero_()
    try:
      theirs = _theirs(model)
    finally:
      model.final_logits_bias.normal_(0, 0.1)
  assert float(np.abs(_ours(config, params) - theirs).max()) < TOL


def test_tied_copies_in_older_checkpoints_are_dropped_only_when_equal(hf_bart, tmp_path):
  """Older BART files (e.g. facebook/bart-base's .bin) also hold the encoder's and decoder's
  embed_tokens and lm_head: copies of model.shared, dropped; a copy that differs is refused."""
  import shutil
  from safetensors.numpy import load_file, save_file
  from jaxformer.convert import hf
  _, path, config, params = hf_bart
  tensors = load_file(path / "hf" / "model.safetensors")
  shared = tensors["model.shared.weight"]
  copies = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
            "lm_head.weight")
  for name, changed in ((None, None), ("lm_head.weight", 1.0)):
    out = tmp_path / str(name)
    out.mkdir()
    shutil.copy(path / "hf" / "config.json", out / "config.json")
    extra = {c: shared + (changed if c == name else 0.0) for c in copies}
    save_file({**tensors, **extra}, out / "model.safetensors", metadata={"format": "pt"})
    if name is None:
      jax.tree.map(np.testing.assert_array_equal, hf.load(out)[1], params)
    else:
      with pytest.raises(ValueError, match="tensors jaxformer does not use.*lm_head.weight"):
        hf.load(out)


def test_save_accepts_scanned_params(hf_bart, tmp_path):
  """Both stacks scanned (`layers` subtrees): hf.save unstacks each with its own layer count
  (the scanned model's own layout; scan = unrolled is tests/unit/models/test_models.py's)."""
  from jaxformer.convert import hf
  _, _, config, params = hf_bart
  scanned = dict(params, encoder=stack_layers(params["encoder"], 2),
                 decoder=stack_layers(params["decoder"], 2))
  scanned_config = config.copy_and_resolve_references()
  scanned_config.scan_layers = True
  shapes = scaling.param_shapes(scanned_config)
  assert jax.tree.map(np.shape, scanned) == jax.tree.map(lambda s: s.shape, shapes)
  hf.save(scanned_config, {"params": scanned}, tmp_path)
  jax.tree.map(np.testing.assert_array_equal, hf.load(tmp_path)[1], params)


@pytest.mark.parametrize("name", ["base", "large"])
def test_published_counts_equal_transformers_num_parameters(name):
  """bart-base/large built on torch's meta device (no memory): num_parameters() counts the
  shared embedding once and not the final_logits_bias buffer, as count_params does."""
  layers, d, heads, ffn, published = bart_configs.SIZES[name]
  with torch.device("meta"):
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=50265, d_model=d, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn, max_position_embeddings=1024))
  cfg = bart_configs.get_config(name)
  counts = scaling.count_params(cfg.model)
  assert counts["total"] == model.num_parameters() == published == cfg.reference.params
  assert counts["non_embedding"] == counts["total"] - 50265 * d - 2 * 1026 * d


def test_tiny_config_counts_its_params_and_big_ones_build_abstractly():
  cfg = bart_configs.get_config()                       # arg None: tiny
  module = models.build(cfg.model)
  shapes = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((2, 8), jnp.int32),
                          jnp.zeros((2, 5), jnp.int32))
  assert sum(x.size for x in jax.tree.leaves(nn.unbox(shapes)["params"])) == \
      scaling.count_params(cfg.model)["total"]
  large = bart_configs.get_config("large").model
  out = jax.eval_shape(lambda s, t: models.build(large).init_with_output(
      jax.random.key(0), s, t)[0], jax.ShapeDtypeStruct((1, 1024), jnp.int32),
      jax.ShapeDtypeStruct((1, 9), jnp.int32))
  assert out.shape == (1, 9, 50265) and out.dtype == jnp.float32
  flops = scaling.flops_per_token(large, 1024)
  assert flops == 6 * scaling.count_params(large)["non_embedding"] + 6 * 36 * 1024 * 1024


def test_a_zero_logits_bias_parameter_round_trips(tmp_path):
  """logits_bias=True params as `init` makes them (a zero bias) load back with the parameter
  (config.json says so); a zero buffer from transformers loads without it (tested above)."""
  from jaxformer.convert import hf
  cfg = dict(SMALL, logits_bias=True)
  params = jax.tree.map(lambda s: np.full(s.shape, 0.5, np.float32), scaling.param_shapes(cfg))
  params["final_logits_bias"][:] = 0
  hf.save(cfg, params, tmp_path)
  config, loaded = hf.load(tmp_path)
  assert config.logits_bias
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_pre_norm_variant_has_final_norms_and_is_not_saved_as_bart(tmp_path):
  from jaxformer.convert import hf
  cfg = dict(SMALL, pre_norm=True)
  shapes = nn.unbox(jax.eval_shape(models.build(cfg).init, jax.random.key(0),
                                   jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 3), jnp.int32)))
  assert {"encoder_norm", "decoder_norm"} <= set(shapes["params"])
  assert "encoder_norm" not in scaling.param_shapes(SMALL)
  params = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), shapes)
  with pytest.raises(ValueError, match="pre_norm"):
    hf.save(cfg, params, tmp_path)


@pytest.mark.parametrize("change, match", [
    (dict(parametrization="mup", mup_base_width=16), "not available for the bart family"),
    (dict(norm="rmsnorm"), "model.norm='rmsnorm'"),
    (dict(num_heads=5), "model.num_heads=5 does not divide model.d_model=32"),
    (dict(max_len=0), "model.max_len=0 must be an int > 0"),
])
def test_bad_configs_are_refused_naming_the_field(change, match):
  with pytest.raises(ValueError, match=match):
    models.build(dict(SMALL, **change))


def test_too_long_input_is_refused_naming_max_len():
  module = models.build(SMALL)
  with pytest.raises(ValueError, match="exceeds model.max_len=16"):
    jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1, 17), jnp.int32),
                   jnp.zeros((1, 3), jnp.int32))


def test_sharded_over_data_and_model_matches_single_device(hf_bart):
  """The logical axis names of every BART param map onto a (data 2, model 4) mesh and give
  the same logits."""
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  from jaxformer.parallel.rules import MESH_AXES, logical_axis_rules
  _, _, config, params = hf_bart
  module = models.build(config)
  boxed = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((2, 10), jnp.int32),
                         jnp.zeros((2, 7), jnp.int32))
  mesh = jax.make_mesh((2, 4, 1), MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  rules = logical_axis_rules()
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)["params"]
  assert shardings["decoder"]["layers_0"]["block"]["cross_attention"]["kv"]["kernel"].spec == \
      P(None, None, "model", None)
  sharded = jax.device_put(params, shardings)

  @jax.jit
  def apply(p, s, t, m):
    with nn.logical_axis_rules(rules):
      return module.apply({"params": p}, s, t, src_mask=m)

  data = NamedSharding(mesh, P("data"))
  with jax.set_mesh(mesh):
    got = apply(sharded, *(jax.device_put(jnp.asarray(x, jnp.int32), data)
                           for x in (SRC, TGT, SRC_MASK)))
  np.testing.assert_allclose(np.asarray(got), _ours(config, params), atol=1e-5)


def test_plan_builds_and_lowers_the_sharded_train_step():
  """What `jaxformer.plan` compiles: the trainer's step for configs/bart.py:tiny on a
  (data 2, model 2) mesh, with the bart_denoising batch layout (lowered, not compiled)."""
  from jaxformer.train.program import build_program
  cfg = bart_configs.get_config("tiny")
  cfg.model.update(d_model=32, mlp_dim=64, max_len=32)
  cfg.data.seq_len = 32
  cfg.train.batch_size = 4
  cfg.mesh.update(data=2, model=2)
  program = build_program(cfg, jax.devices()[:4])
  assert set(program.batch) == {"src", "src_mask", "tgt_in", "tgt_out", "weights"}
  assert program.batch["src"].shape == (4, 32)
  assert program.step.lower(*program.args).as_text()


# --- training ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_tiny_config_learns_to_denoise(tmp_path, monkeypatch):
  """configs/bart.py:tiny for 60 steps on tiny Shakespeare: the eval loss falls."""
  from jaxformer.train import loop
  from tests.runs import on_one_device
  on_one_device(monkeypatch)
  from jaxformer.train.metrics import read
  cfg = bart_configs.get_config("tiny")
  cfg.model.update(d_model=32, mlp_dim=64, num_heads=2, max_len=32)
  cfg.data.update(seq_len=32, eval_batches=2)
  cfg.train.update(steps=40, batch_size=16, eval_every=20, log_every=10, checkpoint_every=40,
                   sample_tokens=0, attention_maps=False)
  cfg.optim.update(warmup_steps=5, lr=3e-3)
  loop.train(cfg, str(tmp_path / "run"))
  evals = [r for r in read(str(tmp_path / "run" / "metrics.jsonl")) if "eval_loss" in r]
  assert [r["step"] for r in evals] == [20, 40]
  assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] < math.log(68)
