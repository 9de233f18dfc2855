#!/usr/bin/env bash
# One device call of h200_run21: a part of experiments/runtime/cases.py (the reference first),
# every case in one process of experiments/runtime/record.py (cbsim.runtime.run, as `python -m
# cbsim mode=runtime`; the runtime's streams belong to the process, so a later run is as fast
# as the first), nvidia-smi sampling the clock beside it, the call's host speed; all in
# $OUT/PART.tgz. BENCH=1 then runs benchmarks/bench_decode.py (issue 12's table; ANCHOR=MODEL:BATCH:PROMPT:GEN
# adds transformers' continuous batching in the same process), TESTS=1 the GPU tests first.
#   bash experiments/runtime/h200_run21/call.sh PART [DEADLINE_S]   (repo root, wheels in .whl)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
PART=${1:?usage: call.sh PART [DEADLINE_S]}
source experiments/device_install.sh || exit 1
D=/tmp/$PART
# a fresh folder: a machine kept warm since an earlier command of the same part still has its files
rm -rf "$D" && mkdir -p "$D"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  nproc; lscpu | grep -E "Model name|MHz"
  python3 -c "import torch, transformers, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'triton', triton.__version__)"
} > "$D/hardware.txt" 2>&1
timeout 30 python3 benchmarks/bench_scheduler.py > "$D/host_speed.log" 2>&1
grep -E "32 " "$D/host_speed.log" | head -3
if [ "${TESTS:-0}" = 1 ]; then
  timeout 120 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/test_runtime_gpu.py \
    > "$D/gpu_tests.log" 2>&1; tail -2 "$D/gpu_tests.log"
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active,utilization.gpu \
  --format=csv -lms 50 > "$D/smi_runtime.csv" 2>&1 &
SMI=$!
timeout 420 python3 experiments/runtime/record.py "$D" "--part=$PART" "--deadline-s=${2:-300}" 2>&1 |
  grep -v Warn > "$D/clock_runtime.log"
kill "$SMI"
grep -E "speedup|FAILED|skipped" "$D/clock_runtime.log"
gzip "$D/smi_runtime.csv"
if [ "${BENCH:-0}" = 1 ]; then
  timeout 170 python3 benchmarks/bench_decode.py --engines sync,async --anchor "${ANCHOR:-none}" \
    --out "$D/bench.json" > "$D/bench.log" 2>&1
  tail -12 "$D/bench.log"
fi
tar czf "$OUT/$PART.tgz" -C /tmp "$PART"
