#!/usr/bin/env bash
# One recording session on the H200 (h200_run7, run8): GPU tests, the six cross-shape cases,
# kernels per step kind (experiments/runtime/README.md).
#   bash experiments/runtime/gpu_session.sh         (repo root, wheels in .whl; OUT set by the device)
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null &&
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>/dev/null &&
  export PYTHONPATH=/tmp/site || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc
  lscpu | grep -E "Model name|MHz"; } > "$OUT/hardware.txt" 2>&1
echo "== gpu tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_runtime_gpu.py -rA -s \
  > "$OUT/gpu_tests.log" 2>&1; tail -3 "$OUT/gpu_tests.log"; grep "launched ahead" "$OUT/gpu_tests.log"
echo "== record"
timeout 290 python3 experiments/runtime/record.py /tmp/rec seed_1024 small_batch long_prompt \
  batch_16_2048 batch_64 continuous > "$OUT/record.log" 2>&1
grep -E "speedup|FAILED|Error" "$OUT/record.log"
tar czf "$OUT/rec.tgz" -C /tmp rec
echo "== diag"
timeout 90 python3 experiments/runtime/diag_launch.py /tmp/diag --prefill --kernels > "$OUT/diag.log" 2>&1
grep -E "^\[prefill\] traced|FAILED" "$OUT/diag.log"; grep -A8 "per forward by kind" "$OUT/diag.log"
tar czf "$OUT/diag.tgz" -C /tmp diag
