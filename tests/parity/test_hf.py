"""Hugging Face conversion (`jaxformer.convert.hf`) against transformers' PyTorch models.

Tiny randomly initialised transformers models are saved to a temporary directory, loaded with
`hf.load`, run with `models.build` and compared in float32 with transformers' forward pass;
then `hf.save` writes them back and transformers loads the result. No network access.
"""

import json
import os
import pathlib
import shutil

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import flax.linen as nn
import jax
import jax.numpy as jnp
from safetensors.numpy import load_file, save_file

from jaxformer import models
from jaxformer.convert import hf
from jaxformer.convert.hf import io as hf_io
from jaxformer.models.stack import stack_layers
from tests.user_errors import user_error as _user_error

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
torch.set_num_threads(1)

TOL = 1e-4
VOCAB, T = 100, 10
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, T))
IMAGES = np.random.default_rng(1).normal(size=(2, 16, 16, 3)).astype(np.float32)
MASK = np.ones((2, T), np.int64)
MASK[1, 6:] = 0                                       # padding in the second sequence
TYPES = np.zeros((2, T), np.int64)
TYPES[:, 5:] = 1
EAGER = dict(attn_implementation="eager")


def _decoder(kind):
  tf = transformers
  if kind == "gpt2":
    return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32,
                                            n_layer=2, n_head=4, **EAGER))
  if kind == "llama_gqa":                 # GQA, head_dim 12 with hidden 40 (H*D != E), untied
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=40, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=32,
        rope_theta=500.0, rms_norm_eps=1e-5, **EAGER))
  if kind == "llama_mha_bias":            # MHA (fused qkv), tied, attention biases only
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
        attention_bias=True, mlp_bias=False, **EAGER))
  if kind == "mistral":                   # sliding window 4 < sequence length 10
    return tf.MistralForCausalLM(tf.MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=4, **EAGER))
  if kind == "mixtral":
    return tf.MixtralForCausalLM(tf.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, **EAGER))
  raise ValueError(kind)


def _bert(cls=None):
  cls = cls or transformers.BertForMaskedLM
  return cls(transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=16, **EAGER))


def _vit(cls=None):
  cls = cls or transformers.ViTForImageClassification
  return cls(transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=32,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, num_labels=5, **EAGER))


def _make(kind):
  torch.manual_seed(0)
  model = {"bert": _bert, "vit": _vit}.get(kind, lambda: _decoder(kind))()
  with torch.no_grad():                   # non-trivial norms and biases (HF inits 1 / 0)
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def _theirs(model):
  with torch.no_grad():
    if isinstance(model, transformers.BertForMaskedLM):
      return model(torch.tensor(TOKENS), token_type_ids=torch.tensor(TYPES),
                   attention_mask=torch.tensor(MASK)).logits.numpy()
    if isinstance(model, transformers.ViTForImageClassification):
      return model(torch.tensor(IMAGES.transpose(0, 3, 1, 2))).logits.numpy()
    return model(torch.tensor(TOKENS)).logits.numpy()


def _ours(config, params):
  module = models.build(config)
  if config["family"] == "bert":
    fn = lambda p: module.apply({"params": p}, jnp.asarray(TOKENS, jnp.int32),
                                token_type_ids=jnp.asarray(TYPES, jnp.int32),
                                attention_mask=jnp.asarray(MASK))
  elif config["family"] == "vit":
    fn = lambda p: module.apply({"params": p}, jnp.asarray(IMAGES))
  else:
    fn = lambda p: module.apply({"params": p}, jnp.asarray(TOKENS, jnp.int32))
  return np.asarray(jax.jit(fn)(params))


def _assert_same_params(a, b):
  fa = jax.tree_util.tree_flatten_with_path(a)[0]
  fb = jax.tree_util.tree_flatten_with_path(b)[0]
  assert [p for p, _ in fa] == [p for p, _ in fb]
  for (path, x), (_, y) in zip(fa, fb):
    assert x.dtype == np.float32 and np.array_equal(x, y), jax.tree_util.keystr(path)


