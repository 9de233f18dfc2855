"""The measured spread of host speed (hardware.host.spread), which the bands draw from, once the
host's two speed levels (regimes.py) are taken out: within a run, step to step inside a level;
between device calls, the same run's fast-level host time recorded in separate calls."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from cbsim.calibration.fit import Fit
from cbsim.calibration.host import Level
from cbsim.calibration.recordings import Recorded
from cbsim.calibration.regimes import decode_steps, step_speeds
from cbsim.calibration.result import Calibration, Row
from cbsim.config.hardware import HostCosts
from cbsim.trace import schema as S

HOST_WORK = (S.SCHEDULE, S.PREPARE, S.LAUNCH, S.UPDATE)
# P5-P95 of a normal spans 2 x 1.645 standard deviations
P5_P95_SIGMAS = 3.29
# decode steps a run needs before its spread is counted
MIN_STEPS = 20


def host_per_decode_step(rec: Recorded, level: Level | None = None) -> np.ndarray:
    """The host's work (schedule + prepare + launch + update) of each decode step at the fast
    level (divided by the step's host-speed factor), us."""
    sp = rec.spans
    host = sp[(sp.lane == S.HOST) & sp.name.isin(HOST_WORK) & (sp.step >= 0)]
    per_step = host.groupby("step")["dur"].sum()
    per_step = per_step[per_step.index.isin(decode_steps(rec))]
    values = per_step.to_numpy(float)
    if level:
        values = values / level(rec, per_step.index.to_numpy())
    return values[values > 0]


def step_speed(rec: Recorded, host: HostCosts, level: Level | None = None) -> np.ndarray:
    """Per decode step, its schedule + prepare + update time over the phase model's (what a
    band's within-run jitter scales), divided by the step's host-speed factor."""
    speeds = step_speeds(rec, host)
    speeds = speeds[speeds.index.isin(decode_steps(rec))]
    speed = speeds.speed.to_numpy(float)
    if level:
        speed = speed / level(rec, speeds.index.to_numpy())
    return speed[speed > 0]


def within_run(recs: list[Recorded], host: HostCosts, level: Level | None = None) -> list[float]:
    """Per run, (log P95 - log P5) / 3.29 of the host's speed per decode step inside a level."""
    sigmas = []
    for rec in recs:
        v = step_speed(rec, host, level)
        if len(v) >= MIN_STEPS:
            lo, hi = np.percentile(np.log(v), [5, 95])
            sigmas.append((hi - lo) / P5_P95_SIGMAS)
    return sigmas


def between_calls(recs: list[Recorded], level: Level | None = None) -> tuple[float | None, int]:
    """The pooled standard deviation of log(median fast-level host time per decode step) between
    calls, over every workload (model and engine) recorded in two or more calls; None without.
    ``fit_spread`` adds the calls' level mix (``call_mix``) to it, in quadrature."""
    groups: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(dict)
    for rec in recs:
        v = host_per_decode_step(rec, level)
        if len(v) >= MIN_STEPS:
            key = (rec.model_key, rec.workload_key, rec.engine)
            groups[key].setdefault(rec.call, []).append(float(np.log(np.median(v))))
    squares, dof = 0.0, 0
    for calls in groups.values():
        if len(calls) < 2:
            continue
        logs = np.array([np.mean(v) for v in calls.values()])
        squares += float(np.sum((logs - logs.mean()) ** 2))
        dof += len(logs) - 1
    return (float(np.sqrt(squares / dof)) if dof else None), dof


def call_mix(recs: list[Recorded], level: Level | None) -> tuple[float | None, int]:
    """The standard deviation between device calls of log(the call's mean host-speed factor over
    its decode steps): the share of time at the slow level differs from call to call (the H200's recordings:
    the 1b call mostly slow, the 3b call mostly fast), which one stationary two-level process
    does not give a long run; None with fewer than two calls."""
    steps: dict[str, list[np.ndarray]] = defaultdict(list)
    for rec in recs:
        if level and not rec.imported:
            steps[rec.call].append(level(rec, np.array(sorted(decode_steps(rec)))))
    means = [np.mean(np.concatenate(v)) for v in steps.values() if sum(map(len, v))]
    if len(means) < 2:
        return None, len(means)
    return float(np.std(np.log(means), ddof=1)), len(means)


def fit_spread(recs: list[Recorded], cal: Calibration, level: Level | None = None) -> None:
    """Both spreads into the profile, inside the levels ``level`` gives each step; one not
    measurable here keeps the base profile's value."""
    host = cal.hardware.host
    spread = host.spread
    prior = {"within_run": spread.within_run, "between_calls": spread.between_calls}
    sigmas = within_run(recs, host, level)
    within = float(np.median(sigmas)) if sigmas else None
    between, dof = between_calls(recs, level)
    mix, calls = call_mix(recs, level)
    if mix is not None:
        between = float(np.hypot(between or 0.0, mix))
    values = {
        "within_run": within if within is not None else spread.within_run,
        "between_calls": between if between is not None else spread.between_calls,
    }
    fitted = {"within_run": within is not None, "between_calls": between is not None}
    if not any(fitted.values()):
        return
    cal.hardware.host = dataclasses.replace(host, spread=dataclasses.replace(spread, **values))
    # residuals: each run's own spread against the median (how much runs differ in it)
    res = np.asarray(sigmas) / within - 1.0 if within else np.zeros(0)
    what = f"host spread ({dof} between-call dof, {calls} calls' level mix)"
    cal.rows.append(Row(what, len(sigmas), Fit(values, fitted, res), prior))
