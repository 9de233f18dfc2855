"""Tables the report draws, computed from a trace alone (times in ms from the run's start); a run
without a trace gets the same tables from its fold and windows (cbsim.report.untraced)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from cbsim.metrics import stall_spans
from cbsim.trace import schema as S
from cbsim.trace.fold import busy_before
from cbsim.trace.model import Trace
from cbsim.trace.window import WINDOW_STEPS, steady_start

IDLE_ROW = "GPU idle"
# top to bottom; the idle row sits under the compute stream it belongs to
ROW_ORDER = (S.HOST, S.H2D, S.COMPUTE, IDLE_ROW, S.D2H, S.DEFAULT)
# timeline axes switch from ms to s above this run length
SECONDS_ABOVE_MS = 10_000.0


@dataclass
class RunFrames:
    """One engine's run, ready to draw."""

    engine: str
    spans: pd.DataFrame  # lane, name, ts_ms, end_ms, dur_us, step, slot, requests, ...
    idle: pd.DataFrame  # ts_ms, end_ms, dur_us: intervals the GPU lane executes nothing
    steps: pd.DataFrame  # step, end_ms, step_ms, gpu_ms, exposed_ms
    hazards: pd.DataFrame  # ts_ms, lane, kind, step, slot, detail
    stalls: pd.DataFrame  # ts_ms, end_ms, step, name, dur_ms, median_ms (cbsim.metrics stalls)
    rows: list[str]  # timeline rows present, top to bottom
    gpu_lane: str
    total_ms: float
    # a run without a trace (cbsim.report.untraced): the windows its spans cover (label, start
    # ms, end ms) and their steps, the GPU's idle time over the whole run and its hazards by kind
    windows: list[tuple[str, float, float]] | None = None
    window_steps: int | None = None
    gpu_idle_ms: float | None = None
    hazard_counts: dict[str, int] | None = None

    @property
    def idle_ms(self) -> float:
        """The GPU's idle time over the run."""
        if self.gpu_idle_ms is not None:
            return self.gpu_idle_ms
        return float(self.idle["dur_us"].sum()) / 1e3

    def hazards_by_kind(self) -> dict[str, int]:
        if self.hazard_counts is not None:
            return self.hazard_counts
        return {str(k): int(v) for k, v in self.hazards["kind"].value_counts().items()}


def time_unit(total_ms: float) -> tuple[float, str]:
    """(ms per unit, unit name) for a time axis: seconds on long runs, so no "300k ms"."""
    return (1e3, "s") if total_ms > SECONDS_ABOVE_MS else (1.0, "ms")


def gpu_lane_of(spans: pd.DataFrame) -> str:
    """The compute stream, or the legacy default stream when everything ran there (as metrics)."""
    lanes = set(spans["lane"].unique())
    return S.DEFAULT if S.COMPUTE not in lanes and S.DEFAULT in lanes else S.COMPUTE


def union_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into disjoint sorted blocks."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > running[:-1]
    ids = np.cumsum(new) - 1
    block_end = np.full(ids[-1] + 1, -np.inf)
    np.maximum.at(block_end, ids, e)
    return s[new], block_end


