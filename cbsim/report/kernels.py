"""Per-kernel GPU time of an imported profiler trace: which kernels the GPU time went to.

A Kineto import keeps, in otherData ``kernels``, one record per kernel name (and step kind, when
the steps have kinds): ``name``, its total GPU time ``gpu_us``, ``calls``, and ``kind``. The
report shows the top kernels by share of the GPU time, per step kind, so it can say, e.g., that
91% of an engine's GPU time is attention over padded KV.
"""

from __future__ import annotations

from typing import Any

from cbsim.report.html import Page, esc, table
from cbsim.trace.model import Trace

KERNELS_KEY = "kernels"
TOP = 12
TIME_KEYS = ("gpu_us", "total_us", "dur_us", "time_us")
NAME_CHARS = 90


def kernel_records(trace: Trace) -> list[dict[str, Any]]:
    """The trace's kernel records as (name, kind, gpu_us, calls), largest first."""
    raw = trace.other_data.get(KERNELS_KEY)
    kineto = trace.other_data.get("kineto")
    if raw is None and isinstance(kineto, dict) and isinstance(kineto.get(KERNELS_KEY), dict):
        raw = _import_records(kineto[KERNELS_KEY])
    if isinstance(raw, dict):  # {kind: [records]} is read the same way
        raw = [{**r, "kind": k} for k, rs in raw.items() if isinstance(rs, list) for r in rs]
    out = []
    for r in raw if isinstance(raw, list) else []:
        if not isinstance(r, dict) or "name" not in r:
            continue
        us = next((r[k] for k in TIME_KEYS if isinstance(r.get(k), (int, float))), None)
        if us is None:
            continue
        out.append(
            {
                "name": str(r["name"]),
                "kind": str(r.get("kind") or "all steps"),
                "gpu_us": float(us),
                "calls": r.get("calls"),
            }
        )
    return sorted(out, key=lambda r: -r["gpu_us"])


def _import_records(table: dict[str, Any]) -> list[dict[str, Any]]:
    """cbsim.trace.kineto's table ({kind: {kernel_us, top: [{name, us, calls}]}}) as records;
    the kernels past its top ones are one record, so shares are of the kind's whole time."""
    out = []
    for kind, g in table.items():
        if not isinstance(g, dict) or not isinstance(g.get("top"), list):
            continue
        top = [{**r, "gpu_us": r.get("us"), "kind": kind} for r in g["top"] if isinstance(r, dict)]
        rest = float(g.get("kernel_us") or 0.0) - sum(float(r.get("us") or 0.0) for r in top)
        if rest > 1e-6:
            top.append({"name": "(all other kernels)", "gpu_us": rest, "kind": kind})
        out.extend(top)
    return out


def category_totals(trace: Trace) -> dict[str, float]:
    """GPU microseconds by kernel category over every kind of step (a Kineto import's)."""
    kineto = trace.other_data.get("kineto")
    table = kineto.get(KERNELS_KEY) if isinstance(kineto, dict) else None
    out: dict[str, float] = {}
    for g in table.values() if isinstance(table, dict) else []:
        cats = g.get("categories") if isinstance(g, dict) else None
        for c, us in (cats or {}).items():
            if isinstance(us, (int, float)):
                out[c] = out.get(c, 0.0) + float(us)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def category_sentence(trace: Trace) -> str | None:
    """'GPU time by kernel category: attention 90.9%, GEMM 5.1%, ...; the top kernel, X, 90.9%'
    for a trace that recorded its kernels; None otherwise."""
    totals = category_totals(trace)
    whole = sum(totals.values())
    if whole <= 0:
        return None
    parts = ", ".join(f"{c} {us / whole:.1%}" for c, us in totals.items() if us / whole >= 0.001)
    records = [r for r in kernel_records(trace) if not r["name"].startswith("(")]
    top = max(records, key=lambda r: r["gpu_us"], default=None)
    tail = f"; the top kernel, {_short(top['name'])}, {top['gpu_us'] / whole:.1%}" if top else ""
    return f"GPU time by kernel category: {parts}{tail}."


def kernel_tables(records: list[dict[str, Any]], top: int = TOP) -> dict[str, str]:
    """Per step kind, an HTML table of the top kernels by share of that kind's GPU time."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        kinds.setdefault(r["kind"], []).append(r)
    out = {}
    for kind, rs in kinds.items():
        total = sum(r["gpu_us"] for r in rs)
        rows = [
            [
                _short(r["name"]),
                f"{r['gpu_us'] / 1e3:.2f}",
                "-" if r["calls"] is None else str(r["calls"]),
                f"{r['gpu_us'] / total:.1%}" if total > 0 else "-",
            ]
            for r in rs[:top]
        ]
        if len(rs) > top:
            rest = sum(r["gpu_us"] for r in rs[top:])
            rows.append(
                [f"{len(rs) - top} more kernels", f"{rest / 1e3:.2f}", "", f"{rest / total:.1%}"]
            )
        out[kind] = table([f"kernel ({kind})", "GPU ms", "calls", "share"], rows)
    return out


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"


def kernels_section(page: Page, traces: dict[str, Trace]) -> None:
    """The top kernels per trace that recorded them (a Kineto import); nothing otherwise."""
    found = {e: kernel_records(t) for e, t in traces.items()}
    found = {e: r for e, r in found.items() if r}
    if not found:
        return
    page.heading("Where the GPU time went, by kernel", anchor="kernels")
    page.para(
        "From the profiler's kernel records: each kernel name's total GPU time and its share "
        "of the GPU time of steps of that kind.",
        "note",
    )
    for engine, records in found.items():
        tables = kernel_tables(records)
        page.para(f"<b>{esc(engine)}</b>")
        sentence = category_sentence(traces[engine])
        if sentence:
            page.para(esc(sentence))
        page.add(
            '<div class="grid">' + "".join(f"<div>{t}</div>" for t in tables.values()) + "</div>"
        )
