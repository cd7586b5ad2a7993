"""`python -m jaxformer.export`: a run's model and tokenizer as a Hugging Face checkpoint that
transformers' AutoTokenizer, generate and pipeline use as they are. Greedy text from the export
equals jaxformer's token for token; the tokenizers (char, SentencePiece BPE and unigram)
encode and decode as the run's; user mistakes are one line.

The runs here are written directly (config.json, tokenizer, an Orbax checkpoint of params
drawn at the model's shapes, or BERT's initial state): what export reads of a trained run,
without the training. The slow test exports a trained run through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

from configs import bert_mlm_shakespeare, bert_nsp_shakespeare, electra as electra_config
from configs import t5 as t5_config
from jaxformer import cli, inference, models
from jaxformer.convert import hf
from jaxformer.convert.hf import tokenizer as hf_tokenizer
from jaxformer.data import tokenizers
from jaxformer.export import export_run, special_tokens
from tests.runs import on_one_device, tiny_run_config, write_run
from tests.repo_root import REPO

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

ROOT = str(REPO)
TEXT = open(os.path.join(ROOT, "jaxformer", "data", "assets", "tinyshakespeare.txt"),
            encoding="utf-8").read()
CHARS = tokenizers.CharTokenizer(TEXT)
# Text outside the training data too: accents, an emoji (byte fallback), runs of spaces, tabs.
HARD_TEXT = TEXT[20_000:24_000] + "  Ünïcødé 😀  two  spaces\tand a tab \n\n end "


def _no_special_token_warnings(caplog, capfd, record):
  """Nothing transformers logged, printed or warned names a special token."""
  logged = [r.getMessage() for r in caplog.records if r.name.startswith("transformers")]
  text = " ".join(logged + [capfd.readouterr().err] + [str(w.message) for w in record])
  for fragment in ("token_id", "pad_token", "eos_token", "bos_token", "Setting"):
    assert fragment not in text, text[-2000:]


def test_char_decoder_export_generates_jaxformers_greedy_text(tmp_path, caplog, capfd):
  run, out = str(tmp_path / "run"), str(tmp_path / "hf")
  cfg = tiny_run_config()
  write_run(run, cfg, CHARS, random=True)
  done = export_run(run, out)
  assert done.architecture == "GPT2LMHeadModel" and done.tokenizer == "char"
  assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors",
                                     "tokenizer.json", "tokenizer_config.json"]
  hc = json.load(open(os.path.join(out, "config.json")))
  assert (hc["bos_token_id"], hc["eos_token_id"], hc["pad_token_id"]) == (None, None, None)
  assert json.load(open(os.path.join(out, "generation_config.json"))) == dict(
      bos_token_id=None, eos_token_id=None, pad_token_id=None)

  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    prompt = "ROMEO: a\n b"
    ids = tok(prompt)["input_ids"]
    assert ids == CHARS.encode(prompt).tolist() and tok.decode(ids) == prompt
    assert tok.decode(tok(HARD_TEXT[:4000])["input_ids"]) == HARD_TEXT[:4000]
    new = cfg.model.max_len - len(ids)
    theirs = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)[0]
    _, params, tokenizer = inference.load_run(run)
    ours = inference.sample_text(cfg, params, tokenizer, prompt=prompt, max_new_tokens=new,
                                 temperature=0)
    assert tok.decode(theirs) == ours and len(theirs) == cfg.model.max_len
    pipe = transformers.pipeline("text-generation", model=out)
    text = pipe(prompt, max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert text == ours[:len(prompt) + 5]
  _no_special_token_warnings(caplog, capfd, record)


@pytest.fixture(scope="module")
def spm_tokenizers():
  lines = TEXT[:60_000].split("\n")
  texts = ["\n".join(lines[i:i + 20]) + "\n" for i in range(0, len(lines), 20)]
  return {kind: tokenizers.SentencePieceTokenizer.train(kind, 400, iter(texts),
                                                        f"spm:{kind}:400")
          for kind in tokenizers.SPM_MODEL_TYPES}


@pytest.mark.parametrize("kind", tokenizers.SPM_MODEL_TYPES)
def test_sentencepiece_tokenizers_encode_and_decode_as_the_runs(kind, spm_tokenizers, tmp_path):
  ours = spm_tokenizers[kind]
  hf_tokenizer.save(ours, str(tmp_path), special={"bos_token": 2, "eos_token": 3,
                                                  "pad_token": 0, "unk_token": 1})
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  ids = tok(HARD_TEXT)["input_ids"]
  assert ids == ours.encode(HARD_TEXT).tolist()
  assert tok.decode(ids) == HARD_TEXT == ours.decode(ids)
  assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2, 3)
  assert (tok.bos_token, tok.eos_token) == ("<s>", "</s>")


def test_hugging_face_tokenizer_exports_without_its_template(tmp_path):
  """A run on a Hugging Face tokenizer.json encodes without the special tokens its template
  adds (jaxformer trains on text encoded so), and so does the export."""
  from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, processors
  words = ["<unk>", "<s>", "</s>", "to", "be", "or", "not", ","]
  source = Tokenizer(tok_models.WordLevel({w: i for i, w in enumerate(words)}, "<unk>"))
  source.pre_tokenizer = pre_tokenizers.Whitespace()
  source.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                        special_tokens=[("<s>", 1), ("</s>", 2)])
  ours = tokenizers.HuggingFaceTokenizer(source.to_str(), "hf:test")
  assert (ours.bos_id, ours.eos_id, hf_tokenizer.unk_id(ours)) == (1, 2, 0)
  hf_tokenizer.save(ours, str(tmp_path), special={"bos_token": 1, "eos_token": 2,
                                                  "unk_token": 0})
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  text = "to be , or not to be maybe"
  assert tok(text)["input_ids"] == ours.encode(text).tolist() == [3, 4, 7, 5, 6, 3, 4, 0]
  assert tok.unk_token == "<unk>" and tok.bos_token_id == 1


def test_llama_with_sentencepiece_and_a_padded_vocabulary(spm_tokenizers, tmp_path, caplog,
                                                           capfd):
  """A Llama-style decoder (RoPE, RMSNorm, SwiGLU) on a SentencePiece BPE vocabulary of 400
  with model.vocab_size=408: its bos/eos/pad ids in config.json and generation_config.json,
  the 8 padded ids suppressed, greedy ids equal to jaxformer's up to the first eos."""
  ours = spm_tokenizers["bpe"]
  cfg = tiny_run_config()
  cfg.model.update(positions="rope", norm="rmsnorm", ffn="swiglu", vocab_size=408,
                   tie_embeddings=False)
  cfg.data.tokenizer = "spm:bpe:400"
  run, out = str(tmp_path / "run"), str(tmp_path / "hf")
  params = write_run(run, cfg, ours, random=True)[8]
  done = export_run(run, out)
  assert done.architecture == "LlamaForCausalLM" and done.tokenizer == "spm"
  hc = json.load(open(os.path.join(out, "config.json")))
  assert (hc["bos_token_id"], hc["eos_token_id"], hc["pad_token_id"]) == (2, 3, 0)
  generation = json.load(open(os.path.join(out, "generation_config.json")))
  assert generation == dict(bos_token_id=2, eos_token_id=3, pad_token_id=0,
                            suppress_tokens=list(range(400, 408)))
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    prompt = "KING RICHARD: my lord"
    ids = tok(prompt)["input_ids"]
    assert ids == ours.encode(prompt).tolist()
    theirs = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)[0]
    mine = inference.generate(cfg.model, params, np.asarray(ids), max_new_tokens=20,
                              temperature=0.0, vocab_limit=400).tolist()
    if 3 in mine[len(ids):]:                         # transformers stops at eos
      mine = mine[:mine.index(3, len(ids)) + 1]
    assert theirs.tolist() == mine
    transformers.pipeline("text-generation", model=out)(prompt, max_new_tokens=3)
  _no_special_token_warnings(caplog, capfd, record)


