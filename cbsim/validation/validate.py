"""Re-simulate recorded runs and measure how far the simulator is from the hardware.

Each recorded trace carries its run config (otherData.config); the simulator runs that config with
a calibrated hardware profile, and both traces go through the same metrics code. Errors:
total time, step time p50/p99, TTFT and TPOT p50 in percent of the real value; GPU idle in
percentage points. "Held out" means the profile was fitted without that run.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cbsim.config.schema import HardwareConfig
from cbsim.metrics import compute_metrics
from cbsim.trace import Trace
from cbsim.trace import schema as S
from cbsim.validation.calibrate import Calibration, calibrate
from cbsim.validation.traces import Recorded

log = logging.getLogger("cbsim")

# the targets, on held-out runs
TARGETS = {"total_time_pct": 3.0, "gpu_idle_pp": 1.0, "step_p50_pct": 5.0}
# Recording sessions whose first step is a known one-off, judged on the time after it (total
# time and GPU idle from the end of the first forward on): h200_run1 predates the runtime's
# prefill warm-up (commit 08f14c7; experiments/runtime/README.md), so its first eager prefill
# paid the set-up (seed_1024 sync: 1.03 s against 0.24 s later). Not a cost to fit.
COLD_FIRST_STEP = frozenset({"h200_run1"})
PCT_ERRORS = {
    "total_time_pct": "total_time_s",
    "steady_time_pct": "steady_time_s",
    "decode_time_pct": "decode_time_s",
    "step_p50_pct": "step_time_ms_p50",
    "step_p99_pct": "step_time_ms_p99",
    "ttft_p50_pct": "ttft_ms_p50",
    "tpot_p50_pct": "tpot_ms_p50",
}
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
    # what the profile had not seen: "workload" (no run of this workload, either engine),
    # "engine" (no run of this engine), "run" (only this run), "" (in sample)
    held_out_by: str = ""

    @property
    def errors(self) -> dict[str, float | None]:
        return errors(self.real, self.sim)

    @property
    def judged(self) -> dict[str, str]:
        """Target -> the error it is judged on (after the first step in COLD_FIRST_STEP)."""
        if self.rec.session in COLD_FIRST_STEP:
            return {
                "total_time_pct": "steady_time_pct",
                "gpu_idle_pp": "steady_idle_pp",
                "step_p50_pct": "step_p50_pct",
            }
        return {k: k for k in TARGETS}

    @property
    def passed(self) -> dict[str, bool]:
        e = self.errors
        return {k: e[j] is not None and abs(e[j]) <= TARGETS[k] for k, j in self.judged.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.rec.name,
            "path": str(self.rec.path),
            "engine": self.rec.engine,
            "batch_size": self.rec.config.workload.batch_size,
            "held_out": self.held_out,
            "held_out_by": self.held_out_by,
            "fit_on": self.fit_on,
            "real": {k: self.real.get(k) for k in SHOWN},
            "sim": {k: self.sim.get(k) for k in SHOWN},
            "errors": self.errors,
            "within_target": self.passed,
            "judged_on": self.judged,
        }


def errors(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, metric in PCT_ERRORS.items():
        r, s = real.get(metric), sim.get(metric)
        out[key] = 100.0 * (s - r) / r if r and s is not None else None
    for key, metric in (
        ("gpu_idle_pp", "gpu_idle_fraction"),
        ("steady_idle_pp", "steady_gpu_idle_fraction"),
    ):
        r, s = real.get(metric), sim.get(metric)
        out[key] = 100.0 * (s - r) if r is not None and s is not None else None
    return out


def decode_time_s(trace: Trace) -> float | None:
    """The summed step times of decode steps (step time as in metrics: between consecutive
    forward ends): the steady state, without prefill and whatever cold start it carries."""
    sp = trace.spans
    lane = S.COMPUTE if (sp.lane == S.COMPUTE).any() else S.DEFAULT
    fwd = sp[(sp.lane == lane) & sp.name.isin(S.FORWARD_NAMES)]
    if fwd.empty:
        return None
    steps = fwd.groupby("step").agg(end=("end", "max"), kind=("kind", "first")).sort_values("end")
    dt = steps.end.diff()
    return float(dt[steps.kind == "decode"].sum()) / 1e6


def covered_us(starts: np.ndarray, ends: np.ndarray) -> float:
    """Time covered by intervals sorted by start (overlaps counted once)."""
    if not len(starts):
        return 0.0
    running = np.maximum.accumulate(ends)
    new = np.r_[True, starts[1:] > running[:-1]]
    block = np.cumsum(new) - 1
    block_end = np.zeros(block[-1] + 1)
    np.maximum.at(block_end, block, ends)
    return float((block_end - starts[new]).sum())


def steady_metrics(trace: Trace) -> dict[str, float | None]:
    """Total time and GPU idle from the end of the first forward to the end of the run."""
    sp = trace.spans
    lane = S.COMPUTE if (sp.lane == S.COMPUTE).any() else S.DEFAULT
    fwd = sp[(sp.lane == lane) & sp.name.isin(S.FORWARD_NAMES)]
    if fwd.empty:
        return {"steady_time_s": None, "steady_gpu_idle_fraction": None}
    t0 = float(fwd[fwd.step == fwd.step.min()].end.max())
    end = float(sp.end.max())
    inst = trace.instants
    if not inst.empty:
        end = max(end, float(inst.ts.max()))
    gpu = sp[sp.lane == lane].sort_values("ts")
    starts, ends = np.maximum(gpu.ts.to_numpy(), t0), gpu.end.to_numpy()
    keep = ends > t0
    busy = covered_us(starts[keep], ends[keep])
    window = end - t0
    return {
        "steady_time_s": window / 1e6,
        "steady_gpu_idle_fraction": 1.0 - busy / window if window > 0 else None,
    }


def measure(trace: Trace) -> dict[str, Any]:
    m = compute_metrics(trace)
    m["decode_time_s"] = decode_time_s(trace)
    m.update(steady_metrics(trace))
    return m


def simulate_like(rec: Recorded, hw: HardwareConfig) -> Trace:
    """The recorded run's config, in the simulator, with ``hw``, timed as the runtime times it."""
    from cbsim.sim import run

    cfg = rec.config
    cfg = dataclasses.replace(cfg, hardware=hw, mode=dataclasses.replace(cfg.mode, name="sim"))
    trace = run(cfg, rec.engine)
    return event_timed(trace) if rec.trace.source == "runtime" else trace


