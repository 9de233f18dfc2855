"""Timelines: the whole run (bars, WebGL segments or time bins by size), and chosen windows.

The overview draws small runs span by span; large ones as time bins whose depth is the busy share
(cbsim.report.bins), which turn into the real spans when zoomed in (cbsim.report.zoom). Long runs
get a time axis in seconds. Host stalls (a phase 10x its median) and prefill steps are marked.
The detail figure draws a few windows (first steps, steady state, end) as SVG bars, every field,
on an axis in ms. Waiting is drawn thin and short spans get ticks (cbsim.report.visible).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cbsim.report.bins import AGGREGATE_BINS, aggregate_rows, share_colorbar
from cbsim.report.frames import IDLE_ROW, RunFrames, detail_windows, time_unit
from cbsim.report.marks import add_hazards, add_marks
from cbsim.report.style import ROW_PX, color_of, engine_rows, legend_entry, row_y, yaxis
from cbsim.report.visible import BAR_WIDTH, add_short_ticks, bar_width

__all__ = ["AGGREGATE_BINS", "detail_figure", "overview_figure", "overview_style", "overview_unit"]

SEGMENT_PX = 16  # thickness of a span in the overview
# The overview draws up to BAR_BUDGET spans as SVG bars (every field in the hover), up to
# SEGMENT_BUDGET as WebGL segments, and above that time bins: in headless Chromium without a GPU
# (software WebGL) each WebGL vertex costs time, and 10^5 spans took 15 s to draw; bins take 1.
BAR_BUDGET = 3_000
SEGMENT_BUDGET = 8_000


def _segments(ts: np.ndarray, end: np.ndarray, *cols: np.ndarray):
    """x as start, end, NaN per span (NaN breaks the line) and per-vertex custom data."""
    n = len(ts)
    x = np.empty(3 * n)
    x[0::3], x[1::3], x[2::3] = ts, end, np.nan
    data = np.zeros((3 * n, len(cols)), dtype=np.float32)
    for j, c in enumerate(cols):
        data[0::3, j] = data[1::3, j] = data[2::3, j] = c
    return x, data


def overview_unit(runs: list[RunFrames]) -> tuple[float, str]:
    """The overview's time unit: seconds when the longest run is long."""
    return time_unit(max((r.total_ms for r in runs), default=0.0))


def overview_figure(runs: list[RunFrames]) -> go.Figure:
    """All engines one above the other on one time axis (ms or s since each run's start).

    Small runs are drawn span by span (bars, then WebGL segments); above SEGMENT_BUDGET spans each
    row shows, per time bin, the phase that filled most of the bin and the GPU idle share.
    """
    style = overview_style(runs)
    titles = [f"{r.engine}: {r.total_ms / 1e3:.3f} s, GPU idle {_idle_share(r):.1%}" for r in runs]
    heights = [max(len(r.rows), 1) for r in runs]
    fig = engine_rows(titles, (0.12, 0.05), row_heights=heights)
    shown: set[str] = set()
    bin_ms = max((r.total_ms for r in runs), default=0.0) / AGGREGATE_BINS
    unit, unit_name = overview_unit(runs)
    for i, run in enumerate(runs, start=1):
        if style == "bins" and bin_ms > 0:
            aggregate_rows(fig, run, i, bin_ms, shown, unit)
        elif style == "segments":
            segment_rows(fig, run, i, shown, unit)
        else:
            bar_rows(fig, run, i, shown, unit)
        if len(run.hazards):
            add_hazards(fig, run, row_y(run.rows), i, shown, unit)
        add_marks(fig, run, i, shown, unit)
        yaxis(fig, run.rows, i)
    if style == "bins" and bin_ms > 0:
        share_colorbar(fig, 1, len(runs))
    fig.update_xaxes(title_text=f"time since the run's start ({unit_name})", row=len(runs), col=1)
    height = sum(heights) * ROW_PX + 110 * len(runs) + 100
    fig.update_layout(
        height=height,
        margin=dict(l=90, r=20, t=40, b=90),
        hovermode="closest",
        barmode="overlay",
        legend=dict(orientation="h", y=-50 / (height - 130), yanchor="top"),
        dragmode="zoom",
    )
    return fig


