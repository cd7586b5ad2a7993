"""BART's denoising objective (Lewis et al., 2020, section 2.2): corrupted text in, the
original text out.

Two noising functions, in this order (as in BART's best configuration):
- sentence permutation: the example is cut into sentences after every delimiter token
  (`data.sentence_delimiters`, e.g. ".!?") and the sentences are shuffled;
- text infilling: `mask_ratio` (30 %) of the tokens are masked in spans whose lengths are
  drawn from Poisson(lambda = 3); each span is replaced by a single mask token, and a span of
  length 0 inserts a mask token (the model must also learn how many tokens a mask hides).

How spans are drawn (`text_infilling`): M = round(mask_ratio * n) tokens are masked exactly.
Span lengths are drawn i.i.d. from Poisson(lambda) until they sum to >= M and the last one is
cut so they sum to M (so it is >= 1). The spans go into distinct gaps between the n - M
unmasked tokens, chosen uniformly, so two spans never touch (each shows as its own mask
token). Zero-length spans (insertions) are dropped only where they would not fit: where
there are more spans than gaps, or where they would make the corrupted text longer than the
original (so the source fits the example's length; both are rare at the default rates).
`mask_ratio` must be <= 0.5, which leaves every non-empty span a gap.

Batches: `DenoisingPipeline` reads random windows of `data.seq_len` tokens of a text corpus
(the stream mode of data/text.py: a pure function of seed and step, so a resumed run reads
what an uninterrupted one would), and gives the seq2seq layout
{'src' (corrupted, padded), 'src_mask', 'tgt_in' (start token + original[:-1]),
'tgt_out' (original), 'weights' (ones)}. Noise is a pure function of (seed, split, step, global
row); eval windows and noise use EVAL_SEED, as MLM's do. The mask, decoder start and padding
ids are the tokenizer's (`<mask>`, its bos, `<pad>`) where it has them, else appended after
its vocabulary in that order (char-level Shakespeare: 65 + 3 = 68).

Not modelled: fairseq's `mask_random` (a fraction of the mask tokens replaced by random
tokens) and document rotation (BART found rotation hurt).
"""

from __future__ import annotations

import numpy as np

from jaxformer.data import settings as source_settings
from jaxformer.data import tokenizers
from jaxformer.data.text import _KeyedWindowsMixin, _TextPipeline

# the objective's own keys and their defaults (`settings.DenoisingSettings`)
DEFAULTS = {k: v for k, v in source_settings.defaults("denoising").items()
            if k in ("mask_ratio", "poisson_lambda", "permute_sentences", "sentence_delimiters")}


def span_lengths(rng: np.random.Generator, num_to_mask: int, lam: float) -> np.ndarray:
  """Poisson(lam) span lengths, drawn until they sum to >= num_to_mask, the last cut so the
  sum is exactly num_to_mask; zeros (insertions) stay where they were drawn."""
  if num_to_mask <= 0:
    return np.zeros(0, np.int64)
  drawn = []
  total = 0
  while total < num_to_mask:            # usually one draw: num_to_mask spans of mean lam
    chunk = rng.poisson(lam, size=max(8, int(num_to_mask / max(lam, 1e-3)) + 8))
    drawn.append(chunk)
    total += int(chunk.sum())
  lengths = np.concatenate(drawn)
  csum = np.cumsum(lengths)
  last = int(np.searchsorted(csum, num_to_mask))      # first index with csum >= num_to_mask
  lengths = lengths[:last + 1].copy()
  lengths[-1] -= int(csum[last]) - num_to_mask
  return lengths


