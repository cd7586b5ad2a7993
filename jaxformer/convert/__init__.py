"""Checkpoint converters between jaxformer params and other libraries' formats.

`from jaxformer.convert import hf`: Hugging Face transformers checkpoints (see `hf.load` /
`hf.save`).
"""
