#!/usr/bin/env bash
# One device call's share of the fidelity recordings (experiments/runtime/README.md), through the
# CLI's code path (cbsim.runtime.run): the reference workload, then the cases of PART
# (experiments/runtime/cases.py: 8b, 3b, 1b, long), both engines each; the host-speed
# measurement of this call; everything into $OUT/rec_PART.tgz.
#   bash experiments/runtime/gpu_session.sh PART      (repo root, wheels in .whl; OUT set by the device)
# Scripts and `python3 -P -m` only: the checkout's cbsim/ must not shadow the installed package
# (cbsim.runtime and cbsim.conf live in runtime/ and conf/, mapped at install time).
# Env: TESTS=1 also runs the GPU tests first; DEADLINE_S (default 200): no case starts after it.
set -o pipefail
export PYTHONUNBUFFERED=1
PART=${1:?usage: gpu_session.sh PART (8b, 3b, 1b or long)}
OUT=${OUT:-/tmp/out}
source experiments/device_install.sh 2>/dev/null || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc
  lscpu | grep -E "Model name|MHz"
  python3 -c "import torch, transformers, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'triton', triton.__version__)"
} > "$OUT/hardware.txt" 2>&1
echo "== host speed: python3 benchmarks/bench_scheduler.py"
timeout 30 python3 benchmarks/bench_scheduler.py > "$OUT/host_speed.log" 2>&1; tail -6 "$OUT/host_speed.log"
if [ "${TESTS:-0}" != 0 ]; then
  echo "== gpu tests"
  timeout 150 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/test_runtime_gpu.py tests/test_kernels.py -rA -s \
    > "$OUT/gpu_tests.log" 2>&1; tail -3 "$OUT/gpu_tests.log"
fi
echo "== record: python3 experiments/runtime/record.py /tmp/rec_$PART --part=$PART"
timeout "${RECORD_TIMEOUT:-260}" python3 experiments/runtime/record.py "/tmp/rec_$PART" \
  "--part=$PART" "--deadline-s=${DEADLINE_S:-200}" > "$OUT/record_$PART.log" 2>&1
grep -E "speedup|FAILED|skipped|Error" "$OUT/record_$PART.log"
cp "$OUT/host_speed.log" "$OUT/hardware.txt" "/tmp/rec_$PART/" 2>/dev/null
tar czf "$OUT/rec_$PART.tgz" -C /tmp "rec_$PART"
