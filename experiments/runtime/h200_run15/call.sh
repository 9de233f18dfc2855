#!/usr/bin/env bash
# One device call of h200_run15: experiments/runtime/parts_call.sh into $OUT/run15.tgz.
#   bash experiments/runtime/h200_run15/call.sh PART[:LIMIT] ...    (repo root, wheels in .whl)
exec bash experiments/runtime/parts_call.sh run15 "$@"
