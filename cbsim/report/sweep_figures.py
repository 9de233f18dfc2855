"""The sweep's figures, from the pair table alone (one row per setting: speedup, GPU idle).

Heatmaps of the async speedup and of GPU idle (sync, async) over two swept keys, each with a
colourbar in its unit (x, %), settings that do not fit the device greyed out, and the border where
async stops paying drawn between measured cells; line charts of the same against each key, where a
crossing of the threshold is shown as the interval between the two measured settings that bracket
it (it was not measured in between).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cbsim.report.style import PHASE_COLORS

LINE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
IDLE_COLOR = PHASE_COLORS["GPU idle"]
NO_FIT_COLOR = "#bdbdbd"
FITS = "fits_device"  # bool column of the pair table: False where the setting does not fit


def order(values: pd.Series) -> list[Any]:
    uniq = list(dict.fromkeys(values))
    try:
        return sorted(uniq, key=float)
    except (TypeError, ValueError):
        return sorted(uniq, key=str)


def numeric(values: list[Any]) -> bool:
    try:
        [float(v) for v in values]
    except (TypeError, ValueError):
        return False
    return True


def crossovers(xs: list[float], speedups: list[float], threshold: float) -> list[float]:
    """x where the speedup line crosses the threshold (log-interpolated in x when x > 0)."""
    out = []
    for (x0, x1), f in brackets(xs, speedups, threshold):
        if x0 > 0 and x1 > 0:
            out.append(float(math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))))
        else:
            out.append(x0 + f * (x1 - x0))
    return out


def brackets(
    xs: list[float], speedups: list[float], threshold: float
) -> list[tuple[tuple[float, float], float]]:
    """((x0, x1), fraction) for each pair of neighbouring measured settings the threshold lies
    between; the fraction is where a straight line between them would cross it."""
    out = []
    for (x0, s0), (x1, s1) in zip(zip(xs, speedups), zip(xs[1:], speedups[1:])):
        if any(map(math.isnan, (s0, s1))) or (s0 - threshold) * (s1 - threshold) > 0 or s0 == s1:
            continue
        out.append(((x0, x1), (threshold - s0) / (s1 - s0)))
    return out


def _grid(comp: pd.DataFrame, x: str, y: str | None):
    xs = order(comp[x])
    ys = order(comp[y]) if y else [""]
    cells = {(r[x], r[y] if y else ""): r for r in comp.to_dict("records")}

    def z(col: str, default: Any = np.nan) -> np.ndarray:
        return np.array(
            [[cells.get((a, b), {}).get(col, default) for a in xs] for b in ys], dtype=float
        )

    return xs, ys, z


COLORBAR = dict(thickness=12, len=1.0, y=0.5, yanchor="middle")


def heatmap_figure(comp: pd.DataFrame, x: str, y: str | None, threshold: float) -> go.Figure:
    """Speedup, GPU idle sync, GPU idle async over (x, y), each with a colourbar in its unit."""
    xs, ys, z = _grid(comp, x, y)
    speed = z("speedup")
    no_fit = z(FITS, 1.0) == 0 if FITS in comp else np.zeros_like(speed, dtype=bool)
    fig = make_subplots(
        rows=1,
        cols=3,
        horizontal_spacing=0.13,
        subplot_titles=(
            f"async speedup (✗: below x{threshold:g})",
            "GPU idle, sync (%)",
            "GPU idle, async (%)",
        ),
    )
    right = [fig.layout[f"xaxis{'' if c == 1 else c}"].domain[1] + 0.01 for c in (1, 2, 3)]
    cells = dict(x=list(range(len(xs))), y=list(range(len(ys))))
    fig.add_trace(_speed_cells(speed, no_fit, threshold, cells, right[0]), row=1, col=1)
    top = 100 * max(0.05, float(np.nanmax(z("gpu_idle_sync"))) if speed.size else 1.0)
    for col, key in ((2, "gpu_idle_sync"), (3, "gpu_idle_async")):
        fig.add_trace(_idle_cells(100 * z(key), no_fit, top, cells, col == 3, right[2]), 1, col)
    for col in (1, 2, 3) if no_fit.any() else ():
        fig.add_trace(
            go.Heatmap(
                **cells,
                z=np.where(no_fit, 1.0, np.nan),
                colorscale=[[0, NO_FIT_COLOR], [1, NO_FIT_COLOR]],
                showscale=False,
                opacity=0.85,
                hovertemplate="does not fit the device<extra></extra>",
            ),
            row=1,
            col=col,
        )
    for col in (1, 2, 3):
        fig.update_xaxes(
            tickvals=cells["x"], ticktext=[str(v) for v in xs], title_text=x, row=1, col=col
        )
        fig.update_yaxes(
            tickvals=cells["y"], ticktext=[str(v) for v in ys], title_text=y, row=1, col=col
        )
    for x0, y0, x1, y1 in _border(speed >= threshold, ~np.isnan(speed)):
        line = dict(color="#111111", width=4)
        fig.add_shape(type="line", x0=x0, y0=y0, x1=x1, y1=y1, xref="x", yref="y", line=line)
    fig.update_layout(height=180 + 55 * len(ys), margin=dict(l=90, r=40, t=40, b=60))
    return fig


def _speed_cells(speed, no_fit, threshold: float, cells: dict, bar_x: float) -> go.Heatmap:
    """The speedup cells, diverging around the threshold (red: does not pay, blue: pays), with
    their colourbar."""
    span = 0.1
    if speed.size and not np.isnan(speed).all():
        span = max(abs(np.nanmax(speed) - threshold), abs(threshold - np.nanmin(speed)), 0.02)
    return go.Heatmap(
        **cells,
        z=speed,
        text=[
            [_speed_text(v, threshold, nf) for v, nf in zip(row, nrow)]
            for row, nrow in zip(speed, no_fit)
        ],
        texttemplate="%{text}",
        colorscale="RdBu",
        zmid=threshold,
        zmin=threshold - span,
        zmax=threshold + span,
        colorbar=dict(title=dict(text="speedup (x)"), x=bar_x, **COLORBAR),
        hovertemplate="x%{z:.3f}<extra></extra>",
    )


def _idle_cells(idle, no_fit, top: float, cells: dict, scale: bool, bar_x: float) -> go.Heatmap:
    """GPU idle cells in percent (white to the idle red); the colourbar on the last panel."""
    return go.Heatmap(
        **cells,
        z=idle,
        zmin=0,
        zmax=top,
        colorscale=[[0, "#ffffff"], [1, IDLE_COLOR]],
        showscale=scale,
        colorbar=dict(title=dict(text="GPU idle (%)"), ticksuffix="%", x=bar_x, **COLORBAR),
        text=[[_idle_text(v, nf) for v, nf in zip(row, nrow)] for row, nrow in zip(idle, no_fit)],
        texttemplate="%{text}",
        hovertemplate="%{z:.2f}%<extra></extra>",
    )


def _speed_text(v: float, threshold: float, no_fit: bool) -> str:
    if math.isnan(v):
        return ""
    return f"x{v:.3f}" + (" ✗" if v < threshold else "") + ("<br>no fit" if no_fit else "")


def _idle_text(v: float, no_fit: bool) -> str:
    return "" if math.isnan(v) else f"{v:.1f}%" + ("<br>no fit" if no_fit else "")


def _border(pays: np.ndarray, known: np.ndarray) -> list[tuple[float, float, float, float]]:
    """Cell edges between a setting where async pays and a neighbour where it does not."""
    lines = []
    rows, cols = pays.shape
    for i in range(rows):
        for j in range(cols):
            if j + 1 < cols and known[i, j] and known[i, j + 1] and pays[i, j] != pays[i, j + 1]:
                lines.append((j + 0.5, i - 0.5, j + 0.5, i + 0.5))
            if i + 1 < rows and known[i, j] and known[i + 1, j] and pays[i, j] != pays[i + 1, j]:
                lines.append((j - 0.5, i + 0.5, j + 0.5, i + 0.5))
    return lines


def lines_figure(comp: pd.DataFrame, x: str, y: str | None, threshold: float) -> go.Figure:
    """Speedup and GPU idle against x, one line per y value; where the speedup crosses the
    threshold, the interval between the bracketing measured settings is drawn on the line."""
    xs = order(comp[x])
    num = numeric(xs)
    log = num and len(xs) >= 3 and min(map(float, xs)) > 0
    log = log and max(map(float, xs)) / min(map(float, xs)) >= 8
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
        subplot_titles=("async speedup", "GPU idle: sync solid, async dashed"),
    )
    groups = comp.groupby(y, sort=False) if y else [("", comp)]
    y_order = order(comp[y]) if y else [""]
    px = [float(v) for v in xs] if num else list(range(len(xs)))
    for k, (yv, g) in enumerate(sorted(groups, key=lambda gr: y_order.index(gr[0]))):
        name = f"{y}={yv}" if y else "speedup"
        color = LINE_COLORS[k % len(LINE_COLORS)]
        _line_group(fig, g.set_index(g[x]).reindex(xs), px, x, name, color, threshold)
    fig.add_hline(
        y=threshold,
        line=dict(color="#555", dash="dot"),
        row=1,
        col=1,
        annotation_text=f"pays above x{threshold:g}",
        annotation_position="top left",
    )
    for col in (1, 2):
        fig.update_xaxes(
            title_text=x,
            type="log" if log else "linear",
            tickvals=px,
            ticktext=[str(v) for v in xs],
            minor=dict(ticks="", showgrid=False),
            row=1,
            col=col,
        )
    fig.update_yaxes(title_text="speedup (sync time / async time, x)", row=1, col=1)
    fig.update_yaxes(title_text="GPU idle (%)", ticksuffix="%", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=400, margin=dict(l=70, r=20, t=40, b=50), hovermode="closest")
    return fig


def _line_group(fig, g: pd.DataFrame, px, x: str, name: str, color: str, threshold: float) -> None:
    """One y value's lines: its speedup (crossing and no-fit marks) and its GPU idle."""
    sp = g["speedup"].astype(float).to_list()
    _band(fig, g, "speedup", px, color, name, 1, 1.0)
    fig.add_trace(
        go.Scatter(
            x=px,
            y=sp,
            mode="lines+markers",
            name=name,
            legendgroup=name,
            line=dict(color=color),
            hovertemplate=f"{x}=%{{x}}: x%{{y:.3f}}<extra>{name}</extra>",
        ),
        row=1,
        col=1,
    )
    _bracket_marks(fig, px, sp, threshold, x, name, color)
    if FITS in g:
        _no_fit_marks(fig, px, sp, g[FITS], name)
    for key, dash in (("gpu_idle_sync", "solid"), ("gpu_idle_async", "dash")):
        _band(fig, g, key, px, color, name, 2, 100.0)
        fig.add_trace(
            go.Scatter(
                x=px,
                y=(100 * g[key].astype(float)).to_list(),
                mode="lines+markers",
                showlegend=False,
                legendgroup=name,
                line=dict(color=color, dash=dash),
                hovertemplate=f"{x}=%{{x}}: %{{y:.2f}}%<extra>{name} {key[9:]}</extra>",
            ),
            row=1,
            col=2,
        )


