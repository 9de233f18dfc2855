"""Where the decode graphs' cuBLASLt GEMMs gain: the kernels of a replayed decode graph under each
mode.graph_blas, by kernel name.

    python experiments/runtime/diag_graph_blas.py OUTDIR CASE [CASE ...]

The kernel tables time each GEMM alone (back-to-back calls of one shape in a graph) and find
cuBLASLt within 1% of cuBLAS over a layer of the 8B shape at 32 rows; the decode step measured
with it in the runtime was 4% shorter (experiments/perf/graph_blas). Each CASE
(experiments/runtime/cases.py, its generation cut to 96 tokens) runs the async engine through
`cbsim.runtime.run`, as `python -m cbsim mode=runtime` does, under torch.profiler, once per
library. Per library, over the replays after the first 16: span, busy and gap time per replay,
and per kernel name its summed time per replay; then the names whose time moved most. Writes
OUTDIR/diag_graph_blas.json and prints a table.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import CASES, MATRIX  # noqa: E402
from diag_async_forward import SKIP, replays  # noqa: E402
from record import make_config  # noqa: E402

LIBRARIES = ("cublas", "cublaslt")


def by_name(rows: list[list[dict]]) -> dict:
    """Span, busy and gap time per replay (medians), and each kernel name's time per replay
    (mean over replays of its summed duration) with its count per replay."""
    rows = rows[SKIP:]
    span = [r[-1]["ts"] + r[-1]["dur"] - r[0]["ts"] for r in rows]
    busy = [sum(k["dur"] for k in r) for r in rows]
    names: dict[str, list[float]] = defaultdict(list)
    count: dict[str, int] = defaultdict(int)
    for r in rows:
        per: dict[str, float] = defaultdict(float)
        for k in r:
            per[k["name"][:90]] += k["dur"]
        for name, us in per.items():
            names[name].append(us)
    if rows:
        for k in rows[-1]:
            count[k["name"][:90]] += 1
    return {
        "replays": len(rows),
        "kernels": int(np.median([len(r) for r in rows])) if rows else 0,
        "span_us": float(np.median(span)) if rows else None,
        "busy_us": float(np.median(busy)) if rows else None,
        "gaps_us": float(np.median(np.subtract(span, busy))) if rows else None,
        "names": {n: [round(float(np.mean(v)), 2), count[n]] for n, v in names.items()},
    }


def profile_case(name: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cbsim.runtime import run

    overrides = {**CASES, **{k: v[0] for p in MATRIX.values() for k, v in p.items()}}[name]
    case = [o for o in overrides if not o.startswith("workload.gen_len=")]
    out = {}
    for lib in LIBRARIES:
        cfg = make_config(
            ["mode=runtime", "engine=async", *case, "workload.gen_len=96", f"mode.graph_blas={lib}"]
        )
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(cfg, "async")
        torch.cuda.synchronize()
        path = Path(f"/tmp/diag_blas_{name}_{lib}.json")
        prof.export_chrome_trace(str(path))
        out[lib] = by_name(replays(json.loads(path.read_text())))
    a, b = out["cublas"]["names"], out["cublaslt"]["names"]
    every = a.keys() | b.keys()
    moved = sorted(
        ((b.get(n, [0, 0])[0] - a.get(n, [0, 0])[0], n) for n in every), key=lambda t: -abs(t[0])
    )
    out["moved_most_us"] = [
        [n, round(d, 2), a.get(n, [0, 0]), b.get(n, [0, 0])] for d, n in moved[:14]
    ]
    return out


def main(argv: list[str]) -> None:
    outdir, names = Path(argv[0]), argv[1:]
    result = {name: profile_case(name) for name in names}
    (outdir / "diag_graph_blas.json").write_text(json.dumps(result, indent=1))
    print("| case | graph_blas | replays | kernels | span us | busy us | gaps us |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in result.items():
        for lib in LIBRARIES:
            e = r[lib]
            print(
                f"| {name} | {lib} | {e['replays']} | {e['kernels']} | {e['span_us']:.1f} | "
                f"{e['busy_us']:.1f} | {e['gaps_us']:.1f} |"
            )
        print("moved most (cublaslt - cublas, us per replay; [us, count] each):")
        for n, d, x, y in r["moved_most_us"]:
            print(f"  {d:+8.2f}  {x} -> {y}  {n}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
