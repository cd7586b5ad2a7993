"""The DPO loss and metrics (jaxformer.posttrain.dpo) against trl's DPOTrainer on the same
log-probabilities, and against a float64 NumPy transcription of the paper's formula."""

import collections
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxformer.data.tokenizers import CharTokenizer
from jaxformer.posttrain import data as pdata
from jaxformer.posttrain import dpo
from tests.user_errors import user_error


def _logps(n=16, seed=0):
  rng = np.random.default_rng(seed)
  return [-rng.uniform(5, 80, n) for _ in range(4)]   # pi_c, pi_r, ref_c, ref_r (float64)


def _numpy_dpo(pc, pr, rc, rr, beta, eps):
  z = beta * ((pc - rc) - (pr - rr))
  log_sig = lambda x: -np.logaddexp(0.0, -x)
  return -(1 - eps) * log_sig(z) - eps * log_sig(-z)


def _trl_dpo(pc, pr, rc, rr, beta, eps):
  """trl's DPOTrainer._compute_loss (loss_type='sigmoid', precomputed reference log-probs) on
  summed log-probs: a stub model returns one 'token' per sequence whose log-prob is the sum."""
  torch = pytest.importorskip("torch")
  trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")
  n = len(pc)
  logps = torch.tensor(np.concatenate([pc, pr]), dtype=torch.float64)[:, None]
  outputs = types.SimpleNamespace(
      log_probs=logps, entropy=torch.zeros_like(logps), mean_logits=torch.zeros_like(logps),
      is_top1=torch.zeros(logps.shape, dtype=torch.bool))
  model = lambda **kwargs: outputs
  metrics = collections.defaultdict(lambda: collections.defaultdict(list))
  ident = lambda x: x
  stub = types.SimpleNamespace(
      model=types.SimpleNamespace(training=True),
      accelerator=types.SimpleNamespace(device="cpu", gather=ident, gather_for_metrics=ident),
      aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
      f_divergence_type="reverse_kl", loss_types=["sigmoid"], loss_weights=[1.0],
      beta=beta, label_smoothing=eps, use_weighting=False, _metrics=metrics,
      _total_train_tokens=0, _tp_size=1)
  inputs = {"input_ids": torch.zeros((2 * n, 2), dtype=torch.long),
            "attention_mask": torch.ones((2 * n, 2), dtype=torch.long),
            "completion_mask": torch.ones((2 * n, 2), dtype=torch.long),
            "ref_chosen_logps": torch.tensor(rc, dtype=torch.float64),
            "ref_rejected_logps": torch.tensor(rr, dtype=torch.float64)}
  loss = trl_dpo.DPOTrainer._compute_loss(stub, model, inputs, return_outputs=False)
  return float(loss), {k: v[-1] for k, v in metrics["train"].items()}


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_matches_trl(beta):
  """trl >= 1 dropped label smoothing from loss_type='sigmoid' (cDPO: the numpy test)."""
  eps = 0.0
  pc, pr, rc, rr = _logps()
  trl_loss, trl_metrics = _trl_dpo(pc, pr, rc, rr, beta, eps)
  with jax.enable_x64(True):
    loss, m = dpo.dpo_loss(*map(jnp.asarray, (pc, pr, rc, rr)), beta=beta,
                           label_smoothing=eps)
    loss, m = float(loss.mean()), {k: float(v.mean()) for k, v in m.items()}
  assert abs(loss - trl_loss) < 1e-6
  for ours, theirs in [("rewards_chosen", "rewards/chosen"),
                       ("rewards_rejected", "rewards/rejected"),
                       ("rewards_margin", "rewards/margins"),
                       ("rewards_accuracy", "rewards/accuracies"),
                       ("logps_chosen", "logps/chosen"), ("logps_rejected", "logps/rejected")]:
    assert abs(m[ours] - trl_metrics[theirs]) < 1e-6, ours


def test_dpo_loss_float32_matches_numpy_float64():
  pc, pr, rc, rr = _logps(64, seed=1)
  for beta, eps in [(0.1, 0.0), (1.0, 0.1)]:
    loss, m = dpo.dpo_loss(*(jnp.asarray(x, jnp.float32) for x in (pc, pr, rc, rr)),
                           beta=beta, label_smoothing=eps)
    np.testing.assert_allclose(np.asarray(loss), _numpy_dpo(pc, pr, rc, rr, beta, eps),
                               atol=2e-5 * beta)
    np.testing.assert_allclose(np.asarray(m["logratio"]), 0.5 * ((pc - rc) + (pr - rr)), atol=2e-5)


def test_dpo_gradient_is_the_papers():
  """d loss / d pi_c = -beta * sigmoid(-z), d loss / d pi_r = +beta * sigmoid(-z); none to ref."""
  pc, pr, rc, rr = (jnp.asarray(x, jnp.float32) for x in _logps(8, seed=2))
  beta = 0.3
  g = jax.grad(lambda a, b, c, d: dpo.dpo_loss(a, b, c, d, beta=beta)[0].sum(),
               argnums=(0, 1))(pc, pr, rc, rr)
  z = beta * ((pc - rc) - (pr - rr))
  np.testing.assert_allclose(g[0], -beta * jax.nn.sigmoid(-z), rtol=1e-5)
  np.testing.assert_allclose(g[1], beta * jax.nn.sigmoid(-z), rtol=1e-5)


def test_dpo_loss_refuses_bad_beta():
  with pytest.raises(ValueError, match="posttrain.beta"):
    dpo.dpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), beta=0.0)


def test_pairs_with_no_preference_are_dropped_and_all_of_them_refused(tmp_path):
  """chosen == rejected (also: equal once cut to seq_len) gives loss log 2 and a zero
  gradient whatever the params: such pairs are dropped and counted; data holding only them is
  refused in one line (it trained at 0.6931, accuracy 0, exit 0)."""
  tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz :.")
  same = [{"prompt": f"say {c}:", "chosen": "ab.", "rejected": "ab."} for c in "abc"]
  same_when_cut = {"prompt": "x" * 13, "chosen": "abcd", "rejected": "abzz"}   # seq_len 14
  good = [{"prompt": f"pick {c}:", "chosen": c, "rejected": "zz"} for c in "de"]

  def pipeline(records):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = ConfigDict(dict(source=str(path), eval_source=str(path), seq_len=14))
    return lambda: pdata.DPOPipeline(data, tok, seed=0, global_batch_size=2, eval_batch_size=2)

  p = pipeline(same + [same_when_cut] + good)()
  assert p.info["identical_pairs"] == 2 * 4 and p.info["dropped_pairs"] == 0
  assert p.dropped == {"train": (4, 6), "validation": (4, 6)}
  kept = [p.records["train"][i] for i in range(len(p.records["train"]))]
  assert len(kept) == len(good) and not any(pdata.same_rows(r) for r in kept)
  assert pdata.dropped_summary(p, "pairs", "why") == (
      "dpo data: dropped 4 of 6 train and 4 of 6 validation pairs (why)")
  text = user_error(pipeline(same + [same_when_cut]), "data.source=", "pairs.jsonl",
                    "every train pair's chosen equals its rejected", "data.seq_len=14")
  assert "\n" not in text
