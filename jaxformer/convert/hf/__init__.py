"""Hugging Face transformers checkpoints <-> jaxformer params.

```python
from jaxformer import models
from jaxformer.convert import hf

model_config, params = hf.load("path/to/checkpoint_dir")   # config.json + weights
logits = models.build(model_config).apply({"params": params}, tokens)
hf.save(model_config, params, "out_dir")   # transformers' from_pretrained(out_dir) loads it
```

`hf.save` refuses a directory holding a training run (its config.json is the run's) and one
holding a checkpoint already unless `overwrite=True`, which also removes the old checkpoint's
shards, indexes and .bin files that the new model.safetensors replaces.

Supported architectures (the `architectures` entry of config.json, or its `model_type`):

| Hugging Face | jaxformer |
|---|---|
| GPT2LMHeadModel | `family='decoder'`, positions='learned', norm='layernorm', ffn='mlp' |
| LlamaForCausalLM | `family='decoder'`, positions='rope', norm='rmsnorm', ffn='swiglu' |
| MistralForCausalLM | as Llama, plus `window = sliding_window - 1` |
| MixtralForCausalLM | as Mistral, plus `num_experts`, `experts_per_token` |
| BertForMaskedLM, BertModel | `family='bert'` |
| BertForPreTraining | `family='bert'`, nsp=True (MLM + next-sentence heads) |
| RobertaForMaskedLM, RobertaModel | `family='roberta'` (pad_id = pad_token_id) |
| DebertaV2ForMaskedLM, DebertaV2Model | `family='deberta'` (v2/v3: c2p + p2c, shared keys) |
| ViTForImageClassification, ViTModel | `family='vit'` (pool='cls') |
| BartForConditionalGeneration, BartModel | `family='bart'` (post-LN; `final_logits_bias` -> `logits_bias`) |
| T5ForConditionalGeneration | `family='t5'` (v1.0: ffn='mlp', tied head; v1.1: ffn='swiglu', activation='gelu', tie_embeddings=False) |
| ElectraForPreTraining, ElectraForMaskedLM | `family='electra'`, role='discriminator' / 'generator' |

Each family's config and tensor mapping is `jaxformer/convert/hf/<family>.py` (`decoder.py`,
`bert.py`, `roberta.py`, `vit.py`, `bart.py`, `t5.py`, `deberta.py`, `electra.py`), next to
which transformers' `models/<name>/modeling_<name>.py` reads.

Weights are read from `model.safetensors`, sharded `*.safetensors` with
`model.safetensors.index.json` (safetensors + NumPy only; bfloat16/float8 tensors are decoded
with ml_dtypes), or `pytorch_model.bin` (+ index), which needs PyTorch. Everything is returned
as NumPy float32 in the unscanned layout (`layers_0 ... layers_{L-1}`; use
`jaxformer.models.stack.stack_layers` for `scan_layers=True`).

Layouts (HF -> ours): torch Linear weights are [out, in] and are transposed to our [in, out]
kernels; GPT-2's Conv1D weights are already [in, out]. Attention projections are split into
heads: fused `qkv` [E, 3, H, D] when num_kv_heads == num_heads, else `query` [E, H, D] +
`kv` [E, 2, Hkv, D]; the output projection is [H, D, E]. Mixtral experts w1 (gate), w3 (up),
w2 (down) are stacked into `wi_gate`/`wi_up` [X, E, F] and `wo` [X, F, E]; the router
`gate` becomes `router/kernel` [E, X]. ViT's patch conv [E, C, ph, pw] becomes [ph, pw, C, E].
RoPE: Hugging Face Llama-family checkpoints already store q/k for the rotate-half convention
that `jaxformer.ops.positions.apply_rope` uses, so no permutation of q/k rows is applied.

Every tensor a model needs must be in the checkpoint (else ValueError naming it) and every
tensor in the checkpoint must be used, except known buffers (attn.bias / masked_bias,
rotary inv_freq, position_ids) and a few heads jaxformer has no place for, which are dropped
with a warning (ViTModel's pooler). Parameters ours has and the
checkpoint legitimately lacks are filled: absent biases with zeros (e.g. Llama with
mlp_bias=True but attention_bias=False), BERT's pooler / MLM head (BertModel /
BertForMaskedLM checkpoints) with a fresh init (with a warning), ViTModel's classifier with
zeros. When saving, a parameter the target architecture has no tensor for must be all zeros.

Files: `io.py` reads config.json and the weights and writes them; `tokenizer.py` writes a
run's tokenizer as tokenizer.json (for `jaxformer.export`); `core.py` holds the mapping
rules, the checks and the `load`/`save` drivers, and finds the per-family converters
(`decoder.py`, `bert.py`, `vit.py`, one interface) through `core.converters()`.
"""

from __future__ import annotations

from jaxformer.convert.hf import core
from jaxformer.convert.hf.core import load, save

__all__ = ["load", "save", "ARCHITECTURES"]

# HF architecture -> (jaxformer family, kind); kind selects the config + tensor mapping.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    arch: (family, conv.ARCHITECTURES[arch])
    for arch, (family, conv) in core.architectures().items()}