KINDS = ["gpt2", "llama_gqa", "llama_mha_bias", "mistral", "mixtral", "bert", "vit"]


@pytest.mark.filterwarnings("ignore:.*freshly initialised")   # BertForMaskedLM: no pooler
@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers_and_round_trip(kind, tmp_path):
  model = _make(kind)
  model.save_pretrained(tmp_path / "hf")
  config, params = hf.load(tmp_path / "hf")
  theirs = _theirs(model)
  ours = _ours(config, params)
  assert ours.shape == theirs.shape
  diff = float(np.abs(ours - theirs).max())
  print(f"{kind}: max |ours - transformers| = {diff:.2e}")
  assert diff < TOL

  hf.save(config, params, tmp_path / "ours")
  reloaded = type(model).from_pretrained(tmp_path / "ours", **EAGER).eval()
  assert float(np.abs(ours - _theirs(reloaded)).max()) < TOL
  config2, params2 = hf.load(tmp_path / "ours")
  assert config2.to_dict() == config.to_dict()
  _assert_same_params(params, params2)


def test_config_fields(tmp_path):
  cfg = {}
  for kind in ("gpt2", "llama_gqa", "mistral", "mixtral"):
    _make(kind).save_pretrained(tmp_path / kind)
    cfg[kind] = hf.load(tmp_path / kind)[0]
  assert cfg["gpt2"].positions == "learned" and cfg["gpt2"].norm == "layernorm"
  assert cfg["gpt2"].activation == "gelu" and cfg["gpt2"].tie_embeddings
  assert cfg["gpt2"].mlp_dim == 4 * 32
  llama = cfg["llama_gqa"]
  assert (llama.positions, llama.norm, llama.ffn, llama.activation) == (
      "rope", "rmsnorm", "swiglu", "silu")
  assert (llama.num_heads, llama.num_kv_heads, llama.head_dim) == (4, 2, 12)
  assert llama.rope_theta == 500.0 and llama.norm_eps == 1e-5 and not llama.tie_embeddings
  assert cfg["mistral"].window == 3                    # sliding_window=4 -> 3 keys to the left
  assert cfg["mixtral"].num_experts == 4 and cfg["mixtral"].experts_per_token == 2


def test_mistral_window_is_exercised(tmp_path):
  """The sliding window matters at this length, and its off-by-one is pinned down."""
  model = _make("mistral")
  model.save_pretrained(tmp_path)
  config, params = hf.load(tmp_path)
  theirs = _theirs(model)
  for window in (None, config.window + 1, config.window - 1):
    other = config.copy_and_resolve_references()
    other.window = window
    assert float(np.abs(_ours(other, params) - theirs).max()) > 1e-3


def test_pytorch_bin_and_sharded_and_bf16_checkpoints(tmp_path):
  model = _make("llama_gqa")
  model.save_pretrained(tmp_path / "single")
  config, params = hf.load(tmp_path / "single")

  # pytorch_model.bin (transformers 5 only writes safetensors; write the .bin ourselves)
  os.makedirs(tmp_path / "bin")
  state = {k: torch.from_numpy(v) for k, v in
           load_file(tmp_path / "single" / "model.safetensors").items()}
  torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
  with open(tmp_path / "single" / "config.json") as f:
    (tmp_path / "bin" / "config.json").write_text(f.read())
  config_bin, params_bin = hf.load(tmp_path / "bin")
  assert config_bin.to_dict() == config.to_dict()
  _assert_same_params(params, params_bin)

  # sharded safetensors with model.safetensors.index.json
  model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
  assert os.path.exists(tmp_path / "sharded" / "model.safetensors.index.json")
  assert not os.path.exists(tmp_path / "sharded" / "model.safetensors")
  _assert_same_params(params, hf.load(tmp_path / "sharded")[1])

  # bfloat16 weights (NumPy has no bfloat16; decoded with ml_dtypes) come back as float32
  import ml_dtypes
  model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
  _, params_bf16 = hf.load(tmp_path / "bf16")
  _assert_same_params(
      jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), params),
      params_bf16)


