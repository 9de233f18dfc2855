#!/usr/bin/env bash
# Device calls for mode.fuse_epilogues (runtime/kernels/fused_epilogues.py), everything into $OUT.
#   bash experiments/perf/epilogues_call.sh STEP...    (repo root, wheels in .whl)
# Steps, in the order given:
#   tests    the GPU tests of the kernels and the runtime (async == sync == generate)
#   kernels  kernels per forward by step kind (Kineto), fused and unfused
#   tables   the elementwise rows of the kernel tables of three model shapes (needs plotly's
#            wheel: the CLI's preflight imports the report)
#   bench    benchmarks/bench_decode.py, async, in the order ORDER (default: fused unfused),
#            ROUNDS times (default 1)
#   skinny   benchmarks/bench_kernels.py's skinny section: a Triton GEMM for few rows vs cuBLAS
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
[ $# -gt 0 ] || { echo "usage: epilogues_call.sh tests|kernels|tables|bench ..."; exit 2; }
source experiments/device_install.sh || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  nproc; lscpu | grep -E "Model name"
} > "$OUT/hardware.txt" 2>&1
timeout 30 python3 benchmarks/bench_scheduler.py > "$OUT/host_speed.log" 2>&1
for step in "$@"; do
  echo "== $(date -u +%H:%M:%S) $step"
  case $step in
  tests)
    OUT=$OUT bash experiments/perf/gpu_tests.sh ;;
  kernels)
    for fused in true false; do
      timeout 80 python3 experiments/runtime/diag_launch.py "$OUT/kernels_$fused" --kernels \
        --set=mode.fuse_epilogues=$fused 2>&1 | grep -A8 "per forward"
    done
    rm -f "$OUT"/kernels_*/kineto_*.json.gz ;;  # the counts are in diag_launch.json
  tables)
    for m in llama3_8b llama3_1b llama3_3b; do
      # from outside the checkout: its cbsim/ folder would shadow the installed package
      (cd /tmp && timeout 60 python3 -m cbsim +experiment=profile_kernels mode=runtime model=$m \
        'extra.kinds=[elementwise]' extra.out="$OUT/tables" extra.target_ms=3.0 \
        hydra.run.dir=/tmp/prof_${m}_$$) > "$OUT/profile_$m.log" 2>&1
      tail -1 "$OUT/profile_$m.log"
    done
    # a device call brings back a few files only: one archive
    tar czf "$OUT/tables.tgz" -C "$OUT" tables profile_llama3_8b.log profile_llama3_1b.log \
      profile_llama3_3b.log && rm -r "$OUT/tables" "$OUT"/profile_*.log ;;
  bench)
    CASES=${CASES:-llama3_8b:32:256:1024,llama3_8b:4:256:512,llama3_1b:128:256:512}
    for round in $(seq 1 "${ROUNDS:-1}"); do
      for fused in ${ORDER:-true false}; do
        timeout 150 python3 benchmarks/bench_decode.py --cases "$CASES" --engines async \
          --anchor none --set mode.fuse_epilogues=$fused --out "$OUT/bench_${fused}_$round.json" \
          > "$OUT/bench_${fused}_$round.log" 2>&1
        tail -4 "$OUT/bench_${fused}_$round.log"
      done
    done ;;
  skinny)
    timeout 140 python3 benchmarks/bench_kernels.py --sections env,skinny --deadline 120 \
      --out "$OUT/skinny" 2>&1 | grep "skinny" ;;
  *) echo "unknown step $step" ;;
  esac
done
