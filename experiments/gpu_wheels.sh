#!/usr/bin/env bash
# The wheels experiments/gpu_check.py needs on the GPU machine beyond its image (Python 3.12,
# JAX, flax, optax, orbax, chex, absl, etils, protobuf, psutil, PyYAML are there; nothing can be
# downloaded there): ml_collections (configs/), grain with array_record and portpicker
# (jaxformer/data/batching.py imports grain at module level, reached through train.tasks).
# Run once on a machine with PyPI, from the repository root; fills the git-ignored .wheels/.
#   bash experiments/gpu_wheels.sh [PYTHON]
set -euo pipefail
python=${1:-python3}
mkdir -p .wheels
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .wheels \
  ml_collections==1.1.0 grain==0.2.18 array_record==0.8.6 portpicker==1.6.0
ls -l .wheels
