#!/usr/bin/env bash
# One device call: a part of experiments/runtime/cases.py (the reference workload first), each
# case through experiments/runtime/record.py (cbsim.runtime.run, as `python -m cbsim
# mode=runtime`), with nvidia-smi sampling the SM clock, power and the clock event reasons
# every 50 ms beside it (experiments/kernels/h200_clock/clock_summary.py reads the start/end lines), and
# this call's host speed; everything into $OUT (rec_PART.tgz: PART/CASE/CASE/trace_*.json.gz).
#   bash experiments/runtime/clock_part_call.sh PART     (repo root, wheels in .whl)
# Env: LIMIT (default 90): seconds per case.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
PART=${1:?usage: clock_part_call.sh PART}
source experiments/device_install.sh || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  nproc; lscpu | grep -E "Model name|MHz"
} > "$OUT/hardware.txt" 2>&1
timeout 30 python3 benchmarks/bench_scheduler.py > "$OUT/host_speed.log" 2>&1
CASES=$(python3 -c "import sys; sys.path.insert(0, 'experiments/runtime'); from cases import part_cases; print(' '.join(part_cases('$PART')))") || exit 1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active,utilization.gpu \
  --format=csv -lms 50 > "$OUT/smi_runtime.csv" 2>&1 &
SMI=$!
for case in $CASES; do
  echo "== $(date -u +%H:%M:%S.%N) start $case"
  timeout "${LIMIT:-90}" python3 experiments/runtime/record.py "/tmp/$PART/$case" "$case" 2>&1 | grep -v Warn
  echo "== $(date -u +%H:%M:%S.%N) end $case"
done | tee "$OUT/clock_runtime.log"
kill "$SMI"
tar czf "$OUT/rec_$PART.tgz" -C /tmp "$PART"
