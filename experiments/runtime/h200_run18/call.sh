#!/usr/bin/env bash
# One device call of h200_run18: experiments/runtime/parts_call.sh into $OUT/run18.tgz, then
# (BENCH=1) benchmarks/bench_decode.py, async, on its default cases into $OUT/bench.json/.log.
#   bash experiments/runtime/h200_run18/call.sh PART[:LIMIT] ...    (repo root, wheels in .whl)
OUT=${OUT:-/tmp/out}
bash experiments/runtime/parts_call.sh run18 "$@"
if [ "${BENCH:-0}" = 1 ]; then
  source experiments/device_install.sh || exit 1
  timeout 170 python3 benchmarks/bench_decode.py --engines async --anchor none \
    --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  tail -8 "$OUT/bench.log"
fi
