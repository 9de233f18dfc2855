#!/usr/bin/env bash
# One device call on the H200: the runtime's own runs (experiments/runtime/record.py) of a
# GPU-heavy and a light workload, with nvidia-smi sampling the SM clock, power and the clock
# event reasons every 50 ms, to see whether the recorded runs run at the kernel tables' clocks.
# Run from the repo root with the wheels in .whl: bash experiments/kernels/clock_call.sh CASE...
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
source experiments/device_install.sh || exit 1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active,utilization.gpu \
  --format=csv -lms 50 > "$OUT/smi_runtime.csv" 2>&1 &
SMI=$!
for case in "$@"; do
  echo "== $(date -u +%H:%M:%S.%N) start $case"
  timeout "${LIMIT:-100}" python3 experiments/runtime/record.py /tmp/rec "$case" 2>&1 | grep -v Warn
  echo "== $(date -u +%H:%M:%S.%N) end $case"
done | tee "$OUT/clock_runtime.log"
kill "$SMI"
