#!/usr/bin/env bash
# Device calls for engine.decode_launch (the decode kernel's launch rule), everything into $OUT.
#   bash experiments/perf/launch_rule_call.sh STEP...    (repo root, wheels in .whl)
# Steps, in the order given (a failed `tests` stops the call):
#   tests    the GPU tests of the kernels and the runtime (async == sync == generate)
#   seed     experiments/runtime/h200_run16/call.sh seed:200 (the reference workload and the
#            seed, both engines), into $OUT/run16.tgz
#   bench    benchmarks/bench_decode.py, async, the default rule then the rule before it
#            (RULES: the order, default "new before")
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
[ $# -gt 0 ] || { echo "usage: launch_rule_call.sh tests|seed|bench ..."; exit 2; }
source experiments/device_install.sh || exit 1
BEFORE="--set engine.decode_launch.target_programs=1024 --set engine.decode_launch.min_partition=1024"
BEFORE="$BEFORE --set engine.decode_launch.small_tile_from=2049 --set engine.decode_launch.split_classes=false"
for step in "$@"; do
  echo "== $(date -u +%H:%M:%S) $step"
  case $step in
  tests)
    OUT=$OUT bash experiments/perf/gpu_tests.sh || { echo "GPU tests failed: stopping"; exit 1; } ;;
  seed)
    OUT=$OUT bash experiments/runtime/h200_run16/call.sh seed:200 ;;
  bench)
    CASES=${CASES:-llama3_8b:32:256:1024,llama3_8b:4:256:512,llama3_1b:128:256:512,llama3_1b:96:256:2048}
    for rule in ${RULES:-new before}; do
      sets=""; [ "$rule" = before ] && sets=$BEFORE
      # shellcheck disable=SC2086
      timeout 150 python3 benchmarks/bench_decode.py --cases "$CASES" --engines async \
        --anchor none $sets --out "$OUT/bench_$rule.json" > "$OUT/bench_$rule.log" 2>&1
      tail -6 "$OUT/bench_$rule.log"
    done
    tar czf "$OUT/bench.tgz" -C "$OUT" bench_new.json bench_new.log bench_before.json bench_before.log 2>/dev/null ;;
  *) echo "unknown step $step" ;;
  esac
done
