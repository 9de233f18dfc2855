#!/usr/bin/env bash
# The device-side assert of h200_run10/heldout_c, before and after the build synchronises with
# the default stream, then one part of the recordings: the five held-out cases that reproduced
# it, in one process each way (experiments/runtime/diag_sequence.py), first on the runtime
# before the change (.whl/ctl.tar: `git archive` of that commit), then on this checkout;
# then `gpu_session.sh PART`.
#   bash experiments/runtime/assert_call.sh PART       (repo root; carry .whl)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
PART=${1:?usage: assert_call.sh PART}
SEQ="q7b_24x384+768 q7b_96x256+256 q7b_poisson_32 l13b_12x1024+512 l13b_2x256+512"
source experiments/device_install.sh || exit 1
mkdir -p /tmp/ctl && tar xf .whl/ctl.tar -C /tmp/ctl &&
  (cd /tmp/ctl && python3 -m pip install -q --no-index --no-deps --no-build-isolation \
    --target /tmp/site_ctl .) || exit 1
show() { grep -E "speedup|FAILED|Error|assert" "$1" | cut -c1-160; }
echo "== control: the runtime before the change"
(cd /tmp && PYTHONPATH=/tmp/site_ctl:/tmp/site timeout "${SEQ_TIMEOUT:-150}" \
  python3 /tmp/ctl/experiments/runtime/diag_sequence.py /tmp/d_ctl $SEQ) > "$OUT/assert_control.log" 2>&1
show "$OUT/assert_control.log"
echo "== this checkout"
timeout "${SEQ_TIMEOUT:-150}" python3 experiments/runtime/diag_sequence.py /tmp/d_fix $SEQ \
  > "$OUT/assert_fix.log" 2>&1
show "$OUT/assert_fix.log"
tar czf "$OUT/seq_fix.tgz" -C /tmp d_fix
DEADLINE_S=${DEADLINE_S:-170} RECORD_TIMEOUT=${RECORD_TIMEOUT:-230} \
  bash experiments/runtime/gpu_session.sh "$PART"
