"""The binned overview: per lane and time bin, how busy the lane was and with which phase.

Used above SEGMENT_BUDGET spans: a heatmap row per lane is one image whatever the trace's size, so
a 10^5-span run opens as fast as a small one. A cell's hue is the phase that filled most of the
bin, its depth the lane's busy share of the bin (white: idle, full colour: busy throughout; the
host's ``wait`` is not busy), so a stream busy 0.02% of the time looks empty; the colourbar is that legend. Zooming in replaces the
bins by the real spans (cbsim.report.zoom); the trace file keeps every span.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from cbsim.report.frames import IDLE_ROW, RunFrames, busy_before, union_intervals
from cbsim.report.style import PHASE_COLORS, color_of, legend_entry, mix, row_y
from cbsim.report.visible import busy_spans

AGGREGATE_BINS = 1500
LEVELS = 20  # depth steps of the busy share: 5% each
SHARE_INK = "#525252"  # the colourbar's ink: depth, whatever the hue


def occupancy(ts: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Busy time of the intervals inside each bin between consecutive edges."""
    s, e = union_intervals(ts, end)
    return np.diff(busy_before(s, e, edges))


def shade_level(busy: np.ndarray) -> np.ndarray:
    """Depth band 0..LEVELS-1 of a busy share in (0, 1]: band k shades (k + 1) / LEVELS."""
    return np.clip(np.ceil(busy * LEVELS), 1, LEVELS) - 1


def _share(ts_ms, end_ms, edges: np.ndarray, bin_ms: float) -> np.ndarray:
    """The busy share of each bin, 0 to 1."""
    busy = occupancy(np.asarray(ts_ms, float), np.asarray(end_ms, float), edges) / bin_ms
    return np.clip(busy, 0.0, 1.0)


def _lane_cells(g, edges: np.ndarray, bin_ms: float) -> tuple[list[str], np.ndarray, list[str]]:
    """(phase names, z of the heatmap row, hover text per bin) of one lane's spans."""
    names = [str(n) for n in g["name"].unique()]
    occ = np.stack(
        [_share(p["ts_ms"], p["end_ms"], edges, bin_ms) for _, p in g.groupby("name", sort=False)]
    )
    busy = _share(g["ts_ms"], g["end_ms"], edges, bin_ms)
    z = np.where(busy > 0, occ.argmax(axis=0) * LEVELS + shade_level(busy) + 0.5, np.nan)
    order = np.argsort(-occ, axis=0)[:3]
    text = [
        f"busy {busy[j]:.2%}<br>"
        + "<br>".join(f"{names[k]} {occ[k, j]:.2%}" for k in order[:, j] if occ[k, j] > 0)
        for j in range(len(busy))
    ]
    return names, z, text


def aggregate_rows(
    fig: go.Figure, run: RunFrames, row: int, bin_ms: float, shown: set[str], unit: float = 1.0
) -> None:
    """Per lane, a one-row heatmap: hue the dominant phase, depth the busy share of the bin."""
    ys = row_y(run.rows)
    nbins = max(1, int(np.ceil(run.total_ms / bin_ms)))
    edges = np.arange(nbins + 1) * bin_ms
    name = "s" if unit == 1e3 else "ms"
    cells = dict(
        x=(edges[:-1] + edges[1:]) / 2 / unit,
        customdata=[[f"{a / unit:.4g}–{b / unit:.4g} {name}" for a, b in zip(edges, edges[1:])]],
        ygap=4,
        meta="bins",
        showscale=False,
        zmin=0,
    )
    for lane, g in busy_spans(run.spans).groupby("lane", sort=False):
        if lane not in ys:
            continue
        names, z, text = _lane_cells(g, edges, bin_ms)
        for n in names:
            legend_entry(fig, n, shown)
        fig.add_trace(
            go.Heatmap(
                **cells,
                y=[ys[lane]],
                z=[z],
                zmax=len(names) * LEVELS,
                colorscale=_phase_scale(names),
                text=[text],
                hovertemplate=f"<b>{lane}</b> %{{customdata}}<br>%{{text}}<extra>{run.engine}</extra>",
            ),
            row=row,
            col=1,
        )
    if IDLE_ROW in ys and len(run.idle):
        idle = _share(run.idle["ts_ms"], run.idle["end_ms"], edges, bin_ms)
        fig.add_trace(
            go.Heatmap(
                **cells,
                y=[ys[IDLE_ROW]],
                z=[np.where(idle > 0, shade_level(idle) + 0.5, np.nan)],
                zmax=LEVELS,
                colorscale=_phase_scale([IDLE_ROW]),
                text=[[f"{v:.2%}" for v in idle]],
                hovertemplate=f"<b>GPU idle</b> %{{customdata}}: %{{text}}<extra>{run.engine}</extra>",
            ),
            row=row,
            col=1,
        )
        legend_entry(fig, IDLE_ROW, shown)


def share_colorbar(fig: go.Figure, row: int, rows: int) -> None:
    """The depth legend: a colourbar of the busy share (%), beside the first engine's rows."""
    fig.add_trace(
        go.Heatmap(
            # one transparent cell below the rows (their y range is fixed): a colourbar needs data
            x=[0.0],
            y=[-5],
            z=[[0.0]],
            opacity=0,
            zmin=0,
            zmax=100,
            colorscale=[[0, "#ffffff"], [1, SHARE_INK]],
            showscale=True,
            hoverinfo="skip",
            meta="share-legend",
            colorbar=dict(
                title=dict(text="lane busy in the bin (%)", side="right"),
                ticksuffix="%",
                len=min(1.0, 1.6 / rows),
                y=1.0,
                yanchor="top",
                thickness=14,
                nticks=6,
            ),
        ),
        row=row,
        col=1,
    )


def _phase_scale(names: list[str]) -> list[list]:
    """A discrete colour scale: LEVELS depths per phase, from 1/LEVELS to full colour."""
    n = len(names) * LEVELS
    scale: list[list] = []
    for k, name in enumerate(names):
        base = PHASE_COLORS.get(name) or color_of(name)
        for lv in range(LEVELS):
            c = mix(base, (lv + 1) / LEVELS)
            i = k * LEVELS + lv
            scale += [[i / n, c], [(i + 1) / n, c]]
    return scale
