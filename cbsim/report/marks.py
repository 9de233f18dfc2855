"""Marks over the overview's rows: hazards the simulator saw, host stalls, prefill steps.

A host stall is a host phase span longer than STALL_FACTOR times its phase's median (the rule of
the metrics' host_stalls): the periodic spikes of the step-time plot, named where they happen.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from cbsim.report.frames import RunFrames
from cbsim.report.style import row_y
from cbsim.trace import schema as S

STALL_COLOR = "#000000"
PREFILL_COLOR = "#000000"  # black like the stalls, open: orange is the H2D copy


def add_hazards(
    fig, run: RunFrames, ys: dict[str, int], row: int, shown: set[str], unit: float = 1.0
) -> None:
    h = run.hazards
    y = np.array([ys.get(lane, ys.get(S.HOST, 0)) for lane in h["lane"]]) + 0.35
    cd = np.stack(
        [
            h["kind"].astype(str),
            h["step"].astype(str),
            h["slot"].astype(str),
            h["detail"].astype(str),
        ],
        axis=1,
    )
    trace_type = go.Scattergl if len(h) > 2000 else go.Scatter
    fig.add_trace(
        trace_type(
            x=h["ts_ms"].to_numpy(float) / unit,
            y=y,
            mode="markers",
            name="hazard",
            legendgroup="hazard",
            showlegend="hazard" not in shown,
            customdata=cd,
            marker=dict(symbol="x", size=11, color="#000000", line=dict(width=1, color="#d62728")),
            hovertemplate="<b>hazard %{customdata[0]}</b><br>step %{customdata[1]}, slot "
            "%{customdata[2]}<br>%{customdata[3]}<extra></extra>",
        ),
        row=row,
        col=1,
    )
    shown.add("hazard")


def add_marks(fig, run: RunFrames, row: int, shown: set[str], unit: float) -> None:
    """Host stalls above the host row, prefill and mixed steps above the compute row."""
    ys = row_y(run.rows)
    st = run.stalls
    if len(st) and S.HOST in ys:
        _marker_trace(
            fig,
            row,
            st["ts_ms"].to_numpy(float) / unit,
            ys[S.HOST] + 0.42,
            [
                f"{n} {d:.2f} ms ({d / m:.0f}x its median {m:.3f} ms), step {s}"
                for n, d, m, s in zip(st["name"], st["dur_ms"], st["median_ms"], st["step"])
            ],
            "host stall",
            "triangle-down",
            STALL_COLOR,
            shown,
        )
    fill = run.steps[run.steps["kind"].isin(("prefill", "mixed"))] if len(run.steps) else None
    if fill is not None and len(fill) and run.gpu_lane in ys:
        fwd = (
            run.spans[(run.spans["lane"] == run.gpu_lane) & run.spans["step"].isin(fill["step"])]
            .groupby("step")["ts_ms"]
            .min()
        )
        _marker_trace(
            fig,
            row,
            fwd.to_numpy(float) / unit,
            ys[run.gpu_lane] + 0.42,
            [
                f"{k} step {s}"
                for k, s in zip(fill.set_index("step").loc[fwd.index, "kind"], fwd.index)
            ],
            "prefill / mixed step",
            "triangle-down-open",
            PREFILL_COLOR,
            shown,
        )


def _marker_trace(fig, row, x, y, text, name, symbol, color, shown: set[str]) -> None:
    kind = go.Scattergl if len(x) > 2000 else go.Scatter
    fig.add_trace(
        kind(
            x=x,
            y=np.full(len(x), y),
            mode="markers",
            name=name,
            legendgroup=name,
            showlegend=name not in shown,
            text=text,
            marker=dict(symbol=symbol, size=9, color=color),
            hovertemplate="<b>" + name + "</b><br>%{text}<extra></extra>",
        ),
        row=row,
        col=1,
    )
    shown.add(name)
