"""What a captured graph's first replay costs the host beyond a later one, from recorded traces.

    python experiments/runtime/diag_first_replay.py 'h200_run11/**/trace_*.json.gz'

The runtime captures a graph per (IO slot, batch bucket) before the loop; the first
`cudaGraphLaunch` of each inside the loop takes far longer than the later ones (the driver
uploads the graph then). Per trace, for the first replay of each (slot, bucket): the launch
phase's excess over the trace's median graph launch, per graph node (the decode forward's
kernels, cbsim.costs.kernel_count, as the simulator counts them); then the median over all of
them, the value `hardware.host.graph_first_replay_us_per_kernel` carries. Paths and globs are
relative to experiments/runtime.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from cbsim.calibration.recordings import load, resolve_traces
from cbsim.costs import CostModel
from cbsim.trace import schema as S

ROOT = Path(__file__).resolve().parent


def first_replays(rec) -> list[tuple[int, int, float, int]]:
    """(step, bucket, excess us, graph nodes) for the first replay of each (slot, bucket)."""
    s = rec.spans
    graphs = s[s.name == S.GRAPH_REPLAY].sort_values("ts")
    launch = s[s.name == S.LAUNCH].set_index("step").dur
    if len(graphs) < 8:
        return []
    costs = CostModel(rec.config)
    median = float(launch.loc[graphs.step].median())
    seen, out = set(), []
    for step, slot, requests in zip(graphs.step, graphs.slot, graphs.requests):
        bucket = costs.graph_size(int(requests))
        if (slot, bucket) in seen:
            continue
        seen.add((slot, bucket))
        gpu = costs.gpu
        nodes = costs.kernels + gpu.decode_kernels_per_layer * costs.layers
        out.append((int(step), int(bucket), float(launch.loc[step]) - median, nodes))
    return out


def main(patterns: list[str]) -> None:
    per_node = []
    for rec in load(resolve_traces(patterns, ROOT), ROOT):
        rows = first_replays(rec)
        if not rows:
            continue
        text = ", ".join(
            f"step {st} bucket {b}: +{x:.0f} us ({x / n:.2f} per node)" for st, b, x, n in rows
        )
        print(f"{rec.name} ({rec.engine}): {text}")
        per_node += [x / n for _, _, x, n in rows]
    p10, p50, p90 = np.percentile(per_node, [10, 50, 90])
    print(
        f"{len(per_node)} first replays: excess per graph node P10 {p10:.2f} / P50 {p50:.2f} / "
        f"P90 {p90:.2f} us"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
