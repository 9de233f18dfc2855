"""capacity.html: latency against arrival rate per engine, the SLO bounds and each capacity.

Drawn from the capacity task's result alone (cbsim.capacity): one panel per bounded latency (its
SLO statistic against the rate, log-log), the bound as a dotted line, each engine's capacity as a
vertical line; a point that missed the SLO is an open marker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cbsim.report.charts import ENGINE_COLORS
from cbsim.report.html import Page, esc, table
from cbsim.report.serving import latency_name

LATENCY_ORDER = ("ttft", "tpot", "e2el")
ENGINE_ORDER = ("sync", "async")


def in_order(d: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """The dict in a reader's order (a JSON file written with sorted keys loses it)."""
    return dict(sorted(d.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99))


def capacity_figure(result: dict[str, Any]) -> go.Figure:
    stat, bounds = result["stat"], in_order(result["slo"], LATENCY_ORDER)
    keys = list(bounds)
    fig = make_subplots(
        rows=1,
        cols=len(keys),
        subplot_titles=[f"{latency_name(stat, k)} (bound {b:g} ms)" for k, b in bounds.items()],
        horizontal_spacing=0.1,
    )
    for engine, r in in_order(result["engines"], ENGINE_ORDER).items():
        color = ENGINE_COLORS.get(engine, "#2ca02c")
        curve = r["curve"]
        rates = [p["rate"] for p in curve]
        for col, key in enumerate(keys, start=1):
            fig.add_trace(
                go.Scatter(
                    x=rates,
                    y=[p.get(f"{stat}_{key}_ms") for p in curve],
                    mode="lines+markers",
                    name=engine,
                    legendgroup=engine,
                    showlegend=col == 1,
                    line=dict(color=color),
                    marker=dict(
                        size=9,
                        symbol=["circle" if p["meets_slo"] else "circle-open" for p in curve],
                    ),
                    customdata=[["meets" if p["meets_slo"] else "misses"] for p in curve],
                    hovertemplate=f"%{{x:.3g}} req/s: {latency_name(stat, key)} "
                    "%{y:.1f} ms "
                    f"(%{{customdata[0]}} the SLO)<extra>{engine}</extra>",
                ),
                row=1,
                col=col,
            )
            ys = [v for p in curve if (v := p.get(f"{stat}_{key}_ms"))] + [bounds[key]]
            if r["capacity_rate"] and ys:
                fig.add_trace(
                    go.Scatter(
                        x=[r["capacity_rate"]] * 2,
                        y=[min(ys) * 0.8, max(ys) * 1.25],
                        mode="lines+text",
                        text=["", f"{engine} {r['capacity_rate']:.3g} req/s"],
                        textposition="top center",
                        line=dict(color=color, dash="dash"),
                        showlegend=False,
                        legendgroup=engine,
                        hovertemplate=f"{engine}: capacity %{{x:.3g}} req/s<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
    for col, (key, b) in enumerate(bounds.items(), start=1):
        fig.add_hline(y=b, line=dict(color="#555", dash="dot"), row=1, col=col)
        fig.update_xaxes(type="log", title_text="arrival rate (req/s)", row=1, col=col)
        fig.update_yaxes(type="log", title_text=f"{latency_name(stat, key)} (ms)", row=1, col=col)
    fig.update_layout(height=420, margin=dict(l=70, r=20, t=50, b=50), hovermode="closest")
    return fig


def write_capacity_page(result: dict[str, Any], path: Path, description: str = "") -> Path:
    title = "cbsim capacity: the highest arrival rate that meets the SLO"
    page = Page(title)
    page.heading(title, level=1)
    page.para(f"<b>{esc(result['answer'])}</b>", "lead")
    if description:
        page.para(esc(description), "note")
    seeds = result.get("seeds") or []
    page.para(
        f"Each engine's capacity is found by bisection over simulated runs of "
        f"{result['requests']} requests, the arrival rate alone changed, once for each of "
        f"{len(seeds)} arrival draws (seeds {', '.join(map(str, seeds))}): the capacity is their "
        "median, the range their spread. The curve is the first draw's (filled markers meet "
        "the SLO, open ones miss it; a run that did not finish every request misses). Costs of "
        f"hardware={esc(str(result.get('hardware')))}: {esc(str(result.get('hardware_source')))}.",
        "note",
    )
    page.add(
        table(
            ["engine", "capacity (req/s)", "range over the seeds", "per seed"],
            [
                [
                    engine,
                    _rate(r["capacity_rate"]),
                    " - ".join(_rate(v) for v in r.get("band") or [r["capacity_rate"]] * 2),
                    ", ".join(_rate(v) for v in r.get("seed_rates") or [r["capacity_rate"]]),
                ]
                for engine, r in in_order(result["engines"], ENGINE_ORDER).items()
            ],
        )
    )
    page.figure(capacity_figure(result), "capacity")
    slo = in_order(result["slo"], LATENCY_ORDER)
    rows = []
    for engine, r in in_order(result["engines"], ENGINE_ORDER).items():
        for p in r["curve"]:
            rows.append(
                [
                    engine,
                    f"{p['rate']:.4g}",
                    *(_ms(p.get(f"{result['stat']}_{k}_ms")) for k in slo),
                    "yes" if p["meets_slo"] else "no",
                ]
            )
    keys = [f"{latency_name(result['stat'], k)} (ms)" for k in slo]
    page.add(table(["engine", "rate (req/s)", *keys, "meets the SLO"], rows))
    return page.write(path)


def _rate(v: Any) -> str:
    return "misses" if v is None else f"{v:.3g}"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"
