"""Colours and row layout shared by the timeline figures."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cbsim.report.frames import IDLE_ROW
from cbsim.trace import schema as S

PHASE_COLORS = {
    S.SCHEDULE: "#9ecae1",
    S.PREPARE: "#3182bd",
    S.LAUNCH: "#08306b",
    S.WAIT: "#c7c7c7",
    S.UPDATE: "#31a354",
    S.COPY_H2D: "#fd8d3c",
    S.CARRY_OVER: "#e377c2",
    S.GRAPH_REPLAY: "#6a51a3",
    S.FORWARD: "#3f007d",
    S.COPY_D2H: "#8c6d31",
    IDLE_ROW: "#d62728",
}
OTHER_COLORS = ("#17becf", "#bcbd22", "#7f7f7f", "#ff9896", "#98df8a", "#c5b0d5")
ROW_PX = 30  # height of one timeline row


def color_of(name: str, _cache: dict[str, str] = {}) -> str:  # noqa: B006 (a stable palette)
    if name in PHASE_COLORS:
        return PHASE_COLORS[name]
    return _cache.setdefault(name, OTHER_COLORS[len(_cache) % len(OTHER_COLORS)])


def mix(color: str, share: float) -> str:
    """The colour mixed with white: share 1 is the colour itself, 0 is white."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "rgb({},{},{})".format(*(round(255 - (255 - c) * share) for c in (r, g, b)))


def row_y(rows: list[str]) -> dict[str, int]:
    return {r: len(rows) - 1 - i for i, r in enumerate(rows)}


def yaxis(fig: go.Figure, rows: list[str], row: int, col: int = 1) -> None:
    ys = row_y(rows)
    fig.update_yaxes(
        tickvals=list(ys.values()),
        ticktext=list(ys),
        range=[-0.6, len(rows) - 0.4],
        fixedrange=True,
        showgrid=False,
        zeroline=False,
        row=row,
        col=col,
    )


def engine_rows(titles: list[str], spacing: tuple[float, float], **options: Any) -> go.Figure:
    """One subplot row per engine (one title each) over a shared x axis, so the engines line up;
    ``spacing``: between rows when there are several, and the margin a lone row keeps."""
    between, alone = spacing
    return make_subplots(
        rows=len(titles),
        cols=1,
        shared_xaxes=True,
        subplot_titles=titles,
        vertical_spacing=between if len(titles) > 1 else alone,
        **options,
    )


def legend_entry(fig: go.Figure, name: str, shown: set[str]) -> None:
    if name in shown:
        return
    fig.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            name=name,
            legendgroup=name,
            marker=dict(symbol="square", size=12, color=color_of(name)),
        )
    )
    shown.add(name)
