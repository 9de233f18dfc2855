"""Metrics from a trace alone: the same code measures the simulator, the runtime and imports.

Definitions (docs/metrics.md says the same in prose):
- total time: from the first event's start to the last span's end.
- GPU idle fraction: the share of the total time during which the compute stream (lane
  ``compute``; ``default`` when everything ran on the legacy default stream) executes nothing.
- lane busy share: the union of a lane's spans over the total time.
- CPU blocked fraction: host time in ``wait`` spans (blocked on the GPU) over the total time.
- step: one forward pass; step time: the interval between consecutive forward ends (the first
  step from the start of the run), so it includes any CPU time the GPU was left waiting for.
- TTFT: first_token - arrival; TPOT: (finish - first_token) / (tokens - 1), per request.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from cbsim.config.schema import ModelConfig
from cbsim.trace import schema as S
from cbsim.trace.model import Trace

PERCENTILES = (50, 90, 99)
MODEL_FIELDS = set(ModelConfig.__dataclass_fields__)


def _union_us(spans: pd.DataFrame) -> float:
    """Total covered time of possibly overlapping intervals."""
    if spans.empty:
        return 0.0
    order = spans.sort_values("ts")
    starts, ends = order["ts"].to_numpy(), order["end"].to_numpy()
    running_end = np.maximum.accumulate(ends)
    # a new block starts where a span begins after everything before it ended
    new_block = np.empty(len(starts), dtype=bool)
    new_block[0] = True
    new_block[1:] = starts[1:] > running_end[:-1]
    block_id = np.cumsum(new_block) - 1
    block_start = starts[new_block]
    block_end = np.zeros(block_id[-1] + 1)
    np.maximum.at(block_end, block_id, ends)
    return float((block_end - block_start).sum())


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def compute_metrics(trace: Trace) -> dict[str, Any]:
    """Every metric cbsim reports, as a flat JSON-ready dict (None where not measurable)."""
    spans = trace.spans
    out: dict[str, Any] = {"source": trace.source, "engine": trace.engine}
    timed = [spans["ts"].min(), spans["end"].max()] if not spans.empty else [0.0, 0.0]
    inst = trace.instants
    if not inst.empty:
        timed = [min(timed[0], inst["ts"].min()), max(timed[1], inst["ts"].max())]
    start, end = float(timed[0]), float(timed[1])
    total_us = end - start
    out["total_time_s"] = total_us / 1e6

    gpu_lane = S.COMPUTE
    if spans[spans.lane == S.COMPUTE].empty and not spans[spans.lane == S.DEFAULT].empty:
        gpu_lane = S.DEFAULT
    lane_busy = {}
    for lane in trace.lanes:
        if lane == S.REQUESTS:
            continue
        busy = _union_us(spans[spans.lane == lane])
        lane_busy[lane] = busy / total_us if total_us > 0 else 0.0
    out["lane_busy"] = lane_busy
    out["gpu_busy_fraction"] = lane_busy.get(gpu_lane, 0.0)
    out["gpu_idle_fraction"] = 1.0 - out["gpu_busy_fraction"] if total_us > 0 else 0.0

    host = spans[spans.lane == S.HOST]
    waits = host[host.name == S.WAIT]
    out["cpu_blocked_fraction"] = float(waits["dur"].sum()) / total_us if total_us > 0 else 0.0
    host_phase_us = host.groupby("name")["dur"].sum()

    forwards = spans[(spans.lane == gpu_lane) & spans.name.isin(S.FORWARD_NAMES)]
    steps = int(forwards["step"].nunique()) if not forwards.empty else 0
    out["steps"] = steps
    out["cpu_blocks_per_step"] = len(waits) / steps if steps else None
    out["generated_tokens"] = int(forwards["new_tokens"].sum())
    out["tokens_per_s"] = out["generated_tokens"] / (total_us / 1e6) if total_us > 0 else None

    step_ends = forwards.groupby("step")["end"].max().sort_values().to_numpy()
    step_ms = np.diff(np.concatenate([[start], step_ends])) / 1e3 if steps else np.array([])
    out["step_time_ms_mean"] = float(step_ms.mean()) if steps else None
    for q in PERCENTILES:
        out[f"step_time_ms_p{q}"] = _pct(step_ms, q)
    out["gpu_forward_ms_mean"] = float(forwards["dur"].mean() / 1e3) if steps else None
    out["host_ms_per_step"] = (
        {str(name): float(us) / 1e3 / steps for name, us in host_phase_us.items()} if steps else {}
    )

    out.update(_request_metrics(inst))
    hazards = inst[inst.name == S.HAZARD] if not inst.empty else inst
    out["hazards"] = int(len(hazards))
    out["hazards_by_kind"] = (
        {str(k): int(v) for k, v in hazards["kind"].value_counts().items()} if len(hazards) else {}
    )
    memory = trace.other_data.get("memory", {})
    for key in ("io_buffer_bytes", "graph_pool_bytes", "graph_pool_bytes_unshared"):
        out[key] = memory.get(key)
    out.update(_bandwidth_metrics(forwards, trace.other_data.get("config")))
    counts = trace.other_data.get("counters")
    if spans.empty and isinstance(counts, dict) and counts.get("steps"):
        out.update(_untraced_metrics(counts))
    return out


def _untraced_metrics(counts: dict[str, Any]) -> dict[str, Any]:
    """A runtime run with tracing off records no spans, only its counters (otherData.counters):
    the counts and the wall time come from them; the shares nothing measured are NaN, not 0."""
    wall = float(counts.get("wall_s") or 0.0)
    steps = int(counts["steps"])
    tokens = int(counts.get("generated_tokens") or 0)
    return {
        "total_time_s": wall,
        "steps": steps,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "step_time_ms_mean": 1e3 * wall / steps,
        "gpu_busy_fraction": math.nan,
        "gpu_idle_fraction": math.nan,
        "cpu_blocked_fraction": math.nan,
    }


def weight_bytes_read_per_step(model: dict[str, Any]) -> float:
    """Weights every forward streams from HBM: all of them but the embedding table, of which
    only the looked-up rows are read (15.01 of 16.06 GB for the Llama-3-8B shape)."""
    shape = ModelConfig(**{k: v for k, v in model.items() if k in MODEL_FIELDS})
    embedding = shape.vocab_size * shape.hidden_size * shape.dtype_bytes
    return shape.weight_bytes - (0 if shape.tie_word_embeddings else embedding)


def _bandwidth_metrics(forwards: pd.DataFrame, config: dict[str, Any] | None) -> dict[str, Any]:
    """Achieved HBM bandwidth per forward: (weights + live KV bytes) / forward time, and the
    share of the roofline floor (those bytes at the hardware's copy bandwidth) it reaches."""
    out: dict[str, Any] = {"hbm_tbps_mean": None, "hbm_floor_fraction": None}
    if config is None or forwards.empty or "model" not in config or "hardware" not in config:
        return out
    try:
        weights = weight_bytes_read_per_step(config["model"])
        kv_per_token = ModelConfig(
            **{k: v for k, v in config["model"].items() if k in MODEL_FIELDS}
        ).kv_bytes_per_token
        peak = float(config["hardware"]["hbm_bandwidth"])
    except (TypeError, ValueError, KeyError):
        return out
    dur_s = forwards["dur"].to_numpy() / 1e6
    moved = weights + forwards["kv_tokens"].to_numpy() * kv_per_token
    ok = dur_s > 0
    if not ok.any():
        return out
    out["hbm_tbps_mean"] = float(moved[ok].sum() / dur_s[ok].sum() / 1e12)
    out["hbm_floor_fraction"] = float((moved[ok] / peak).sum() / dur_s[ok].sum())
    return out


def _request_metrics(inst: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {"requests_finished": 0}
    for q in (50, 99):
        out[f"ttft_ms_p{q}"] = None
        out[f"tpot_ms_p{q}"] = None
    if inst.empty or "rid" not in inst:
        return out
    req = inst[inst.lane == S.REQUESTS]
    by_name = {name: g.groupby("rid")["ts"].min() for name, g in req.groupby("name")}
    arrival, first, finish = (by_name.get(n) for n in (S.ARRIVAL, S.FIRST_TOKEN, S.FINISH))
    if finish is not None:
        out["requests_finished"] = int(len(finish))
    if arrival is not None and first is not None:
        ttft = (first - arrival).dropna().to_numpy() / 1e3
        for q in (50, 99):
            out[f"ttft_ms_p{q}"] = _pct(ttft, q)
    if first is not None and finish is not None:
        fin = req[req.name == S.FINISH].set_index("rid")
        tokens = fin["tokens"] if "tokens" in fin else None
        if tokens is not None:
            span = (finish - first).dropna()
            n = tokens.reindex(span.index).astype(float) - 1
            tpot = (span[n > 0] / n[n > 0]).to_numpy() / 1e3
            for q in (50, 99):
                out[f"tpot_ms_p{q}"] = _pct(tpot, q)
    return out


def compare_metrics(sync: dict[str, Any], async_: dict[str, Any]) -> dict[str, Any]:
    """Side-by-side figures: the speedup and how much of the sync idle time async recovered."""
    speedup = sync["total_time_s"] / async_["total_time_s"] if async_["total_time_s"] else None
    idle_s = sync["gpu_idle_fraction"] * sync["total_time_s"]
    saved_s = sync["total_time_s"] - async_["total_time_s"]
    return {
        "speedup": speedup,
        "time_saved_fraction": saved_s / sync["total_time_s"] if sync["total_time_s"] else None,
        "idle_recovered_fraction": saved_s / idle_s if idle_s > 0 else None,
        "gpu_idle_sync": sync["gpu_idle_fraction"],
        "gpu_idle_async": async_["gpu_idle_fraction"],
    }


SUMMARY_ROWS = (
    ("total time (s)", "total_time_s", "{:.3f}"),
    ("steps", "steps", "{:d}"),
    ("generated tokens", "generated_tokens", "{:d}"),
    ("tokens/s", "tokens_per_s", "{:.1f}"),
    ("step time p50 (ms)", "step_time_ms_p50", "{:.3f}"),
    ("step time p99 (ms)", "step_time_ms_p99", "{:.3f}"),
    ("GPU idle", "gpu_idle_fraction", "{:.2%}"),
    ("HBM TB/s (forward)", "hbm_tbps_mean", "{:.2f}"),
    ("of the HBM floor", "hbm_floor_fraction", "{:.1%}"),
    ("CPU blocked", "cpu_blocked_fraction", "{:.2%}"),
    ("CPU blocks/step", "cpu_blocks_per_step", "{:.2f}"),
    ("TTFT p50 (ms)", "ttft_ms_p50", "{:.2f}"),
    ("TPOT p50 (ms)", "tpot_ms_p50", "{:.3f}"),
    ("hazards", "hazards", "{:d}"),
)


def format_table(runs: dict[str, dict[str, Any]]) -> str:
    """A short fixed-width table, one column per engine."""
    names = list(runs)
    lines = [f"{'metric':<22}" + "".join(f"{n:>16}" for n in names)]
    for label, key, fmt in SUMMARY_ROWS:
        cells = []
        for n in names:
            v = runs[n].get(key)
            ok = v is not None and not (isinstance(v, float) and math.isnan(v))
            cells.append(f"{fmt.format(v) if ok else '-':>16}")
        lines.append(f"{label:<22}" + "".join(cells))
    return "\n".join(lines)