def event_timed(trace: Trace) -> Trace:
    """The simulated trace as the runtime's CUDA events would have timed it: an eager forward's
    span starts at its marker, before the host has launched its kernels, so the time the stream
    waited for those launches (``launch_bound_us``) is inside the span, not idle before it."""
    lane = {k: v for k, v in trace.lane_of.items() if v == S.COMPUTE}
    events = [dict(e) for e in trace.events]
    first: dict[int, dict] = {}  # step -> its first span on the compute lane
    for e in events:
        if e.get("ph") == "X" and (e["pid"], e["tid"]) in lane:
            step = e.get("args", {}).get("step")
            if step is not None and (step not in first or e["ts"] < first[step]["ts"]):
                first[step] = e
    for e in events:
        wait = e.get("args", {}).get("launch_bound_us") if e.get("ph") == "X" else None
        if wait and (e["pid"], e["tid"]) in lane:
            head = first[e["args"]["step"]]
            head["ts"] -= wait
            head["dur"] += wait
    return Trace(events, trace.other_data)


def validate_run(rec: Recorded, hw: HardwareConfig, held_out: bool, fit_on: list[str]) -> RunResult:
    trace = simulate_like(rec, hw)
    return RunResult(rec, trace, measure(rec.trace), measure(trace), held_out, fit_on)