@pytest.mark.parametrize("config", [
    dict(family="decoder", vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4,
         num_kv_heads=2, mlp_dim=48, positions="rope", norm="rmsnorm", ffn="swiglu",
         use_bias=False, tie_embeddings=False, window=5, rope_theta=1000.0),
    dict(family="decoder", vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, mlp_dim=48,
         max_len=16, use_bias=False, activation="gelu_exact")],
    ids=["mistral", "gpt2_no_bias"])
def test_save_from_our_init(config, tmp_path):
  """jaxformer-made params (boxed as `init` returns them; minimal config) load in
  transformers. Random values instead of `init`, whose compile is slow on CPU."""
  module = models.build(config)
  shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))
  rng = np.random.default_rng(0)
  variables = jax.tree.map(lambda s: rng.normal(0, 0.3, s.shape).astype(np.float32), shapes)
  hf.save(config, variables, tmp_path)
  arch = json.loads((tmp_path / "config.json").read_text())["architectures"][0]
  assert arch == ("MistralForCausalLM" if config.get("window") else "GPT2LMHeadModel")
  theirs = _theirs(getattr(transformers, arch).from_pretrained(tmp_path, **EAGER).eval())
  ours = _ours(config, nn.unbox(variables)["params"])
  assert float(np.abs(ours - theirs).max()) < TOL


def test_save_accepts_scanned_params(tmp_path):
  model = _make("mixtral")
  model.save_pretrained(tmp_path / "hf")
  config, params = hf.load(tmp_path / "hf")
  scanned = dict(params, decoder=stack_layers(params["decoder"], config.num_layers))
  scanned_config = config.copy_and_resolve_references()
  scanned_config.scan_layers = True
  np.testing.assert_allclose(_ours(scanned_config, scanned), _ours(config, params), atol=1e-5)
  hf.save(scanned_config, {"params": scanned}, tmp_path / "ours")
  _assert_same_params(params, hf.load(tmp_path / "ours")[1])


def test_base_models_bert_and_vit(tmp_path):
  torch.manual_seed(0)
  bert = _bert(transformers.BertModel).eval()
  bert.save_pretrained(tmp_path / "bert")
  with pytest.warns(UserWarning, match="freshly initialised"):
    config, params = hf.load(tmp_path / "bert")
  module = models.build(config)
  seq, pooled = jax.jit(lambda p: module.apply(
      {"params": p}, jnp.asarray(TOKENS, jnp.int32), token_type_ids=jnp.asarray(TYPES, jnp.int32),
      attention_mask=jnp.asarray(MASK), method=type(module).encode))(params)
  with torch.no_grad():
    out = bert(torch.tensor(TOKENS), token_type_ids=torch.tensor(TYPES),
               attention_mask=torch.tensor(MASK))
  assert float(np.abs(np.asarray(seq) - out.last_hidden_state.numpy()).max()) < TOL
  assert float(np.abs(np.asarray(pooled) - out.pooler_output.numpy()).max()) < TOL

  vit = _vit(transformers.ViTModel).eval()
  vit.save_pretrained(tmp_path / "vit")
  with pytest.warns(UserWarning, match="pooler"):
    config, params = hf.load(tmp_path / "vit")
  assert config.num_classes == 5 and not params["head"]["kernel"].any()
  vit_cls = _vit()                        # the same backbone with a random head on both sides
  missing, _ = vit_cls.vit.load_state_dict(vit.state_dict(), strict=False)
  assert not missing
  head = np.random.default_rng(2).normal(size=(32, 5)).astype(np.float32)
  params["head"]["kernel"] = head
  with torch.no_grad():
    vit_cls.classifier.weight.copy_(torch.from_numpy(head.T))
    vit_cls.classifier.bias.zero_()
  theirs = _theirs(vit_cls.eval())
  assert np.abs(theirs).max() > 0.1
  np.testing.assert_allclose(_ours(config, params), theirs, atol=TOL)


