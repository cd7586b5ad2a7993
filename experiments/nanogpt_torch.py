"""The nanoGPT architecture in PyTorch (eager), for `experiments/nanogpt_cpu.py`'s side-by-side
timing: pre-norm GPT-2 blocks without biases, learned positions, tied output head, causal
`scaled_dot_product_attention`, GELU MLP, N(0, 0.02) init with residual projections scaled by
1/sqrt(2 L). The optimizer matches the jaxformer config (AdamW, decay on non-embedding
matrices, global-norm clipping); the learning rate per step comes from jaxformer's schedule.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer import run_settings
from jaxformer.state import optim as optim_lib


class _LayerNorm(nn.Module):
  def __init__(self, d: int):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(d))

  def forward(self, x):
    return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class _Block(nn.Module):
  def __init__(self, d: int, heads: int):
    super().__init__()
    self.heads = heads
    self.ln1, self.ln2 = _LayerNorm(d), _LayerNorm(d)
    self.qkv = nn.Linear(d, 3 * d, bias=False)
    self.proj = nn.Linear(d, d, bias=False)
    self.fc = nn.Linear(d, 4 * d, bias=False)
    self.fc_proj = nn.Linear(4 * d, d, bias=False)

  def forward(self, x):
    b, t, d = x.shape
    q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
               for z in self.qkv(self.ln1(x)).split(d, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
    return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
  def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int):
    super().__init__()
    self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
    self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
    self.ln_f = _LayerNorm(d)
    for name, p in self.named_parameters():
      if p.dim() >= 2:
        std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
        nn.init.normal_(p, 0.0, std)

  def forward(self, tokens):
    x = self.wte(tokens.long()) + self.wpe(torch.arange(tokens.shape[1]))
    for block in self.blocks:
      x = block(x)
    return self.ln_f(x) @ self.wte.weight.T          # tied head


def build(cfg):
  """(model, optimizer, jaxformer's lr schedule) for a jaxformer nanogpt_cpu config."""
  torch.manual_seed(cfg.train.seed)
  m, o = cfg.model, run_settings.parse_section("optim", cfg.optim)
  model = GPT(m.vocab_size, m.d_model, m.num_layers, m.num_heads, m.max_len)
  embeddings = {"wte.weight", "wpe.weight"}
  decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in embeddings]
  rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n not in embeddings)]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                           {"params": rest, "weight_decay": 0.0}], lr=o.lr,
                          betas=(o.b1, o.b2), eps=o.eps)
  return model, opt, optim_lib.learning_rate_schedule(o, cfg.train.steps)


def train_step(model, opt, lr: float, inputs, targets, *, clip: float) -> float:
  model.train()
  for group in opt.param_groups:
    group["lr"] = lr
  logits = model(inputs)
  loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long())
  loss.backward()
  if clip:
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
  opt.step()
  opt.zero_grad(set_to_none=True)
  return loss


@torch.no_grad()
def evaluate(model, batches) -> float:
  """Mean next-token NLL over the eval batches (padded rows, `valid` = 0, excluded)."""
  model.eval()
  total = count = 0.0
  for b in batches:
    logits = model(b["inputs"])
    nll = F.cross_entropy(logits.transpose(1, 2), b["targets"].long(), reduction="none")
    w = b["valid"].float()[:, None].expand_as(nll)
    total += float((nll * w).sum())
    count += float(w.sum())
  return total / count