def overview_style(runs: list[RunFrames]) -> str:
    """ "bars", "segments" or "bins", by the number of spans of all runs together."""
    n = sum(len(r.spans) + len(r.idle) for r in runs)
    return "bars" if n <= BAR_BUDGET else "segments" if n <= SEGMENT_BUDGET else "bins"


def bar_rows(fig: go.Figure, run: RunFrames, row: int, shown: set[str], unit: float = 1.0) -> None:
    ys = row_y(run.rows)
    for name, g in run.spans.groupby("name", sort=False):
        _add_bars(fig, row, 1, g, ys, str(name), run.engine, shown, unit, run.total_ms)
        legend_entry(fig, str(name), shown)
    if len(run.idle) and IDLE_ROW in ys:
        _add_bars(fig, row, 1, _idle_spans(run.idle), ys, IDLE_ROW, run.engine, shown, unit)
        legend_entry(fig, IDLE_ROW, shown)


def _idle_spans(idle: pd.DataFrame) -> pd.DataFrame:
    return idle.assign(
        lane=IDLE_ROW,
        step=-1,
        slot=-1,
        requests=0,
        query_tokens=0,
        kv_tokens=0,
        kind="GPU executes nothing",
    )


def segment_rows(
    fig: go.Figure, run: RunFrames, row: int, shown: set[str], unit: float = 1.0
) -> None:
    ys = row_y(run.rows)
    for (lane, name), g in run.spans.groupby(["lane", "name"], sort=False):
        if lane not in ys:
            continue
        x, cd = _segments(
            g["ts_ms"].to_numpy() / unit,
            g["end_ms"].to_numpy() / unit,
            g["step"].to_numpy(),
            g["dur_us"].to_numpy(),
        )
        y = np.full(len(g), ys[lane])
        add_short_ticks(fig, row, 1, g, y, str(name), run.engine, run.total_ms, unit)
        _add_segments(
            fig,
            row,
            x,
            ys[lane],
            cd,
            str(name),
            run.engine,
            shown,
            "step %{customdata[0]}<br>%{customdata[1]:.1f} µs",
        )
    if len(run.idle) and IDLE_ROW in ys:
        x, cd = _segments(
            run.idle["ts_ms"].to_numpy() / unit,
            run.idle["end_ms"].to_numpy() / unit,
            run.idle["dur_us"].to_numpy(),
        )
        _add_segments(
            fig,
            row,
            x,
            ys[IDLE_ROW],
            cd,
            IDLE_ROW,
            run.engine,
            shown,
            "GPU executes nothing for %{customdata[0]:.1f} µs",
        )


def _idle_share(run: RunFrames) -> float:
    return float(run.idle["dur_us"].sum()) / 1e3 / run.total_ms if run.total_ms > 0 else 0.0


def _add_segments(fig, row, x, y, cd, name, engine, shown, hover) -> None:
    fig.add_trace(
        go.Scattergl(
            x=x,
            y=np.full(len(x), y, dtype=np.int8),
            customdata=cd,
            mode="lines",
            line=dict(color=color_of(name), width=SEGMENT_PX * bar_width(name) / BAR_WIDTH),
            name=name,
            legendgroup=name,
            showlegend=name not in shown,
            connectgaps=False,
            hovertemplate=f"<b>{name}</b><br>{hover}<br>t=%{{x:.6g}}<extra>{engine}</extra>",
        ),
        row=row,
        col=1,
    )
    shown.add(name)


