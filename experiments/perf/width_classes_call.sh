#!/usr/bin/env bash
# Device calls for engine.graph_width_classes (a decode graph per launch class of the attention
# kernel), everything into $OUT.
#   bash experiments/perf/width_classes_call.sh STEP...    (repo root, wheels in .whl)
# Steps, in the order given (a failed `tests` stops the call):
#   tests    the GPU tests of the kernels and the runtime (async == sync == generate)
#   seed     experiments/runtime/clock_part_call.sh seed (LIMIT=200), into $OUT/rec_seed.tgz
#   bench    benchmarks/bench_decode.py, async, graph_width_classes in the order ORDER
#            (default: true false)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
[ $# -gt 0 ] || { echo "usage: width_classes_call.sh tests|seed|bench ..."; exit 2; }
source experiments/device_install.sh || exit 1
for step in "$@"; do
  echo "== $(date -u +%H:%M:%S) $step"
  case $step in
  tests)
    OUT=$OUT bash experiments/perf/gpu_tests.sh || { echo "GPU tests failed: stopping"; exit 1; } ;;
  seed)
    LIMIT=200 bash experiments/runtime/clock_part_call.sh seed > "$OUT/seed_call.log" 2>&1
    grep -E "async:|sync:" "$OUT/seed_call.log" ;;
  bench)
    CASES=${CASES:-llama3_8b:32:256:1024,llama3_1b:128:256:512}
    for on in ${ORDER:-true false}; do
      timeout 120 python3 benchmarks/bench_decode.py --cases "$CASES" --engines async \
        --anchor none --set engine.graph_width_classes=$on --out "$OUT/bench_$on.json" \
        > "$OUT/bench_$on.log" 2>&1
      tail -4 "$OUT/bench_$on.log"
    done ;;
  *) echo "unknown step $step" ;;
  esac
done
