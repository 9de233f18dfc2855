"""The binned overview: per lane and time bin, the phase that filled most of it.

Used above SEGMENT_BUDGET spans: a heatmap row per lane is one image whatever the trace's size, so
a 10^5-span run opens as fast as a small one; the detail windows and the trace file keep every span.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from cbsim.report.frames import IDLE_ROW, RunFrames, busy_before, union_intervals
from cbsim.report.style import PHASE_COLORS, color_of, legend_entry, row_y

AGGREGATE_BINS = 1500
LEVELS = 4  # busy-share bands per phase colour


def occupancy(ts: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Busy time of the intervals inside each bin between consecutive edges."""
    s, e = union_intervals(ts, end)
    return np.diff(busy_before(s, e, edges))


def aggregate_rows(
    fig: go.Figure, run: RunFrames, row: int, bin_ms: float, shown: set[str]
) -> None:
    """Per lane, a one-row heatmap of the dominant phase per bin; the idle row as a red ramp."""
    ys = row_y(run.rows)
    nbins = max(1, int(np.ceil(run.total_ms / bin_ms)))
    edges = np.arange(nbins + 1) * bin_ms
    centers = (edges[:-1] + edges[1:]) / 2
    label = [f"{a:.2f}–{b:.2f} ms" for a, b in zip(edges[:-1], edges[1:])]
    for lane, g in run.spans.groupby("lane", sort=False):
        if lane not in ys:
            continue
        names = [str(n) for n in g["name"].unique()]
        occ = (
            np.stack(
                [
                    occupancy(p["ts_ms"].to_numpy(float), p["end_ms"].to_numpy(float), edges)
                    for _, p in g.groupby("name", sort=False)
                ]
            )
            / bin_ms
        )
        # colour: the phase that filled most of the bin, paler the less the lane was busy
        busy = np.clip(occ.sum(axis=0), 0.0, 1.0)
        level = np.clip(np.ceil(busy * LEVELS), 1, LEVELS) - 1
        z = np.where(busy > 0, occ.argmax(axis=0) * LEVELS + level + 0.5, np.nan)
        order = np.argsort(-occ, axis=0)[:3]
        text = [
            "<br>".join(f"{names[k]} {occ[k, j]:.1%}" for k in order[:, j] if occ[k, j] > 0)
            for j in range(nbins)
        ]
        scale = _phase_scale(names)
        for name in names:
            legend_entry(fig, name, shown)
        fig.add_trace(
            go.Heatmap(
                x=centers,
                y=[ys[lane]],
                z=[z],
                zmin=0,
                zmax=len(names) * LEVELS,
                colorscale=scale,
                showscale=False,
                customdata=[label],
                text=[text],
                ygap=4,
                hovertemplate=f"<b>{lane}</b> %{{customdata}}<br>%{{text}}<extra>{run.engine}</extra>",
            ),
            row=row,
            col=1,
        )
    if IDLE_ROW in ys and len(run.idle):
        idle = (
            occupancy(run.idle["ts_ms"].to_numpy(float), run.idle["end_ms"].to_numpy(float), edges)
            / bin_ms
        )
        fig.add_trace(
            go.Heatmap(
                x=centers,
                y=[ys[IDLE_ROW]],
                z=[idle],
                zmin=0,
                zmax=1,
                showscale=False,
                ygap=4,
                colorscale=[[0, "#ffffff"], [1, PHASE_COLORS[IDLE_ROW]]],
                customdata=[label],
                hovertemplate="<b>GPU idle</b> %{customdata}: %{z:.1%}<extra>"
                + run.engine
                + "</extra>",
            ),
            row=row,
            col=1,
        )
        legend_entry(fig, IDLE_ROW, shown)


def _mix(color: str, share: float) -> str:
    """The colour mixed with white: share 1 is the colour itself."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "rgb({},{},{})".format(*(round(255 - (255 - c) * share) for c in (r, g, b)))


def _phase_scale(names: list[str]) -> list[list]:
    """A discrete colour scale: LEVELS bands per phase, from pale (little busy) to full."""
    n = len(names) * LEVELS
    scale: list[list] = []
    for k, name in enumerate(names):
        for lv in range(LEVELS):
            c = _mix(color_of(name), 0.25 + 0.75 * (lv + 1) / LEVELS)
            i = k * LEVELS + lv
            scale += [[i / n, c], [(i + 1) / n, c]]
    return scale