def _band(fig, g: pd.DataFrame, stem: str, px, color: str, name: str, col: int, scale: float):
    """The P5-P95 band of ``stem`` (comparison.csv's ``<stem>_p5``/``_p95``, mode.bands) as a
    shaded area under its line, where the sweep drew one."""
    low, high = f"{stem}_p5", f"{stem}_p95"
    if low not in g or high not in g or g[low].isna().all():
        return
    lo = (scale * g[low].astype(float)).to_list()
    hi = (scale * g[high].astype(float)).to_list()
    r, gg, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    common = dict(mode="lines", line=dict(width=0), showlegend=False, legendgroup=name)
    fig.add_trace(go.Scatter(x=px, y=hi, hoverinfo="skip", **common), row=1, col=col)
    fig.add_trace(
        go.Scatter(
            x=px,
            y=lo,
            fill="tonexty",
            fillcolor=f"rgba({r},{gg},{b},0.18)",
            hovertemplate=f"P5-P95 band<extra>{name}</extra>",
            **common,
        ),
        row=1,
        col=col,
    )


def _bracket_marks(fig, px, sp, threshold: float, x: str, name: str, color: str) -> None:
    """A thick segment on the threshold line between two measured settings it lies between."""
    for (x0, x1), _ in brackets(px, sp, threshold):
        fig.add_trace(
            go.Scatter(
                x=[x0, x1],
                y=[threshold, threshold],
                mode="lines",
                showlegend=False,
                legendgroup=name,
                opacity=0.45,
                line=dict(color=color, width=9),
                hovertemplate=f"async stops paying between {x}={x0:g} and {x1:g} "
                f"(not measured in between)<extra>{name}</extra>",
            ),
            row=1,
            col=1,
        )