def test_bert_exports_its_appended_tokens_and_loads_with_automodel(tmp_path):
  """BERT with next-sentence prediction on characters: MLM's [MASK] (65) and NSP's [CLS],
  [SEP] (66, 67) appended to the 65 characters, which the exported tokenizer puts around
  text as NSP trained: fill-mask works on the export, its MLM logits equal jaxformer's."""
  cfg = bert_nsp_shakespeare.get_config("tiny")
  run, out = str(tmp_path / "run"), str(tmp_path / "hf")
  params = write_run(run, cfg, CHARS)[8]     # the init's scale: atol 1e-4 on the logits
  done = export_run(run, out)
  assert done.architecture == "BertForPreTraining"
  assert "generation_config.json" not in done.files
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert (tok.mask_token, tok.cls_token, tok.sep_token, tok.pad_token) == (
      "[MASK]", "[CLS]", "[SEP]", None)
  text = "To be, or [MASK] to be"
  ids = tok(text)["input_ids"]
  assert ids == [66] + CHARS.encode("To be, or ").tolist() + [65] + CHARS.encode(
      " to be").tolist() + [67]
  assert tok("ab", "cd")["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
  assert isinstance(transformers.AutoModel.from_pretrained(out), transformers.BertModel)
  model = transformers.AutoModelForMaskedLM.from_pretrained(out)
  theirs = model(torch.tensor([ids])).logits.detach().numpy()
  mine = jax.jit(models.build(cfg.model).apply)({"params": params}, np.asarray([ids]))["mlm"]
  np.testing.assert_allclose(theirs, mine, atol=1e-4)
  assert len(transformers.pipeline("fill-mask", model=out)(text)) == 5


def test_electra_exports_its_discriminator_and_its_generator(tmp_path):
  cfg = electra_config.get_config("tiny")
  run, out = str(tmp_path / "run"), str(tmp_path / "hf")
  write_run(run, cfg, CHARS, random=True)
  done = export_run(run, out)
  assert done.architecture == "ElectraForPreTraining"
  assert {"config.json", "tokenizer.json", "generator/config.json",
          "generator/tokenizer.json"} <= set(done.files)
  assert isinstance(transformers.AutoModelForPreTraining.from_pretrained(out),
                    transformers.ElectraForPreTraining)
  generator = os.path.join(out, "generator")
  assert len(transformers.pipeline("fill-mask", model=generator)("to [MASK]")) == 5


def test_special_tokens_of_mlm_t5_and_bart():
  """MLM: [MASK] after the 65 characters; T5: <pad>, </s>, then 8 sentinels, <extra_id_0> the
  top id; BART: <mask>, <s>, <pad>. The ids are those the data pipelines use."""
  mlm = bert_mlm_shakespeare.get_config("tiny")
  assert special_tokens(CHARS, "mlm", mlm.data, 66)[1:] == (66, ["[MASK]"], [])
  t5 = t5_config.get_config("tiny")
  ids, size, appended, sentinels = special_tokens(CHARS, "span_corruption", t5.data,
                                                  t5.model.vocab_size)
  assert (ids["pad_id"], ids["eos_id"], size) == (65, 66, 75)
  assert appended[:2] == ["<pad>", "</s>"] and appended[2:] == sentinels
  assert sentinels[-1] == "<extra_id_0>" and sentinels[0] == "<extra_id_7>"
  ids, size, appended, _ = special_tokens(CHARS, "bart_denoising", None, 68)
  assert (ids["mask_id"], ids["bos_id"], ids["pad_id"], size) == (65, 66, 67, 68)
  assert appended == ["<mask>", "<s>", "<pad>"]
  with pytest.raises(ValueError, match="does not fit model.vocab_size=67"):
    special_tokens(CHARS, "bart_denoising", None, 67)


def test_config_token_ids():
  """hf.save without token ids: GPT-2's default 50256 only for a vocabulary that has it; with
  them: each an id of the vocabulary or None, RoBERTa's pad_token_id its model.pad_id."""
  cfg = models.with_defaults(tiny_run_config().model)
  assert hf.core.converters()["decoder"].to_hf(cfg)[1]["bos_token_id"] is None
  assert hf.core.converters()["decoder"].to_hf(dict(cfg, vocab_size=50257))[1][
      "eos_token_id"] == 50256
  hc = {}
  hf.core._set_token_ids(hc, {"eos_token_id": 64, "pad_token_id": None},
                         hf.core.converters()["decoder"], cfg)
  assert hc == {"eos_token_id": 64, "pad_token_id": None}
  with pytest.raises(ValueError, match=r"token_ids\['bos_token_id'\]=65 must be None or a "
                                       r"token id in \[0, 65\)"):
    hf.core._set_token_ids({}, {"bos_token_id": 65}, hf.core.converters()["decoder"], cfg)
  with pytest.raises(ValueError, match="'cls_token_id' is not one of"):
    hf.core._set_token_ids({}, {"cls_token_id": 1}, hf.core.converters()["decoder"], cfg)
  hc = {"pad_token_id": 1}
  hf.core._set_token_ids(hc, {"pad_token_id": None}, hf.core.converters()["roberta"],
                         dict(cfg, family="roberta"))
  assert hc == {"pad_token_id": 1}


def _user_error(capsys, fn, *fragments):
  with pytest.raises(SystemExit) as info:
    cli.user_errors(fn)()
  assert info.value.code == cli.EXIT_USER_ERROR
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  for fragment in fragments:
    assert fragment in lines[0], (fragment, lines[0])


def test_checkpoint_steps_and_user_errors(tmp_path, capsys):
  run, out = str(tmp_path / "run"), str(tmp_path / "hf")
  saved = write_run(run, tiny_run_config(), CHARS, steps=(4, 8), random=True)
  _, params, _ = inference.load_run(run, which="4")
  jax.tree.map(np.testing.assert_array_equal, params, saved[4])
  _user_error(capsys, lambda: export_run(run, out, which=5), "no checkpoint of step 5",
              "checkpoints/ keeps steps [4, 8]")
  _user_error(capsys, lambda: export_run(run, out, which="final"),
              "--checkpoint='final' must be 'latest', 'best' or a step number")
  _user_error(capsys, lambda: export_run(run, out, which="best"), "has no best checkpoint")
  _user_error(capsys, lambda: export_run(str(tmp_path / "none"), out), "holds no training run")
  _user_error(capsys, lambda: export_run(None, out), "--workdir is not set")
  _user_error(capsys, lambda: export_run(run, run), "holds a training run")
  captioner = str(tmp_path / "captioner")
  os.makedirs(captioner)
  with open(os.path.join(captioner, "config.json"), "w") as f:
    json.dump({"model": {"family": "captioner"}, "train": {}}, f)
  _user_error(capsys, lambda: export_run(captioner, out), "model.family='captioner'",
              "the families that export: bart, bert, deberta, decoder")
  assert not os.path.exists(out)

  export_run(run, out, which=4)
  embedding = lambda params: params["embed"]["embedding"]
  np.testing.assert_array_equal(embedding(hf.load(out)[1]), embedding(saved[4]))
  _user_error(capsys, lambda: export_run(run, out), "already holds config.json",
              "--overwrite")
  with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
    f.write("{}")                                  # stale: from another tokenizer
  export_run(run, out, overwrite=True)
  np.testing.assert_array_equal(embedding(hf.load(out)[1]), embedding(saved[8]))
  assert not os.path.exists(os.path.join(out, "special_tokens_map.json"))


@pytest.mark.slow
def test_trained_run_through_the_command_line(tmp_path, monkeypatch):
  """A run trained 8 steps (on one device: the mesh is not what is tested here), exported by
  `python -m jaxformer.export`, generates jaxformer's greedy text in transformers' pipeline."""
  from jaxformer.train import loop
  on_one_device(monkeypatch)
  run, out = str(tmp_path / "run"), str(tmp_path / "hf")
  loop.train(tiny_run_config(steps=8, eval_every=4, checkpoint_every=4), run)
  result = subprocess.run(
      [sys.executable, "-m", "jaxformer.export", f"--workdir={run}", f"--out={out}",
       "--checkpoint=best"], capture_output=True, text=True, cwd=ROOT, timeout=240,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "as GPT2LMHeadModel with its 'char' tokenizer" in result.stdout
  config, params, tokenizer = inference.load_run(run, which="best")
  ours = inference.sample_text(config, params, tokenizer, prompt="ROMEO:", max_new_tokens=26,
                               temperature=0)
  pipe = transformers.pipeline("text-generation", model=out)
  assert pipe("ROMEO:", max_new_tokens=26, do_sample=False)[0]["generated_text"] == ours
