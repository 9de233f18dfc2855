"""What a run's metrics.json holds, from its engines' metrics: one engine's metrics under its
name, or sync, async and their comparison; and whether the run fits the device. One place for
the app's runs and the grid sweep's points, so both write the same numbers."""

from __future__ import annotations

from typing import Any

from cbsim.metrics import compare_metrics


def device_fit(memory: dict[str, Any], bytes_available: float) -> dict[str, Any]:
    """Whether weights + KV cache + IO buffers + graph pool fit the device, from the back end's
    memory estimate (a trace's otherData.memory)."""
    return {
        "fits_device": memory.get("fits_device"),
        "device_bytes_needed": memory.get("device_bytes_needed"),
        "device_bytes_available": bytes_available,
    }


def run_metrics(per_engine: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """metrics.json of a run: ``{"engine": name, **metrics}`` for one engine; for sync and
    async both, each under its name, their comparison, and fits_device of both."""
    if len(per_engine) == 1:
        ((engine, metrics),) = per_engine.items()
        return {"engine": engine, **metrics}
    out: dict[str, Any] = dict(per_engine)
    out["comparison"] = compare_metrics(per_engine["sync"], per_engine["async"])
    fits = [m.get("fits_device") for m in per_engine.values()]
    out["fits_device"] = None if None in fits else all(fits)
    return out
