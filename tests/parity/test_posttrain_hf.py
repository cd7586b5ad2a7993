"""Post-training from a Hugging Face checkpoint: posttrain.init_from='hf:DIR' (a tiny GPT-2
and its tokenizer.json) starts DPO with the checkpoint's params as policy and reference."""

import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import dpo as dpo_config
from jaxformer.convert import hf
from jaxformer.state import checkpoint, train_state
from jaxformer.train import loop
from jaxformer.train.metrics import read

WORDS = "say yes no maybe good bad the a answer is".split()


@pytest.mark.slow
def test_dpo_from_a_hugging_face_checkpoint(tmp_path):
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  ckpt = tmp_path / "gpt2"
  tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(
      special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=tok.get_vocab_size(), n_positions=16, n_embd=32, n_layer=2, n_head=4))
  model.save_pretrained(str(ckpt))
  tok.save(str(ckpt / "tokenizer.json"))
  rng = np.random.default_rng(0)
  with open(tmp_path / "pairs.jsonl", "w") as f:
    for i in range(24):
      good, bad = rng.choice(WORDS, 2, replace=False)
      f.write(json.dumps({"prompt": f"say {WORDS[i % 10]} answer is", "chosen": f" {good}",
                          "rejected": f" {bad}"}) + "\n")
  cfg = dpo_config.get_config(f"hf:{ckpt}")
  assert cfg.data.seq_len == 16 and cfg.model.vocab_size == tok.get_vocab_size()
  cfg.data.update(source=str(tmp_path / "pairs.jsonl"), eval_batches=1)
  cfg.train.update(steps=2, batch_size=8, log_every=1, eval_every=2, checkpoint_every=2)
  cfg.optim.warmup_steps = 1
  workdir = str(tmp_path / "dpo")
  loop.train(cfg, workdir)
  train = [r for r in read(os.path.join(workdir, "metrics.jsonl")) if "loss" in r]
  assert abs(train[0]["loss"] - np.log(2)) < 1e-4          # policy == reference == HF
  _, params = hf.load(str(ckpt))
  _, _, init_boxed = train_state.train_state_fns(ConfigDict(train_state.read_config(workdir)))
  ckpts = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"), read_only=True)
  _, state = ckpts.restore_latest(nn.unbox(jax.eval_shape(init_boxed)))
  ckpts.close()
  same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), state["reference"], params)
  assert all(jax.tree.leaves(same))
