"""Metrics side by side: the sync/async comparison and the fixed-width table the CLI prints."""

from __future__ import annotations

import math
from typing import Any


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
    ("idle: host wait", "gpu_idle_host_wait_fraction", "{:.2%}"),
    ("idle: kernel wait", "gpu_idle_kernel_wait_fraction", "{:.2%}"),
    ("idle: other", "gpu_idle_other_fraction", "{:.2%}"),
    ("idle: launch waits", "gpu_launch_wait_fraction", "{:.2%}"),
    ("HBM TB/s (forward)", "hbm_tbps_mean", "{:.2f}"),
    ("of the HBM floor", "hbm_floor_fraction", "{:.1%}"),
    ("CPU blocked", "cpu_blocked_fraction", "{:.2%}"),
    ("CPU blocks/step", "cpu_blocks_per_step", "{:.2f}"),
    # vLLM's labels, as the report's serving table has them
    ("Median TTFT (ms)", "median_ttft_ms", "{:.2f}"),
    ("Median TPOT (ms)", "median_tpot_ms", "{:.3f}"),
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
