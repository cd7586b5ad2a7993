"""The analysis core of the TPU planner: compile-only devices of a named topology
(`topology`), per-chip figures with their sources (`chips`), and what a compiled TPU program
does per step, read from its HLO text (`hlo`: collectives per mesh axis, the compiler's cycle
estimate, matmul FLOPs and HBM traffic, loops multiplied out). Needs libtpu (`[tpu]` extra)
only to compile; `hlo` reads text and imports nothing TPU-specific."""
