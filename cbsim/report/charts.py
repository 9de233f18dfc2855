"""The run's story in three charts: where the time went, step time, and each step's make-up.

Step-time axes are clipped to the steady state (STEADY_QUANTILE, with headroom), so one prefill or
stall step does not flatten the rest; the steps above the axis are marked at its top edge with
their real values in the hover.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from cbsim.config.output import MAX_CHART_POINTS
from cbsim.report.frames import RunFrames
from cbsim.report.style import PHASE_COLORS, engine_rows

GPU_COLOR = PHASE_COLORS["graph_replay"]
EXPOSED_COLOR = PHASE_COLORS["GPU idle"]
# engines are never red: red is GPU idle on every chart of the page
ENGINE_COLORS = {"sync": "#525252", "async": "#1f77b4"}
STEADY_QUANTILE = 0.99
HEADROOM = 1.25
# above this many steps the stacked view shows means over groups of steps
MAX_BARS = 400


def time_split_figure(runs: list[RunFrames]) -> go.Figure:
    """Per engine, the run's wall time split into GPU busy and GPU idle (one bar each)."""
    names = [r.engine for r in runs]
    idle_s = [r.idle_ms / 1e3 for r in runs]
    total_s = [r.total_ms / 1e3 for r in runs]
    busy_s = [t - i for t, i in zip(total_s, idle_s)]
    share = [i / t if t > 0 else 0.0 for i, t in zip(idle_s, total_s)]
    fig = go.Figure()
    for x, shares, word, name, position, color in (
        (busy_s, [1 - s for s in share], "busy", "GPU busy", "inside", GPU_COLOR),
        (idle_s, share, "idle", "GPU idle (waiting for the CPU)", "outside", EXPOSED_COLOR),
    ):
        fig.add_trace(
            go.Bar(
                y=names,
                x=x,
                orientation="h",
                name=name,
                marker_color=color,
                text=[f"{word} {s:.1%}" for s in shares],
                textposition=position,
                # a label outside its bar may pass the axis (None: plotly's default)
                cliponaxis=False if position == "outside" else None,
                hovertemplate=f"%{{y}}: GPU {word} %{{x:.3f}} s<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=110 + 45 * len(runs),
        margin=dict(l=60, r=90, t=30, b=40),
        xaxis_title="wall time (s)",
        yaxis=dict(autorange="reversed"),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


def steady_top(values: list[np.ndarray]) -> float | None:
    """The top of a step-time axis: the steady state's high quantile with headroom; None when
    nothing sticks out above it (the axis then shows everything)."""
    v = np.concatenate([np.asarray(x, float) for x in values]) if values else np.array([])
    v = v[np.isfinite(v)]
    if len(v) < 20:
        return None
    top = float(np.quantile(v, STEADY_QUANTILE)) * HEADROOM
    return top if top > 0 and v.max() > top else None


def step_causes(run: RunFrames) -> dict[int, str]:
    """Why a step may stand out: its batch kind when it prefills, and the host stalls that fall
    inside its interval (between the previous forward's end and its own)."""
    st = run.steps
    out: dict[int, list[str]] = {}
    for step, kind in zip(st["step"], st["kind"]):
        if kind in ("prefill", "mixed"):
            out.setdefault(int(step), []).append(f"{kind} step")
    if len(st) and len(run.stalls):
        ends = st["end_ms"].to_numpy(float)
        at = np.searchsorted(ends, run.stalls["end_ms"].to_numpy(float), side="left")
        for i, name, dur in zip(at, run.stalls["name"], run.stalls["dur_ms"]):
            if i < len(ends):
                out.setdefault(int(st["step"].iloc[i]), []).append(
                    f"host stall: {name} {dur:.1f} ms"
                )
    return {k: "; ".join(v) for k, v in out.items()}


def envelope_index(y: np.ndarray, max_points: int) -> tuple[np.ndarray, int]:
    """(positions to draw, steps a bucket) of a per-step series: every position when it has at
    most ``max_points``; else, per bucket of consecutive steps, where its min and its max fall,
    in order. The points drawn are real steps and a one-step spike stays in the line."""
    y = np.asarray(y, float)
    n = len(y)
    if n <= max_points:
        return np.arange(n), 1
    size = int(np.ceil(n / (max_points // 2)))
    rows = int(np.ceil(n / size))
    pad = rows * size - n
    base = np.arange(rows) * size
    lo = base + np.argmin(np.pad(y, (0, pad), constant_values=np.inf).reshape(rows, size), 1)
    hi = base + np.argmax(np.pad(y, (0, pad), constant_values=-np.inf).reshape(rows, size), 1)
    pairs = np.stack([np.minimum(lo, hi), np.maximum(lo, hi)], axis=1).ravel()
    keep = np.concatenate([[True], pairs[1:] != pairs[:-1]])
    return pairs[keep], size


def _outliers(
    fig: go.Figure,
    x,
    y,
    top: float,
    color: str,
    engine: str,
    causes: dict[int, str],
    count: int | None = None,
    **where,
) -> None:
    """Values above the clipped axis as triangles on its top edge, real values and what is in
    the step (prefill, a host stall) in the hover; ``count``: how many steps are above, when
    ``y`` is a thinned series."""
    x, y = np.asarray(x), np.asarray(y, float)
    over = y > top
    if not over.any():
        return
    n = int(over.sum()) if count is None else count
    why = [causes.get(int(s), "") for s in x[over]]
    fig.add_trace(
        go.Scatter(
            x=x[over],
            y=np.full(int(over.sum()), top * 0.985),
            mode="markers",
            name=f"{engine}: {n} steps above the axis (max {y[over].max():.1f} ms)",
            marker=dict(
                symbol="triangle-up", size=9, color=color, line=dict(width=1, color="#000")
            ),
            customdata=np.stack([y[over], np.array(why, dtype=object)], axis=1),
            hovertemplate="step %{x}: %{customdata[0]:.3f} ms (above the axis)<br>"
            "%{customdata[1]}<extra>" + engine + "</extra>",
        ),
        **where,
    )


def step_time_figure(runs: list[RunFrames], max_points: int = MAX_CHART_POINTS) -> go.Figure:
    """Step time over the run per engine, with the GPU's share of each step dotted; the axis
    clipped to the steady state, the steps above it marked. A line of more than ``max_points``
    steps keeps each bucket's min and max (envelope_index), and the title says so."""
    fig = go.Figure()
    top = steady_top([r.steps["step_ms"].to_numpy(float) for r in runs])
    sizes = []
    for r in runs:
        s = r.steps
        color = ENGINE_COLORS.get(r.engine, "#2ca02c")
        steps = s["step"].to_numpy(int)
        for column, what, hover, line in (
            ("step_ms", "step time", "", dict(color=color, width=1.5)),
            ("gpu_ms", "GPU busy in the step", "GPU busy ", dict(color=color, width=1, dash="dot")),
        ):
            y = s[column].to_numpy(float)
            at, size = envelope_index(y, max_points)
            sizes.append(size)
            fig.add_trace(
                go.Scatter(
                    x=steps[at] if size > 1 else steps,
                    y=y[at] if size > 1 else y,
                    mode="lines",
                    name=f"{r.engine}: {what}",
                    line=line,
                    hovertemplate=f"step %{{x}}: {hover}%{{y:.3f}} ms<extra>{r.engine}</extra>",
                )
            )
        if top is not None:
            y = s["step_ms"].to_numpy(float)
            at, _ = envelope_index(y, max_points)
            count = int((y > top).sum())
            _outliers(fig, steps[at], y[at], top, color, r.engine, step_causes(r), count=count)
    if top is not None:
        fig.update_yaxes(range=[0, top])
    if max(sizes, default=1) > 1:
        fig.update_layout(
            title=dict(
                text=f"Thinned: the min and max of each {max(sizes)}-step bucket "
                "(output.max_chart_points)",
                font=dict(size=12),
                x=0.5,
                yref="container",
                y=0.97,
            ),
            margin=dict(t=60),
        )
    fig.update_layout(
        height=320,
        margin=dict(l=60, r=20, t=30, b=45),
        xaxis_title="step",
        yaxis_title="ms",
        yaxis_rangemode="tozero",
        hovermode="x unified",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


def binned_steps(steps: pd.DataFrame, max_bars: int = MAX_BARS) -> tuple[pd.DataFrame, int]:
    """Means over groups of consecutive steps, so the bar count stays bounded."""
    n = len(steps)
    size = max(1, int(np.ceil(n / max_bars)))
    if size == 1:
        out = steps.assign(first=steps["step"], last=steps["step"])
        return out, 1
    group = np.arange(n) // size
    out = steps.groupby(group).agg(
        first=("step", "min"),
        last=("step", "max"),
        gpu_ms=("gpu_ms", "mean"),
        exposed_ms=("exposed_ms", "mean"),
    )
    return out, size


def stacked_steps_figure(runs: list[RunFrames]) -> go.Figure:
    """Each step (or group of steps): GPU busy under the time the GPU waited for the CPU."""
    titles = []
    binned = []
    for r in runs:
        b, size = binned_steps(r.steps)
        binned.append(b)
        per = "per step" if size == 1 else f"mean per step over groups of {size} steps"
        titles.append(f"{r.engine}: GPU busy vs CPU exposed, {per}")
    top = steady_top([(b["gpu_ms"] + b["exposed_ms"]).to_numpy(float) for b in binned])
    fig = engine_rows(titles, (0.18, 0.1), shared_yaxes=True)
    for i, (r, b) in enumerate(zip(runs, binned), start=1):
        label = [f"{a}" if a == z else f"{a}-{z}" for a, z in zip(b["first"], b["last"])]
        x = b["first"].to_numpy(int)
        for column, name, color, group, what in (
            ("gpu_ms", "GPU busy", GPU_COLOR, "gpu", "GPU"),
            ("exposed_ms", "CPU exposed (GPU idle)", EXPOSED_COLOR, "exposed", "exposed"),
        ):
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=b[column].to_numpy(float),
                    name=name,
                    marker_color=color,
                    customdata=label,
                    showlegend=i == 1,
                    legendgroup=group,
                    marker_line_width=0,
                    hovertemplate=f"steps %{{customdata}}: {what} %{{y:.3f}} ms"
                    f"<extra>{r.engine}</extra>",
                ),
                row=i,
                col=1,
            )
        fig.update_yaxes(title_text="ms", rangemode="tozero", row=i, col=1)
        if top is not None:
            total = (b["gpu_ms"] + b["exposed_ms"]).to_numpy(float)
            color = ENGINE_COLORS.get(r.engine, "#2ca02c")
            _outliers(fig, x, total, top, color, r.engine, step_causes(r), row=i, col=1)
    if top is not None:
        fig.update_yaxes(range=[0, top])
    fig.update_xaxes(title_text="step", row=len(runs), col=1)
    fig.update_layout(
        barmode="stack",
        bargap=0.05,
        height=120 + 230 * len(runs),
        margin=dict(l=60, r=20, t=50, b=45),
        legend=dict(orientation="h", y=1.06, yanchor="bottom", x=0),
    )
    return fig
