"""The reference workload (ref_8b_16x512+256) in every device call that recorded it: the spread
between calls, as a table (markdown) and its summary. Reads the committed traces only.

    python experiments/runtime/reference_spread.py > experiments/runtime/reference_spread.md
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cbsim.calibration.recordings import load, resolve_traces
from cbsim.metrics import compute_metrics

ROOT = Path(__file__).resolve().parent
PATTERN = "h200_run*/**/ref_8b_16x512+256/trace_*.json.gz"


def build(cfg) -> str:
    """The runtime build a recording ran (as the simulator reads it from the trace/manifest)."""
    fused = "fused" if cfg.mode.fuse_epilogues else "unfused"
    rule = ", launch rule" if cfg.engine.decode_launch.min_partition != 1024 else ""
    return fused + (", width classes" if cfg.engine.graph_width_classes else "") + rule


def main() -> None:
    runs: dict[tuple[str, str], dict[str, dict]] = {}
    builds: dict[tuple[str, str], str] = {}
    for rec in load(resolve_traces([PATTERN], ROOT), ROOT):
        where = str(rec.path.parent.parent.relative_to(ROOT))
        runs.setdefault((where, rec.call), {})[rec.engine] = compute_metrics(rec.trace)
        builds[(where, rec.call)] = build(rec.config)
    print(
        "| recording | call | build | sync s | async s | sync GPU idle | async GPU idle | speedup |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for (where, call), m in sorted(runs.items()):
        if {"sync", "async"} - set(m):
            continue
        s, a = m["sync"], m["async"]
        row = (
            s["total_time_s"],
            a["total_time_s"],
            100 * s["gpu_idle_fraction"],
            100 * a["gpu_idle_fraction"],
            s["total_time_s"] / a["total_time_s"],
        )
        rows.append(row)
        print(
            f"| {where} | {call} | {builds[(where, call)]} | {row[0]:.3f} | {row[1]:.3f} "
            f"| {row[2]:.2f}% | {row[3]:.2f}% "
            f"| x{row[4]:.3f} |"
        )
    arr = np.array(rows)
    calls = len({c for _, c in runs})
    print(
        f"\n{len(rows)} recordings in {calls} device calls (the totals move with the build too; "
        "the idle and the speedup are the host's):\n"
    )
    for i, name in enumerate(("sync total s", "async total s", "sync GPU idle %",
                              "async GPU idle %", "speedup")):  # fmt: skip
        v = arr[:, i]
        print(
            f"- {name}: mean {v.mean():.4g}, range {v.min():.4g} - {v.max():.4g}, "
            f"std {v.std(ddof=1):.3g}, std of log {np.log(v).std(ddof=1):.3g}"
        )


if __name__ == "__main__":
    main()
