"""How the simulator is compared with a recorded run: the recorded config re-simulated with a
profile, the simulated trace timed as the runtime's events time it, and both measured by the same
metrics code. Errors: total time, step time p50/p99, TTFT and TPOT p50 in percent of the recorded
value; GPU idle in percentage points.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cbsim.calibration.simulated import event_timed, simulate_like
from cbsim.metrics import compute_metrics
from cbsim.trace import Trace
from cbsim.trace import schema as S
from cbsim.trace.fold import busy_blocks

__all__ = ["banded_metrics", "errors", "event_timed", "measure", "simulate_like", "steady_metrics"]

PCT_ERRORS = {
    "total_time_pct": "total_time_s",
    "steady_time_pct": "steady_time_s",
    "decode_time_pct": "decode_time_s",
    "step_p50_pct": "step_time_ms_p50",
    "step_p99_pct": "step_time_ms_p99",
    "ttft_p50_pct": "ttft_ms_p50",
    "tpot_p50_pct": "tpot_ms_p50",
}


def errors(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, metric in PCT_ERRORS.items():
        r, s = real.get(metric), sim.get(metric)
        out[key] = 100.0 * (s - r) / r if r and s is not None else None
    for key, metric in (
        ("gpu_idle_pp", "gpu_idle_fraction"),
        ("steady_idle_pp", "steady_gpu_idle_fraction"),
    ):
        r, s = real.get(metric), sim.get(metric)
        out[key] = 100.0 * (s - r) if r is not None and s is not None else None
    return out


def decode_time_s(trace: Trace) -> float | None:
    """The summed step times of decode steps (step time as in metrics: between consecutive
    forward ends): the steady state, without prefill and whatever cold start it carries."""
    sp = trace.spans
    lane = S.COMPUTE if (sp.lane == S.COMPUTE).any() else S.DEFAULT
    fwd = sp[(sp.lane == lane) & sp.name.isin(S.FORWARD_NAMES)]
    if fwd.empty:
        return None
    steps = fwd.groupby("step").agg(end=("end", "max"), kind=("kind", "first")).sort_values("end")
    dt = steps.end.diff()
    return float(dt[steps.kind == "decode"].sum()) / 1e6


def covered_us(starts: np.ndarray, ends: np.ndarray) -> float:
    """Time covered by intervals sorted by start (overlaps counted once)."""
    if not len(starts):
        return 0.0
    running = np.maximum.accumulate(ends)
    new = np.r_[True, starts[1:] > running[:-1]]
    block = np.cumsum(new) - 1
    block_end = np.zeros(block[-1] + 1)
    np.maximum.at(block_end, block, ends)
    return float((block_end - starts[new]).sum())


def steady_metrics(trace: Trace) -> dict[str, float | None]:
    """Total time and GPU idle from the end of the first forward to the end of the run."""
    sp = trace.spans
    lane = S.COMPUTE if (sp.lane == S.COMPUTE).any() else S.DEFAULT
    fwd = sp[(sp.lane == lane) & sp.name.isin(S.FORWARD_NAMES)]
    if fwd.empty:
        return {"steady_time_s": None, "steady_gpu_idle_fraction": None}
    t0 = float(fwd[fwd.step == fwd.step.min()].end.max())
    end = float(sp.end.max())
    inst = trace.instants
    if not inst.empty:
        end = max(end, float(inst.ts.max()))
    gpu = sp[sp.lane == lane].sort_values("ts")
    starts, ends = np.maximum(gpu.ts.to_numpy(), t0), gpu.end.to_numpy()
    keep = ends > t0
    busy = covered_us(starts[keep], ends[keep])
    window = end - t0
    return {
        "steady_time_s": window / 1e6,
        "steady_gpu_idle_fraction": 1.0 - busy / window if window > 0 else None,
    }


def measure(trace: Trace) -> dict[str, Any]:
    m = compute_metrics(trace)
    m["decode_time_s"] = decode_time_s(trace)
    m.update(steady_metrics(trace))
    return m


def banded_metrics(trace: Trace) -> dict[str, float]:
    """Total time and GPU idle as ``compute_metrics`` gives them (cbsim.trace.fold: the first
    event's start to the last one's end; the compute lane's busy union, or the default stream's
    where everything ran there), read off the events without the metric tables: a band's draws
    need only these, and the tables of a validation's hundreds of draws would be most of its
    time."""
    events = trace.events
    spans = [e for e in events if e.get("ph") == "X"]
    marks = [float(e["ts"]) for e in events if e.get("ph") in ("i", "I")]
    ts = np.array([float(e["ts"]) for e in spans], dtype=np.float64)
    dur = np.array([float(e["dur"]) for e in spans], dtype=np.float64)
    lo, hi = (float(ts.min()), float((ts + dur).max())) if len(spans) else (np.inf, -np.inf)
    if lo > hi:
        lo = hi = 0.0
    start, end = (min(lo, min(marks)), max(hi, max(marks))) if marks else (lo, hi)
    total = end - start
    busy = 0.0
    gpu = _gpu_rows(trace.lane_of, spans)
    if gpu:
        ts, dur = ts[gpu], dur[gpu]
        order = np.lexsort((dur, ts))
        starts, ends = busy_blocks(ts[order], ts[order] + dur[order])
        busy = float((ends[:-1] - starts[:-1]).sum()) + float(ends[-1] - starts[-1])
    idle = 1.0 - busy / total if total > 0 else 0.0
    return {"total_time_s": total / 1e6, "gpu_idle_fraction": idle}


def _gpu_rows(lane_of: dict[tuple[int, int], str], spans: list[dict[str, Any]]) -> list[int]:
    """The spans on the compute lane, or on the default stream where none ran on it."""
    lanes = [lane_of.get((e["pid"], e["tid"])) for e in spans]
    rows = [i for i, lane in enumerate(lanes) if lane == S.COMPUTE]
    return rows or [i for i, lane in enumerate(lanes) if lane == S.DEFAULT]
