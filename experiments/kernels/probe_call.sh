#!/usr/bin/env bash
# One device call on the H200: install the wheels, then run experiments/kernels/probe_h200.py
# (decode attention between KV-tile multiples and at wide block tables; sustained-load GEMMs and
# prefill attention) with nvidia-smi sampling the SM clock and power every 50 ms beside it.
# Run from the repo root with the wheels in .whl: bash experiments/kernels/probe_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
source experiments/device_install.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv > "$OUT/hardware.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv -lms 50 > "$OUT/smi.csv" 2>&1 &
SMI=$!
nvidia-smi --query-gpu=timestamp,clocks_event_reasons.active --format=csv -lms 50 > "$OUT/smi_reasons.csv" 2>&1 &
REASONS=$!
cp experiments/kernels/probe_h200.py /tmp/probe_h200.py
(cd /tmp && timeout "${LIMIT:-200}" python3 -P /tmp/probe_h200.py "$OUT" "${SECONDS_PER_POINT:-0.4}") 2>&1 |
  grep -v Warn | tee "$OUT/probe.log" | tail -40
kill "$SMI" "$REASONS"
ls -la "$OUT"
