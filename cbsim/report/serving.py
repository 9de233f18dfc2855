"""The serving story of an online run: latency distributions in vLLM's names and the queue.

TTFT, TPOT, ITL and E2EL per request (per token for ITL) as cumulative distributions, one line per
engine, and the scheduler's waiting and running requests over time: when the offered load exceeds
what an engine sustains, its queue grows for the whole run and every TTFT behind it with it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cbsim.metrics import MetricInputs, inputs_from_trace
from cbsim.metrics.serving import STATS, itl_ms, latencies_ms
from cbsim.metrics.timeline import time_range
from cbsim.report.charts import ENGINE_COLORS
from cbsim.report.frames import time_unit
from cbsim.report.html import table
from cbsim.report.untraced import UntracedRun
from cbsim.trace import schema as S
from cbsim.trace.model import Trace


def latency_name(stat: str, key: str) -> str:
    """vLLM's name of a latency statistic: "Mean TTFT", "P99 ITL" (its label adds " (ms)")."""
    return f"{stat.capitalize()} {key.upper()}"


LATENCIES = (
    ("ttft", "TTFT: time to first token"),
    ("tpot", "TPOT: time per output token"),
    ("itl", "ITL: inter-token latency"),
    ("e2el", "E2EL: end-to-end latency"),
)
CDF_POINTS = 400  # quantiles drawn per line: the shape of 10^5 ITLs in a few KB
QUEUE_POINTS = 3000
# (label, metric key, format): vLLM bench serve's rows and labels (the one label of each figure
# in every cbsim table)
SERVING_ROWS = (
    ("Successful requests", "completed", "{:d}"),
    ("Duration (s)", "duration", "{:.2f}"),
    ("Total input tokens", "total_input_tokens", "{:d}"),
    ("Total generated tokens", "total_output_tokens", "{:d}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Request goodput (req/s)", "request_goodput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.1f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    ("Offered request rate (req/s)", "offered_request_rate", "{:.2f}"),
    ("Sustained request rate (req/s)", "sustained_request_rate", "{:.2f}"),
    *(
        (f"{latency_name(stat, key)} (ms)", f"{stat}_{key}_ms", "{:.2f}")
        for key, _ in LATENCIES
        for stat in STATS
    ),
)


def is_online(metrics: dict[str, dict[str, Any]]) -> bool:
    """Requests arrived over time (an offered rate was measured) in some engine's run."""
    return any(m.get("offered_request_rate") for m in metrics.values())


def overload_sentence(metrics: dict[str, dict[str, Any]]) -> str | None:
    """The first thing to say when an engine cannot keep up with the arrivals, else None."""
    over = [e for e, m in metrics.items() if m.get("overloaded")]
    if not over:
        return None
    parts = []
    for e in over:
        m = metrics[e]
        parts.append(
            f"{e} cannot sustain the offered {m['offered_request_rate']:.2f} req/s (it starts "
            f"{m['sustained_request_rate']:.2f} req/s), so its queue grows for the whole run"
        )
    ttft = "; ".join(f"{e} {_ms(m.get('median_ttft_ms'))}" for e, m in metrics.items())
    return "; ".join(parts) + f". Median TTFT: {ttft}."


def _ms(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.1f} ms" if v < 100 else f"{v:,.0f} ms"


def inputs_of(run: Trace | UntracedRun) -> MetricInputs:
    """What a run's metrics were computed from: its trace's tables, or the fold of a run
    without a trace."""
    return run.inputs if isinstance(run, UntracedRun) else inputs_from_trace(run)


def serving_values(run: Trace | UntracedRun) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT, E2EL and per-token ITL (ms), as cbsim.metrics computes them."""
    inp = inputs_of(run)
    req = inp.fold.requests()
    start, _ = time_range(inp)
    lat = latencies_ms(req)
    return {
        "ttft": lat["ttft"].dropna().to_numpy(),
        "tpot": lat["tpot"].dropna().to_numpy(),
        "itl": itl_ms(inp, req, start),
        "e2el": lat["e2el"].dropna().to_numpy(),
    }


def serving_table(metrics: dict[str, dict[str, Any]]) -> str:
    names = list(metrics)
    rows = []
    for label, key, fmt in SERVING_ROWS:
        cells = [metrics[n].get(key) for n in names]
        if all(c is None for c in cells):
            continue
        rows.append([label, *("-" if c is None else fmt.format(c) for c in cells)])
    return table(["serving (vLLM's names)", *names], rows)


def cdf_figure(values: dict[str, dict[str, np.ndarray]]) -> go.Figure:
    """The four latency CDFs, one line per engine, log x (they span decades when overloaded)."""
    fig = make_subplots(
        rows=1, cols=4, subplot_titles=[t for _, t in LATENCIES], horizontal_spacing=0.06
    )
    probs = np.linspace(0, 1, CDF_POINTS)
    for engine, vals in values.items():
        color = ENGINE_COLORS.get(engine, "#2ca02c")
        for col, (key, _) in enumerate(LATENCIES, start=1):
            v = vals.get(key, np.array([]))
            v = v[np.isfinite(v) & (v > 0)]
            if not len(v):
                continue
            fig.add_trace(
                go.Scatter(
                    x=np.quantile(v, probs),
                    y=probs * 100,
                    mode="lines",
                    name=engine,
                    legendgroup=engine,
                    showlegend=col == 1,
                    line=dict(color=color, width=2),
                    hovertemplate=f"{key.upper()} %{{x:.2f}} ms: %{{y:.1f}}% of "
                    + ("tokens" if key == "itl" else "requests")
                    + f" at or below<extra>{engine}</extra>",
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(type="log", title_text="ms", row=1, col=col)
    fig.update_yaxes(title_text="share at or below (%)", ticksuffix="%", row=1, col=1)
    fig.update_yaxes(range=[0, 100])
    fig.update_layout(
        height=340,
        margin=dict(l=60, r=20, t=40, b=45),
        legend=dict(orientation="h", y=1.12, yanchor="bottom", x=0),
    )
    return fig


def queue_curve(run: Trace | UntracedRun) -> tuple[np.ndarray, np.ndarray]:
    """(ms since the run's start, requests arrived and still without their first token): the
    queue every TTFT waits in, counted from the request events alone."""
    inp = inputs_of(run)
    req = inp.fold.requests()
    start, _ = time_range(inp)
    arrive = req[S.ARRIVAL].dropna().to_numpy(float)
    first = req[S.FIRST_TOKEN].dropna().to_numpy(float)
    t = np.concatenate([arrive, first])
    step = np.concatenate([np.ones(len(arrive)), -np.ones(len(first))])
    order = np.argsort(t, kind="stable")
    return (t[order] - start) / 1e3, np.cumsum(step[order])


def running_curve(trace: Trace | UntracedRun) -> tuple[np.ndarray, np.ndarray] | None:
    """(ms, running requests) from the scheduler's counter track, when it has one (a run
    without a trace kept none)."""
    if isinstance(trace, UntracedRun):
        return None
    c = trace.counters
    if c.empty or "running" not in c:
        return None
    c = c[c["name"] == S.SCHEDULER_COUNTER].sort_values("ts")
    start, _ = time_range(inputs_from_trace(trace))
    return (c["ts"].to_numpy(float) - start) / 1e3, c["running"].to_numpy(float)


def queue_figure(traces: dict[str, Trace | UntracedRun]) -> go.Figure | None:
    """Per engine: requests queued (arrived, no first token yet) and running, over time."""
    curves = {e: (queue_curve(t), running_curve(t)) for e, t in traces.items()}
    curves = {e: c for e, c in curves.items() if len(c[0][0])}
    if not curves:
        return None
    unit, name = time_unit(max(float(q[0].max()) for q, _ in curves.values()))
    fig = go.Figure()
    for engine, (queue, running) in curves.items():
        color = ENGINE_COLORS.get(engine, "#2ca02c")
        for label, curve, dash in (("queued", queue, "solid"), ("running", running, "dot")):
            if curve is None:
                continue
            ms, n = curve
            keep = slice(None, None, max(1, len(ms) // QUEUE_POINTS))
            fig.add_trace(
                go.Scatter(
                    x=ms[keep] / unit,
                    y=n[keep],
                    mode="lines",
                    line=dict(color=color, dash=dash, shape="hv"),
                    name=f"{engine}: {label}",
                    hovertemplate=f"%{{y:.0f}} {label}<extra>{engine}</extra>",
                )
            )
    fig.update_layout(
        height=300,
        margin=dict(l=60, r=20, t=30, b=45),
        xaxis_title=f"time since the run's start ({name})",
        yaxis_title="requests",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig
