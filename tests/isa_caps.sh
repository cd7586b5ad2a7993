#!/usr/bin/env bash
# The numerical tests as other x86 CPUs compute them: a tolerance tuned to one machine's
# rounding fails here. Each pass caps XLA:CPU's code generation to an older instruction set
# (--xla_cpu_max_isa; tests/conftest.py appends its own flags to XLA_FLAGS) and puts OpenBLAS
# (NumPy's and SciPy's BLAS/LAPACK: the scaling fits) and NumPy's SIMD loops at their
# x86-64-v2 baseline (no AVX2/AVX-512 loops):
#   SSE4_2: no AVX, no FMA (OpenBLAS's Nehalem kernels)
#   AVX:    256-bit vectors, no FMA (OpenBLAS's Sandy Bridge kernels)
# The default machine's run is the suite itself. Wider ISAs than the host's (AVX-512 on an
# AVX2 host) cannot be emulated; the tolerances are derived (docs/design/testing.md), not tuned.
#
#   tests/isa_caps.sh                    the numerical files below, under both caps
#   tests/isa_caps.sh tests/unit/layers/test_moe.py  other files / pytest arguments instead
#   ISA_CAPS="AVX" tests/isa_caps.sh     one cap
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python}"
if [[ $# -eq 0 ]]; then
  set -- tests/unit/parallel/test_parallel.py tests/unit/parallel/test_sharding.py tests/unit/layers/test_moe.py tests/unit/models/test_models.py \
    tests/unit/ops/test_attention_ops.py tests/unit/layers/test_attention_layers.py tests/unit/layers/test_layers_basic.py \
    tests/unit/scaling/test_mup.py tests/unit/experiments/test_reports.py tests/unit/scaling/test_scaling_fits.py tests/unit/scaling/test_scaling_stats.py
fi
declare -A openblas=([SSE4_2]=Nehalem [AVX]=Sandybridge)
status=0
for cap in ${ISA_CAPS:-SSE4_2 AVX}; do
  if [[ -z "${openblas[$cap]:-}" ]]; then echo "isa_caps: unknown cap $cap (SSE4_2, AVX)" >&2; exit 2; fi
  start=$SECONDS
  XLA_FLAGS="${XLA_FLAGS:-} --xla_cpu_max_isa=$cap" OPENBLAS_CORETYPE="${openblas[$cap]}" \
    NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4 AVX512_ICL AVX512_SPR" \
    "$python" -m pytest -q -p no:cacheprovider "$@"
  rc=$?
  echo "isa_caps: --xla_cpu_max_isa=$cap, OpenBLAS ${openblas[$cap]}: exit $rc in $((SECONDS - start)) s"
  [[ $rc -eq 0 ]] || status=1
done
exit $status
