"""Whether a decode graph's replay span, as the runtime's CUDA events time it, is the GPU's time:
each engine's run under torch.profiler, its kernels (CUPTI) against its own trace's spans.

    python3 experiments/runtime/diag_replay_kernels.py OUTDIR [CASE]   (default 1b_8x4096+1024)

Per engine, one run of the case (experiments/runtime/cases.py) through `cbsim.runtime.run`
under torch.profiler; the Kineto trace imported (`cbsim.trace.kineto`: a step is its first
kernel's start to its last kernel's end, with its kernels' busy time) and the runtime's own
trace of the same run, both over the first, middle and last tenth of the decode steps.
h200_run21 (section 3) found the async replays of small models up to 70% longer than the sync
ones at short contexts in record.py's runs and not in the benchmarks': this says which engine's
spans are the GPU's. Writes OUTDIR/{kineto,runtime}_{sync,async}.json.gz (not trace_*: the
recordings' globs leave them out) and a table.
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import MATRIX  # noqa: E402
from record import make_config  # noqa: E402


def windows(values) -> list[float]:
    """Medians over the first, middle and last tenth of a run's steps (values in step order)."""
    import statistics

    values, n = list(values), len(values)
    cuts = [(n // 20, n // 10), (n // 2 - n // 20, n // 2 + n // 20), (n - n // 10, n - n // 20)]
    return [statistics.median(values[a:b]) for a, b in cuts]


def shown(values) -> str:
    return " / ".join(f"{x:.0f}" for x in windows(values))


def replays(trace) -> tuple[list[float], list[float]]:
    """Decode graph replays in time order: span durations and kernel busy time (where known)."""
    xs = [e for e in trace.events if e.get("ph") == "X" and e.get("name") == "graph_replay"]
    xs.sort(key=lambda e: e["ts"])
    busy = [e.get("args", {}).get("kernel_busy_us") for e in xs]
    return [e["dur"] for e in xs], [b for b in busy if isinstance(b, (int, float))]


def profiled(case: list[str], engine: str, out: Path):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cbsim.runtime import run
    from cbsim.trace import write_trace

    config = make_config(["mode=runtime", f"engine={engine}", *case])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        trace = run(config, engine)
    torch.cuda.synchronize()
    raw = out / f"kineto_{engine}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as f, gzip.open(f"{raw}.gz", "wb") as g:
        g.write(f.read())
    os.remove(raw)
    write_trace(trace, out / f"runtime_{engine}.json.gz")
    return trace, Path(f"{raw}.gz")


def main(argv: list[str]) -> None:
    from cbsim.trace.kineto import import_kineto

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    name = argv[1] if len(argv) > 1 else "1b_8x4096+1024"
    case = next(p[name][0] for p in MATRIX.values() if name in p)
    print(f"{name}: decode replay us over the first / middle / last tenth of the steps")
    for engine in ("sync", "async"):
        trace, kineto = profiled(case, engine, out)
        own, _ = replays(trace)
        k_span, k_busy = replays(import_kineto(kineto))
        print(f"{engine:>5} runtime events {shown(own)} | kineto span {shown(k_span)}", end="")
        print(f" | kernel busy {shown(k_busy)}" if len(k_busy) >= 20 else "", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
