"""The host's two speed levels, read from recorded traces (``hardware.host.regimes``).

The device machine's host runs at one of two speeds that switch every 0.2-2 s, invisibly to the
guest (an H200 recording). In a trace the switch shows as the host phases of
whole stretches of steps taking 1.6-3x their usual time at the same batch. So: each step's host
speed is its schedule + prepare + update time over what the phase model (fitted at the fast
level) gives for that step's batch, so that batch and token changes are not read as speed; the
median over a window of decode steps (``WINDOW_S``, ``WINDOW_STEPS``) is the window's speed, and
every step takes the level of the window it falls in; the windows of every run, in log speed,
are split into two levels (two means per engine, one threshold); a run's slow
factor is its slow level over its fast level, pooled over the runs that show both. The dwell
times are exponential means with censoring: the time spent at a level over the switches out of
it, so a run that is all one level adds its time and no switch. The phases are fitted again with
every span divided by its step's factor (host.py), and the levels found again from that fit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cbsim.calibration.fit import Fit
from cbsim.calibration.host import (
    HOST_PHASES,
    PhaseSpans,
    fit_host_phases,
    phase_prediction,
    phase_spans,
)
from cbsim.calibration.recordings import Recorded
from cbsim.calibration.result import Calibration, Row
from cbsim.config.hardware import HostCosts, HostRegimes

# a window: consecutive steps spanning at least this long and at least this many steps (the
# levels last 0.2-2 s; a median over 8 steps is not moved by one stalled step)
WINDOW_S, WINDOW_STEPS = 0.05, 8
# two levels closer than this factor are one level with noise (the measured switch: x1.65 for a
# fixed piece of Python, x1.9-2.5 for the runtime's phases; the H200's recordings)
MIN_SLOW_FACTOR = 1.3
# and the two clusters must be apart by this many of their own spreads (Ashman's D; 2: cleanly)
MIN_SEPARATION = 2.0
# a run shows two levels only with this many windows at each (fewer: its first window's
# prefill, or one stalled stretch)
MIN_LEVEL_WINDOWS = 3
# the phases are fitted, the levels found, this many times (the second pass moves the levels
# by the difference between a mixed-level and a fast-level phase fit)
PASSES = 2


@dataclass
class RunLevels:
    """One run's windows: start (us), length (s), log speed, slow (bool); its steps' window."""

    start_us: np.ndarray
    length_s: np.ndarray
    log_speed: np.ndarray
    steps: np.ndarray
    window_of_step: np.ndarray
    slow: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    factor: float = 1.0  # the slow level over the fast one, for this run's slow windows


@dataclass
class HostLevels:
    """Each recorded run's step-by-step host-speed factor (1 at the fast level), by trace path."""

    runs: dict[Path, RunLevels] = field(default_factory=dict)

    def at(self, rec: Recorded, steps: np.ndarray) -> np.ndarray:
        """The factor in force at each of ``steps`` of ``rec`` (1 where not known)."""
        steps = np.asarray(steps)
        run = self.runs.get(rec.path)
        out = np.ones(len(steps))
        if run is None or not len(run.steps):
            return out
        idx = np.clip(np.searchsorted(run.steps, steps), 0, len(run.steps) - 1)
        known = run.steps[idx] == steps
        slow = run.slow[run.window_of_step[idx]]
        out[known & slow] = run.factor
        return out


def step_speeds(rec: Recorded, host: HostCosts, cache: PhaseSpans | None = None) -> pd.DataFrame:
    """Per step with host phases (sorted): its first span's ts and its host speed, the phases'
    recorded time over the phase model's."""
    parts = []
    for phase in HOST_PHASES:
        p = phase_spans(rec, phase, cache)
        parts.append(
            p.assign(pred=phase_prediction(getattr(host, phase), p))[["step", "ts", "dur", "pred"]]
        )
    df = pd.concat(parts)
    df = df[df.step >= 0]
    g = df.groupby("step").agg(ts=("ts", "min"), obs=("dur", "sum"), pred=("pred", "sum"))
    g = g[(g.obs > 0) & (g.pred > 0)].sort_index()
    return pd.DataFrame({"ts": g.ts, "speed": g.obs / g.pred})


