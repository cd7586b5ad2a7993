"""Evaluation of any checkpoint of a training run: `python -m jaxformer.evaluate`.

- `perplexity`: loss, perplexity and bits per byte of a decoder LM on any text source,
  read as training reads it (`perplexity.evaluate`);
- `choices`: multiple-choice accuracy on local JSONL in the HellaSwag, ARC, PIQA and a
  generic format (`choices.evaluate`);
- `harness`: `JaxformerLM`, lm-evaluation-harness's model API for jaxformer runs (the
  `[eval]` extra), and `harness.run`;
- `probe`: a linear probe on frozen features of an encoder (BERT family, ViT).

`scoring` is the one scoring core the first three share; `results` writes
`<workdir>/eval/<name>.json`. Nothing here imports lm_eval except `harness`.
"""
