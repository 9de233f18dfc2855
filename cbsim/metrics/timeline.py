"""Timeline metrics: total time, lane busy shares, GPU idle, steps, host phases, bandwidth."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from cbsim.config.schema import ModelConfig
from cbsim.metrics.inputs import MetricInputs
from cbsim.trace import schema as S
from cbsim.trace.hardware import measured_copy_rate

PERCENTILES = (50, 90, 99)
# hbm_floor_basis: what the HBM floor's rate is
FLOOR_MEASURED, FLOOR_PROFILE = "measured copy rate", "profile"
MODEL_FIELDS = set(ModelConfig.__dataclass_fields__)


def union_us(spans: pd.DataFrame) -> float:
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


def pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def time_range(inp: MetricInputs) -> tuple[float, float]:
    """From the first event's start to the last event's end (spans and instants)."""
    spans, inst = inp.spans, inp.instants
    timed = [spans["ts"].min(), spans["end"].max()] if not spans.empty else [0.0, 0.0]
    if not inst.empty:
        timed = [min(timed[0], inst["ts"].min()), max(timed[1], inst["ts"].max())]
    return float(timed[0]), float(timed[1])


def gpu_lane(spans: pd.DataFrame) -> str:
    """The compute stream; the legacy default stream when everything ran there."""
    if spans[spans.lane == S.COMPUTE].empty and not spans[spans.lane == S.DEFAULT].empty:
        return S.DEFAULT
    return S.COMPUTE


def forward_spans(spans: pd.DataFrame) -> pd.DataFrame:
    return spans[(spans.lane == gpu_lane(spans)) & spans.name.isin(S.FORWARD_NAMES)]


def step_times_ms(forwards: pd.DataFrame, start: float) -> np.ndarray:
    """The interval between consecutive forward ends (the first from the start of the run)."""
    if forwards.empty:
        return np.array([])
    step_ends = forwards.groupby("step")["end"].max().sort_values().to_numpy()
    return np.diff(np.concatenate([[start], step_ends])) / 1e3


def timeline_metrics(inp: MetricInputs) -> dict[str, Any]:
    """Total time, busy shares, steps and step times, host time per step, hazards, memory."""
    spans = inp.spans
    out: dict[str, Any] = {"source": inp.source, "engine": inp.engine}
    start, end = time_range(inp)
    total_us = end - start
    out["total_time_s"] = total_us / 1e6

    lane = gpu_lane(spans)
    lane_busy = {}
    for name in inp.lanes:
        busy = union_us(spans[spans.lane == name])
        lane_busy[name] = busy / total_us if total_us > 0 else 0.0
    out["lane_busy"] = lane_busy
    out["gpu_busy_fraction"] = lane_busy.get(lane, 0.0)
    out["gpu_idle_fraction"] = 1.0 - out["gpu_busy_fraction"] if total_us > 0 else 0.0
    out["gpu_launch_wait_fraction"] = launch_wait_fraction(inp, lane, total_us)

    host = spans[spans.lane == S.HOST]
    waits = host[host.name == S.WAIT]
    out["cpu_blocked_fraction"] = float(waits["dur"].sum()) / total_us if total_us > 0 else 0.0
    host_phase_us = host.groupby("name")["dur"].sum()

    forwards = forward_spans(spans)
    steps = int(forwards["step"].nunique()) if not forwards.empty else 0
    out["steps"] = steps
    out["cpu_blocks_per_step"] = len(waits) / steps if steps else None
    out["generated_tokens"] = int(forwards["new_tokens"].sum())
    out["tokens_per_s"] = out["generated_tokens"] / (total_us / 1e6) if total_us > 0 else None

    step_ms = step_times_ms(forwards, start)
    out["step_time_ms_mean"] = float(step_ms.mean()) if steps else None
    for q in PERCENTILES:
        out[f"step_time_ms_p{q}"] = pct(step_ms, q)
    out["gpu_forward_ms_mean"] = float(forwards["dur"].mean() / 1e3) if steps else None
    out["host_ms_per_step"] = (
        {str(name): float(us) / 1e3 / steps for name, us in host_phase_us.items()} if steps else {}
    )
    inst = inp.instants
    hazards = inst[inst.name == S.HAZARD]
    out["hazards"] = int(len(hazards))
    out["hazards_by_kind"] = (
        {str(k): int(v) for k, v in hazards["kind"].value_counts().items()} if len(hazards) else {}
    )
    for key in ("io_buffer_bytes", "graph_pool_bytes", "graph_pool_bytes_unshared"):
        out[key] = inp.memory.get(key)
    out.update(bandwidth_metrics(forwards, inp.config, inp.hardware))
    counts = inp.counters
    if spans.empty and isinstance(counts, dict) and counts.get("steps"):
        out.update(untraced_metrics(counts))
    return out


def launch_wait_fraction(inp: MetricInputs, lane: str, total_us: float) -> float | None:
    """The share of the run the GPU waited inside eager forwards for their kernels' launches,
    part of the simulator's GPU idle. A recording cannot tell it apart: the runtime's CUDA events
    count it busy (compare its idle with the simulator's idle less this), a profiler import
    counts it idle (None for both: not measured)."""
    if inp.source != "sim" or total_us <= 0:
        return None
    spans = inp.spans
    return float(spans.loc[spans.lane == lane, "launch_bound_us"].sum()) / total_us


def untraced_metrics(counts: dict[str, Any]) -> dict[str, Any]:
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


def bandwidth_metrics(
    forwards: pd.DataFrame, config: dict[str, Any] | None, hardware: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Achieved HBM bandwidth per forward: (weights + live KV bytes) / forward time, and the
    share of the floor (those bytes at a copy rate) it reaches. The rate is the one the run's
    machine measured (otherData.hardware) when there is one: a profile's hbm_bandwidth may be
    fitted, or another GPU's."""
    out: dict[str, Any] = {
        "hbm_tbps_mean": None,
        "hbm_floor_fraction": None,
        "hbm_floor_basis": None,
        "hbm_floor_tbps": None,
    }
    if config is None or forwards.empty or "model" not in config:
        return out
    measured = measured_copy_rate(hardware)
    try:
        weights = weight_bytes_read_per_step(config["model"])
        kv_per_token = ModelConfig(
            **{k: v for k, v in config["model"].items() if k in MODEL_FIELDS}
        ).kv_bytes_per_token
        if measured is not None:
            peak, basis = measured[0], FLOOR_MEASURED
        else:
            peak, basis = float(config["hardware"]["hbm_bandwidth"]), FLOOR_PROFILE
    except (TypeError, ValueError, KeyError):
        return out
    dur_s = forwards["dur"].to_numpy() / 1e6
    moved = weights + forwards["kv_tokens"].to_numpy() * kv_per_token
    ok = dur_s > 0
    if not ok.any() or not peak > 0:
        return out
    out["hbm_tbps_mean"] = float(moved[ok].sum() / dur_s[ok].sum() / 1e12)
    out["hbm_floor_fraction"] = float((moved[ok] / peak).sum() / dur_s[ok].sum())
    out["hbm_floor_basis"] = basis
    out["hbm_floor_tbps"] = peak / 1e12
    return out
