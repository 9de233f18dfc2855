"""report.html for one run: the verdict, metrics, config, timelines and per-step charts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cbsim.config import CbsimConfig
from cbsim.config.output import MAX_CHART_POINTS
from cbsim.metrics import why_line
from cbsim.report.charts import stacked_steps_figure, step_time_figure, time_split_figure
from cbsim.report.frames import RunFrames, run_frames
from cbsim.report.html import Page, esc, table
from cbsim.report.kernels import category_sentence, kernels_section
from cbsim.report.machine import recorded_on
from cbsim.report.serving import (
    cdf_figure,
    is_online,
    overload_sentence,
    queue_figure,
    serving_table,
    serving_values,
)
from cbsim.report.tables import (
    _int,
    bands_table,
    comparison_table,
    config_table,
    fit_sentence,
    metrics_table,
    recorded_table,
    verdict,
)
from cbsim.report.timeline import (
    AGGREGATE_BINS,
    detail_figure,
    overview_figure,
    overview_style,
    overview_unit,
)
from cbsim.report.untraced import UntracedRun, untraced_frames, window_line
from cbsim.report.zoom import DETAIL_BUDGET, TIMELINE_JS, zoom_payload
from cbsim.trace.model import Trace
from cbsim.trace.window import HAZARDS_KEPT

PERFETTO_HELP = (
    "The report draws every span, but the trace file holds everything (every field, counters, "
    'request events). Open it in <a href="https://ui.perfetto.dev">Perfetto UI</a> '
    "(<i>Open trace file</i>, works offline once the page is cached; the file never leaves your "
    "machine) or in Chrome/Chromium at <code>chrome://tracing</code> (<i>Load</i>). Both read "
    "<code>.json</code> and <code>.json.gz</code>."
)

NO_TRACE = (
    "No trace was kept (<code>output.trace=false</code>); <code>output.trace=true</code> writes "
    "one beside this report, every span and field, to open in "
    '<a href="https://ui.perfetto.dev">Perfetto UI</a>.'
)

OVERVIEW_NOTES = {
    "bars": "Every span is drawn; hover one for its step, slot, requests, tokens and duration.",
    "segments": "Every span is drawn (WebGL); hover a segment's end for its step and duration.",
    "bins": (
        "{n} spans are too many to draw one by one and still open fast: each row shows "
        f"{AGGREGATE_BINS} time bins, coloured by the phase that filled most of the bin and "
        "as deep as the lane was busy in it (the colourbar: white is idle, full colour busy "
        "throughout; hover for the shares); the red row is the GPU idle share of the bin. "
        "Zoom in (drag) and, once the window holds at most {budget} spans, the bins give way "
        "to the real spans. Black triangles: host stalls (a phase 10x its median); open ones: "
        "prefill or mixed steps."
    ),
}


def trace_files(engines: list[str], gzip: bool) -> list[str]:
    """The trace file names the app writes beside the report (cbsim.app.trace_name): one per
    engine."""
    single = len(engines) == 1
    names = [f"trace_{e}" for e in engines] if not single else ["trace"]
    return [n + ".json" + (".gz" if gzip else "") for n in names]


def hazards_section(page: Page, frames: list[RunFrames]) -> None:
    counts = {f.engine: f.hazards_by_kind() for f in frames}
    total = sum(sum(c.values()) for c in counts.values())
    if not total:
        return
    page.heading(f"Hazards: {total}", anchor="hazards")
    page.para(
        "The simulator saw these data races (black crosses on the timeline). A hazard "
        "means the config is unsafe on a real GPU: see the kind and the step.",
        "note",
    )
    for f in frames:
        if not counts[f.engine]:
            continue
        page.para(
            f"<b>{esc(f.engine)}</b>: "
            + ", ".join(f"{esc(k)} × {int(v)}" for k, v in counts[f.engine].items())
        )
        first = f.hazards.head(HAZARDS_KEPT)
        page.add(
            table(
                ["t (ms)", "lane", "kind", "step", "slot", "detail"],
                [
                    [f"{r.ts_ms:.3f}", r.lane, r.kind, _int(r.step), _int(r.slot), r.detail]
                    for r in first.itertuples()
                ],
            )
        )


def page_title(engines: list[str], config: CbsimConfig | None, traces: list[Trace]) -> str:
    """The runs, the model and the machine: the device a recording ran on (with the profile
    its config named), or the profile a simulation ran with."""
    device = recorded_on(traces)
    if config is None:
        sources = " + ".join(dict.fromkeys(t.source or "trace" for t in traces))
        on = f" on {device}" if device else ""
        return (
            f"cbsim · {' vs '.join(engines)} · {sources} trace{'s' if len(traces) > 1 else ''}{on}"
        )
    h = config.hardware.name
    return (
        f"cbsim · {' vs '.join(engines)} · {config.model.name} on "
        f"{f'{device} (profile {h})' if device else h} "
        f"· batch {config.workload.batch_size} · {config.mode.name}"
    )


def build_page(
    runs: dict[str, tuple[Trace | UntracedRun, dict[str, Any]]],
    config: CbsimConfig | None,
    files: list[str] | None = None,
    bands: dict[str, Any] | None = None,
) -> Page:
    """The run report; without a config (a trace file alone) what the traces recorded stands
    in for the config table. `files`: the trace files to point at (default: the app's names)."""
    metrics = {e: m for e, (_, m) in runs.items()}
    traces = {e: t for e, (t, _) in runs.items()}
    frames = [
        untraced_frames(e, t) if isinstance(t, UntracedRun) else run_frames(e, t)
        for e, t in traces.items()
    ]
    title = page_title(list(runs), config, list(traces.values()))
    page = Page(title)
    page.heading(title, level=1)
    for text, cls in ((fit_sentence(metrics), "bad"), (overload_sentence(metrics), "")):
        if text:
            page.para(f'<b class="{cls}">{esc(text)}</b>', "lead")
    page.para(esc(verdict(metrics)), "lead")
    why = why_line(metrics)
    if why:
        page.para(esc(why), "lead why")
    for trace in traces.values():
        categories = category_sentence(trace)
        if categories:
            page.para(esc(categories), "lead")
    if config is not None and config.description:
        page.para(esc(config.description), "note")
    tables = [metrics_table(metrics)]
    if len(metrics) == 2:
        tables.append(comparison_table(metrics))
    bands = bands or next(
        (b for t in traces.values() if isinstance(b := t.other_data.get("bands"), dict)), None
    )
    if bands:
        tables.append(bands_table(bands))
    first = next(iter(traces.values())).other_data if traces else {}
    tables.append(config_table(config, first) if config is not None else recorded_table(traces))
    page.add('<div class="grid">' + "".join(f"<div>{t}</div>" for t in tables) + "</div>")
    if is_online(metrics):
        serving_section(page, traces, metrics)
    page.heading("Where the time went", anchor="split")
    page.para(
        "Red is time the GPU executed nothing (red means that on every chart here): it waited "
        "for the CPU to schedule, build and launch the next batch. Async batching exists to "
        "shrink it.",
        "note",
    )
    page.figure(time_split_figure(frames), "split")
    kernels_section(page, traces)
    hazards_section(page, frames)
    cap = config.output.max_chart_points if config is not None else MAX_CHART_POINTS
    steps_sections(page, frames, cap)
    page.heading("The full trace", anchor="trace")
    if all(isinstance(t, UntracedRun) for t in traces.values()):
        page.para(NO_TRACE, "note")
        return page
    if files is None and config is not None:
        files = trace_files(list(runs), bool(config.output.trace_gzip))
    where = "Beside this report: " if config is not None else "The traces: "
    names = ", ".join(f"<code>{esc(f)}</code>" for f in files or [])
    page.para((where + names + ". " if names else "") + PERFETTO_HELP, "note")
    return page


def steps_sections(page: Page, frames: list[RunFrames], max_points: int) -> None:
    """The timeline, its detail windows and the step-time charts (lines of at most
    ``max_points``); for runs without a trace, the windows their recorder kept as the timeline."""
    line = window_line(frames)
    if line is not None:
        page.heading("Timeline", anchor="timeline")
        page.para(esc(line), "note window")
        detail = detail_figure(frames)
        if detail is not None:
            page.figure(detail, "detail")
        steps_charts(page, frames, max_points)
        return
    style = timeline_section(page, frames)
    detail = detail_figure(frames) if style != "bars" else None
    if detail is not None:
        page.heading("Windows in full detail", anchor="detail")
        page.para(
            "The first steps, a steady-state window and the end, with every field in the "
            "hover (step, slot, requests, tokens, duration).",
            "note",
        )
        page.figure(detail, "detail")
    steps_charts(page, frames, max_points)


def steps_charts(page: Page, frames: list[RunFrames], max_points: int) -> None:
    """Step time and each step's make-up over the run."""
    page.heading("Step time over the run", anchor="steps")
    page.para(
        "A step is the interval between consecutive forward ends. Solid: step time; "
        "dotted: the GPU's busy time inside it. The gap between them is CPU time the GPU "
        "waited for. The axis stops at the steady state; steps above it are triangles on its "
        "top edge (hover for their time).",
        "note",
    )
    page.figure(step_time_figure(frames, max_points), "step_time")
    page.figure(stacked_steps_figure(frames), "stacked")


def serving_section(
    page: Page, traces: dict[str, Trace | UntracedRun], metrics: dict[str, dict[str, Any]]
) -> None:
    """Latencies in vLLM's names, their distributions and the queue (online workloads)."""
    page.heading("Serving: latency and the queue", anchor="serving")
    page.para(
        "As vLLM's <code>bench serve</code> reports them: TTFT from arrival to the first "
        "token, TPOT per output token after the first, ITL between a request's consecutive "
        "tokens, E2EL from arrival to the last token. An engine that finishes requests more "
        "slowly than they arrive builds a queue, and every request behind it waits longer.",
        "note",
    )
    page.add(serving_table(metrics))
    page.figure(cdf_figure({e: serving_values(t) for e, t in traces.items()}), "latency_cdf")
    queue = queue_figure(traces)
    if queue is not None:
        running = any(not isinstance(t, UntracedRun) for t in traces.values())
        page.para(
            "The queue: requests that arrived and have no first token yet (solid: what every "
            "TTFT waits in)"
            + (" and requests running in the batch (dotted)." if running else ".")
            + ("" if running else " The running requests need the trace (output.trace=true)."),
            "note",
        )
        page.figure(queue, "queue")


def timeline_section(page: Page, frames: list[RunFrames]) -> str:
    """The overview timeline, with the zoom-to-spans hook when it is binned; returns its style."""
    page.heading("Timeline", anchor="timeline")
    style = overview_style(frames)
    page.para(
        "One row per lane: the host thread's phases, then the H2D, compute and D2H streams "
        "(red row: GPU idle). Drag to zoom, double-click to zoom out. Engines share one "
        "time axis. "
        + OVERVIEW_NOTES[style].format(n=sum(len(f.spans) for f in frames), budget=DETAIL_BUDGET),
        "note",
    )
    fig = overview_figure(frames)
    if style == "bins":
        page.script(TIMELINE_JS)
        page.figure(
            fig,
            "timeline",
            hook="timelineDetail",
            extra=zoom_payload(frames, *overview_unit(frames)),
        )
    elif overview_unit(frames)[1] == "s":  # zoomed in, the axis labels its ticks in ms
        page.script(TIMELINE_JS)
        page.figure(fig, "timeline", hook="msAxis")
    else:
        page.figure(fig, "timeline")
    return style


def write_run_report(
    runs: dict[str, tuple[Trace | UntracedRun, dict[str, Any]]],
    config: CbsimConfig | None,
    path: Path,
    js_dir: Path | None = None,
    files: list[str] | None = None,
    bands: dict[str, Any] | None = None,
) -> Path:
    """Write report.html for one run (one engine, or sync and async for engine=compare), or
    for traces without a config (config None); plotly.js inline, or with js_dir one
    plotly.min.js shared there (a sweep's directory). bands: cbsim.bands.predict_bands."""
    return build_page(runs, config, files, bands).write(path, js_dir)
