"""configs/captioning.py names and experiments/captioning.py's scoring and report, on the
bundled 8x8 digits with an untrained tiny model (the trained study is its committed report,
checked in tests/unit/experiments/test_reports.py)."""

from __future__ import annotations

import jax
import pytest

from configs import captioning
from jaxformer import models


@pytest.mark.parametrize("encoder", sorted(captioning.ENCODERS))
@pytest.mark.parametrize("decoder", sorted(captioning.DECODERS))
def test_every_named_config_builds_and_pooled_only_drops_attention(encoder, decoder):
  attn = captioning.get_config(f"{encoder}_{decoder}")
  pooled = captioning.get_config(f"{encoder}_{decoder}_pooled")
  models.build(attn.model), models.build(pooled.model)
  assert attn.model.attention and not pooled.model.attention
  a, p = attn.to_dict(), pooled.to_dict()
  a["model"].pop("name"), p["model"].pop("name")
  a["model"].pop("attention"), p["model"].pop("attention")
  assert a == p                      # same data, sizes, steps, seed and optimizer
  assert (attn.model.max_len, attn.model.image_size) == (17, 48)
  assert "no attention" in captioning.label(f"{encoder}_{decoder}_pooled")


@pytest.mark.parametrize("bad", ["cnn", "cnn_rnn", "mlp_lstm", "cnn_lstm_pool"])
def test_a_bad_name_lists_the_valid_ones(bad):
  with pytest.raises(ValueError, match=r"unknown captioning config .*cnn_lstm"):
    captioning.get_config(bad)


@pytest.mark.slow
def test_scores_render_and_figures_on_an_untrained_tiny_model(tmp_path):
  from experiments import captioning as study
  with pytest.raises(ValueError, match="--mnist is required"):
    study.experiment_configs("", ["cnn_lstm"])
  config = captioning.get_config("vit_transformer")
  config.data.source, config.data.digit_size = "digits", 8
  config.data.max_digits = 3
  config.model.update(image_size=30, max_len=8, patch_size=10, d_model=16, num_heads=2,
                      mlp_dim=32, encoder_layers=1, decoder_layers=1)
  params = models.build(config.model).init(
      jax.random.key(0), jax.numpy.zeros((1, 30, 30, 1)),
      jax.numpy.zeros((1, 8), jax.numpy.int32))["params"]
  sets = {n: study.eval_set(config, n, 3) for n in (2, 3)}
  assert all(len(e["labels"]) == n for n in sets for e in sets[n])
  metrics = study.evaluate(config, params, sets, beams=[1, 2])
  assert set(metrics) == {"beam1", "beam2"} and set(metrics["beam1"]) == {"2", "3", "all"}
  import numpy as np
  for n in (2, 3):                   # the greedy captions, scored by hand
    hyps = study.caption(config, params, np.stack([e["image"] for e in sets[n]]), 1)
    refs = [e["words"] for e in sets[n]]
    assert metrics["beam1"][str(n)]["exact"] == pytest.approx(
        np.mean([h == r for h, r in zip(hyps, refs)]))
    aligned = [sum(i < len(h) + 1 and (h + ["<eos>"])[i] == w
                   for i, w in enumerate(r + ["<eos>"])) for h, r in zip(hyps, refs)]
    assert metrics["beam1"][str(n)]["token_accuracy"] == pytest.approx(
        sum(aligned) / sum(len(r) + 1 for r in refs))
  report = {"examples_per_count": 3, "digits": [2, 3], "beams": [1, 2],
            "models": {"vit_transformer": {"label": "tiny", "attention": True, "steps": 0,
                                           "params": 123, "metrics": metrics}}}
  text = study.render(report)
  assert "| tiny | 123 | 0 |" in text and "beam 2" in text
  study.plot(report, str(tmp_path / "acc.png"))
  study.plot_attention(config, params, sets[3][:2], str(tmp_path / "maps.png"), "tiny")
  assert (tmp_path / "acc.png").stat().st_size > 0 and (tmp_path / "maps.png").stat().st_size
