"""The run report's tables and sentences: the verdict, metrics with names and units, the
comparison of two runs, the run's config, or, for a trace without one, what it recorded."""

from __future__ import annotations

import math
from typing import Any

from cbsim.config import CbsimConfig
from cbsim.metrics import SUMMARY_ROWS, compare_metrics
from cbsim.report.html import table
from cbsim.report.machine import device_summary, floor_basis, host_summary, profile_source
from cbsim.trace.model import Trace

HOST_ROWS = 8  # host phases in the metrics table, the largest per step first


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _int(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def fit_sentence(metrics: dict[str, dict[str, Any]]) -> str | None:
    """A warning when the configuration does not fit the device (metrics fits_device)."""
    bad = {e: m for e, m in metrics.items() if m.get("fits_device") is False}
    if not bad:
        return None
    e, m = next(iter(bad.items()))
    need, have = m.get("device_bytes_needed"), m.get("device_bytes_available")
    size = (
        f": it needs {need / 1e9:.1f} GB of the device's {have / 1e9:.1f} GB"
        if need and have
        else ""
    )
    return (
        f"This configuration does not fit the device{size} (weights, KV cache, IO buffers and "
        f"graph pool; {', '.join(bad)}). The simulator ran it anyway; a GPU would refuse it."
    )


def latency_change(s: dict[str, Any], a: dict[str, Any]) -> str:
    """For an online run (requests arrive over time) the latencies first: what a user of the
    service feels; empty otherwise."""
    if not (s.get("offered_request_rate") and a.get("offered_request_rate")):
        return ""
    parts = [
        f"median {key.upper()} {_fmt(s.get(f'median_{key}_ms'), '{:,.1f}')} → "
        f"{_fmt(a.get(f'median_{key}_ms'), '{:,.1f}')} ms"
        for key in ("ttft", "tpot")
        if s.get(f"median_{key}_ms") is not None and a.get(f"median_{key}_ms") is not None
    ]
    return ", ".join(parts) + "; total time " if parts else ""


def verdict(metrics: dict[str, dict[str, Any]]) -> str:
    """One sentence a reader can stop at."""
    if "sync" in metrics and "async" in metrics:
        s, a = metrics["sync"], metrics["async"]
        c = compare_metrics(s, a)
        rec = c["idle_recovered_fraction"]
        recovered = f"; it recovered {rec:.0%} of the time the GPU sat idle in sync" if rec else ""
        pays = "pays" if (c["speedup"] or 0) >= 1.05 else "does not pay here"
        return (
            f"Async batching {pays}: {latency_change(s, a)}x{_fmt(c['speedup'], '{:.3f}')} "
            f"({s['total_time_s']:.3f} s → {a['total_time_s']:.3f} s); GPU idle "
            f"{s['gpu_idle_fraction']:.1%} → {a['gpu_idle_fraction']:.1%}{recovered}."
        )
    lines = []
    for engine, m in metrics.items():
        lines.append(
            f"{engine}: {m['total_time_s']:.3f} s, GPU idle {m['gpu_idle_fraction']:.1%} (time "
            f"the GPU waited for the CPU), CPU blocked {m['cpu_blocked_fraction']:.1%}."
        )
    if "sync" in metrics:
        lines.append(
            "Async batching can hide at most the GPU idle share; run engine=compare to see it."
        )
    return " ".join(lines)


# what an import of another engine's profile cannot count: no tokens, not zero tokens
UNCOUNTED_IN_IMPORTS = ("generated_tokens", "tokens_per_s")


def _shown(m: dict[str, Any], key: str) -> Any:
    if key in UNCOUNTED_IN_IMPORTS and m.get("source") == "kineto" and not m.get(key):
        return None
    return m.get(key)


def metrics_table(metrics: dict[str, dict[str, Any]]) -> str:
    names = list(metrics)
    rows = [
        [label, *(_fmt(_shown(metrics[n], key), fmt) for n in names)]
        for label, key, fmt in SUMMARY_ROWS
    ]
    if any(floor_basis(metrics[n]) for n in names):
        at = rows.index(next(r for r in rows if r[0] == "of the HBM floor")) + 1
        rows.insert(at, ["  floor at", *(floor_basis(metrics[n]) or "-" for n in names)])
    rows.append(
        [
            "GPU forward mean (ms)",
            *(_fmt(metrics[n].get("gpu_forward_ms_mean"), "{:.3f}") for n in names),
        ]
    )
    per = {n: metrics[n].get("host_ms_per_step") or {} for n in names}
    phases = sorted({p for n in names for p in per[n]})
    # an import's host lane holds every runtime call by name: its HOST_ROWS largest are shown
    phases.sort(key=lambda p: -max(per[n].get(p) or 0.0 for n in names))
    kept = sorted(phases[:HOST_ROWS])
    for p in kept:
        rows.append(
            [
                f"host {p} (ms/step)",
                *(_fmt((metrics[n].get("host_ms_per_step") or {}).get(p), "{:.3f}") for n in names),
            ]
        )
    if len(phases) > len(kept):
        rest = phases[HOST_ROWS:]
        rows.append(
            [
                f"host: {len(rest)} more phases (ms/step)",
                *(_fmt(sum(per[n].get(p) or 0.0 for p in rest), "{:.3f}") for n in names),
            ]
        )
    classes = [[""] * (len(names) + 1) for _ in rows]
    for i, row in enumerate(rows):
        if row[0] == "hazards":
            classes[i] = [""] + ["bad" if c not in ("0", "-") else "" for c in row[1:]]
    return table(["metric", *names], rows, classes)


def comparison_table(metrics: dict[str, dict[str, Any]]) -> str:
    """Two runs side by side: sync vs async when those are the two, else the first against
    the second (speedup = first's time / second's)."""
    names = ["sync", "async"] if set(metrics) == {"sync", "async"} else list(metrics)
    a, b = (metrics[n] for n in names)
    c = compare_metrics(a, b)
    rows = [
        [f"speedup ({names[0]} time / {names[1]} time)", _fmt(c["speedup"], "x{:.3f}")],
        ["time saved", _fmt(c["time_saved_fraction"], "{:.1%}")],
        [
            f"GPU idle {names[0]} → {names[1]}",
            f"{_fmt(c['gpu_idle_sync'], '{:.2%}')} → {_fmt(c['gpu_idle_async'], '{:.2%}')}",
        ],
        [
            f"share of the {names[0]} idle time recovered",
            _fmt(c["idle_recovered_fraction"], "{:.1%}"),
        ],
    ]
    good = (c["speedup"] or 0) >= 1.05
    classes = [["", "good" if good else "bad"]] + [["", ""]] * 3
    return table([f"{names[1]} vs {names[0]}", ""], rows, classes)


def bands_table(bands: dict[str, Any]) -> str:
    """P5 / median / P95 over the host-speed spread (cbsim.bands.predict_bands)."""
    q = bands.get("quantiles") or ["p5", "median", "p95"]
    rows = []
    for engine in ("sync", "async"):
        for key, label, fmt in (
            ("total_time_s", "total time (s)", "{:.3f}"),
            ("gpu_idle_fraction", "GPU idle", "{:.2%}"),
        ):
            band = (bands.get(engine) or {}).get(key)
            if band:
                rows.append([f"{engine} {label}", *(_fmt(band.get(k), fmt) for k in q)])
    if bands.get("speedup"):
        rows.append(["async speedup", *(_fmt(bands["speedup"].get(k), "x{:.3f}") for k in q)])
    title = f"bands over {bands.get('draws', '?')} host-speed draws"
    if bands.get("model_error"):
        title += " and the model's error on held-out runs"
    return table([title, *q], rows)


def config_table(config: CbsimConfig, other: dict[str, Any] | None = None) -> str:
    """The key values of the run config, and the machine a recording (``other``: its
    otherData) ran on."""
    e, w, m, h = config.engine, config.workload, config.model, config.hardware
    dist = {"fixed": ""}
    rows = [
        ["mode / task", f"{config.mode.name} / {config.task}"],
        ["engine", e.name],
        ["IO slots · CUDA graphs", f"{e.io_slots} · {'on' if e.cuda_graphs else 'off'}"],
        [
            "streams · carry-over · event waits",
            f"{e.streams} · {'on' if e.carry_over else 'off'} · {'on' if e.event_waits else 'off'}",
        ],
        [
            "model",
            f"{m.name} ({m.num_params / 1e9:.2f} B params, {m.num_layers} layers, {m.dtype})",
        ],
        ["hardware profile", f"{h.name} ({profile_source(h.source)})"],
        *([["recorded on", device]] if (device := device_summary(other or {})) else []),
        *([["host", host]] if (host := host_summary(other or {})) else []),
        ["batch size · requests", f"{w.batch_size} · {w.total_requests}"],
        [
            "prompt · generated tokens",
            f"{w.prompt_len}{dist.get(w.prompt_dist, ' ' + w.prompt_dist)} · "
            f"{w.gen_len}{dist.get(w.gen_dist, ' ' + w.gen_dist)}",
        ],
        ["arrival · max batch tokens", f"{w.arrival} · {w.max_batch_tokens}"],
        ["seed", str(w.seed)],
    ]
    return table(["config", ""], rows, kind="kv")


def recorded_table(traces: dict[str, Trace]) -> str:
    """What a trace without its run config says about its run (its otherData), per trace."""
    names = list(traces)

    def get(t: Trace, *path: str) -> Any:
        v: Any = t.other_data
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        return v

    rows = []
    for label, path in RECORDED_ROWS:
        if label in MACHINE_ROWS:
            cells = [MACHINE_ROWS[label](traces[n].other_data) for n in names]
        else:
            cells = [get(traces[n], *path) for n in names]
        if all(c in (None, "", [], {}) for c in cells):
            continue
        rows.append(
            [label, *(" ".join(map(str, c)) if isinstance(c, list) else _txt(c) for c in cells)]
        )
    return table(["recorded", *names], rows, kind="kv")


RECORDED_ROWS = (
    ("source", ("source",)),
    ("engine", ("engine",)),
    ("model", ("config", "model", "name")),
    ("hardware profile", ("config", "hardware", "name")),
    ("batch size", ("config", "workload", "batch_size")),
    ("prompt tokens (mean)", ("config", "workload", "prompt_len")),
    ("generated tokens (mean)", ("config", "workload", "gen_len")),
    ("device", ("hardware", "name")),
    ("host", ()),
    ("torch · CUDA", ("hardware", "torch")),
    ("transformers", ("hardware", "transformers")),
    ("attention", ("attention",)),
    ("CUDA graphs", ("cuda_graphs",)),
    ("IO slots", ("io_slots",)),
    ("overrides", ("config_overrides",)),
)


# rows of the recorded table written from otherData as a whole (cbsim/report/machine.py)
MACHINE_ROWS = {"device": device_summary, "host": host_summary}


def _txt(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return "-" if v is None else str(v)
