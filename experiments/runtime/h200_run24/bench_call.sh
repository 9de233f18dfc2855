#!/usr/bin/env bash
# h200_run24's first command: the GPU tests (async == sync == generate; the chunked case's
# continuations attend as decode rows, engine.continuation_decode_max) and
# benchmarks/bench_continuation.py on the 8B and 1B shapes; all in $OUT/bench_cont.tgz.
#   bash experiments/runtime/h200_run24/bench_call.sh   (repo root, wheels in .whl)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
source experiments/device_install.sh || exit 1
D=/tmp/bench_cont
rm -rf "$D" && mkdir -p "$D"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  nproc; lscpu | grep -E "Model name|MHz"
} > "$D/hardware.txt" 2>&1
timeout 30 python3 benchmarks/bench_scheduler.py > "$D/host_speed.log" 2>&1
timeout 150 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/test_runtime_gpu.py \
  > "$D/gpu_tests.log" 2>&1
tail -2 "$D/gpu_tests.log"
for m in llama3_8b llama3_1b; do
  timeout 150 python3 benchmarks/bench_continuation.py --model "$m" --out "$D/cont_$m.json" \
    > "$D/cont_$m.log" 2>&1
  tail -22 "$D/cont_$m.log"
done
tar czf "$OUT/bench_cont.tgz" -C /tmp bench_cont
