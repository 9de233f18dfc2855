#!/usr/bin/env bash
# One device call of h200_run16: experiments/runtime/parts_call.sh into $OUT/run16.tgz.
#   bash experiments/runtime/h200_run16/call.sh PART[:LIMIT] ...    (repo root, wheels in .whl)
exec bash experiments/runtime/parts_call.sh run16 "$@"