@pytest.mark.parametrize("arch,model_type", [("OPTForCausalLM", "opt"),
                                             ("T5ForConditionalGeneration", "t5")])
def test_unsupported_architecture(tmp_path, arch, model_type):
  (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch],
                                                    "model_type": model_type}))
  save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match=arch):
    hf.load(tmp_path)


def test_missing_and_unexpected_tensors(tmp_path):
  model = _make("gpt2")
  model.save_pretrained(tmp_path)
  _, params = hf.load(tmp_path)
  file = str(tmp_path / "model.safetensors")
  tensors = load_file(file)
  name = "transformer.h.1.mlp.c_fc.weight"
  save_file({k: v for k, v in tensors.items() if k != name}, file, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=name.replace(".", r"\.")):
    hf.load(tmp_path)
  # the original GPT-2 layout: no "transformer." prefix, attention-mask buffers, tied lm_head
  legacy = {k.removeprefix("transformer."): v for k, v in tensors.items()}
  legacy.update({"h.0.attn.bias": np.ones((1, 1, 16, 16), np.float32),
                 "h.0.attn.masked_bias": np.full((), -1e4, np.float32),
                 "lm_head.weight": tensors["transformer.wte.weight"]})
  save_file(legacy, file, metadata={"format": "pt"})
  _assert_same_params(hf.load(tmp_path)[1], params)
  save_file(dict(tensors, **{"transformer.h.0.mystery.weight": np.zeros(3, np.float32)}),
            file, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"transformer\.h\.0\.mystery\.weight"):
    hf.load(tmp_path)
  save_file(dict(tensors, **{"transformer.wte.weight": np.zeros((VOCAB, 31), np.float32)}),
            file, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"transformer\.wte\.weight.*shape"):
    hf.load(tmp_path)


def test_unsupported_options(tmp_path):
  model = _make("llama_gqa")
  model.save_pretrained(tmp_path)
  config_file = tmp_path / "config.json"
  original = json.loads(config_file.read_text())
  for key, value, match in [
      ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0},
       "rope_parameters"),
      ("rope_scaling", {"type": "linear", "factor": 2.0}, "rope_scaling"),
      ("hidden_act", "gelu_10", "hidden_act")]:
    config_file.write_text(json.dumps(dict(original, **{key: value})))
    with pytest.raises(ValueError, match=match):
      hf.load(tmp_path)

  with pytest.raises(ValueError, match="no Hugging Face equivalent"):
    hf.save(dict(family="decoder", vocab_size=VOCAB, d_model=32, num_layers=1, num_heads=4,
                 mlp_dim=64, positions="alibi"), {}, tmp_path / "alibi")
  with pytest.raises(ValueError, match=r"model.parametrization='mup' at d_model=32 \(base 16\)"):
    hf.save(dict(family="decoder", vocab_size=VOCAB, d_model=32, num_layers=1, num_heads=4,
                 mlp_dim=64, parametrization="mup", mup_base_width=16), {}, tmp_path / "mup")


@pytest.mark.parametrize("family, key, value", [
    ("bert", "ffn", "swiglu"), ("bert", "pre_norm", True), ("vit", "num_kv_heads", 2),
    ("vit", "norm", "rmsnorm"), ("decoder", "pre_norm", False)])
