"""One recorded run against its simulation: the errors, the predicted band, and whether the run
meets the targets on held-out runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from cbsim.calibration.recordings import Recorded
from cbsim.config.schema import HardwareConfig
from cbsim.trace import Trace
from cbsim.validation.forked import forked_map
from cbsim.validation.measure import errors, measure, simulate_like

# the targets, on held-out runs: total time in percent, GPU idle in percentage points
# (within one device call; across calls the recorded idle must lie inside the predicted band),
# step time p50 in percent
TARGETS = {"total_time_pct": 3.0, "gpu_idle_pp": 1.0, "step_p50_pct": 5.0}
# a run's metric -> its key in a predicted band (cbsim.bands: P5-P95 over the host-speed draws)
BANDED = {"total_time_s": "total_time_s", "gpu_idle_fraction": "gpu_idle_fraction"}
SHOWN = (
    "total_time_s",
    "decode_time_s",
    "steady_time_s",
    "gpu_idle_fraction",
    "steady_gpu_idle_fraction",
    "step_time_ms_p50",
    "step_time_ms_p99",
    "ttft_ms_p50",
    "tpot_ms_p50",
    "steps",
    "generated_tokens",
)


@dataclass
class RunResult:
    rec: Recorded
    sim_trace: Trace
    real: dict[str, Any]
    sim: dict[str, Any]
    held_out: bool
    fit_on: list[str] = field(default_factory=list)
    fit_table: str = ""  # the residuals table of the profile it was simulated with
    # what the profile had not seen: "workload", "engine", "model", "call" (no run of that
    # kind), "run" (only this run), "fit_on" / "profile" (a fixed profile), "" (in sample)
    held_out_by: str = ""
    # metric -> (P5, P95) predicted around the simulated value, when bands were drawn: the
    # draws' spread widened by the profile's model error (cbsim.widening)
    band: dict[str, tuple[float, float]] = field(default_factory=dict)
    # the same from the draws alone (what the model error needed to cover a run is measured on)
    draw_band: dict[str, tuple[float, float]] = field(default_factory=dict)
    # the profile it was simulated with
    hardware: HardwareConfig | None = None
    # the profile saw no run of this run's device call: another host's speed
    across_calls: bool = False
    # holdout=anchored: the call's machine its reference runs measured (cbsim.validation.anchor)
    machine: Any = None

    @property
    def errors(self) -> dict[str, float | None]:
        return errors(self.real, self.sim)

    @property
    def judged(self) -> dict[str, str]:
        """Target -> the error it is judged on: after the first step when the recording's
        manifest says its first step was a one-off (quirks.cold_first_step)."""
        if self.rec.manifest.quirks.cold_first_step:
            return {
                "total_time_pct": "steady_time_pct",
                "gpu_idle_pp": "steady_idle_pp",
                "step_p50_pct": "step_p50_pct",
            }
        return {k: k for k in TARGETS}

    @property
    def in_band(self) -> dict[str, bool]:
        """Metric -> whether the recorded value lies inside the predicted P5-P95 band."""
        out = {}
        for metric, (lo, hi) in self.band.items():
            value = self.real.get(metric)
            if value is not None:
                out[metric] = bool(lo <= value <= hi)
        return out

    @property
    def passed(self) -> dict[str, bool]:
        e = self.errors
        out = {k: e[j] is not None and abs(e[j]) <= TARGETS[k] for k, j in self.judged.items()}
        if self.across_calls and "gpu_idle_fraction" in self.in_band:
            # another call's host: the idle lies inside the band the host spread gives (or within
            # the target of a run of the same call, where the band is narrower: an async run)
            out["gpu_idle_pp"] = out["gpu_idle_pp"] or self.in_band["gpu_idle_fraction"]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.rec.name,
            "path": str(self.rec.path),
            "engine": self.rec.engine,
            "batch_size": self.rec.config.workload.batch_size,
            "model": self.rec.config.model.name,
            "session": self.rec.session,
            "call": self.rec.call,
            "held_out": self.held_out,
            "held_out_by": self.held_out_by,
            "across_calls": self.across_calls,
            "fit_on": self.fit_on,
            "real": {k: self.real.get(k) for k in SHOWN},
            "sim": {k: self.sim.get(k) for k in SHOWN},
            "errors": self.errors,
            "band": {k: list(v) for k, v in self.band.items()},
            "draw_band": {k: list(v) for k, v in self.draw_band.items()},
            "in_band": self.in_band,
            "within_target": self.passed,
            "judged_on": self.judged,
            "call_machine": dataclasses.asdict(self.machine) if self.machine else None,
            "host_level": self.hardware.host.level.factor if self.hardware else None,
        }


def validate_run(rec: Recorded, hw: HardwareConfig, held_out: bool, fit_on: list[str]) -> RunResult:
    trace = simulate_like(rec, hw)
    result = RunResult(rec, trace, measure(rec.trace), measure(trace), held_out, fit_on)
    result.hardware = hw
    return result


def validate_runs(
    recs: list[Recorded], hosts: list[HardwareConfig], held_out: list[bool], jobs: int
) -> list[RunResult]:
    """``validate_run`` of each run on its profile, in ``jobs`` forked worker processes (0: one
    per CPU; 1: here), none fitted on: each worker sends back the run's config, its simulated
    trace and both metrics."""
    done = forked_map(_simulated, list(zip(recs, hosts)), jobs)
    results = []
    for rec, hw, held, (config, trace, real, sim) in zip(recs, hosts, held_out, done):
        rec.config = config  # composed once, in the worker: the draws and the tables read it
        result = RunResult(rec, trace, real, sim, held)
        result.hardware = hw
        results.append(result)
    return results


def _simulated(
    run: tuple[Recorded, HardwareConfig],
) -> tuple[Any, Trace, dict[str, Any], dict[str, Any]]:
    rec, hw = run
    trace = simulate_like(rec, hw)
    return rec.config, trace, measure(rec.trace), measure(trace)


TABLE = (
    ("total %", "total_time_pct"),
    ("after0 %", "steady_time_pct"),
    ("decode %", "decode_time_pct"),
    ("idle pp", "gpu_idle_pp"),
    ("idle0 pp", "steady_idle_pp"),
    ("p50 %", "step_p50_pct"),
    ("p99 %", "step_p99_pct"),
    ("TTFT %", "ttft_p50_pct"),
    ("TPOT %", "tpot_p50_pct"),
)


def error_table(results: list[RunResult]) -> str:
    lines = [f"{'run':<42}{'engine':>7}{'held':>9}" + "".join(f"{h:>10}" for h, _ in TABLE)]
    for r in results:
        e = r.errors
        cells = [f"{e[k]:+.2f}" if e[k] is not None else "-" for _, k in TABLE]
        held = (r.held_out_by or "yes") if r.held_out else "no"
        lines.append(
            f"{r.rec.name[:41]:<42}{r.rec.engine:>7}{held:>9}" + "".join(f"{c:>10}" for c in cells)
        )
    return "\n".join(lines)
