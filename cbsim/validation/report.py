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
from cbsim.rundir import atomic_write_text
from cbsim.trace import Trace
from cbsim.trace import schema as S
from cbsim.validation.host_phases import SAME_HOST
from cbsim.validation.judged_text import check_lines, judged_table
from cbsim.validation.runs import TARGETS, RunResult
from cbsim.validation.speedup import SPEEDUP_POINTS, Speedup

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


def error_rows(
    results: list[RunResult], held_label: bool = True
) -> tuple[list[list[Any]], list[list[str]]]:
    rows, classes = [], []
    for r in results:
        e = r.errors
        row = [
            r.rec.name,
            r.rec.engine,
            r.rec.config.workload.batch_size,
            (r.held_out_by or "held out") if (r.held_out and held_label) else "in sample",
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


def speedup_rows(pairs: list[Speedup], held_label: bool) -> tuple[list[list[Any]], list[list[str]]]:
    rows, classes = [], []
    for p in pairs:
        e = p.error_points
        band = f"x{p.band[0]:.3f} - x{p.band[1]:.3f}" if p.band else "-"
        rows.append(
            [
                p.workload,
                p.sync.rec.config.model.name,
                p.sync.rec.config.workload.batch_size,
                (p.held_out_by or "held out") if (p.held_out and held_label) else "in sample",
                f"x{p.recorded:.3f}" if p.recorded else "-",
                f"x{p.predicted:.3f}" if p.predicted else "-",
                f"{e:+.2f}" if e is not None else "-",
                band,
                {None: "-", True: "yes", False: "no"}[p.in_band],
            ]
        )
        ok = "good" if p.passed else "bad"
        classes.append([""] * 6 + [ok if e is not None else "", "", ""])
    return rows, classes


def lead(out: dict[str, Any], held_label: bool) -> str:
    """The page's first sentence: what was checked and how it came out."""
    s = out["summary"]
    if not held_label:
        return (
            f"Every run simulated with the profile hardware={out['hardware_base']} as it is "
            f"({out['holdout']}): the runs it was fitted on are in sample, no run was held out "
            "of a fit made here."
        )
    sp = s["speedup"]
    verdict = "within" if s["all_within_target"] else "not all within"
    return (
        f"Async speedup within {SPEEDUP_POINTS:g} point on {sp['within_target']} of "
        f"{sp['workloads']} held-out workloads; {s['held_out_within_target']} of "
        f"{s['held_out_runs']} held-out runs {verdict} the targets: total time within "
        f"{TARGETS['total_time_pct']}%, GPU idle within {TARGETS['gpu_idle_pp']} pp (across "
        f"device calls: inside the predicted band), step time p50 within "
        f"{TARGETS['step_p50_pct']}%."
    )


def build_page(results: list[RunResult], pairs: list[Speedup], out: dict[str, Any]) -> Page:
    held_label = out["holdout"] not in ("profile",)
    title = f"cbsim validation · {len(results)} recorded run(s) · holdout {out['holdout']}"
    page = Page(title)
    page.heading(title, level=1)
    page.para(esc(lead(out, held_label)), "lead")
    if out.get("judged"):
        add_judged(page, out["judged"])
    if pairs:
        page.heading("Async speedup per workload, recorded vs predicted", anchor="speedup")
        rows, classes = speedup_rows(pairs, held_label)
        header = [
            "workload",
            "model",
            "batch",
            "profile",
            "recorded",
            "predicted",
            "points",
            "predicted band",
            "recorded in band",
        ]
        page.add(table(header, rows, classes))
        page.para(
            "Speedup: sync time / async time of one workload in one device call (after the "
            "first step where the recording's manifest marks it a one-off). Points: 100 x "
            "(predicted - recorded).",
            "note",
        )
    page.heading("Error per run (simulated minus recorded)", anchor="errors")
    rows, classes = error_rows(results, held_label)
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
    note = (
        "Percent errors are relative to the recorded value; GPU idle is the difference of "
        "the two idle shares in percentage points."
    )
    if held_label:
        note += (
            " Held out: the profile used was fitted without this run (and without every run "
            "sharing what the holdout names)."
        )
    page.para(note, "note")
    add_host_phases(page, out.get("host_phases"))
    page.heading("Step-time distributions", anchor="steps")
    page.figure(distribution_figure(results), "steps")
    add_timelines(page, results)
    return page


def add_host_phases(page: Page, phases: dict[str, Any] | None) -> None:
    """Each host phase's recorded over simulated mean per step (cbsim.validation.host_phases)."""
    if not phases:
        return
    page.heading("Host phases, recorded over simulated", anchor="host")
    lo, hi = SAME_HOST
    rows = [
        [
            phase,
            f"x{v['ratio_median']:.2f}",
            f"x{v['ratio_min']:.2f}-x{v['ratio_max']:.2f}",
            f"{v['recorded_us_median']:.1f}",
            f"{v['simulated_us_median']:.1f}",
            v["runs"],
        ]
        for phase, v in phases.items()
    ]
    classes = [
        ["", "" if lo <= v["ratio_median"] <= hi else "bad", "", "", "", ""]
        for v in phases.values()
    ]
    header = ["phase", "median ratio", "range", "recorded us", "simulated us", "runs"]
    page.add(table(header, rows, classes))
    page.para(
        f"Mean span per step of each run, recorded over simulated; medians over the runs. Outside "
        f"x{lo:.2f}-x{hi:.2f} the profile's host costs are not these runs'.",
        "note",
    )


def add_judged(page: Page, j: dict[str, Any]) -> None:
    """The lead table (predicted vs the recorded mean of the repeats, the constant baseline
    beside) and the targets, as the terminal prints them (cbsim.validation.judge)."""
    page.heading("Predicted vs the recorded mean of the repeats", anchor="judged")
    page.add(f"<pre>{esc(judged_table(j))}</pre>")
    page.add(f"<pre>{esc(chr(10).join(check_lines(j)))}</pre>")


def add_timelines(page: Page, results: list[RunResult]) -> None:
    """Per run, the recorded and the simulated timelines of steady-state steps on one axis."""
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


def write_validation_report(
    results: list[RunResult], pairs: list[Speedup], out: dict[str, Any], path: Path
) -> Path:
    return atomic_write_text(path, build_page(results, pairs, out).render())
