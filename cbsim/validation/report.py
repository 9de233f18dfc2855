"""validation.html: per run, the recorded and the simulated timelines on one time axis, the step-
time distributions side by side, and the error table. Built from cbsim.report's pieces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from cbsim.report.frames import run_frames
from cbsim.report.html import Page, esc, table
from cbsim.report.timeline import overview_figure
from cbsim.trace import Trace
from cbsim.trace import schema as S
from cbsim.validation.validate import TARGETS, RunResult

# a timeline shows this many steps from the steady state (the middle of the run) of each run
WINDOW_STEPS = 12
ERROR_COLUMNS = (
    ("total time", "total_time_pct", "{:+.2f}%"),
    ("decode steps", "decode_time_pct", "{:+.2f}%"),
    ("GPU idle", "gpu_idle_pp", "{:+.2f} pp"),
    ("step p50", "step_p50_pct", "{:+.2f}%"),
    ("step p99", "step_p99_pct", "{:+.2f}%"),
    ("TTFT p50", "ttft_p50_pct", "{:+.2f}%"),
    ("TPOT p50", "tpot_p50_pct", "{:+.2f}%"),
)


def window(trace: Trace, first: int, last: int) -> Trace:
    """Everything that ran while the GPU worked on steps first..last: from the first of their
    forward spans' start to the last one's end, spans clipped to that interval."""
    fwd = [
        e
        for e in trace.events
        if e.get("ph") == "X"
        and e.get("name") in S.FORWARD_NAMES
        and first <= e.get("args", {}).get("step", -1) <= last
    ]
    if not fwd:
        return trace
    t0 = min(e["ts"] for e in fwd)
    t1 = max(e["ts"] + e["dur"] for e in fwd)
    events = [e for e in trace.events if e.get("ph") == "M"]
    for e in trace.events:
        if e.get("ph") == "X" and e["ts"] < t1 and e["ts"] + e["dur"] > t0:
            ts = max(e["ts"], t0)
            events.append({**e, "ts": ts, "dur": min(e["ts"] + e["dur"], t1) - ts})
    return Trace(events=events, other_data=trace.other_data)


def steady_window(result: RunResult) -> tuple[int, int]:
    steps = result.rec.spans.step
    steps = steps[steps >= 0]
    if steps.empty:
        return 0, 0
    mid = int(steps.median())
    return max(mid - WINDOW_STEPS // 2, int(steps.min())), mid + WINDOW_STEPS // 2 - 1


# a box plot is drawn from this many evenly spaced quantiles of a run's step times (the same
# box, whiskers and outliers as all 8192 steps; a page of ten runs stays small)
BOX_POINTS = 512


def step_times_ms(trace: Trace) -> list[float]:
    frames = run_frames("", trace)
    t = frames.steps["step_ms"].to_numpy(float)
    if len(t) > BOX_POINTS:
        t = np.quantile(t, np.linspace(0.0, 1.0, BOX_POINTS))
    return t.tolist()


def distribution_figure(results: list[RunResult]) -> go.Figure:
    fig = go.Figure()
    for label, color, pick in (
        ("recorded", "#3f007d", lambda r: r.rec.trace),
        ("simulated", "#fd8d3c", lambda r: r.sim_trace),
    ):
        xs, ys = [], []
        for r in results:
            t = step_times_ms(pick(r))
            xs += [f"{r.rec.name} ({r.rec.engine})"] * len(t)
            ys += t
        fig.add_trace(go.Box(x=xs, y=ys, name=label, marker_color=color, boxpoints=False))
    fig.update_layout(
        boxmode="group",
        height=380,
        yaxis_title="step time (ms)",
        margin=dict(l=60, r=20, t=30, b=120),
        yaxis_type="log",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


def error_rows(results: list[RunResult]) -> tuple[list[list[Any]], list[list[str]]]:
    rows, classes = [], []
    for r in results:
        e = r.errors
        row = [
            r.rec.name,
            r.rec.engine,
            r.rec.config.workload.batch_size,
            "held out" if r.held_out else "in sample",
            f"{r.real['total_time_s']:.3f}",
            f"{r.sim['total_time_s']:.3f}",
        ]
        cls = [""] * len(row)
        for _, key, fmt in ERROR_COLUMNS:
            row.append(fmt.format(e[key]) if e[key] is not None else "-")
            bad = key in TARGETS and e[key] is not None and abs(e[key]) > TARGETS[key]
            cls.append("bad" if bad else ("good" if key in TARGETS and e[key] is not None else ""))
        rows.append(row)
        classes.append(cls)
    return rows, classes


def build_page(results: list[RunResult], out: dict[str, Any]) -> Page:
    s = out["summary"]
    title = f"cbsim validation · {len(results)} recorded run(s) · holdout {out['holdout']}"
    page = Page(title)
    page.heading(title, level=1)
    verdict = (
        "every held-out run is within the targets"
        if s["all_within_target"]
        else "not every held-out run is within the targets"
    )
    page.para(
        esc(
            f"Targets on held-out runs: total time within {TARGETS['total_time_pct']}%, "
            f"GPU idle within {TARGETS['gpu_idle_pp']} pp, step time p50 within "
            f"{TARGETS['step_p50_pct']}%: {verdict}."
        ),
        "lead",
    )
    page.heading("Error per run (simulated minus recorded)", anchor="errors")
    rows, classes = error_rows(results)
    header = [
        "run",
        "engine",
        "batch",
        "profile",
        "real s",
        "sim s",
        *(c[0] for c in ERROR_COLUMNS),
    ]
    page.add(table(header, rows, classes))
    page.para(
        "Percent errors are relative to the recorded value; GPU idle is the difference of "
        "the two idle shares in percentage points. Held out: the profile used was fitted "
        "without this run.",
        "note",
    )
    page.heading("Step-time distributions", anchor="steps")
    page.figure(distribution_figure(results), "steps")
    page.heading("Timelines, recorded above simulated", anchor="timelines")
    page.para(
        f"{WINDOW_STEPS} steady-state steps from the middle of each run: what ran from the "
        "first of their forward passes' start to the last one's end. Drag to zoom, "
        "double-click to reset.",
        "note",
    )
    for i, r in enumerate(results):
        first, last = steady_window(r)
        frames = [
            run_frames(
                f"recorded ({r.rec.trace.source}) · {r.rec.engine}",
                window(r.rec.trace, first, last),
            ),
            run_frames(f"simulated · {r.rec.engine}", window(r.sim_trace, first, last)),
        ]
        page.heading(f"{r.rec.name}: steps {first}-{last}", level=3)
        if r.fit_table:
            fitted_on = ", ".join(r.fit_on) or "-"
            page.add(
                f'<details><summary class="note">the profile it was simulated with, fitted '
                f"on {esc(fitted_on)}</summary><pre>{esc(r.fit_table)}</pre></details>"
            )
        page.figure(overview_figure(frames), f"timeline{i}")
    return page


def write_validation_report(results: list[RunResult], out: dict[str, Any], path: Path) -> Path:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(build_page(results, out).render(), encoding="utf-8")
    tmp.replace(path)
    return path
