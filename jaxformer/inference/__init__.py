"""Inference from trained models: restore a run, decode with the KV cache, sample text.

    from jaxformer import inference
    config, params, tokenizer = inference.load_run(workdir)       # restore.py (latest|best)
    inference.sample_text(config, params, tokenizer, prompt="ROMEO:", max_new_tokens=200)
    inference.generate(config.model, params, tokens, max_new_tokens=20)   # decode.py (ids)
    inference.generate(..., kv_cache=inference.KVCachePolicy("sinks", budget=64))  # compressed
    inference.streaming_nll(config.model, params, tokens, kv_cache=...)  # streaming.py
    inference.caption_images(config.model, params, images, beam_size=3)  # captions.py
    inference.predict.mode_for(config).run(inference.predict.Request(...))  # every family

From the training package this imports only the train state's layout, its optimizer and
checkpoints (`jaxformer.train.state`, `.optim`, `.checkpoint`: the state training builds
too), never the loop (tests/unit/package/test_structure.py checks it).
"""

from __future__ import annotations

from jaxformer.inference.beam import beam_search, greedy_decode
from jaxformer.inference.captions import attention_maps, caption_images, caption_metrics
from jaxformer.inference.decode import filter_logits, generate, generate_ragged
from jaxformer.inference.restore import load_run
from jaxformer.inference.streaming import stream_logits_fn, streaming_nll
from jaxformer.layers.kv_cache import KVCachePolicy
from jaxformer.inference.text import sample_text
from jaxformer.inference import predict  # noqa: E402  (after the modules it uses)

__all__ = ["filter_logits", "generate", "generate_ragged", "load_run", "sample_text",
           "beam_search", "greedy_decode", "caption_images", "attention_maps", "caption_metrics",
           "predict", "KVCachePolicy", "stream_logits_fn", "streaming_nll"]
