#!/usr/bin/env bash
# One device call of a recording session: parts of experiments/runtime/cases.py through
# experiments/runtime/clock_part_call.sh, each part's outputs in $OUT/PART, all in one archive
# ($OUT/NAME.tgz: a device call brings back a handful of files only).
#   bash experiments/runtime/parts_call.sh NAME PART[:LIMIT] ...    (repo root, wheels in .whl)
set -uo pipefail
OUT=${OUT:-/tmp/out}
name=${1:?usage: parts_call.sh NAME PART[:LIMIT] ...}
shift
parts=()
for spec in "$@"; do
  part=${spec%%:*}
  limit=${spec#*:}; [ "$limit" = "$spec" ] && limit=90
  LIMIT=$limit bash experiments/runtime/clock_part_call.sh "$part" 2>&1 | grep -E "async:|sync:"
  mkdir -p "$OUT/$part"
  mv "$OUT/rec_$part.tgz" "$OUT/smi_runtime.csv" "$OUT/clock_runtime.log" "$OUT/hardware.txt" \
    "$OUT/host_speed.log" "$OUT/$part/" 2>/dev/null
  parts+=("$part")
done
tar czf "$OUT/$name.tgz" -C "$OUT" "${parts[@]}" && rm -r "${parts[@]/#/$OUT/}"