def test_save_refuses_block_settings_the_architecture_lacks(tmp_path, family, key, value):
  """Every family takes every block setting; HF formats are narrower and say which."""
  cfg = dict(family=family, d_model=32, num_heads=4, mlp_dim=64, num_layers=1, **{key: value})
  cfg.update(dict(num_classes=3, image_size=8, patch_size=4) if family == "vit" else
             dict(vocab_size=VOCAB))
  models.build(cfg)                   # a valid model ...
  with pytest.raises(ValueError, match=f"model.{key}={value!r}: the Hugging Face {family}"):
    hf.save(cfg, {}, tmp_path / "out")   # ... that the format cannot hold


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_low_precision_safetensors_load_cast_to_float32(tmp_path, dtype):
  """Checkpoints stored in every floating dtype torch writes to safetensors load, each weight
  equal to the float32 weights rounded to that dtype."""
  import ml_dtypes
  model = _make("llama_gqa")
  model.save_pretrained(tmp_path / "f32")
  _, params = hf.load(tmp_path / "f32")
  model.to(getattr(torch, dtype)).save_pretrained(tmp_path / dtype)
  _, low = hf.load(tmp_path / dtype)
  rounded = getattr(ml_dtypes, dtype) if not hasattr(np, dtype) else np.dtype(dtype)
  _assert_same_params(jax.tree.map(lambda x: x.astype(rounded).astype(np.float32), params), low)