def detail_figure(runs: list[RunFrames]) -> go.Figure | None:
    """Chosen windows of each run as bars with every field in the hover (a run without a trace:
    the windows its recorder kept)."""
    per_run = [
        r.windows if r.windows is not None else detail_windows(r.steps, r.spans) for r in runs
    ]
    cols = max((len(w) for w in per_run), default=0)
    if cols == 0:
        return None
    titles = []
    for run, wins in zip(runs, per_run):
        titles += [f"{run.engine} · {label}" for label, _, _ in wins] + [""] * (cols - len(wins))
    fig = make_subplots(
        rows=len(runs),
        cols=cols,
        subplot_titles=titles,
        horizontal_spacing=0.04,
        vertical_spacing=0.16 if len(runs) > 1 else 0.1,
    )
    shown: set[str] = set()
    for i, (run, wins) in enumerate(zip(runs, per_run), start=1):
        ys = row_y(run.rows)
        for j, (_, t0, t1) in enumerate(wins, start=1):
            sp = run.spans[(run.spans["end_ms"] >= t0) & (run.spans["ts_ms"] <= t1)]
            for name, g in sp.groupby("name", sort=False):
                _add_bars(fig, i, j, g, ys, str(name), run.engine, shown, 1.0, t1 - t0)
            idle = run.idle[(run.idle["end_ms"] >= t0) & (run.idle["ts_ms"] <= t1)]
            if len(idle) and IDLE_ROW in ys:
                _add_bars(fig, i, j, _idle_spans(idle), ys, IDLE_ROW, run.engine, shown)
            # a few steps' window in ms, whatever the run's length ("12,345.6", not "12.3456 s")
            fig.update_xaxes(range=[t0, t1], tickformat=",~f", row=i, col=j)
            yaxis(fig, run.rows, i, j)
            if j > 1:
                fig.update_yaxes(showticklabels=False, row=i, col=j)
    fig.update_xaxes(title_text="ms since the run's start", row=len(runs))
    fig.update_layout(
        barmode="overlay",
        bargap=0.25,
        hovermode="closest",
        height=len(runs) * (max(len(r.rows) for r in runs) * ROW_PX + 120) + 40,
        margin=dict(l=90, r=20, t=40, b=50),
        showlegend=False,
    )
    return fig


def _add_bars(
    fig,
    row: int,
    col: int,
    g: pd.DataFrame,
    ys: dict[str, int],
    name: str,
    engine: str,
    shown: set[str],
    unit: float = 1.0,
    window_ms: float = 0.0,
) -> None:
    """Bars of one phase; with ``window_ms``, a tick on each span too short to see in it."""
    g = g[g["lane"].isin(list(ys))]
    if g.empty:
        return
    y = np.array([ys[lane] for lane in g["lane"]])
    add_short_ticks(fig, row, col, g, y, name, engine, window_ms, unit)
    cd = np.stack(
        [
            g["step"].astype(int),
            g["slot"].astype(int),
            g["requests"].astype(int),
            g["query_tokens"].astype(int),
            g["kv_tokens"].astype(int),
            g["dur_us"].astype(float).round(2),
            g["kind"].astype(str),
        ],
        axis=1,
    )
    fig.add_trace(
        go.Bar(
            orientation="h",
            y=y,
            base=g["ts_ms"].to_numpy(float) / unit,
            x=(g["end_ms"] - g["ts_ms"]).to_numpy(float) / unit,
            marker_color=color_of(name),
            name=name,
            legendgroup=name,
            showlegend=False,
            customdata=cd,
            width=bar_width(name),
            hovertemplate=(
                f"<b>{name}</b> (%{{customdata[5]}} µs)<br>step %{{customdata[0]}}, slot "
                "%{customdata[1]}<br>%{customdata[2]} requests, %{customdata[3]} query "
                "tokens, %{customdata[4]} KV tokens<br>%{customdata[6]}<br>"
                f"starts at %{{base:.6g}}<extra>{engine}</extra>"
            ),
        ),
        row=row,
        col=col,
    )
