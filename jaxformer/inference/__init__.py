"""Inference from trained models: restore a run, decode with the KV cache, sample text.

    from jaxformer import inference
    config, params, tokenizer = inference.load_run(workdir)       # restore.py (latest|best)
    inference.sample_text(config, params, tokenizer, prompt="ROMEO:", max_new_tokens=200)
    inference.generate(config.model, params, tokens, max_new_tokens=20)   # decode.py (ids)

Nothing here imports the training package (tests/test_structure.py checks it): the train
state's layout comes from `jaxformer.state`, which training builds its state with too.
"""

from __future__ import annotations

from jaxformer.inference.decode import filter_logits, generate
from jaxformer.inference.restore import load_run
from jaxformer.inference.text import sample_text

__all__ = ["filter_logits", "generate", "load_run", "sample_text"]
