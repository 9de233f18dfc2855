#!/usr/bin/env bash
# One device call on the H200: install the wheels, then time the kernels of three model shapes
# (Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B) into kernel tables under $OUT/h200/.
# Run from the repo root with the wheels in .whl (../shared/tools/gpu-wheels.sh .whl):
#   bash experiments/kernels/profile_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
source experiments/device_install.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/hardware.txt" 2>&1
TARGET=${TARGET:-2.0}
# the Llama-3.2-3B shape: conf/model/llama3_3b.yaml (the committed 3B table was recorded with the
# same dimensions given as overrides of model=llama3_1b, before that preset existed)
THREE_B="model=llama3_3b"
run() {  # $1: seconds, rest: overrides
  local limit=$1; shift
  echo "== python3 -m cbsim +experiment=profile_kernels mode=runtime $* extra.out=$OUT/h200"
  # from outside the checkout: its cbsim/ folder would shadow the installed package (cbsim.conf)
  (cd /tmp && timeout "$limit" python3 -m cbsim +experiment=profile_kernels mode=runtime "$@" \
    extra.out="$OUT/h200" extra.target_ms="$TARGET" hydra.run.dir="/tmp/prof_${RANDOM}") 2>&1 | grep -v Warn | tail -8
  # a device call brings back a few files, and what is under $OUT when it is stopped: one archive
  tar -czf "$OUT/h200.tgz" -C "$OUT" h200 hardware.txt
}
run "${T1:-200}" model=llama3_1b extra.max_seconds="${S1:-170}"
run "${T3:-170}" $THREE_B "extra.kinds=[elementwise,gemm,prefill_attention,decode_attention]" extra.max_seconds="${S3:-150}"
run "${T8:-170}" model=llama3_8b "extra.kinds=[elementwise,gemm,prefill_attention,decode_attention]" extra.max_seconds="${S8:-150}"
ls -la "$OUT/h200"
