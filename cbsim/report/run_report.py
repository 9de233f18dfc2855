"""report.html for one run: the verdict, metrics, config, timelines and per-step charts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cbsim.config import CbsimConfig
from cbsim.metrics import SUMMARY_ROWS, compare_metrics
from cbsim.report.charts import stacked_steps_figure, step_time_figure, time_split_figure
from cbsim.report.frames import RunFrames, run_frames
from cbsim.report.html import Page, esc, table
from cbsim.report.serving import (
    cdf_figure,
    is_online,
    overload_sentence,
    queue_figure,
    serving_table,
    serving_values,
)
from cbsim.report.timeline import (
    AGGREGATE_BINS,
    detail_figure,
    overview_figure,
    overview_style,
    overview_unit,
)
from cbsim.report.zoom import DETAIL_BUDGET, TIMELINE_JS, zoom_payload
from cbsim.trace.model import Trace

PERFETTO_HELP = (
    "The report draws every span, but the trace file holds everything (every field, counters, "
    'request events). Open it in <a href="https://ui.perfetto.dev">Perfetto UI</a> '
    "(<i>Open trace file</i>, works offline once the page is cached; the file never leaves your "
    "machine) or in Chrome/Chromium at <code>chrome://tracing</code> (<i>Load</i>). Both read "
    "<code>.json</code> and <code>.json.gz</code>."
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
        "to the real spans. Black triangles: host stalls (a phase 10x its median); orange: "
        "prefill or mixed steps."
    ),
}


def trace_files(engines: list[str], gzip: bool) -> list[str]:
    """The trace file names the app writes beside the report (cbsim.app.trace_name)."""
    single = len(engines) == 1
    return [
        ("trace.json" if single else f"trace_{e}.json") + (".gz" if gzip else "") for e in engines
    ]


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _int(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def fit_sentence(metrics: dict[str, dict[str, Any]]) -> str | None:
    """A warning when the configuration does not fit the device (metrics fits_device)."""
    bad = {e: m for e, m in metrics.items() if m.get("fits_device") is False}
    if not bad:
        return None
    e, m = next(iter(bad.items()))
    need, have = m.get("device_bytes_needed"), m.get("device_bytes_available")
    size = (
        f": it needs {need / 1e9:.1f} GB of the device's {have / 1e9:.1f} GB"
        if need and have
        else ""
    )
    return (
        f"This configuration does not fit the device{size} (weights, KV cache, IO buffers and "
        f"graph pool; {', '.join(bad)}). The simulator ran it anyway; a GPU would refuse it."
    )


def verdict(metrics: dict[str, dict[str, Any]]) -> str:
    """One sentence a reader can stop at."""
    if "sync" in metrics and "async" in metrics:
        s, a = metrics["sync"], metrics["async"]
        c = compare_metrics(s, a)
        rec = c["idle_recovered_fraction"]
        recovered = f"; it recovered {rec:.0%} of the time the GPU sat idle in sync" if rec else ""
        pays = "pays" if (c["speedup"] or 0) >= 1.05 else "does not pay here"
        return (
            f"Async batching {pays}: x{_fmt(c['speedup'], '{:.3f}')} "
            f"({s['total_time_s']:.3f} s → {a['total_time_s']:.3f} s); GPU idle "
            f"{s['gpu_idle_fraction']:.1%} → {a['gpu_idle_fraction']:.1%}{recovered}."
        )
    lines = []
    for engine, m in metrics.items():
        lines.append(
            f"{engine}: {m['total_time_s']:.3f} s, GPU idle {m['gpu_idle_fraction']:.1%} (time "
            f"the GPU waited for the CPU), CPU blocked {m['cpu_blocked_fraction']:.1%}."
        )
    if "sync" in metrics:
        lines.append(
            "Async batching can hide at most the GPU idle share; run engine=compare to see it."
        )
    return " ".join(lines)


def metrics_table(metrics: dict[str, dict[str, Any]]) -> str:
    names = list(metrics)
    rows = [
        [label, *(_fmt(metrics[n].get(key), fmt) for n in names)]
        for label, key, fmt in SUMMARY_ROWS
    ]
    rows.append(
        [
            "GPU forward mean (ms)",
            *(_fmt(metrics[n].get("gpu_forward_ms_mean"), "{:.3f}") for n in names),
        ]
    )
    phases = sorted({p for n in names for p in (metrics[n].get("host_ms_per_step") or {})})
    for p in phases:
        rows.append(
            [
                f"host {p} (ms/step)",
                *(_fmt((metrics[n].get("host_ms_per_step") or {}).get(p), "{:.3f}") for n in names),
            ]
        )
    classes = [[""] * (len(names) + 1) for _ in rows]
    for i, row in enumerate(rows):
        if row[0] == "hazards":
            classes[i] = [""] + ["bad" if c not in ("0", "-") else "" for c in row[1:]]
    return table(["metric", *names], rows, classes)


def comparison_table(sync: dict[str, Any], async_: dict[str, Any]) -> str:
    c = compare_metrics(sync, async_)
    rows = [
        ["speedup (sync time / async time)", _fmt(c["speedup"], "x{:.3f}")],
        ["time saved", _fmt(c["time_saved_fraction"], "{:.1%}")],
        [
            "GPU idle sync → async",
            f"{_fmt(c['gpu_idle_sync'], '{:.2%}')} → {_fmt(c['gpu_idle_async'], '{:.2%}')}",
        ],
        ["share of the sync idle time recovered", _fmt(c["idle_recovered_fraction"], "{:.1%}")],
    ]
    good = (c["speedup"] or 0) >= 1.05
    classes = [["", "good" if good else "bad"]] + [["", ""]] * 3
    return table(["async vs sync", ""], rows, classes)


def config_table(config: CbsimConfig) -> str:
    e, w, m, h = config.engine, config.workload, config.model, config.hardware
    dist = {"fixed": ""}
    rows = [
        ["mode / task", f"{config.mode.name} / {config.task}"],
        ["engine", e.name],
        ["IO slots · CUDA graphs", f"{e.io_slots} · {'on' if e.cuda_graphs else 'off'}"],
        [
            "streams · carry-over · event waits",
            f"{e.streams} · {'on' if e.carry_over else 'off'} · {'on' if e.event_waits else 'off'}",
        ],
        [
            "model",
            f"{m.name} ({m.num_params / 1e9:.2f} B params, {m.num_layers} layers, {m.dtype})",
        ],
        ["hardware", f"{h.name} ({h.source})"],
        ["batch size · requests", f"{w.batch_size} · {w.total_requests}"],
        [
            "prompt · generated tokens",
            f"{w.prompt_len}{dist.get(w.prompt_dist, ' ' + w.prompt_dist)} · "
            f"{w.gen_len}{dist.get(w.gen_dist, ' ' + w.gen_dist)}",
        ],
        ["arrival · max batch tokens", f"{w.arrival} · {w.max_batch_tokens}"],
        ["seed", str(w.seed)],
    ]
    return table(["config", ""], rows, kind="kv")


def hazards_section(page: Page, frames: list[RunFrames]) -> None:
    total = sum(len(f.hazards) for f in frames)
    if not total:
        return
    page.heading(f"Hazards: {total}", anchor="hazards")
    page.para(
        "The simulator saw these data races (black crosses on the timeline). A hazard "
        "means the config is unsafe on a real GPU: see the kind and the step.",
        "note",
    )
    for f in frames:
        if f.hazards.empty:
            continue
        counts = f.hazards["kind"].value_counts()
        page.para(
            f"<b>{esc(f.engine)}</b>: "
            + ", ".join(f"{esc(k)} × {int(v)}" for k, v in counts.items())
        )
        first = f.hazards.head(20)
        page.add(
            table(
                ["t (ms)", "lane", "kind", "step", "slot", "detail"],
                [
                    [f"{r.ts_ms:.3f}", r.lane, r.kind, _int(r.step), _int(r.slot), r.detail]
                    for r in first.itertuples()
                ],
            )
        )


def build_page(runs: dict[str, tuple[Trace, dict[str, Any]]], config: CbsimConfig) -> Page:
    metrics = {e: m for e, (_, m) in runs.items()}
    frames = [run_frames(e, t) for e, (t, _) in runs.items()]
    engines = list(runs)
    title = (
        f"cbsim · {' vs '.join(engines)} · {config.model.name} on {config.hardware.name} "
        f"· batch {config.workload.batch_size} · {config.mode.name}"
    )
    page = Page(title)
    page.heading(title, level=1)
    no_fit = fit_sentence(metrics)
    if no_fit:
        page.para(f'<b class="bad">{esc(no_fit)}</b>', "lead")
    overload = overload_sentence(metrics)
    if overload:
        page.para("<b>" + esc(overload) + "</b>", "lead")
    page.para(esc(verdict(metrics)), "lead")
    if config.description:
        page.para(esc(config.description), "note")
    tables = [metrics_table(metrics), config_table(config)]
    if "sync" in metrics and "async" in metrics:
        tables.insert(1, comparison_table(metrics["sync"], metrics["async"]))
    page.add('<div class="grid">' + "".join(f"<div>{t}</div>" for t in tables) + "</div>")
    if is_online(metrics):
        serving_section(page, {e: t for e, (t, _) in runs.items()}, metrics)

    page.heading("Where the time went", anchor="split")
    page.para(
        "Red is time the GPU executed nothing (red means that on every chart here): it waited for the CPU to schedule, build "
        "and launch the next batch. Async batching exists to shrink it.",
        "note",
    )
    page.figure(time_split_figure(frames), "split")
    hazards_section(page, frames)

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

    page.heading("Step time over the run", anchor="steps")
    page.para(
        "A step is the interval between consecutive forward ends. Solid: step time; "
        "dotted: the GPU's busy time inside it. The gap between them is CPU time the GPU "
        "waited for.",
        "note",
    )
    page.figure(step_time_figure(frames), "step_time")
    page.figure(stacked_steps_figure(frames), "stacked")

    page.heading("The full trace", anchor="trace")
    files = trace_files(engines, config.output.trace_gzip)
    page.para(
        "Beside this report: "
        + ", ".join(f"<code>{esc(f)}</code>" for f in files)
        + ". "
        + PERFETTO_HELP,
        "note",
    )
    return page


def serving_section(
    page: Page, traces: dict[str, Trace], metrics: dict[str, dict[str, Any]]
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
        page.para("The scheduler's queue: requests waiting (solid) and running (dotted).", "note")
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
    else:
        page.figure(fig, "timeline")
    return style


def write_run_report(
    runs: dict[str, tuple[Trace, dict[str, Any]]],
    config: CbsimConfig,
    path: Path,
    js_dir: Path | None = None,
) -> Path:
    """Write report.html for one run (one engine, or sync and async for engine=compare);
    plotly.js inline, or with js_dir one plotly.min.js shared there (a sweep's directory)."""
    return build_page(runs, config).write(path, js_dir)
