"""sweep.html: where async batching pays, over the swept settings.

Heatmaps of the async speedup and of GPU idle (sync, async) over two swept keys (batch size and
generated length when swept), with the border where async stops paying drawn between cells; line
charts of the same with the crossover interpolated; the pair table; the jobs not finished.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cbsim.report.html import Page, esc, table
from cbsim.sweep.summary import COMPARISON_FILE, FINISHED, SUMMARY_FILE, override_keys

PREFERRED_X = ("workload.batch_size",)
PREFERRED_Y = ("workload.gen_len", "workload.prompt_len")
MAX_FACETS = 8
LINE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def _varying(comp: pd.DataFrame, keys: list[str]) -> list[str]:
    return [k for k in keys if comp[k].astype(str).nunique() > 1]


def _order(values: pd.Series) -> list[Any]:
    uniq = list(dict.fromkeys(values))
    try:
        return sorted(uniq, key=float)
    except (TypeError, ValueError):
        return sorted(uniq, key=str)


def _numeric(values: list[Any]) -> bool:
    try:
        [float(v) for v in values]
    except (TypeError, ValueError):
        return False
    return True


def pick_axes(comp: pd.DataFrame, keys: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(x key, y key, facet keys) among the keys that vary."""
    vary = _varying(comp, keys)
    x = next((k for k in PREFERRED_X if k in vary), vary[0] if vary else None)
    rest = [k for k in vary if k != x]
    y = next((k for k in PREFERRED_Y if k in rest), rest[0] if rest else None)
    return x, y, [k for k in rest if k != y]


def crossovers(xs: list[float], speedups: list[float], threshold: float) -> list[float]:
    """x where the speedup line crosses the threshold (log-interpolated in x when x > 0)."""
    out = []
    for (x0, s0), (x1, s1) in zip(zip(xs, speedups), zip(xs[1:], speedups[1:])):
        if any(map(math.isnan, (s0, s1))) or (s0 - threshold) * (s1 - threshold) > 0 or s0 == s1:
            continue
        f = (threshold - s0) / (s1 - s0)
        if x0 > 0 and x1 > 0:
            out.append(float(math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))))
        else:
            out.append(x0 + f * (x1 - x0))
    return out


