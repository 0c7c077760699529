#!/usr/bin/env bash
# Run a command with torch's own CPU kernels, MKL (its BLAS) and oneDNN moved together onto one kernel path, so a
# developer on one machine can check a result on a second path (docs/kernel_paths.md: which switch moves which
# numbers, measured).
#
#   bench/kernel_path.sh PATH -- COMMAND [ARGS...]
#   bench/kernel_path.sh PATH --show          # what torch and MKL report on PATH (the stage-cache key's kernel_path)
#
# PATH:
#   native   nothing forced: each library picks the best its build and the CPU allow (the variables are unset)
#   avx512   ATEN_CPU_CAPABILITY=avx512  MKL_ENABLE_INSTRUCTIONS=AVX512  ONEDNN_MAX_CPU_ISA=AVX512_CORE (no AMX)
#   avx2     ATEN_CPU_CAPABILITY=avx2    MKL_ENABLE_INSTRUCTIONS=AVX2    ONEDNN_MAX_CPU_ISA=AVX2
#   default  ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2  ONEDNN_MAX_CPU_ISA=SSE41 (no vector ISA
#            in torch's own kernels)
#
# The variables are read once, when torch loads, so they must be set before the process starts: exported here, they
# reach every process the command starts (torchrun ranks, sweep workers, launched jobs on this machine). A path the
# CPU lacks falls back to the best it has (the libraries clamp it); --show says what was taken.
set -euo pipefail

usage() {
    sed -n '5,6p' "$0" | sed 's/^# *//' >&2
    exit 2
}
[[ $# -ge 2 ]] || usage
path=$1
shift
case "$path" in
native) unset ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS ONEDNN_MAX_CPU_ISA ;;
avx512) export ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 ONEDNN_MAX_CPU_ISA=AVX512_CORE ;;
avx2) export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ;;
default) export ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41 ;;
*)
    echo "kernel_path.sh: unknown kernel path '$path' (native, avx512, avx2 or default)" >&2
    exit 2
    ;;
esac

if [[ $1 == --show ]]; then
    exec "${PYTHON:-python}" -c 'import json; from harness.runs.planning.kernel_path import kernel_path
print(json.dumps(kernel_path(), indent=2))'
fi
[[ $1 == -- && $# -ge 2 ]] || usage
shift
exec "$@"