def run_windows(speeds: pd.DataFrame, decode: set) -> RunLevels:
    """The run's decode steps (where the phase model is exact about the batch: a mixed step's
    misfit is not to be read as speed) grouped into windows of ``WINDOW_S`` and
    ``WINDOW_STEPS`` or more, each the log of its median speed; every step with host phases,
    decode or not, takes the window it falls in by time."""
    dec = speeds[speeds.index.isin(decode)]
    ts, speed = dec.ts.to_numpy(float), dec.speed.to_numpy(float)
    of_step = np.zeros(len(ts), dtype=int)
    starts, w, first = [], 0, 0
    for i in range(len(ts)):
        if i - first >= WINDOW_STEPS and ts[i] - ts[first] >= WINDOW_S * 1e6:
            starts.append(first)
            first, w = i, w + 1
        of_step[i] = w
    if len(ts):
        starts.append(first)
    bounds = np.append(ts[starts], ts[-1] if len(ts) else 0.0) if starts else np.zeros(1)
    logs = np.array([np.log(np.median(speed[of_step == k])) for k in range(len(starts))])
    every = speeds.ts.to_numpy(float)
    window = np.clip(np.searchsorted(bounds[:-1], every, side="right") - 1, 0, None)
    return RunLevels(
        start_us=bounds[:-1],
        length_s=np.maximum(np.diff(bounds), 0.0) / 1e6,
        log_speed=logs,
        steps=speeds.index.to_numpy(),
        window_of_step=window if len(logs) else np.zeros(len(every), dtype=int),
    )


def decode_steps(rec: Recorded) -> set:
    """The decode steps replayed from a graph: the host speed is read where the phase model
    describes the code that ran. An eager step's phases run 2-4x the graphed ones' (the H100
    probes: prepare 180 against 30 us; the held-out eager runs alike), from the eager path
    itself, so an eager run read as a speed level would put the whole run at the slow level and
    divide its launches by the slow factor."""
    fwd = rec.forward
    return set(fwd[(fwd.kind == "decode") & fwd.graph.astype(bool)].step)


def two_levels(x: np.ndarray, w: np.ndarray) -> tuple[float, float] | None:
    """The two levels of ``x`` (weights ``w``) by two means in one dimension: (fast, slow)
    centres, or None when the data show one level (too close, or not separated)."""
    if len(x) < 2 or np.ptp(x) <= 0:
        return None
    lo, hi = np.percentile(x, [10, 90])
    for _ in range(100):
        cut = 0.5 * (lo + hi)
        a, b = x <= cut, x > cut
        if not a.any() or not b.any():
            return None
        new = np.average(x[a], weights=w[a] + 1e-12), np.average(x[b], weights=w[b] + 1e-12)
        if np.allclose(new, (lo, hi), atol=1e-12):
            break
        lo, hi = new
    sd = np.sqrt(np.var(x[x <= cut]) + np.var(x[x > cut]))
    apart = hi - lo >= np.log(MIN_SLOW_FACTOR) and np.sqrt(2) * (hi - lo) >= MIN_SEPARATION * sd
    return (float(lo), float(hi)) if apart else None


def smooth(slow: np.ndarray) -> np.ndarray:
    """A window whose level differs from both neighbours takes theirs (a median of three): one
    window on its own is a stalled stretch or noise, not a switch of 0.2 s or more."""
    if len(slow) < 3:
        return slow
    out = slow.copy()
    lone = (slow[1:-1] != slow[:-2]) & (slow[1:-1] != slow[2:])
    out[1:-1][lone] = slow[:-2][lone]
    return out


def find_levels(
    recs: list[Recorded], host: HostCosts, cache: PhaseSpans | None = None
) -> tuple[HostLevels, HostRegimes | None]:
    """Every run's windows split into the two levels; the pooled regimes (None: one level).

    The windows are split per engine (the phase model, fitted over both engines, reads the two
    engines' hosts a little apart), one threshold over every run of that engine, so that a run
    at one level throughout is told slow or fast by the other runs. A run with enough windows at
    both levels has its own slow factor (its slow windows' median over its fast ones'); the
    pooled factor is the median of those, and the others' slow windows take it."""
    runs = {
        rec.path: run_windows(step_speeds(rec, host, cache), decode_steps(rec))
        for rec in recs
        if not rec.imported
    }
    runs = {p: r for p, r in runs.items() if len(r.log_speed)}
    engines = {rec.path: rec.engine for rec in recs}
    for engine in set(engines[p] for p in runs):
        group = [r for p, r in runs.items() if engines[p] == engine]
        x = np.concatenate([r.log_speed for r in group])
        centres = two_levels(x, np.concatenate([r.length_s for r in group]))
        for r in group:
            r.slow = smooth(r.log_speed > 0.5 * sum(centres)) if centres else r.slow[:0]
            if not len(r.slow):
                r.slow = np.zeros(len(r.log_speed), dtype=bool)
    gaps = {p: g for p, r in runs.items() if (g := own_gap(r)) is not None}
    if not gaps:
        # no run shows both levels at length: a few windows off the model are not a second level
        for r in runs.values():
            r.slow[:] = False
        return HostLevels(runs), None
    pooled = float(np.median(list(gaps.values())))
    for p, r in runs.items():
        r.factor = float(np.exp(gaps.get(p, pooled)))
    return HostLevels(runs), dwell_times(list(runs.values()), float(np.exp(pooled)))