def heatmap_figure(comp: pd.DataFrame, x: str, y: str | None, threshold: float) -> go.Figure:
    xs = _order(comp[x])
    ys = _order(comp[y]) if y else [""]
    grid = {(r[x], r[y] if y else ""): r for r in comp.to_dict("records")}

    def z(col: str) -> np.ndarray:
        return np.array([[grid.get((a, b), {}).get(col, np.nan) for a in xs] for b in ys], float)

    speed = z("speedup")
    fig = make_subplots(
        rows=1,
        cols=3,
        horizontal_spacing=0.07,
        subplot_titles=(
            f"async speedup (✗: below x{threshold:g})",
            "GPU idle, sync",
            "GPU idle, async",
        ),
    )
    text = [
        [("" if math.isnan(v) else f"x{v:.3f}" + (" ✗" if v < threshold else "")) for v in row]
        for row in speed
    ]
    span = max(abs(np.nanmax(speed) - 1), abs(1 - np.nanmin(speed)), 0.05) if speed.size else 0.1
    fig.add_trace(
        go.Heatmap(
            x=list(range(len(xs))),
            y=list(range(len(ys))),
            z=speed,
            text=text,
            texttemplate="%{text}",
            colorscale="RdBu",
            zmid=1.0,
            zmin=1 - span,
            zmax=1 + span,
            showscale=False,  # the cells carry their values
            hovertemplate="x%{z:.3f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    for col, key in ((2, "gpu_idle_sync"), (3, "gpu_idle_async")):
        idle = z(key)
        fig.add_trace(
            go.Heatmap(
                x=list(range(len(xs))),
                y=list(range(len(ys))),
                z=idle,
                zmin=0,
                zmax=max(0.05, float(np.nanmax(z("gpu_idle_sync"))) if speed.size else 1.0),
                colorscale=[[0, "#ffffff"], [1, "#d62728"]],
                showscale=col == 3,
                text=[[("" if math.isnan(v) else f"{v:.1%}") for v in row] for row in idle],
                texttemplate="%{text}",
                hovertemplate="%{z:.2%}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    for col in (1, 2, 3):
        fig.update_xaxes(
            tickvals=list(range(len(xs))),
            ticktext=[str(v) for v in xs],
            title_text=x,
            row=1,
            col=col,
        )
        fig.update_yaxes(
            tickvals=list(range(len(ys))),
            ticktext=[str(v) for v in ys],
            title_text=y if col == 1 else None,
            row=1,
            col=col,
        )
    for x0, y0, x1, y1 in _border(speed >= threshold, ~np.isnan(speed)):
        fig.add_shape(
            type="line",
            x0=x0,
            y0=y0,
            x1=x1,
            y1=y1,
            xref="x",
            yref="y",
            line=dict(color="#111111", width=4),
        )
    fig.update_layout(height=140 + 55 * len(ys), margin=dict(l=90, r=20, t=40, b=60))
    return fig


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
    """Speedup and GPU idle against x, one line per y value; crossovers starred."""
    xs = _order(comp[x])
    numeric = _numeric(xs)
    log = (
        numeric and all(float(v) > 0 for v in xs) and max(map(float, xs)) / min(map(float, xs)) >= 8
    )
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
        subplot_titles=("async speedup", "GPU idle: sync solid, async dashed"),
    )
    groups = comp.groupby(y, sort=False) if y else [("", comp)]
    order = _order(comp[y]) if y else [""]
    groups = sorted(groups, key=lambda g: order.index(g[0]))
    for k, (yv, g) in enumerate(groups):
        g = g.set_index(g[x]).reindex(xs)
        px = [float(v) for v in xs] if numeric else list(range(len(xs)))
        color = LINE_COLORS[k % len(LINE_COLORS)]
        name = f"{y}={yv}" if y else "speedup"
        sp = g["speedup"].astype(float).to_list()
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
        cross = crossovers(px, sp, threshold)
        if cross:
            fig.add_trace(
                go.Scatter(
                    x=cross,
                    y=[threshold] * len(cross),
                    mode="markers",
                    showlegend=False,
                    legendgroup=name,
                    marker=dict(
                        symbol="star", size=15, color=color, line=dict(width=1, color="#000")
                    ),
                    hovertemplate=f"async stops paying near {x}≈%{{x:.3g}}<extra>{name}</extra>",
                ),
                row=1,
                col=1,
            )
        for key, dash in (("gpu_idle_sync", "solid"), ("gpu_idle_async", "dash")):
            fig.add_trace(
                go.Scatter(
                    x=px,
                    y=g[key].astype(float).to_list(),
                    mode="lines+markers",
                    showlegend=False,
                    legendgroup=name,
                    line=dict(color=color, dash=dash),
                    hovertemplate=f"{x}=%{{x}}: %{{y:.2%}}<extra>{name} {key[9:]}</extra>",
                ),
                row=1,
                col=2,
            )
    fig.add_hline(
        y=threshold,
        line=dict(color="#555", dash="dot"),
        row=1,
        col=1,
        annotation_text=f"pays above x{threshold:g}",
        annotation_position="top left",
    )
    for col in (1, 2):
        fig.update_xaxes(title_text=x, type="log" if log else None, row=1, col=col)
        if not numeric:
            fig.update_xaxes(
                tickvals=list(range(len(xs))), ticktext=[str(v) for v in xs], row=1, col=col
            )
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=380, margin=dict(l=60, r=20, t=40, b=50), hovermode="closest")
    return fig


def single_figure(comp: pd.DataFrame, threshold: float) -> go.Figure:
    """One setting: the speedup as a bar against the line where async pays."""
    fig = go.Figure(
        go.Bar(
            x=["async speedup"],
            y=comp["speedup"].astype(float).to_list()[:1],
            marker_color="#1f77b4",
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
    fig.update_layout(height=300, width=420, margin=dict(l=60, r=20, t=30, b=40))
    return fig


def verdict(comp: pd.DataFrame, keys: list[str], threshold: float) -> str:
    ok = comp["speedup"].astype(float)
    pays = comp[ok >= threshold]
    text = (
        f"Async pays (speedup ≥ x{threshold:g}) in {len(pays)} of {len(comp)} settings; "
        f"speedup x{ok.min():.3f} to x{ok.max():.3f}."
    )
    losing = comp[ok < threshold]
    if len(losing):
        shown = "; ".join(
            " ".join(f"{k.split('.')[-1]}={r[k]}" for k in keys) + f" (x{r['speedup']:.3f})"
            for r in losing.head(8).to_dict("records")
        )
        text += f" It does not pay at: {shown}{' …' if len(losing) > 8 else ''}."
    return text


def write_sweep_report(jobs: list, comp: pd.DataFrame, path: Path, threshold: float = 1.05) -> Path:
    path = Path(path)
    done = sum(j.status == FINISHED for j in jobs)
    page = Page(f"cbsim sweep · {path.parent.name}")
    page.heading(f"cbsim sweep: {done} of {len(jobs)} jobs finished", level=1)
    keys = [k for k in override_keys(jobs) if k != "engine"]
    if comp.empty:
        page.para(
            "No setting has both engines finished yet: sweep engine=sync,async (or "
            "engine=compare) to see where async pays.",
            "lead",
        )
    else:
        x, y, facets = pick_axes(comp, keys)
        page.para(esc(verdict(comp, _varying(comp, keys), threshold)), "lead")
        page.para(
            "Speedup = sync time / async time for the same settings (jobs paired by every "
            "override but the engine, or one engine=compare job). GPU idle = share of the "
            "run the compute stream executed nothing. The black border and the stars mark "
            f"where the speedup crosses x{threshold:g}, the line this report calls paying "
            "(set it with hydra.callbacks.sweep_summary.min_speedup).",
            "note",
        )
        groups = list(comp.groupby(facets, sort=True)) if facets else [((), comp)]
        for values, g in groups[:MAX_FACETS]:
            values = values if isinstance(values, tuple) else (values,)
            if facets:
                page.heading(", ".join(f"{k}={v}" for k, v in zip(facets, values)), level=3)
            if x is not None:
                page.figure(heatmap_figure(g, x, y, threshold), "heatmap")
                page.figure(lines_figure(g, x, y, threshold), "lines")
                if y is not None:
                    page.figure(lines_figure(g, y, x, threshold), "lines_y")
            else:
                page.figure(single_figure(g, threshold), "speedup")
        if len(groups) > MAX_FACETS:
            page.para(
                f"{len(groups) - MAX_FACETS} more groups of {', '.join(facets)} are in "
                f"{COMPARISON_FILE}.",
                "note",
            )
        page.heading("All pairs")
        cols = [*keys, "speedup", "gpu_idle_sync", "gpu_idle_async", "time_sync_s", "time_async_s"]
        cols = [c for c in cols if c in comp]
        records = comp.sort_values(keys).to_dict("records") if keys else comp.to_dict("records")
        rows = [[_cell(c, r[c]) for c in cols] for r in records]
        classes = [
            [
                ("good" if r["speedup"] >= threshold else "bad") if c == "speedup" else ""
                for c in cols
            ]
            for r in records
        ]
        page.add(table(cols, rows, classes))
    missing = [j for j in jobs if j.status != FINISHED]
    if missing:
        page.heading(f"Not finished: {len(missing)}")
        page.para(
            "Run the same command again with hydra.sweep.dir set to this directory: "
            "finished jobs are skipped, these are run.",
            "note",
        )
        page.add(
            table(
                ["job", "status", "overrides"],
                [[j.num, j.status, " ".join(j.overrides)] for j in missing],
            )
        )
    page.para(
        f"Every job's overrides and metrics: <code>{SUMMARY_FILE}</code>; the pairs: "
        f"<code>{COMPARISON_FILE}</code>; each job's report.html is in its directory.",
        "note",
    )
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page.render(), encoding="utf-8")
    tmp.replace(path)
    return path


def _cell(col: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if col == "speedup":
        return f"x{value:.3f}"
    if col.startswith("gpu_idle"):
        return f"{value:.2%}"
    if col.startswith("time"):
        return f"{value:.3f}"
    return str(value)
