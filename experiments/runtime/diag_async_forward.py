"""Why a replayed decode graph can run longer under the async loop than under the sync loop.

    python experiments/runtime/diag_async_forward.py OUTDIR CASE [CASE ...]

h200_run12/13 recorded some shapes' async graph replays 150-280 us longer than their sync twins
(q7b_16x1024+512 in two calls), others within the carry-over's 40 us. Each CASE
(experiments/runtime/cases.py, its generation cut to 96 tokens) runs both engines through
`cbsim.runtime.run`, as `python -m cbsim mode=runtime` does, under torch.profiler. Per engine,
over the replays after the first 16: the replay's span on the GPU (first kernel start to last
kernel end), its kernels' summed time, the gaps inside it, and the kernels whose mean time moved
most between the loops (by name and position in the graph). Writes OUTDIR/diag_async_forward.json
and prints a table.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import CASES, MATRIX  # noqa: E402
from record import make_config  # noqa: E402

SKIP = 16  # replays left out at the start (first replays, clock settling)


def replays(trace: dict) -> list[list[dict]]:
    """The kernels of each cudaGraphLaunch, in order, by the launch's correlation id."""
    launches = sorted(
        (e for e in trace["traceEvents"] if e.get("name") == "cudaGraphLaunch"),
        key=lambda e: e["ts"],
    )
    by_corr: dict[int, list[dict]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel":
            by_corr[e["args"].get("correlation")].append(e)
    out = [sorted(by_corr[e["args"]["correlation"]], key=lambda k: k["ts"]) for e in launches]
    return [k for k in out if k]


def summary(kernels_per_replay: list[list[dict]]) -> dict:
    rows = kernels_per_replay[SKIP:]
    span = [r[-1]["ts"] + r[-1]["dur"] - r[0]["ts"] for r in rows]
    busy = [sum(k["dur"] for k in r) for r in rows]
    per_kernel: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in rows:
        for i, k in enumerate(r):
            per_kernel[(i, k["name"][:60])].append(k["dur"])
    return {
        "replays": len(rows),
        "kernels": int(np.median([len(r) for r in rows])) if rows else 0,
        "span_us": float(np.median(span)) if rows else None,
        "busy_us": float(np.median(busy)) if rows else None,
        "gaps_us": float(np.median(np.subtract(span, busy))) if rows else None,
        "per_kernel": {f"{i}:{n}": float(np.mean(v)) for (i, n), v in per_kernel.items()},
    }


def profile_case(name: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cbsim.runtime import run

    overrides = {**CASES, **{k: v[0] for p in MATRIX.values() for k, v in p.items()}}[name]
    out = {}
    for engine in ("sync", "async"):
        case = [o for o in overrides if not o.startswith("workload.gen_len=")]
        cfg = make_config(["mode=runtime", f"engine={engine}", *case, "workload.gen_len=96"])
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(cfg, engine)
        torch.cuda.synchronize()
        path = Path(f"/tmp/diag_{name}_{engine}.json")
        prof.export_chrome_trace(str(path))
        out[engine] = summary(replays(json.loads(path.read_text())))
    s, a = out["sync"]["per_kernel"], out["async"]["per_kernel"]
    moved = sorted(((a[k] - s[k], k) for k in s.keys() & a.keys()), reverse=True)
    out["moved_most_us"] = [[k, round(d, 2)] for d, k in moved[:8]]
    for engine in ("sync", "async"):
        out[engine].pop("per_kernel")
    return out


def main(argv: list[str]) -> None:
    outdir, names = Path(argv[0]), argv[1:]
    result = {name: profile_case(name) for name in names}
    (outdir / "diag_async_forward.json").write_text(json.dumps(result, indent=1))
    print("| case | engine | replays | kernels | span us | busy us | gaps us |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in result.items():
        for engine in ("sync", "async"):
            e = r[engine]
            print(
                f"| {name} | {engine} | {e['replays']} | {e['kernels']} | {e['span_us']:.1f} | "
                f"{e['busy_us']:.1f} | {e['gaps_us']:.1f} |"
            )
        print(f"moved most (async - sync, us): {r['moved_most_us']}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
