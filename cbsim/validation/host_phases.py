"""Where a validation's host time goes astray: each host phase's recorded mean per step over the
simulated one, run by run.

Kernel tables transfer across GPUs and the host does not: a profile whose totals miss on
another machine misses in every host phase at once, by similar factors (x1.9-x3.2 on the H100's
held-out recording against h200_profiled), and this says so phase by phase before anyone fits a
constant to the totals. The wait is left out
(it is the GPU's time seen from the host)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cbsim.trace import Trace
from cbsim.trace import schema as S
from cbsim.validation.runs import RunResult

PHASES = (S.SCHEDULE, S.PREPARE, S.LAUNCH, S.UPDATE)
# a median ratio outside this range: the profile's host is not this machine's (h200_profiled
# against its own 22 probe runs: every phase within x0.81-x1.22)
SAME_HOST = (2 / 3, 1.5)


def phase_means_us(trace: Trace) -> dict[str, float]:
    """Each host phase's mean span (us) over the steps that ran it: the mean, spikes and all,
    is what a run's total pays and what the profile's per-step costs are fitted to."""
    sp = trace.spans
    host = sp[(sp.lane == S.HOST) & sp.name.isin(PHASES)]
    means = host.groupby("name")["dur"].mean()
    return {p: float(means[p]) for p in PHASES if p in means.index}


def host_phase_summary(results: list[RunResult]) -> dict[str, Any] | None:
    """Per phase over the held-out runs (all runs when none is held out): the median ratio, its
    range and the medians of both means; None when no run has host phases."""
    runs = [r for r in results if r.held_out] or results
    means = [(phase_means_us(r.rec.trace), phase_means_us(r.sim_trace)) for r in runs]
    out: dict[str, Any] = {}
    for phase in PHASES:
        rows = [
            (real[phase], sim[phase], real[phase] / sim[phase])
            for real, sim in means
            if phase in real and sim.get(phase, 0.0) > 0
        ]
        if rows:
            a = np.asarray(rows)
            out[phase] = {
                "runs": len(rows),
                "recorded_us_median": round(float(np.median(a[:, 0])), 2),
                "simulated_us_median": round(float(np.median(a[:, 1])), 2),
                "ratio_median": round(float(np.median(a[:, 2])), 3),
                "ratio_min": round(float(a[:, 2].min()), 3),
                "ratio_max": round(float(a[:, 2].max()), 3),
            }
    return out or None


def host_phase_lines(summary: dict[str, Any] | None) -> list[str]:
    """The terminal's lines: one per phase, and what to do when the host is another one."""
    if not summary:
        return []
    n = max(v["runs"] for v in summary.values())
    lines = [f"host phases, recorded over simulated mean per step ({n} runs: median, range):"]
    for phase, v in summary.items():
        lines.append(
            f"  {phase:<9} x{v['ratio_median']:.2f} (x{v['ratio_min']:.2f}-x{v['ratio_max']:.2f})"
            f"  {v['recorded_us_median']:.1f} us recorded, {v['simulated_us_median']:.1f} us "
            "simulated"
        )
    lo, hi = SAME_HOST
    off = [p for p, v in summary.items() if not lo <= v["ratio_median"] <= hi]
    if off:
        lines.append(
            f"  {', '.join(off)} off by more than x{hi:g}: the profile's host costs are not "
            "these runs' (+experiment=profile_machine on their machine measures them, fresh "
            "processes included; extra.holdout=anchored moves them per call)"
        )
    return lines
