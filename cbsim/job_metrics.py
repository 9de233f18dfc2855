"""What a run's metrics.json holds, from its engines' metrics: one engine's metrics under its
name, or sync, async and their comparison; and whether the run fits the device. One place for
the app's runs and the grid sweep's points, so both write the same numbers."""

from __future__ import annotations

from typing import Any

from cbsim.config import CbsimConfig
from cbsim.config.hardware import HardwareConfig
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


def has_spread(hw: HardwareConfig) -> bool:
    """Whether the profile carries any spread a band draws: host speed between calls or within a
    run, two host speed levels, or the forward model's error."""
    spread = hw.host.spread
    return bool(
        spread.between_calls
        or spread.within_run
        or hw.host.regimes.switching
        or hw.gpu.spread.forward_error
    )


def wants_bands(config: CbsimConfig, in_sweep: bool) -> bool:
    """Whether a run's metrics carry bands (mode.bands): never for a measurement; auto draws them
    for a single simulated run whose profile has a spread, not in a sweep's jobs (each band costs
    2 x hardware.host.spread.draws simulations)."""
    if config.mode.name != "sim" or config.mode.bands == "false":
        return False
    if config.mode.bands == "true":
        return True
    return not in_sweep and has_spread(config.hardware)
