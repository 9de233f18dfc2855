"""From measurements to a hardware profile: the device's measured rates and kernel tables set in,
then the host, copy and forward terms fitted on the probes' per-phase spans by the calibration
(cbsim.calibration.calibrate, as +experiment=calibrate fits recordings), starting from the base
profile. A term the probes cannot determine keeps the base's value, and ``provenance`` says of
every value whether it was measured, fitted or taken from the base.

Physical quantities stay physical: hbm_bandwidth is the measured copy rate and peak_flops the
measured GEMM's (a fit that would raise them gives efficiencies of 1 instead), and a fitted
host-device bandwidth is never above the measured pinned copy.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbsim.calibration.calibrate import Calibration, FitOptions, calibrate
from cbsim.calibration.recordings import load
from cbsim.config.schema import HardwareConfig
from cbsim.profiling.fresh import FRESH_DIR, apply_level, fresh_level, level_summary
from cbsim.profiling.probes import PROBES_DIR
from cbsim.profiling.profile_dir import KERNELS_DIR
from cbsim.validation.tasks import runtime_traces

MEASURED = ("hbm_bandwidth", "peak_flops", "h2d_bandwidth", "d2h_bandwidth", "memory_bytes")
MEASURED_HOW = {
    "hbm_bandwidth": "device-to-device copy, read + write counted",
    "peak_flops": "bf16 square matmul on random data (float32 on a CPU)",
    "h2d_bandwidth": "pinned host-to-device copy",
    "d2h_bandwidth": "pinned device-to-host copy",
    "memory_bytes": "the device's total memory",
}
EFFICIENCIES = {
    "hbm_bandwidth": ("gemm_bandwidth_eff", "attention_bandwidth_eff"),
    "peak_flops": ("gemm_flops_eff", "attention_flops_eff"),
}
HOST_PHASES = ("schedule", "prepare", "update")


@dataclass
class Fitted:
    hardware: HardwareConfig
    calibration: Calibration | None
    notes: list[str]
    fresh: dict[str, Any] | None = None


def leaf_paths(obj: Any, prefix: str = "") -> list[str]:
    """Every value's key path of a profile (host.schedule.fixed_us, gpu.clock..., peak_flops)."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += leaf_paths(value, f"{prefix}{f.name}.")
        elif f.name not in ("name", "source", "provenance", "device_name", "tier"):
            out.append(prefix + f.name)
    return out


def _term_path(what: str, term: str, paths: list[str]) -> str:
    """A calibration row's term as a profile key path (us_per_byte_* are the bandwidths)."""
    if term.startswith("us_per_byte_"):
        return term.removeprefix("us_per_byte_") + "_bandwidth"
    phase = what.split()[0]
    if phase in HOST_PHASES:
        return f"host.{phase}.{term}"
    named = [p for p in paths if p.rsplit(".", 1)[-1] == term]
    return named[0] if len(named) == 1 else term


def fit_profile(
    out: Path,
    base: HardwareConfig,
    rates: dict[str, Any],
    name: str,
    options: FitOptions,
    probes: bool = True,
    given_tables: str | None = None,
) -> Fitted:
    """The profile of the measurements in ``out`` (kernels/, probes/) and ``rates``; without
    ``probes`` (no time left to fit them) the host and GPU costs stay the base's.
    ``given_tables``: tables of this GPU made before (extra.kernel_tables) where kernels/ has
    none."""
    hw = copy.deepcopy(base)
    hw.name, hw.tier = name, "profiled"
    hw.device_name = str(rates.get("device_name", ""))
    prov = {p: f"from base {base.name}" for p in leaf_paths(hw)}
    for key in MEASURED:
        if rates.get(key):
            setattr(hw, key, float(rates[key]))
            prov[key] = f"measured: {MEASURED_HOW[key]}"
    tables = sorted((out / KERNELS_DIR).glob("*.csv"))
    hw.kernel_table = str(out / KERNELS_DIR) if tables else given_tables or base.kernel_table
    if tables:
        prov["kernel_table"] = f"measured: {', '.join(f'{KERNELS_DIR}/{t.name}' for t in tables)}"
        kernels = "kernel tables measured"
    elif given_tables:
        prov["kernel_table"] = (
            f"given: extra.kernel_tables={given_tables} (+experiment=profile_kernels on this GPU: "
            "the tables' headers say where and when)"
        )
        kernels = f"kernel tables given ({given_tables})"
    else:
        kernels = f"kernel tables {base.name}'s (none measured)"
    notes: list[str] = []
    recs = sorted((out / PROBES_DIR).glob("*/trace_*.json.gz")) if probes else []
    cal = None
    if recs:
        cal = calibrate(runtime_traces(load(recs, out / PROBES_DIR)), hw, name, options)
        hw = cal.hardware
        hw.tier, hw.device_name = "profiled", str(rates.get("device_name", ""))
        for row in cal.rows:
            for term, fitted in row.fit.fitted.items():
                path = _term_path(row.what, term, list(prov))
                prov[path] = (
                    f"fitted: {row.what}, {row.samples} spans, rms {row.fit.rms_pct:.2f}%"
                    if fitted
                    else f"from base {base.name} (the probes cannot determine it: {row.what})"
                )
        notes += cal.notes
    else:
        notes.append("no probe traces: every host and GPU cost is the base's")
    level = fresh_level(out, hw)
    if level is not None:
        hw = apply_level(hw, level, prov)
        notes.append(
            f"host level: x{level.host:.3f} of the probes' fit, the median of "
            f"{len(level.machines)} fresh runs ({FRESH_DIR}/), every host cost scaled by it"
            + (
                f" but the eager launch costs, by the median eager launch factor "
                f"x{level.eager:.3f} of {len(level.eager_runs)} runs"
                if level.eager is not None
                else ""
            )
            + f"; every forward by their median forward factor x{level.forward:.3f}"
        )
    notes += keep_physical(hw, rates, prov)
    hw.provenance = {k: prov[k] for k in sorted(prov)}
    hw.source = (
        f"profiled by +experiment=profile_machine on {hw.device_name or 'this device'}: rates "
        f"measured, {kernels}, host costs fitted on {len(recs)} probe traces"
        f"{' at the fresh runs level' if level is not None else ''}, the rest from "
        f"{base.name} (provenance says which)"
    )
    return Fitted(hw, cal, notes, level_summary(level) if level is not None else None)


def keep_physical(hw: HardwareConfig, rates: dict[str, Any], prov: dict[str, str]) -> list[str]:
    """The measured ceilings back where a fit moved them; returns what it changed."""
    notes = []
    for ceiling, effs in EFFICIENCIES.items():
        measured = rates.get(ceiling)
        fitted = getattr(hw, ceiling)
        if measured and fitted > measured:
            setattr(hw, ceiling, float(measured))
            for k in effs:
                setattr(hw.gpu, k, min(1.0, getattr(hw.gpu, k) * fitted / measured))
                prov[f"gpu.{k}"] = prov.get(f"gpu.{k}", "") + "; capped at 1 (measured ceiling)"
            notes.append(
                f"{ceiling}: the fit reached {fitted:.4g}, kept at the measured {measured:.4g}"
            )
    for key in ("h2d_bandwidth", "d2h_bandwidth"):
        measured = rates.get(key)
        if measured and getattr(hw, key) > measured:
            notes.append(f"{key}: fitted {getattr(hw, key):.4g} above the measured {measured:.4g}")
            setattr(hw, key, float(measured))
            prov[key] = f"measured: {MEASURED_HOW[key]} (the fit's value was above it)"
    return notes