def text_infilling(tokens: np.ndarray, rng: np.random.Generator, *, mask_id: int,
                   mask_ratio: float = 0.3, lam: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
  """(corrupted tokens, masked [n] bool: which original tokens a mask hides); see the module
  docstring for how spans are drawn and placed."""
  tokens = np.asarray(tokens)
  n = len(tokens)
  num_to_mask = int(round(mask_ratio * n))
  lengths = span_lengths(rng, num_to_mask, lam)
  unmasked = n - num_to_mask
  zeros = np.flatnonzero(lengths == 0)
  # insertions that do not fit: more spans than gaps, or a source longer than the original
  excess = max(len(lengths) - (unmasked + 1), len(lengths) - num_to_mask, 0)
  if excess:
    lengths = np.delete(lengths, rng.choice(zeros, size=excess, replace=False))
  slots = np.sort(rng.choice(unmasked + 1, size=len(lengths), replace=False))
  slot_len = np.zeros(unmasked + 1, np.int64)
  has_span = np.zeros(unmasked + 1, bool)
  slot_len[slots], has_span[slots] = lengths, True
  # Original layout: gap j's span (slot_len[j] tokens), then unmasked token j (j < unmasked).
  before = np.cumsum(slot_len)                      # masked tokens up to and including gap j
  keep_pos = np.arange(unmasked) + before[:unmasked]
  masked = np.ones(n, bool)
  masked[keep_pos] = False
  # Corrupted layout: gap j's mask token (if any), then unmasked token j.
  masks_upto = np.cumsum(has_span)
  out = np.empty(unmasked + int(has_span.sum()), tokens.dtype)
  out[np.arange(unmasked) + masks_upto[:unmasked]] = tokens[keep_pos]
  span_slots = np.flatnonzero(has_span)
  out[span_slots + masks_upto[span_slots] - 1] = mask_id
  return out, masked


def permute_sentences(tokens: np.ndarray, rng: np.random.Generator,
                      delimiter_ids) -> np.ndarray:
  """The sentences of `tokens` (each ending after a delimiter token, the last one wherever the
  tokens end) in a random order."""
  tokens = np.asarray(tokens)
  ends = np.flatnonzero(np.isin(tokens, np.asarray(list(delimiter_ids))))
  pieces = [p for p in np.split(tokens, ends + 1) if len(p)]
  if len(pieces) < 2:
    return tokens.copy()
  return np.concatenate([pieces[i] for i in rng.permutation(len(pieces))])


def bart_noise(tokens: np.ndarray, rng: np.random.Generator, *, mask_id: int,
               delimiter_ids=(), mask_ratio: float = 0.3, lam: float = 3.0,
               permute: bool = True) -> np.ndarray:
  """Sentence permutation (if `permute`), then text infilling."""
  if permute and len(delimiter_ids):
    tokens = permute_sentences(tokens, rng, delimiter_ids)
  return text_infilling(tokens, rng, mask_id=mask_id, mask_ratio=mask_ratio, lam=lam)[0]


def denoising_example(original: np.ndarray, corrupted: np.ndarray, *, start_id: int,
                      pad_id: int) -> dict[str, np.ndarray]:
  """The seq2seq record: src = corrupted padded to len(original) with pad_id, src_mask,
  tgt_in = start + original[:-1], tgt_out = original, weights = 1."""
  n = len(original)
  if len(corrupted) > n:
    raise ValueError(f"corrupted text of {len(corrupted)} tokens is longer than the original "
                     f"({n})")
  src = np.full(n, pad_id, np.int32)
  src[:len(corrupted)] = corrupted
  tgt_in = np.concatenate([[start_id], original[:-1]]).astype(np.int32)
  return {"src": src, "src_mask": np.arange(n) < len(corrupted), "tgt_in": tgt_in,
          "tgt_out": np.asarray(original, np.int32), "weights": np.ones(n, np.float32)}


def noise_options(data) -> dict:
  """The objective's keys of the typed settings (or of a data section, parsed and checked:
  errors name the key and the fix)."""
  data = source_settings.coerce("denoising", data)
  return dict(mask_ratio=float(data.mask_ratio), lam=float(data.poisson_lambda),
              permute=data.permute_sentences, delimiters=data.sentence_delimiters)


class DenoisingPipeline(_KeyedWindowsMixin, _TextPipeline):
  """BART denoising batches on stream windows of `data.seq_len` tokens (module docstring)."""
  task = "bart_denoising"
  data_kind = "denoising"

  def __init__(self, data, **kw):
    data = source_settings.coerce(self.data_kind, data)
    options = noise_options(data)
    super().__init__(data, **kw)
    tok = self.tokenizer
    ids, size = tokenizers.special_ids(tok, tokenizers.TASK_SPECIAL_IDS[self.task])
    self.mask_id, self.start_id, self.pad_id = ids["mask_id"], ids["bos_id"], ids["pad_id"]
    self.info = {"vocab_size": size}
    self.delimiter_ids = []
    for char in options["delimiters"] if options["permute"] else "":
      ids = tok.encode(char)
      if len(ids) != 1:
        raise ValueError(f"data.sentence_delimiters: {char!r} is {len(ids)} tokens of "
                         f"data.tokenizer={data.tokenizer!r}, not one; give delimiters "
                         "the tokenizer keeps as single tokens (or "
                         "data.permute_sentences=False)")
      self.delimiter_ids.append(int(ids[0]))
    self.noise = dict(mask_ratio=options["mask_ratio"], lam=options["lam"],
                      permute=options["permute"])
    self._load_streams(self.seq_len)

  def _transform(self, window: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    corrupted = bart_noise(window, rng, mask_id=self.mask_id, delimiter_ids=self.delimiter_ids,
                           **self.noise)
    return denoising_example(window, corrupted, start_id=self.start_id, pad_id=self.pad_id)
