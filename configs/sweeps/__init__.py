"""Sweep definitions: `configs/sweeps/<name>.py` has `get_sweep(arg=None)` (see
jaxformer/sweep/__main__.py, the `python -m jaxformer.sweep --help` text).

Run one with `python -m jaxformer.sweep --config=configs/sweeps/<name>.py[:arg] --workdir=DIR`.
"""
