"""Text corpora of any size: sources resolved once, tokenized once into sharded token files
(streaming, over the CPU cores), read per host by offset."""
