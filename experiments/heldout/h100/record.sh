#!/usr/bin/env bash
# Record the H100 held-out set through the product's own command line, REPEATS times in this
# device call, each workload in a process of its own: traces only, under OUT/rep<i>/<workload>/.
# Usage (on the GPU machine, cbsim installed): bash experiments/heldout/h100/record.sh OUT REPEATS
set -uo pipefail
out=${1:?OUT}; repeats=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv > "$out/hardware.txt" 2>&1
{ nproc; lscpu | grep 'Model name'; python3 -c 'import torch,transformers,triton;print(torch.__version__, torch.version.cuda, transformers.__version__, triton.__version__)'; } >> "$out/hardware.txt"
for rep in $(seq 1 "$repeats"); do
  grep -v '^#' "$here/workloads.txt" | while read -r name overrides; do
    dir="$out/rep$rep/$name"; mkdir -p "$out/rep$rep"
    start=$(date +%s)
    # shellcheck disable=SC2086
    python3 -P -m cbsim mode=runtime engine=compare $overrides output.trace_gzip=true \
      output.report=false output.print_table=false hydra.run.dir="$dir" > "$dir.log" 2>&1 \
      || echo "FAILED $name rep$rep (see $dir.log)"
    echo "rep$rep $name $(( $(date +%s) - start )) s"
    rm -rf "$dir/.hydra"
  done
done
