"""The verdict over a validation's held-out runs: errors per engine, targets met per holdout and
per stack, the async speedup per workload, and how often the predicted band held the recording."""

from __future__ import annotations

from typing import Any

import numpy as np

from cbsim.validation.measure import PCT_ERRORS
from cbsim.validation.runs import TARGETS, RunResult
from cbsim.validation.speedup import SPEEDUP_POINTS, Speedup
from cbsim.widening import covering_error, needed_error, run_needed

# the band targets: the recorded value inside P5-P95 for this share of held-out runs,
# with a median half-width of the GPU-idle band under this many percentage points
BAND_COVERAGE, BAND_HALF_WIDTH_PP = 0.9, 2.0


def _count(runs: list[RunResult]) -> dict[str, int]:
    return {"runs": len(runs), "within_target": sum(all(r.passed.values()) for r in runs)}


def _by(held: list[RunResult], key) -> dict[str, dict[str, int]]:
    return {k: _count([r for r in held if key(r) == k]) for k in sorted({key(r) for r in held})}


def engine_errors(runs: list[RunResult]) -> dict[str, Any]:
    """Worst and mean absolute error of each metric over ``runs``."""
    agg: dict[str, Any] = {"runs": len(runs)}
    for key in (*PCT_ERRORS, "gpu_idle_pp"):
        vals = [abs(r.errors[key]) for r in runs if r.errors[key] is not None]
        agg[f"{key}_max_abs"] = max(vals) if vals else None
        agg[f"{key}_mean_abs"] = sum(vals) / len(vals) if vals else None
    return agg


def covering(banded: list[RunResult], pairs: list[Speedup]) -> dict[str, float] | None:
    """The model error that would hold BAND_COVERAGE of ``banded`` inside their bands in both
    metrics, and of ``pairs`` inside their speedup bands."""
    runs = [run_needed(r.real, r.sim, r.draw_band) for r in banded if r.draw_band]
    out = covering_error(runs, BAND_COVERAGE)
    speedups = [
        {"speedup": needed_error("speedup", p.recorded, p.predicted, *p.draw_band)}
        for p in pairs
        if p.draw_band and p.recorded is not None and p.predicted is not None
    ]
    sp = covering_error(speedups, BAND_COVERAGE)
    if out is None or sp is None:
        return out or sp
    return {**out, **sp}


def band_summary(held: list[RunResult], pairs: list[Speedup] = ()) -> dict[str, Any] | None:
    """Share of held-out runs whose recorded total time and GPU idle both lie in their band, and
    the median half-width of the idle band (pp); None when no bands were drawn."""
    banded = [r for r in held if r.in_band]
    if not banded:
        return None
    inside = [all(r.in_band.values()) for r in banded]
    half = [
        50.0 * (r.band["gpu_idle_fraction"][1] - r.band["gpu_idle_fraction"][0])
        for r in banded
        if "gpu_idle_fraction" in r.band
    ]
    coverage = float(np.mean(inside))
    width = float(np.median(half)) if half else None
    return {
        "runs": len(banded),
        "coverage": coverage,
        # hardware.model_error with which BAND_COVERAGE of these runs would lie inside their
        # bands (measured on the draws' bands alone: split conformal, cbsim.widening)
        "model_error_for_coverage": covering(banded, pairs),
        "idle_half_width_pp_median": width,
        "targets": {"coverage": BAND_COVERAGE, "idle_half_width_pp": BAND_HALF_WIDTH_PP},
        "within_target": coverage >= BAND_COVERAGE
        and width is not None
        and width < BAND_HALF_WIDTH_PP,
    }


def speedup_summary(pairs: list[Speedup]) -> dict[str, Any]:
    held = [p for p in pairs if p.held_out]
    errs = [abs(p.error_points) for p in held if p.error_points is not None]
    return {
        "workloads": len(held),
        "within_target": sum(p.passed for p in held),
        "target_points": SPEEDUP_POINTS,
        "error_points_max_abs": max(errs) if errs else None,
        "error_points_mean_abs": float(np.mean(errs)) if errs else None,
    }


def summary(results: list[RunResult], pairs: list[Speedup]) -> dict[str, Any]:
    """Everything validation.json's summary holds (see docs/validation.md)."""
    held = [r for r in results if r.held_out]
    out: dict[str, Any] = {"targets": TARGETS}
    for engine in sorted({r.rec.engine for r in held}):
        out[engine] = engine_errors([r for r in held if r.rec.engine == engine])
    out["held_out_runs"] = len(held)
    out["held_out_by"] = _by(held, lambda r: r.held_out_by)
    out["held_out_within_target"] = sum(all(r.passed.values()) for r in held)
    out["all_within_target"] = bool(held) and all(all(r.passed.values()) for r in held)
    out["stacks"] = _by(held, lambda r: r.rec.stack)
    out["speedup"] = speedup_summary(pairs)
    out["bands"] = band_summary(held, [p for p in pairs if p.held_out])
    return out
