#!/usr/bin/env bash
# Predict the held-out set (conf/experiment/heldout.yaml's cases) with the simulator before
# it is recorded: one line per case with the profile's totals, idle and async speedup (P5-P95
# band). Usage, from the checkout root:
#   bash experiments/heldout/predict.sh OUT.txt hardware=h100
#   bash experiments/heldout/predict.sh OUT.txt hardware=h200 hardware.kernel_table=DIR
set -uo pipefail
out=${1:?OUT}; shift
cases() {  # "name override override ..." per case of the preset
  python - <<'PY'
import yaml
extra = yaml.safe_load(open("conf/experiment/heldout.yaml"))["extra"]
for name, overrides in extra["cases"].items():
    print(name, *overrides, *extra.get("pass", []))
PY
}
echo "# predicted by: python -m cbsim engine=compare <workload> $* ($(git rev-parse --short HEAD 2>/dev/null))" > "$out"
cases | while read -r name overrides; do
  dir=$(mktemp -d)
  # shellcheck disable=SC2086
  python -m cbsim engine=compare $overrides "$@" output.trace=false output.report=false \
    output.print_table=false hydra.run.dir="$dir" > "$dir/log" 2>&1 || { echo "$name FAILED" >> "$out"; continue; }
  python - "$name" "$dir/metrics.json" >> "$out" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
m = json.load(open(path))
runs = {e: m[e] for e in ("sync", "async") if e in m} or m.get("engines", {})
s, a = runs["sync"], runs["async"]
band = (m.get("bands") or {}).get("speedup") or {}
lo, hi = band.get("p5", float("nan")), band.get("p95", float("nan"))
sp = s["total_time_s"] / a["total_time_s"]
print(f"{name} sync {s['total_time_s']:.3f} s idle {100 * s['gpu_idle_fraction']:.2f}% | "
      f"async {a['total_time_s']:.3f} s idle {100 * a['gpu_idle_fraction']:.2f}% | "
      f"speedup x{sp:.4f} band x{lo:.4f}-x{hi:.4f}")
PY
  rm -rf "$dir"
done
