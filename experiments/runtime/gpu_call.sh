#!/usr/bin/env bash
# One device call on the H200: install the wheels, run the runtime's GPU tests, record the
# reference runs (traces, metrics, tracing overhead, a small Kineto trace), run the anchor.
# Run from the repo root with the wheels in .whl (../shared/tools/gpu-wheels.sh .whl):
#   bash experiments/runtime/gpu_call.sh "CASES" "ANCHOR_ARGS"      (CASES=skip: no recording)
# Env: TESTS=0 skips the GPU tests; CLI="mode=runtime +experiment=seed" also runs the app.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
CASES=${1:-"seed_1024 small_batch long_prompt"}
ANCHOR=${2:-"--hf-gen 128 --hf-async-gen 32"}
source experiments/device_install.sh || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, transformers, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'triton', triton.__version__)"
  nproc; } > "$OUT/hardware.txt" 2>&1
if [ -n "${TESTS:-1}" ] && [ "${TESTS:-1}" != 0 ]; then
  echo "== gpu tests: python3 -m pytest -q -m gpu tests/test_runtime_gpu.py"
  timeout "${TESTS_TIMEOUT:-150}" python3 -P -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_runtime_gpu.py -rA -s 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
if [ -n "${CLI:-}" ]; then
  echo "== cli: python3 -m cbsim $CLI hydra.run.dir=/tmp/cli"
  timeout "${CLI_TIMEOUT:-240}" python3 -P -m cbsim $CLI hydra.run.dir=/tmp/cli 2>&1 |
    tee "$OUT/cli.log" | tail -30
  tar czf "$OUT/cli.tgz" -C /tmp cli
fi
[ "$CASES" = skip ] && exit 0
echo "== record: python3 experiments/runtime/record.py /tmp/rec $CASES ${RECORD_FLAGS---overhead --kineto}"
timeout "${RECORD_TIMEOUT:-260}" python3 experiments/runtime/record.py /tmp/rec $CASES \
  ${RECORD_FLAGS---overhead --kineto} 2>&1 | tee "$OUT/record.log" | grep -v Warning
tar czf "$OUT/rec.tgz" -C /tmp rec
if [ "$ANCHOR" != skip ]; then
  echo "== anchor: python3 benchmarks/bench_anchor.py $ANCHOR"
  timeout "${ANCHOR_TIMEOUT:-150}" python3 benchmarks/bench_anchor.py $ANCHOR \
    --out "$OUT/anchor.json" 2>&1 | tee "$OUT/anchor.log" | tail -12
fi
