"""A calibrated profile's model error (``hardware.model_error``), measured on the calibration set
itself: each device call predicted from a profile fitted on the other calls of the same runtime
build (holdout=call within the stack: a call of another build would measure the build's change,
not the model's error), banded by that profile's spread, and the error that would hold 90% of
those runs (and of their speedups) inside their bands (split conformal, cbsim.widening)."""

from __future__ import annotations

import dataclasses

from cbsim.calibration.calibrate import FitOptions
from cbsim.calibration.recordings import Recorded
from cbsim.config.model_error import ModelError
from cbsim.config.schema import HardwareConfig
from cbsim.validation.banding import attach_bands
from cbsim.validation.holdout import leave_out
from cbsim.validation.speedup import speedups
from cbsim.validation.summary import BAND_COVERAGE, covering

MODEL_ERRORS = ("call", "none")


def held_out_model_error(
    recs: list[Recorded],
    base: HardwareConfig,
    name: str,
    options: FitOptions,
    jobs: int = 0,
    show: bool = False,
) -> tuple[ModelError, str] | None:
    """The model error of profiles fitted as ``options`` fit, from the runs of each device
    call predicted without that call, and what it was measured on; None with one call."""
    calls = sorted({r.call for r in recs})
    if len(calls) < 2:
        return None
    fold = dataclasses.replace(options, progress=False)
    results, _ = leave_out(recs, base, name, "call", True, fold, jobs, show)
    held = [r for r in results if r.held_out_by == "call"]
    pairs = speedups(held)
    attach_bands(held, pairs, show)
    need = covering([r for r in held if r.draw_band], [p for p in pairs if p.draw_band])
    if not need:
        return None
    how = (
        f"measured: {len(held)} runs of {len({r.rec.call for r in held})} device calls "
        f"({', '.join(sorted({r.rec.call for r in held}))}), each call's predicted by a profile fitted "
        "on the other calls of its build; the error that holds "
        f"{BAND_COVERAGE:.0%} of them inside their P5-P95 bands (split conformal)"
    )
    return ModelError(**{k: round(v, 4) for k, v in need.items()}), how
