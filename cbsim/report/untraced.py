"""The report of a simulation that kept no trace (output.trace=false, the report on).

The run was folded as it ran (cbsim.trace.fold) and its recorder kept the spans of a few windows
of steps (cbsim.trace.window), so the page draws from those: the metrics, the time split, the
step-time charts and the latency distributions from the fold, which covers every step; the
timeline from the windows, in full detail, with a line saying so. Host stalls are named where
they fall inside a window (against the medians of the whole run, as the metrics count them);
the hazard table lists the first ones, their counts are the run's. What needs every span, the
whole-run overview and the scheduler's running-requests curve, is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cbsim.metrics import MetricInputs
from cbsim.metrics.stalls import STALL_FACTOR, STALL_MIN_US, is_stall
from cbsim.report.frames import (
    RunFrames,
    gpu_lane_of,
    idle_gaps,
    span_frame,
    stall_frame,
    timeline_rows,
)
from cbsim.trace import schema as S
from cbsim.trace.fold import TraceFold
from cbsim.trace.window import Window

HAZARD_COLUMNS = ["ts_ms", "lane", "kind", "step", "slot", "detail"]


@dataclass
class UntracedRun:
    """A simulation without a trace as the report reads it: the inputs its metrics came from
    (the fold), the windows of spans its recorder kept and its first hazards; ``other_data`` is
    what its trace's otherData would hold of the run (memory, counters, config)."""

    inputs: MetricInputs
    windows: list[Window]
    width: int  # the windows' steps
    hazards: list[dict[str, Any]] = field(default_factory=list)
    other_data: dict[str, Any] = field(default_factory=dict)
    source: str = "sim"


def window_line(frames: list[RunFrames]) -> str | None:
    """The page's line on what its timeline shows, for runs drawn from windows; else None."""
    windows = [w for f in frames for w in f.windows or []]
    if not windows:
        return None
    if all(label == "whole run" for label, _, _ in windows):
        return (
            "No trace was kept (output.trace=false); the run is short, so its timeline shows "
            "every span."
        )
    steps = max(f.window_steps or 0 for f in frames)
    return (
        f"No trace was kept (output.trace=false), so the timeline shows windows of {steps} "
        "steps (output.report_window_steps) picked as the run went: the first steps, a "
        "steady-state window and the end. The charts below and the metrics cover every step; "
        "host stalls are named only inside these windows. output.trace=true draws every span."
    )


def untraced_frames(engine: str, run: UntracedRun) -> RunFrames:
    """What the report draws of a run without a trace (see the module docstring)."""
    fold = run.inputs.fold
    t0, t1 = fold.time_range()
    total_ms = (t1 - t0) / 1e3
    kept = [w.spans for w in run.windows if len(w.spans)]
    raw = pd.concat(kept, ignore_index=True) if kept else None
    if raw is not None:
        raw = raw[raw["lane"] != S.REQUESTS]
        raw = raw.drop_duplicates(["lane", "name", "ts", "dur", "step"]).sort_values("ts")
    df = span_frame(raw, t0) if raw is not None else _no_spans()
    last = float(df["end_ms"].max()) if len(df) else total_ms
    windows = [(w.label, _ms(w.t0, t0, 0.0), _ms(w.t1, t0, last)) for w in run.windows]
    lane = fold.gpu_lane() if fold.spans else gpu_lane_of(df)
    gpu = df[df["lane"] == lane]
    idle = [idle_gaps(_overlapping(gpu, a, b), a, b) for _, a, b in windows]
    return RunFrames(
        engine=engine,
        spans=df.reset_index(drop=True),
        idle=pd.concat(idle, ignore_index=True).drop_duplicates() if idle else _no_idle(),
        steps=step_series(fold, lane, t0),
        hazards=hazard_frame(run.hazards, t0),
        stalls=stall_frame(window_stalls(raw, fold), t0),
        rows=timeline_rows(df, run.inputs.lanes),
        gpu_lane=lane,
        total_ms=total_ms,
        windows=windows,
        window_steps=run.width,
        gpu_idle_ms=max(total_ms - fold.busy_us(lane) / 1e3, 0.0),
        hazard_counts=dict(fold.hazards.most_common()),
    )


def _ms(t: float | None, t0: float, otherwise: float) -> float:
    """A window's edge (us) in ms from the run's start; None: ``otherwise``."""
    return otherwise if t is None else (t - t0) / 1e3


def _overlapping(spans: pd.DataFrame, a: float, b: float) -> pd.DataFrame:
    return spans[(spans["end_ms"] >= a) & (spans["ts_ms"] <= b)]


def step_series(fold: TraceFold, lane: str, t0: float) -> pd.DataFrame:
    """Per step, as cbsim.report.frames.step_table computes it from every span: its time
    between forward ends, the GPU's busy time in it, the rest and the batch kind."""
    per_step = fold.forwards[lane].per_step().sort_values("end")
    end = per_step["end"].to_numpy(float)
    busy = per_step["busy"].to_numpy(float)
    step_ms = np.diff(end, prepend=t0) / 1e3
    gpu_ms = np.diff(busy, prepend=0.0) / 1e3
    kinds = np.array([*S.BATCH_KINDS, ""], dtype=object)  # code -1: unknown
    return pd.DataFrame(
        {
            "step": per_step.index.to_numpy(int),
            "end_ms": (end - t0) / 1e3,
            "step_ms": step_ms,
            "gpu_ms": gpu_ms,
            "exposed_ms": np.maximum(step_ms - gpu_ms, 0.0),
            "kind": kinds[per_step["kind"].to_numpy(int)].astype(str),
        }
    )


def window_stalls(raw: pd.DataFrame | None, fold: TraceFold) -> pd.DataFrame:
    """The kept host spans that are stalls against their phase's median over the whole run
    (cbsim.metrics.stalls' rule), with ``median_us``."""
    cols = {"ts": [], "end": [], "step": [], "name": [], "dur": [], "median_us": []}
    if raw is None:
        return pd.DataFrame(cols)
    host = raw[(raw["lane"] == S.HOST) & (raw["name"] != S.WAIT)]
    medians = {key: float(np.median(d)) for key, d in fold.host_work_us().items()}
    median = np.array(
        [medians.get((str(n), str(k)), np.nan) for n, k in zip(host["name"], host["kind"])],
        dtype=float,
    )
    long = is_stall(host["dur"].to_numpy(float), median, STALL_FACTOR, STALL_MIN_US)
    return host[long].assign(median_us=median[long])


def hazard_frame(hazards: list[dict[str, Any]], t0: float) -> pd.DataFrame:
    """The kept hazards as cbsim.report.frames.hazard_table gives a trace's."""
    if not hazards:
        return pd.DataFrame(columns=HAZARD_COLUMNS)
    out = pd.DataFrame(hazards)
    out["ts_ms"] = (out["ts"].astype(float) - t0) / 1e3
    return out[HAZARD_COLUMNS]


def _no_idle() -> pd.DataFrame:
    return pd.DataFrame({"ts_ms": [], "end_ms": [], "dur_us": []})


def _no_spans() -> pd.DataFrame:
    cols = ["lane", "name", "ts_ms", "end_ms", "dur_us", *S.SPAN_ARGS, "new_tokens"]
    return pd.DataFrame({c: [] for c in cols})
