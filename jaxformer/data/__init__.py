"""Data: tokenizers and sources that yield deterministic, resumable batches."""