def _no_fit_marks(fig, px, sp, fits: pd.Series, name: str) -> None:
    bad = [i for i, f in enumerate(fits.to_list()) if f is False or f == 0]
    if not bad:
        return
    fig.add_trace(
        go.Scatter(
            x=[px[i] for i in bad],
            y=[sp[i] for i in bad],
            mode="markers",
            name="does not fit the device",
            legendgroup="no-fit",
            marker=dict(symbol="x-open", size=14, color="#000"),
            hovertemplate="does not fit the device<extra>" + name + "</extra>",
        ),
        row=1,
        col=1,
    )


def single_figure(comp: pd.DataFrame, threshold: float) -> go.Figure:
    """One setting: the speedup as a bar against the line where async pays."""
    fig = go.Figure(
        go.Bar(
            x=["async speedup"],
            y=comp["speedup"].astype(float).to_list()[:1],
            marker_color=LINE_COLORS[0],
            width=0.4,
            hovertemplate="x%{y:.3f}<extra></extra>",
        )
    )
    fig.add_hline(
        y=threshold,
        line=dict(color="#555", dash="dot"),
        annotation_text=f"pays above x{threshold:g}",
        annotation_position="top left",
    )
    fig.update_layout(
        height=300, width=420, margin=dict(l=60, r=20, t=30, b=40), yaxis_title="speedup (x)"
    )
    return fig