# what each held-out run's profile leaves out, of the run's own recording session
LEAVE_OUT = ("run", "workload", "engine")


def leave_out(
    recs: list[Recorded],
    base: HardwareConfig,
    name: str,
    by: str = "workload",
    by_session: bool = True,
) -> tuple[list[RunResult], dict[str, Calibration]]:
    """Each run predicted by a profile fitted on other runs of its recording session (one
    software stack: runs recorded by another version of the runtime cost something else; all
    sessions when ``by_session`` is false), leaving out ``by``:

    - ``run``: only this run (its workload's other engine stays in);
    - ``workload``: every run of its workload (batch size, lengths, arrivals), both engines:
      the profile has not seen this shape; a session of one workload falls back to ``run``;
    - ``engine``: every run of its engine (async predicted from sync runs and vice versa, all
      workloads): the question a user asks before writing the async engine."""
    if by not in LEAVE_OUT:
        raise ValueError(f"leave out {by!r}; allowed: {', '.join(LEAVE_OUT)}")
    results, cals = [], {}
    for rec in recs:
        pool = [r for r in recs if r is not rec]
        if by_session:
            pool = [r for r in pool if r.session == rec.session] or pool
        kind = by
        others = [r for r in pool if not _same(r, rec, by)]
        if not others:  # a session of one workload (or engine): leave out the run alone
            others, kind = pool, "run"
        cal = calibrate(others, base, name)
        cals[rec.name] = cal
        log.info("held out %s (%s): fitted on %d other run(s)", rec.name, kind, len(others))
        result = validate_run(rec, cal.hardware, True, [r.name for r in others])
        result.fit_table = cal.table()
        result.held_out_by = kind
        results.append(result)
    return results, cals


def workload_key(rec: Recorded) -> str:
    """Runs of one workload: the same requests and batching limits (the engine aside)."""
    return repr(dataclasses.asdict(rec.config.workload))


def _same(other: Recorded, rec: Recorded, by: str) -> bool:
    if by == "workload":
        return workload_key(other) == workload_key(rec)
    if by == "engine":
        return other.engine == rec.engine
    return False


def summary(results: list[RunResult]) -> dict[str, Any]:
    """Worst and mean absolute error per engine over held-out runs, and whether all pass."""
    out: dict[str, Any] = {"targets": TARGETS}
    held = [r for r in results if r.held_out]
    for engine in sorted({r.rec.engine for r in held}):
        runs = [r for r in held if r.rec.engine == engine]
        agg: dict[str, Any] = {"runs": len(runs)}
        for key in (*PCT_ERRORS, "gpu_idle_pp"):
            vals = [abs(r.errors[key]) for r in runs if r.errors[key] is not None]
            agg[f"{key}_max_abs"] = max(vals) if vals else None
            agg[f"{key}_mean_abs"] = sum(vals) / len(vals) if vals else None
        out[engine] = agg
    out["held_out_runs"] = len(held)
    out["held_out_by"] = {
        by: {"runs": len(runs), "within_target": sum(all(r.passed.values()) for r in runs)}
        for by in sorted({r.held_out_by for r in held})
        for runs in [[r for r in held if r.held_out_by == by]]
    }
    out["held_out_within_target"] = sum(all(r.passed.values()) for r in held)
    out["all_within_target"] = bool(held) and all(all(r.passed.values()) for r in held)
    # per recording session (one runtime version): how many held-out runs meet every target
    out["sessions"] = {
        session: {
            "runs": len(runs),
            "within_target": sum(all(r.passed.values()) for r in runs),
            "total_time_pct_max_abs": max(abs(r.errors["total_time_pct"] or 0.0) for r in runs),
        }
        for session in sorted({r.rec.session for r in held})
        for runs in [[r for r in held if r.rec.session == session]]
    }
    return out


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