def idle_gaps(busy: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """The complement of the busy intervals inside [start, end]."""
    s, e = union_intervals(busy["ts_ms"].to_numpy(float), busy["end_ms"].to_numpy(float))
    gap_s = np.concatenate([[start], e])
    gap_e = np.concatenate([s, [end]])
    keep = gap_e - gap_s > 1e-9
    out = pd.DataFrame({"ts_ms": gap_s[keep], "end_ms": gap_e[keep]})
    out["dur_us"] = (out["end_ms"] - out["ts_ms"]) * 1e3
    return out


def step_table(gpu: pd.DataFrame, start: float) -> pd.DataFrame:
    """Per step: its time (between forward ends, as metrics), GPU busy in it, the rest, and the
    batch kind (prefill, decode, mixed)."""
    fwd = gpu[gpu["name"].isin(S.FORWARD_NAMES)]
    if fwd.empty:
        return pd.DataFrame(columns=["step", "end_ms", "step_ms", "gpu_ms", "exposed_ms", "kind"])
    ends = fwd.groupby("step")["end_ms"].max().sort_values()
    kinds = fwd.groupby("step")["kind"].first().reindex(ends.index)
    end_ms = ends.to_numpy(float)
    prev = np.concatenate([[start], end_ms[:-1]])
    bs, be = union_intervals(gpu["ts_ms"].to_numpy(float), gpu["end_ms"].to_numpy(float))
    gpu_ms = busy_before(bs, be, end_ms) - busy_before(bs, be, prev)
    step_ms = end_ms - prev
    return pd.DataFrame(
        {
            "step": ends.index.to_numpy(int),
            "end_ms": end_ms,
            "step_ms": step_ms,
            "gpu_ms": gpu_ms,
            "exposed_ms": np.maximum(step_ms - gpu_ms, 0.0),
            "kind": kinds.astype(str).to_numpy(),
        }
    )


def stall_table(trace_spans: pd.DataFrame, t0: float) -> pd.DataFrame:
    """The metrics' host stalls (cbsim.metrics.stall_spans) in ms from the run's start."""
    return stall_frame(stall_spans(trace_spans), t0)


def stall_frame(st: pd.DataFrame, t0: float) -> pd.DataFrame:
    """Stall spans (with ``median_us``) in ms from the run's start."""
    return pd.DataFrame(
        {
            "ts_ms": (st["ts"].to_numpy(float) - t0) / 1e3,
            "end_ms": (st["end"].to_numpy(float) - t0) / 1e3,
            "step": st["step"].to_numpy(int),
            "name": st["name"].astype(str).to_numpy(),
            "dur_ms": st["dur"].to_numpy(float) / 1e3,
            "median_ms": st["median_us"].to_numpy(float) / 1e3,
        }
    )


def span_frame(spans: pd.DataFrame, t0: float) -> pd.DataFrame:
    """Spans (us) as the report draws them: times in ms from the run's start ``t0``."""
    df = pd.DataFrame(
        {
            "lane": spans["lane"].to_numpy(),
            "name": spans["name"].to_numpy(),
            "ts_ms": (spans["ts"].to_numpy(float) - t0) / 1e3,
            "end_ms": (spans["end"].to_numpy(float) - t0) / 1e3,
            "dur_us": spans["dur"].to_numpy(float),
        }
    )
    for col in (*S.SPAN_ARGS, "new_tokens"):
        df[col] = spans[col].to_numpy()
    return df


def timeline_rows(df: pd.DataFrame, lanes: list[str]) -> list[str]:
    """The timeline's rows: the lanes with spans, the required lanes the run declared (an idle
    stream is information), the GPU idle row when anything ran."""
    present = set(df["lane"].unique()) | (set(lanes) & set(S.REQUIRED_LANES))
    return [r for r in ROW_ORDER if r in present or (r == IDLE_ROW and not df.empty)]


def run_frames(engine: str, trace: Trace) -> RunFrames:
    spans = trace.spans
    spans = spans[spans["lane"] != S.REQUESTS]
    inst = trace.instants
    t0 = float(spans["ts"].min()) if not spans.empty else 0.0
    t1 = float(spans["end"].max()) if not spans.empty else 0.0
    if not inst.empty:
        t0, t1 = min(t0, float(inst["ts"].min())), max(t1, float(inst["ts"].max()))
    df = span_frame(spans, t0)
    total_ms = (t1 - t0) / 1e3
    lane = gpu_lane_of(df)
    gpu = df[df["lane"] == lane]
    idle = idle_gaps(gpu, 0.0, total_ms)
    return RunFrames(
        engine=engine,
        spans=df,
        idle=idle,
        steps=step_table(gpu, 0.0),
        hazards=hazard_table(inst, t0),
        stalls=stall_table(spans, t0),
        rows=timeline_rows(df, list(trace.lanes)),
        gpu_lane=lane,
        total_ms=total_ms,
    )


def hazard_table(inst: pd.DataFrame, t0: float) -> pd.DataFrame:
    cols = ["ts_ms", "lane", "kind", "step", "slot", "detail"]
    if inst.empty or "cat" not in inst:
        return pd.DataFrame(columns=cols)
    h = inst[inst["cat"] == S.HAZARD]
    out = pd.DataFrame({"ts_ms": (h["ts"].astype(float) - t0) / 1e3, "lane": h["lane"]})
    for col in cols[2:]:
        out[col] = h[col] if col in h else ""
    return out.reset_index(drop=True)


def detail_windows(
    steps: pd.DataFrame, spans: pd.DataFrame, width: int = WINDOW_STEPS
) -> list[tuple[str, float, float]]:
    """(label, start ms, end ms) of the first steps, a steady-state window and the end."""
    if spans.empty:
        return []
    if steps.empty or len(steps) <= 3 * width:
        return [("whole run", 0.0, float(spans["end_ms"].max()))]
    n = len(steps)
    picks = [("first steps", 0), ("steady state", steady_start(steps, width)), ("end", n - width)]
    out = []
    ends = steps["end_ms"].to_numpy(float)
    numbers = steps["step"].to_numpy(int)
    for label, i in picks:
        start = 0.0 if i == 0 else ends[i - 1]
        end = ends[i + width - 1] if i + width < n else float(spans["end_ms"].max())
        out.append((f"{label}: steps {numbers[i]}-{numbers[i + width - 1]}", start, end))
    return out
