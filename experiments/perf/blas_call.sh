#!/usr/bin/env bash
# One device call for mode.blas (the library torch's GEMMs go to), everything into $OUT/blas.tgz:
#   bash experiments/perf/blas_call.sh    (repo root, wheels in .whl)
# benchmarks/bench_decode.py, async, cublas then cublaslt then cublas again (a drift check);
# the GEMM rows of the 8B and 1B kernel tables under each; then, when cublaslt's 8B x 32 decode
# step was at least 1% shorter than both cublas runs, the seed workload with it (SEED=0: never).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
source experiments/device_install.sh || exit 1
mkdir -p "$OUT/blas"
CASES=${CASES:-llama3_8b:32:256:1024,llama3_8b:4:256:512,llama3_1b:128:256:512}
i=0
for lib in cublas cublaslt cublas; do
  i=$((i + 1))
  timeout 120 python3 benchmarks/bench_decode.py --cases "$CASES" --engines async --anchor none \
    --set mode.blas=$lib --out "$OUT/blas/bench_${i}_$lib.json" > "$OUT/blas/bench_${i}_$lib.log" 2>&1
  echo "== $lib"; tail -4 "$OUT/blas/bench_${i}_$lib.log"
done
for lib in cublas cublaslt; do
  for m in llama3_8b llama3_1b; do
    (cd /tmp && timeout 60 python3 -m cbsim +experiment=profile_kernels mode=runtime model=$m \
      mode.blas=$lib "extra.kinds=[gemm]" extra.target_ms=2.0 extra.out="$OUT/blas" \
      extra.name=${m}_gemm_$lib hydra.run.dir=/tmp/prof_$RANDOM) > /dev/null 2>&1
  done
done
tar czf "$OUT/blas.tgz" -C "$OUT" blas
python3 - "$OUT/blas" <<'PY' > "$OUT/blas/decision.txt"
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
def step(name):
    rows = json.loads((d / name).read_text())["rows"]
    return next(r["ms_per_step"] for r in rows if r["case"] == "llama3_8b:32:256:1024")
a, lt, b = step("bench_1_cublas.json"), step("bench_2_cublaslt.json"), step("bench_3_cublas.json")
print("seed" if lt < 0.99 * min(a, b) else "no", a, lt, b)
PY
cat "$OUT/blas/decision.txt"
if [ "${SEED:-1}" = 1 ] && grep -q '^seed' "$OUT/blas/decision.txt"; then
  (cd /tmp && timeout 200 python3 -m cbsim mode=runtime +experiment=seed_repro mode.blas=cublaslt \
    hydra.run.dir=/tmp/seed_lt) > "$OUT/blas/seed_lt.log" 2>&1
  tail -12 "$OUT/blas/seed_lt.log"
  cp /tmp/seed_lt/metrics.json "$OUT/blas/seed_lt_metrics.json" 2>/dev/null
  tar czf "$OUT/blas.tgz" -C "$OUT" blas
fi
