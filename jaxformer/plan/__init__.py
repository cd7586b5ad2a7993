"""Ahead-of-time planning for TPUs: what a training config costs on a slice, from any machine.

- `topology`: libtpu's compile-only devices of a named slice (`v5e:4x4`, several slices);
- `hlo`: what a compiled program does per step, read from its HLO text (collectives per mesh
  axis, the compiler's cycle estimate, matmul FLOPs and HBM traffic, loops multiplied out);
- `estimate`: the trainer's step compiled for a topology (`jaxformer.train.program` builds
  it), its memory per chip against HBM and its estimated step time (communication the
  schedule does not hide, custom kernels at a stated efficiency), the on-disk compile cache;
- `search`: the best sharding (mesh, FSDP, remat, accumulation, attention, scanning,
  optimizer state), and the nearest change that makes a step fit;
- `__main__`: the one command line, `python -m jaxformer.plan`.

The accelerator figures are `jaxformer.accelerators`; the trainer's own fit check is
`jaxformer.train.program.require_fit` (the trainer imports nothing from here).
"""

EXIT_DOES_NOT_FIT = 3    # the step (with --search: every candidate) does not fit in HBM
