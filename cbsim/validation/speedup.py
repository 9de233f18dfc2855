"""The user's question, per workload: does async pay, and by how much? The recorded speedup (sync
time / async time, the two runs of one workload in one device call) against the predicted one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cbsim.validation.runs import RunResult

# the target: predicted within this many percentage points of the recorded speedup
# (x1.05 predicted for x1.06 recorded is 1 point)
SPEEDUP_POINTS = 1.0


@dataclass
class Speedup:
    """The sync and async runs of one workload, model and device call."""

    sync: RunResult
    async_: RunResult
    # (P5, P95) of the predicted speedup, when bands were drawn (widened by the model error),
    # and from the draws alone
    band: tuple[float, float] | None = None
    draw_band: tuple[float, float] | None = None

    @property
    def workload(self) -> str:
        """The workload's name: the recording's path without the trace file."""
        return self.sync.rec.name.rpartition("/")[0] or self.sync.rec.name

    @property
    def metric(self) -> str:
        """Total time, or the time after the first step when that step was a one-off."""
        cold = self.sync.rec.manifest.quirks.cold_first_step
        return "steady_time_s" if cold else "total_time_s"

    @property
    def recorded(self) -> float | None:
        return _ratio(self.sync.real, self.async_.real, self.metric)

    @property
    def predicted(self) -> float | None:
        return _ratio(self.sync.sim, self.async_.sim, self.metric)

    @property
    def error_points(self) -> float | None:
        if self.recorded is None or self.predicted is None:
            return None
        return 100.0 * (self.predicted - self.recorded)

    @property
    def held_out(self) -> bool:
        return self.sync.held_out and self.async_.held_out

    @property
    def held_out_by(self) -> str:
        kinds = {self.sync.held_out_by, self.async_.held_out_by} - {""}
        return "/".join(sorted(kinds))

    @property
    def passed(self) -> bool:
        e = self.error_points
        return e is not None and abs(e) <= SPEEDUP_POINTS

    @property
    def in_band(self) -> bool | None:
        if self.band is None or self.recorded is None:
            return None
        return bool(self.band[0] <= self.recorded <= self.band[1])

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "call": self.sync.rec.call,
            "model": self.sync.rec.config.model.name,
            "batch_size": self.sync.rec.config.workload.batch_size,
            "recorded": self.recorded,
            "predicted": self.predicted,
            "error_points": self.error_points,
            "band": list(self.band) if self.band else None,
            # the draws' band alone, before the model error widens it (what pooling the error
            # over several validations measures on: cbsim/widening.py)
            "draw_band": list(self.draw_band) if self.draw_band else None,
            "in_band": self.in_band,
            "held_out": self.held_out,
            "held_out_by": self.held_out_by,
            "within_target": self.passed,
            "judged_on": self.metric,
        }


def _ratio(sync: dict[str, Any], async_: dict[str, Any], key: str) -> float | None:
    s, a = sync.get(key), async_.get(key)
    return s / a if s and a else None


def speedups(results: list[RunResult]) -> list[Speedup]:
    """One Speedup per workload recorded with both engines in one call, in the results' order;
    a workload recorded twice in one call (a repeat, in a folder of its own) is two."""
    groups: dict[tuple[str, str, str, str], dict[str, RunResult]] = {}
    for r in results:
        folder = r.rec.name.rpartition("/")[0]
        key = (r.rec.call, r.rec.model_key, r.rec.workload_key, folder)
        groups.setdefault(key, {})[r.rec.engine] = r
    return [Speedup(g["sync"], g["async"]) for g in groups.values() if "sync" in g and "async" in g]


def speedup_table(pairs: list[Speedup]) -> str:
    """The headline table: recorded vs predicted async speedup per workload."""
    head = f"{'workload':<40}{'recorded':>10}{'predicted':>11}{'points':>8}{'band':>17}{'held':>10}"
    lines = [head]
    for p in pairs:
        rec = f"x{p.recorded:.3f}" if p.recorded else "-"
        pred = f"x{p.predicted:.3f}" if p.predicted else "-"
        pts = f"{p.error_points:+.2f}" if p.error_points is not None else "-"
        band = f"x{p.band[0]:.3f}-x{p.band[1]:.3f}" if p.band else "-"
        held = p.held_out_by if p.held_out else "no"
        lines.append(f"{p.workload[:39]:<40}{rec:>10}{pred:>11}{pts:>8}{band:>17}{held:>10}")
    return "\n".join(lines)
