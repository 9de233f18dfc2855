"""The compute stream's idle between two forwards queued back to back, from recorded traces.

    python experiments/runtime/diag_forward_gap.py 'experiments/runtime/h200_run9/*/*/trace_async.json.gz'

A forward counts when the host was ahead of it: the next forward's launch had returned 50 us
before this forward ended and its H2D copy was done, so nothing but the device kept the next
one from starting. Per trace: how many, and the gap's P10 / P50 / P90 (us); then the median of
the traces' medians, the value `hardware.gpu.forward_gap_us` carries.
"""

from __future__ import annotations

import glob
import sys

import numpy as np

from cbsim.trace.io import read_trace


def gaps(path: str) -> np.ndarray:
    s = read_trace(path).spans
    f = s[s.lane == "compute"].sort_values("ts")
    launch = s[(s.lane == "host") & (s.name == "launch")].sort_values("ts").end.to_numpy()
    h2d = s[s.lane == "h2d"].sort_values("ts").end.to_numpy()
    start, end = f.ts.to_numpy(), f.end.to_numpy()
    n = min(len(start), len(launch), len(h2d))
    ahead = (launch[1:n] < end[: n - 1] - 50.0) & (h2d[1:n] < end[: n - 1])
    return (start[1:n] - end[: n - 1])[ahead]


def main(pattern: str) -> None:
    medians = []
    for path in sorted(glob.glob(pattern)):
        g = gaps(path)
        if not len(g):
            continue
        medians.append(float(np.median(g)))
        p10, p50, p90 = np.percentile(g, [10, 50, 90])
        print(f"{path}: {len(g)} forwards, gap P10 {p10:.2f} / P50 {p50:.2f} / P90 {p90:.2f} us")
    print(f"median of {len(medians)} traces' medians: {np.median(medians):.2f} us")


if __name__ == "__main__":
    main(sys.argv[1])
