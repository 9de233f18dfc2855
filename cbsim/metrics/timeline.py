"""Timeline metrics: total time, lane busy shares, GPU idle, steps, host phases, bandwidth."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from cbsim.config.schema import ModelConfig
from cbsim.metrics.inputs import MetricInputs
from cbsim.trace import schema as S
from cbsim.trace.fold import Forwards
from cbsim.trace.hardware import measured_copy_rate

PERCENTILES = (50, 90, 99)
# hbm_floor_basis: what the HBM floor's rate is
FLOOR_MEASURED, FLOOR_PROFILE = "measured copy rate", "profile"
MODEL_FIELDS = set(ModelConfig.__dataclass_fields__)


def pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def time_range(inp: MetricInputs) -> tuple[float, float]:
    """From the first event's start to the last event's end (spans and instants)."""
    return inp.fold.time_range()


def step_times_ms(per_step: pd.DataFrame, start: float) -> np.ndarray:
    """The interval between consecutive forward ends (the first from the start of the run);
    ``per_step``: cbsim.trace.fold.Forwards.per_step."""
    if per_step.empty:
        return np.array([])
    step_ends = per_step["end"].sort_values().to_numpy()
    return np.diff(np.concatenate([[start], step_ends])) / 1e3


def timeline_metrics(inp: MetricInputs) -> dict[str, Any]:
    """Total time, busy shares, steps and step times, host time per step, hazards, memory."""
    fold = inp.fold
    out: dict[str, Any] = {"source": inp.source, "engine": inp.engine}
    start, end = fold.time_range()
    total_us = end - start
    out["total_time_s"] = total_us / 1e6

    lane = fold.gpu_lane()
    lane_busy = {name: fold.busy_us(name) / total_us if total_us > 0 else 0.0 for name in inp.lanes}
    out["lane_busy"] = lane_busy
    out["gpu_busy_fraction"] = lane_busy.get(lane, 0.0)
    out["gpu_idle_fraction"] = 1.0 - out["gpu_busy_fraction"] if total_us > 0 else 0.0
    out["gpu_launch_wait_fraction"] = launch_wait_fraction(inp, lane, total_us)

    wait_us = fold.host_us.get(S.WAIT, 0.0)
    out["cpu_blocked_fraction"] = wait_us / total_us if total_us > 0 else 0.0

    forwards = fold.forwards[lane]
    per_step = forwards.per_step()
    steps = len(per_step)
    out["steps"] = steps
    out["cpu_blocks_per_step"] = fold.host_spans.get(S.WAIT, 0) / steps if steps else None
    out["generated_tokens"] = forwards.tokens
    out["tokens_per_s"] = out["generated_tokens"] / (total_us / 1e6) if total_us > 0 else None

    step_ms = step_times_ms(per_step, start)
    out["step_time_ms_mean"] = float(step_ms.mean()) if steps else None
    for q in PERCENTILES:
        out[f"step_time_ms_p{q}"] = pct(step_ms, q)
    out["gpu_forward_ms_mean"] = forwards.dur_us / forwards.count / 1e3 if steps else None
    out["host_ms_per_step"] = (
        {name: us / 1e3 / steps for name, us in sorted(fold.host_us.items())} if steps else {}
    )
    out["hazards"] = sum(fold.hazards.values())
    out["hazards_by_kind"] = dict(fold.hazards.most_common())
    for key in ("io_buffer_bytes", "graph_pool_bytes", "graph_pool_bytes_unshared"):
        out[key] = inp.memory.get(key)
    out.update(bandwidth_metrics(forwards, inp.config, inp.hardware))
    counts = inp.counters
    if not fold.spans and isinstance(counts, dict) and counts.get("steps"):
        out.update(untraced_metrics(counts))
    return out


def launch_wait_fraction(inp: MetricInputs, lane: str, total_us: float) -> float | None:
    """The share of the run the GPU waited inside eager forwards for their kernels' launches,
    part of the simulator's GPU idle. A recording cannot tell it apart: the runtime's CUDA events
    count it busy (compare its idle with the simulator's idle less this), a profiler import
    counts it idle (None for both: not measured)."""
    if inp.source != "sim" or total_us <= 0:
        return None
    on_lane = inp.fold.lanes.get(lane)
    return (on_lane.launch_bound_us if on_lane else 0.0) / total_us


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
    forwards: Forwards, config: dict[str, Any] | None, hardware: dict[str, Any] | None = None
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
    if config is None or not forwards.count or "model" not in config:
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
    # over the forwards that took time: their bytes moved and their seconds
    seconds = forwards.timed_us / 1e6
    moved = forwards.timed * weights + forwards.timed_kv_tokens * kv_per_token
    if not forwards.timed or not peak > 0:
        return out
    out["hbm_tbps_mean"] = float(moved / seconds / 1e12)
    out["hbm_floor_fraction"] = float(moved / peak / seconds)
    out["hbm_floor_basis"] = basis
    out["hbm_floor_tbps"] = peak / 1e12
    return out
