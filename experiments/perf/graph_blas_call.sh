#!/usr/bin/env bash
# One device call for mode.graph_blas (cuBLASLt in the decode graphs, cuBLAS eager) and
# mode.split_argmax (the two-stage argmax), everything into $OUT/graph_blas.tgz:
#   bash experiments/perf/graph_blas_call.sh STEP...    (repo root, wheels in .whl)
# Steps, in the order given (a failed `tests` stops the call):
#   tests    the GPU tests of the kernels and the runtime (async == sync == generate) on the
#            defaults (graph_blas=cublaslt, split_argmax=true)
#   bench    benchmarks/bench_decode.py, async: the defaults, then both off (the build before),
#            then the defaults again (a drift check)
#   profile  the GEMM rows (cuBLAS, and cuBLASLt at the graphs' rows) and the elementwise rows
#            (argmax_split among them) of the 1B, 3B and 8B shapes, into gemm/ (env: KINDS, the
#            extra.kinds list; GEMM_DIR, the folder)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
[ $# -gt 0 ] || { echo "usage: graph_blas_call.sh tests|bench|profile ..."; exit 2; }
source experiments/device_install.sh || exit 1
D=$OUT/graph_blas
mkdir -p "$D"
pack() { tar czf "$OUT/graph_blas.tgz" -C "$OUT" graph_blas; }
BEFORE="--set mode.graph_blas=cublas --set mode.split_argmax=false"
CASES=${CASES:-llama3_8b:32:256:1024,llama3_8b:4:256:512,llama3_1b:128:256:512,llama3_3b:64:256:1024}
for step in "$@"; do
  echo "== $(date -u +%H:%M:%S) $step"
  case $step in
  tests)
    OUT=$D bash experiments/perf/gpu_tests.sh || { pack; echo "GPU tests failed: stopping"; exit 1; } ;;
  bench)
    i=0
    for build in new before new; do
      i=$((i + 1)); sets=""; [ "$build" = before ] && sets=$BEFORE
      # shellcheck disable=SC2086
      timeout 150 python3 benchmarks/bench_decode.py --cases "$CASES" --engines async \
        --anchor none $sets --out "$D/bench_${i}_$build.json" > "$D/bench_${i}_$build.log" 2>&1
      tail -6 "$D/bench_${i}_$build.log"
    done ;;
  profile)
    for m in llama3_1b llama3_3b llama3_8b; do
      (cd /tmp && timeout 100 python3 -m cbsim +experiment=profile_kernels mode=runtime model=$m \
        "extra.kinds=[${KINDS:-gemm,elementwise}]" extra.target_ms=2.0 extra.out="$D/${GEMM_DIR:-gemm}" \
        hydra.run.dir=/tmp/prof_$RANDOM) 2>&1 | grep -v Warn | tail -3
    done ;;
  *) echo "unknown step $step" ;;
  esac
  pack
done