def test_unreadable_checkpoint_files_name_the_file(tmp_path):
  model = _make("llama_gqa")
  model.save_pretrained(tmp_path / "ok")
  weights = tmp_path / "ok" / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:1000])              # truncated download
  with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors"):
    hf.load(tmp_path / "ok")
  (tmp_path / "ok" / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
    hf.load(tmp_path / "ok")
  header = json.dumps({"w": {"dtype": "F6_E3M2", "shape": [4], "data_offsets": [0, 3]}})
  (tmp_path / "x.safetensors").write_bytes(len(header).to_bytes(8, "little") + header.encode()
                                           + bytes(3))
  with pytest.raises(ValueError, match=r"tensor 'w' has dtype F6_E3M2, which jaxformer cannot"):
    hf_io._read_safetensors_raw(str(tmp_path / "x.safetensors"), ["w"])


@pytest.fixture(scope="module")
def gpt2_checkpoints(tmp_path_factory):
  """A tiny GPT-2 saved whole, sharded, and as pytorch_model.bin; tests damage copies."""
  root = tmp_path_factory.mktemp("gpt2")
  model = _make("gpt2")
  model.save_pretrained(root / "whole")
  model.save_pretrained(root / "sharded", max_shard_size="20KB")
  (root / "bin").mkdir()
  (root / "bin" / "config.json").write_text((root / "whole" / "config.json").read_text())
  torch.save({k: torch.from_numpy(v) for k, v in
              load_file(root / "whole" / "model.safetensors").items()},
             root / "bin" / "pytorch_model.bin")
  return root


def _copy(gpt2_checkpoints, kind, tmp_path):
  return pathlib.Path(shutil.copytree(gpt2_checkpoints / kind, tmp_path / kind))


@pytest.mark.parametrize("edit, match", [
    (lambda c: [1], "config.json holds a JSON list, not an object"),
    (lambda c: dict(c, n_embd="32"), "config.json: n_embd='32' must be an integer > 0"),
    (lambda c: dict(c, n_head=0), "config.json: n_head=0 must be an integer > 0"),
    (lambda c: dict(c, n_layer=None), "config.json: n_layer=None must be an integer > 0"),
    (lambda c: dict(c, resid_pdrop="x"), "config.json: resid_pdrop='x' must be a number"),
    (lambda c: {k: v for k, v in c.items() if k != "n_layer"},
     "config.json does not set n_layer, so transformers' default 12 was used"),
    (lambda c: {k: v for k, v in c.items() if k != "n_embd"},
     "config.json does not set n_embd, so transformers' default 768 was used")],
    ids=["not_object", "size_str", "zero_heads", "size_null", "rate_str", "no_n_layer",
         "no_n_embd"])
def test_damaged_config_json_names_the_file(gpt2_checkpoints, tmp_path, edit, match):
  ckpt = _copy(gpt2_checkpoints, "whole", tmp_path)
  config_file = ckpt / "config.json"
  config_file.write_text(json.dumps(edit(json.loads(config_file.read_text()))))
  _user_error(lambda: hf.load(ckpt), config_file, match)


@pytest.mark.parametrize("edit, match", [
    (lambda index, shard: "{oops", "model.safetensors.index.json is not valid JSON"),
    (lambda index, shard: "{}", "index.json has no 'weight_map'"),
    (lambda index, shard: dict(index, weight_map=dict(index["weight_map"], extra=shard)),
     "places tensor 'extra' in {shard}, which does not hold it"),
    (lambda index, shard: index, "shard {shard} named in model.safetensors.index.json does "
     "not exist")],
    ids=["index_not_json", "no_weight_map", "tensor_not_in_its_shard", "missing_shard"])
def test_damaged_shard_index_names_the_file(gpt2_checkpoints, tmp_path, edit, match):
  ckpt = _copy(gpt2_checkpoints, "sharded", tmp_path)
  index_file = ckpt / "model.safetensors.index.json"
  index = json.loads(index_file.read_text())
  shard = sorted(set(index["weight_map"].values()))[1]
  edited = edit(index, shard)
  index_file.write_text(edited if isinstance(edited, str) else json.dumps(edited))
  if "does not exist" in match:
    (ckpt / shard).unlink()
  _user_error(lambda: hf.load(ckpt), ckpt, match.format(shard=shard), "download")


@pytest.mark.parametrize("damage", [lambda b: b"", lambda b: b[:len(b) // 2],
                                    lambda b: b"garbage" * 20],
                         ids=["empty", "truncated", "not_a_pickle"])
def test_damaged_pytorch_bin_names_the_file(gpt2_checkpoints, tmp_path, damage):
  ckpt = _copy(gpt2_checkpoints, "bin", tmp_path)
  weights = ckpt / "pytorch_model.bin"
  weights.write_bytes(damage(weights.read_bytes()))
  _user_error(lambda: hf.load(ckpt), weights, "is not a readable PyTorch state dict",
              "download or save it again")


def test_weights_path_that_is_a_directory_names_it(gpt2_checkpoints, tmp_path):
  ckpt = _copy(gpt2_checkpoints, "whole", tmp_path)
  (ckpt / "model.safetensors").unlink()
  (ckpt / "model.safetensors").mkdir()
  _user_error(lambda: hf.load(ckpt), ckpt / "model.safetensors", "is not a file")


def test_save_never_overwrites_a_run_and_replaces_a_checkpoint_only_when_asked(
    gpt2_checkpoints, tmp_path):
  config, params = hf.load(gpt2_checkpoints / "whole")
  run = tmp_path / "run"                  # a training workdir (jaxformer/train/workdir.py)
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text(json.dumps({"model": {}, "data": {}, "train": {}}))
  before = (run / "config.json").read_text()
  for overwrite in (False, True):
    _user_error(lambda: hf.save(config, params, run, overwrite=overwrite),
                f"{run} holds a training run (checkpoints/, a training config.json)",
                f"save to another directory, e.g. {run / 'hf'}")
  (run / "checkpoints").rmdir()           # a run that has not checkpointed yet: still a run
  _user_error(lambda: hf.save(config, params, run), "holds a training run")
  assert (run / "config.json").read_text() == before
  hf.save(config, params, run / "hf")     # the suggested directory works

  out = tmp_path / "out"                  # an earlier, sharded save (of another model) there
  _make("llama_gqa").save_pretrained(out, max_shard_size="20KB")
  old_files = sorted(os.listdir(out))
  assert "model.safetensors.index.json" in old_files
  _user_error(lambda: hf.save(config, params, out),
              f"{out} already holds config.json, model-00001-of-", "pass overwrite=True")
  assert sorted(os.listdir(out)) == old_files
  hf.save(config, params, out, overwrite=True)
  assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
  _assert_same_params(hf.load(out)[1], params)
  (tmp_path / "afile").write_text("x")
  _user_error(lambda: hf.save(config, params, tmp_path / "afile"), "is a file, not a directory")
