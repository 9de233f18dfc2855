#!/usr/bin/env bash
# One device call of h200_run17: experiments/runtime/parts_call.sh into $OUT/run17.tgz, then
# (DIAG=1) experiments/runtime/diag_graph_blas.py on the seed shape into $OUT.
#   bash experiments/runtime/h200_run17/call.sh PART[:LIMIT] ...    (repo root, wheels in .whl)
OUT=${OUT:-/tmp/out}
bash experiments/runtime/parts_call.sh run17 "$@"
if [ "${DIAG:-0}" = 1 ]; then
  source experiments/device_install.sh || exit 1
  timeout 150 python3 experiments/runtime/diag_graph_blas.py "$OUT" seed_1024 2>&1 | grep -v Warn | tail -40
fi
