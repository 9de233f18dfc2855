"""GPU idle split the way Holistic Trace Analysis names it: host wait, kernel wait, other.

Every idle stretch of the compute lane ends where the next GPU span starts. Where that span had
not been enqueued yet when the lane went idle, the GPU was waiting on the host: *host wait*, up
to the moment it was enqueued. What is left of the stretch was spent with the work queued: a
short rest is the overhead of starting queued work (an event wait, a graph launch reaching the
GPU): *kernel wait*; a long one waited on something else (a copy, a synchronisation): *other*.

When a span was enqueued is the end of the host's ``launch`` span of its step (the simulator and
the runtime record one). A trace without launch spans (an import of another engine) counts the
part of a stretch the host spent working (any host span but ``wait``) as host wait. The same
code splits sim, runtime and imported traces, so the three read alike.
"""

from __future__ import annotations

from typing import Any

from cbsim.metrics.inputs import MetricInputs
from cbsim.trace.fold import IDLE_PARTS, KERNEL_WAIT_MAX_US

SPLIT = IDLE_PARTS
__all__ = ["KERNEL_WAIT_MAX_US", "SPLIT", "idle_split_metrics"]


def idle_split_metrics(inp: MetricInputs) -> dict[str, Any]:
    """``gpu_idle_<part>_fraction`` of the total time for each part of SPLIT (None without a
    GPU lane), summing to the GPU idle fraction. The split runs as the trace is folded
    (cbsim.trace.fold.TraceFold: each gap when its closing span comes)."""
    out: dict[str, Any] = {f"gpu_idle_{p}_fraction": None for p in SPLIT}
    fold = inp.fold
    parts = fold.idle_split(fold.gpu_lane())
    start, end = fold.time_range()
    total = end - start
    if parts is None or total <= 0:
        return out
    for p in SPLIT:
        out[f"gpu_idle_{p}_fraction"] = parts[p] / total
    return out
