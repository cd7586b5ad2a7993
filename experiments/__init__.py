"""Experiments and benchmarks: `python -m experiments.<name>` from the repository root (each
prints a table and/or writes a report under experiments/results/)."""