def own_gap(r: RunLevels) -> float | None:
    """A run's own slow level over its fast level, in log, when it has enough of both."""
    if min(r.slow.sum(), (~r.slow).sum()) < MIN_LEVEL_WINDOWS:
        return None
    gap = float(np.median(r.log_speed[r.slow]) - np.median(r.log_speed[~r.slow]))
    return gap if gap >= np.log(MIN_SLOW_FACTOR) else None


def dwell_times(runs: list[RunLevels], slow_factor: float) -> HostRegimes | None:
    """Mean seconds at each level: time at it over the switches out of it (exponential dwell,
    censored at the ends of every run); a level never left keeps its time as a lower bound."""
    time, exits = np.zeros(2), np.zeros(2)
    for r in runs:
        level = r.slow.astype(int)
        np.add.at(time, level, r.length_s)
        switch = np.flatnonzero(np.diff(level) != 0)
        np.add.at(exits, level[switch], 1)
    if time[1] <= 0:
        return None
    fast, slow = (float(v) for v in time / np.maximum(exits, 1))
    return HostRegimes(
        slow_factor=max(float(slow_factor), 1.0), fast_dwell_s=max(fast, 1e-3), slow_dwell_s=slow
    )


def fit_host_levels(recs: list[Recorded], cal: Calibration, levels: HostLevels) -> None:
    """The host phases fitted at the fast level and the regimes into the profile; ``levels`` is
    filled with every run's step factors for the other host fits (wait, launch, spread)."""
    hw = cal.hardware
    found, regimes = HostLevels(), None
    cache: PhaseSpans = {}
    for _ in range(PASSES):
        scratch = Calibration(dataclasses.replace(hw, host=dataclasses.replace(hw.host)))
        fit_host_phases(recs, scratch, *at_fast_level(found, regimes), cache=cache)
        found, regimes = find_levels(recs, scratch.hardware.host, cache)
    fit_host_phases(recs, cal, *at_fast_level(found, regimes), cache=cache)
    levels.runs = found.runs if regimes else {}
    row_regimes(found, regimes, cal)


def at_fast_level(found: HostLevels, regimes: HostRegimes | None) -> tuple:
    """``fit_host_phases``' level and slow-factor arguments (none while one level is known)."""
    return (found.at, regimes.slow_factor) if regimes else (None, 1.0)


def row_regimes(found: HostLevels, regimes: HostRegimes | None, cal: Calibration) -> None:
    """The regimes into the profile and a row of the residuals table: each window's speed
    against its level's (the runs' own fast level, times the factor when slow)."""
    runs = list(found.runs.values())
    if not runs:
        return
    host = cal.hardware.host
    prior = dataclasses.asdict(host.regimes)
    one_level = regimes is None
    if one_level:
        total = float(sum(r.length_s.sum() for r in runs))
        regimes = HostRegimes(slow_factor=1.0, fast_dwell_s=max(total, 1e-3), slow_dwell_s=0.0)
        for r in runs:
            r.slow = np.zeros(len(r.log_speed), dtype=bool)
    res = []
    for r in runs:
        fast = np.median(r.log_speed[~r.slow]) if (~r.slow).any() else np.median(r.log_speed)
        expected = fast + np.log(r.factor) * r.slow if not one_level else fast
        res.append(np.exp(r.log_speed - expected) - 1.0)
    cal.hardware.host = dataclasses.replace(host, regimes=regimes)
    values = dataclasses.asdict(regimes)
    switches = sum(int(np.sum(np.diff(r.slow.astype(int)) != 0)) for r in runs)
    slow_runs = sum(bool(r.slow.any()) for r in runs)
    what = f"host regimes ({len(runs)} runs, {slow_runs} slow, {switches} switches)"
    fit = Fit(values, dict.fromkeys(values, True), np.concatenate(res))
    cal.rows.append(Row(what, int(sum(len(r.log_speed) for r in runs)), fit, prior))
