#!/usr/bin/env bash
# The GPU tests of the kernels and the runtime (async == sync == generate) on the device, into
# $OUT/gpu_tests.log; prints its last lines and exits with pytest's status. Called by the
# device-call scripts beside it (their `tests` step), after experiments/device_install.sh.
OUT=${OUT:-/tmp/out}
timeout 170 python3 -P -m pytest -q -m gpu -p no:cacheprovider tests/test_fused_epilogues.py \
  tests/test_kernels.py tests/test_sampling_kernel.py tests/test_runtime_gpu.py > "$OUT/gpu_tests.log" 2>&1
rc=$?
tail -3 "$OUT/gpu_tests.log"
exit $rc
