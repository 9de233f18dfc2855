"""Calibration of the copies and of the host: phases, stalls, the wait's wake-up, launches.
Each is a linear model of the span's args (cbsim/costs.py charges them so); see calibrate.py.
The host costs are fitted at the host's fast level: given ``level`` (each step's host-speed
factor, regimes.py), every host span is divided by its step's factor first."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd

from cbsim.calibration.fit import Fit, linear_fit
from cbsim.calibration.recordings import Recorded, forward_steps
from cbsim.calibration.result import Calibration, Row, label_out, outliers, set_quantile
from cbsim.calibration.steps import samples_by_step, step_shapes
from cbsim.config.hardware import PhaseCost
from cbsim.costs import CostModel
from cbsim.sim.streams import LaunchQueue
from cbsim.trace import schema as S

# what SimEngine.launch enqueues per step besides the forward: two copies (H2D, D2H) and five
# event operations (record h2d_done, wait on it, record compute_done, wait on it, record d2h_done)
LAUNCH_COPIES, LAUNCH_EVENT_OPS = 2, 5


# ---- copies ----------------------------------------------------------------------------------
def fit_copies(recs: list[Recorded], cal: Calibration) -> None:
    hw = cal.hardware
    rows = []
    for rec in recs:
        sp = rec.spans
        for name in (S.COPY_H2D, S.COPY_D2H):
            c = sp[(sp.name == name) & sp["bytes"].notna()]
            rows += [(name, float(b), float(d)) for b, d in zip(c["bytes"], c.dur)]
    if not rows:
        return
    kind = np.array([r[0] for r in rows])
    nbytes = np.array([r[1] for r in rows])
    X = np.column_stack(
        [np.ones(len(rows)), nbytes * (kind == S.COPY_H2D), nbytes * (kind == S.COPY_D2H)]
    )
    names = ["copy_latency_us", "us_per_byte_h2d", "us_per_byte_d2h"]
    prior = [hw.copy_latency_us, 1e6 / hw.h2d_bandwidth, 1e6 / hw.d2h_bandwidth]
    # a bandwidth term under 1% of the copy time at the prior bandwidth cannot be measured
    y = np.array([r[2] for r in rows])
    fit = linear_fit(X, y, names, prior, min_share=0.01)
    out = outliers(fit.residuals)
    if out.any():
        fit = linear_fit(X[~out], y[~out], names, prior, min_share=0.01)
    hw.copy_latency_us = fit.values["copy_latency_us"]
    if fit.values["us_per_byte_h2d"] > 0:
        hw.h2d_bandwidth = 1e6 / fit.values["us_per_byte_h2d"]
    if fit.values["us_per_byte_d2h"] > 0:
        hw.d2h_bandwidth = 1e6 / fit.values["us_per_byte_d2h"]
    cal.rows.append(Row(label_out("copies", out), int((~out).sum()), fit, dict(zip(names, prior))))


# ---- host ------------------------------------------------------------------------------------
# each step's host-speed factor (1 at the fast level), for a run's steps; None: all at 1
Level = Callable[[Recorded, np.ndarray], np.ndarray]
HOST_PHASES = (S.SCHEDULE, S.PREPARE, S.UPDATE)


# a run's host spans of each phase, by (trace path, phase): built once for a fit's passes
PhaseSpans = dict[tuple[object, str], pd.DataFrame]


def phase_spans(rec: Recorded, phase: str, cache: PhaseSpans | None = None) -> pd.DataFrame:
    """The run's host spans of ``phase`` with what the phase cost reads: step, ts, end, dur,
    requests, tokens (query tokens; for update the sampled ones, as the simulator charges) and
    KV blocks; kept in ``cache`` when given."""
    if cache is not None:
        if (rec.path, phase) not in cache:
            cache[(rec.path, phase)] = phase_spans(rec, phase)
        return cache[(rec.path, phase)]
    sp = rec.spans
    p = sp[(sp.lane == S.HOST) & (sp.name == phase)]
    if phase == S.UPDATE:
        tokens = p.step.map(samples_by_step(rec.forward)).fillna(0).to_numpy()
    else:
        tokens = p.query_tokens.to_numpy()
    cols = {k: p[k].to_numpy() for k in ("step", "ts", "end", "dur", "requests")}
    return pd.DataFrame({**cols, "tokens": tokens, "blocks": span_blocks(rec, p)})


def phase_prediction(cost: PhaseCost, spans: pd.DataFrame) -> np.ndarray:
    """The phase cost of each span (``phase_spans``), us."""
    counts = PhaseCost.counts(spans.requests.to_numpy(), spans.tokens.to_numpy(), spans.blocks)
    return sum(getattr(cost, k) * np.asarray(v, float) for k, v in counts.items())


def phase_table(
    recs: list[Recorded], phase: str, level: Level | None = None, cache: PhaseSpans | None = None
) -> np.ndarray:
    """One row per host span of ``phase`` with a duration: requests, tokens, duration (at the
    fast level: divided by its step's ``level``), trace index, the update index it falls at (the
    stall period is counted in updates), KV blocks."""
    parts = []
    for i, rec in enumerate(recs):
        p = phase_spans(rec, phase, cache)
        sp = rec.spans
        updates = np.sort(sp[(sp.lane == S.HOST) & (sp.name == S.UPDATE)].ts)
        at = np.searchsorted(updates, p.ts.to_numpy())
        dur = p.dur.to_numpy() / (level(rec, p.step.to_numpy()) if level else 1.0)
        cols = [p.requests.to_numpy(), p.tokens.to_numpy(), dur, np.full(len(p), i), at]
        parts.append(np.column_stack([*cols, p.blocks.to_numpy()]))
    data = np.concatenate(parts) if parts else np.empty((0, 6))
    return data[data[:, 2] > 0]


def fit_host_phases(
    recs: list[Recorded],
    cal: Calibration,
    level: Level | None = None,
    slow_factor: float = 1.0,
    cache: PhaseSpans | None = None,
) -> None:
    """Each phase by least squares on its spans at the fast level, robustly: spans far above the
    fit (a garbage collection, an allocator trim) are left out and become the periodic host
    stall, which the simulator charges to every ``stall_every_steps``-th update. A span counts
    as a stall only above ``slow_factor`` x its fit: one the slow level explains (a window
    whose level was read wrong, a switch inside a window) is not a stall."""
    host = cal.hardware.host
    excess: list[float] = []
    where: list[tuple[float, float]] = []  # (trace index, update index) of each stall
    updates = 0
    # the phase cost's own form: one column per coefficient (PhaseCost.counts)
    names = list(PhaseCost.counts(1, 1, 1))
    for phase in HOST_PHASES:
        data = phase_table(recs, phase, level, cache)
        if not len(data):
            continue
        updates += len(data) if phase == S.UPDATE else 0
        cost = getattr(host, phase)
        prior = [getattr(cost, k) for k in names]
        counts = PhaseCost.counts(data[:, 0], data[:, 1], data[:, 5])
        X = np.column_stack([np.broadcast_to(counts[k], (len(data),)) for k in names])
        y = data[:, 2]
        fit = linear_fit(X, y, names, prior)
        pred = X @ np.array([fit.values[k] for k in names])
        over = _stalls(y - pred, y, (slow_factor - 1.0) * pred)
        if over.any():
            fit = linear_fit(X[~over], y[~over], names, prior)
            excess += list((y - X @ np.array([fit.values[k] for k in names]))[over])
            where += [tuple(r) for r in data[over][:, 3:5]]
        setattr(host, phase, dataclasses.replace(cost, **fit.values))
        what = phase + (f" ({over.sum()} stalls out)" if over.any() else "")
        cal.rows.append(Row(what, int((~over).sum()), fit, dict(zip(names, prior))))
    if len(excess) >= 2 and updates:
        fit_stalls(cal, excess, where, updates)


def fit_stalls(
    cal: Calibration, excess: list[float], where: list[tuple[float, float]], updates: int
) -> None:
    """The periodic stall from the host spans left out of the phase fits."""
    host = cal.hardware.host
    prior = {"stall_us": host.stall_us, "stall_every_steps": host.stall_every_steps}
    host.stall_us = float(np.median(excess))
    host.stall_every_steps = _stall_period(where, updates)
    res = np.asarray(excess) / host.stall_us - 1.0
    values = {"stall_us": host.stall_us, "stall_every_steps": float(host.stall_every_steps)}
    fit = Fit(values, dict.fromkeys(values, True), res)
    cal.rows.append(Row("host stalls", len(excess), fit, prior))


def span_blocks(rec: Recorded, spans) -> np.ndarray:
    """KV blocks of each span's batch, as the simulator counts them (CostModel.kv_blocks)."""
    block = rec.config.workload.kv_block_size
    return (spans.kv_tokens.to_numpy() // block + spans.requests.to_numpy()).astype(float)


def _stall_period(where: list[tuple[float, float]], updates: int) -> int:
    """Stalls at a regular spacing (a counter, as the simulator's): the median spacing, in
    updates, within one trace; irregular ones (a garbage collector): their mean rate."""
    gaps = []
    for trace in {w[0] for w in where}:
        at = sorted(w[1] for w in where if w[0] == trace)
        gaps += [g for g in np.diff(at) if g > 0]
    regular = len(gaps) >= 2 and np.std(gaps) <= 0.25 * np.mean(gaps)
    period = float(np.median(gaps)) if regular else updates / len(where)
    return max(int(round(period)), 1)


def _stalls(excess: np.ndarray, y: np.ndarray, allowance: np.ndarray | float = 0.0) -> np.ndarray:
    """Spans far above the fit: more than 10 robust deviations and half the typical span, beyond
    ``allowance`` (what the slow host level adds to each span)."""
    mad = 1.4826 * float(np.median(np.abs(excess - np.median(excess))))
    return excess - allowance > max(10.0 * mad, 0.5 * float(np.median(y)), 1.0)


def trimmed_fit(
    X: np.ndarray, y: np.ndarray, names: list[str], prior: list[float]
) -> tuple[Fit, np.ndarray]:
    """linear_fit robust to a heavy upper tail (a launch that the OS or the allocator held up):
    spans more than 5 robust deviations (and 5%) above the fit are left out, twice. Returns the
    fit and which spans were left out."""
    out = np.zeros(len(y), dtype=bool)
    fit = linear_fit(X, y, names, prior)
    for _ in range(2):
        res = y - X @ np.array([fit.values[k] for k in names])
        mad = 1.4826 * float(np.median(np.abs(res - np.median(res))))
        out = res - np.median(res) > max(5.0 * mad, 0.05 * float(np.median(np.abs(y))), 1e-9)
        if not out.any() or out.all():
            out = np.zeros(len(y), dtype=bool)
            break
        fit = linear_fit(X[~out], y[~out], names, prior)
    return fit, out


@dataclasses.dataclass
class WaitLaunch:
    """The wait and launch spans calibration reads, durations at the fast level (each divided by
    its step's host-speed factor) but the wake's, which is kept with its factor."""

    wake: list[float] = dataclasses.field(default_factory=list)
    wake_factor: list[float] = dataclasses.field(default_factory=list)
    wake_run: list[int] = dataclasses.field(default_factory=list)
    quick: list[float] = dataclasses.field(default_factory=list)
    graph: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    eager: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)
    eager_model: list[str] = dataclasses.field(default_factory=list)  # each eager span's model
    blocked: int = 0


def wait_launch_spans(recs: list[Recorded], depth: int, level: Level | None) -> WaitLaunch:
    out = WaitLaunch()
    for i, rec in enumerate(recs):
        sp = rec.spans
        d2h_end = sp[sp.name == S.COPY_D2H].groupby("step")["end"].max()
        waits = sp[(sp.lane == S.HOST) & (sp.name == S.WAIT)]
        done = waits.step.map(d2h_end).to_numpy()
        blocked = done > waits.ts.to_numpy() + 1e-6
        factor = level(rec, waits.step.to_numpy()) if level else np.ones(len(waits))
        out.wake += list((waits.end.to_numpy() - done)[blocked])
        out.wake_factor += list(factor[blocked])
        out.wake_run += [i] * int(blocked.sum())
        quick = ~blocked & ~np.isnan(done)
        out.quick += list((waits.dur.to_numpy() / factor)[quick])
        fwd = forward_steps(rec).drop_duplicates("step").sort_values("ts")
        kernels, queue_free = step_kernels_and_queue(rec, fwd, depth)
        fwd = fwd.set_index("step")
        launches = sp[(sp.lane == S.HOST) & (sp.name == S.LAUNCH) & sp.step.isin(fwd.index)]
        blocks = span_blocks(rec, launches)
        fast = launches.dur.to_numpy() / (level(rec, launches.step.to_numpy()) if level else 1.0)
        for step, ts, dur, at_fast, nblocks in zip(
            launches.step, launches.ts, launches.dur, fast, blocks
        ):
            if fwd.at[step, "graph"]:
                out.graph.append((at_fast, nblocks))
            elif not launch_blocked(ts, dur, queue_free[step], fwd.at[step, "dur"], depth):
                # as recorded: the speed level is read on the Python phases, which an eager
                # launch does not follow (cbsim/profiling/fresh.py measures its own level)
                out.eager.append((dur, kernels[step], nblocks))
                out.eager_model.append(rec.model_key)
            else:
                out.blocked += 1
    return out


def fit_wake(cal: Calibration, wake: np.ndarray, factor: np.ndarray, run: np.ndarray) -> None:
    """``sync_wake_us``, which the simulator charges times the host-speed factor. The recorded
    wake is a property of the run more than of the level (the H200's recordings: per-run medians 20-35 us,
    45-105 us in a third of the sync runs; x1.4 between the levels where the phases take x2), so
    the point prediction takes its mean over runs (each run's median), divided by the mean
    factor the waits saw: the simulated wake is right on average over runs and levels."""
    host = cal.hardware.host
    prior = host.sync_wake_us
    per_run = np.array([np.median(wake[run == r]) for r in np.unique(run)])
    mean_factor = float(np.mean(factor))
    host.sync_wake_us = max(float(np.mean(per_run)) / mean_factor, 0.0)
    res = (host.sync_wake_us * mean_factor - per_run) / max(float(np.median(per_run)), 1e-9)
    values = {"sync_wake_us": host.sync_wake_us}
    what = "wait (blocked): wake, per run"
    cal.rows.append(
        Row(what, len(per_run), Fit(values, {"sync_wake_us": True}, res), {"sync_wake_us": prior})
    )
    slow = factor > 1.0
    if slow.any() and (~slow).any():
        ratio = float(np.median(wake[slow]) / max(np.median(wake[~slow]), 1e-9))
        cal.notes.append(
            f"sync wake: x{ratio:.2f} at the slow host level against its fast level (the host "
            f"phases: x{float(np.median(factor[slow])):.2f}); sync_wake_us is the mean of the "
            f"runs' median wakes over the mean factor {mean_factor:.3f}"
        )


def fit_wait_launch(recs: list[Recorded], cal: Calibration, level: Level | None = None) -> None:
    """Wake-up after a blocking wait, a non-blocking wait's cost, then the launch body, at the
    host's fast level where ``level`` gives each step's host-speed factor."""
    host = cal.hardware.host
    spans = wait_launch_spans(recs, cal.hardware.gpu.launch_queue_depth, level)
    if spans.quick:
        set_quantile(cal, "wait (not blocked)", np.array(spans.quick), host, "event_us")
    if spans.wake:
        fit_wake(cal, *(np.array(v) for v in (spans.wake, spans.wake_factor, spans.wake_run)))
    enqueue = LAUNCH_COPIES * host.copy_launch_us + LAUNCH_EVENT_OPS * host.event_us
    if spans.graph:
        dur, nblocks = np.array(spans.graph).T
        names = ["graph_launch_us", "launch_per_block_us"]
        prior = [host.graph_launch_us, host.launch_per_block_us]
        X = np.column_stack([np.ones(len(dur)), nblocks])
        fit, out = trimmed_fit(X, dur - enqueue, names, prior)
        host.graph_launch_us = fit.values["graph_launch_us"]
        host.launch_per_block_us = fit.values["launch_per_block_us"]
        what = "launch (graph)" + (f" ({int(out.sum())} slow out)" if out.any() else "")
        cal.rows.append(Row(what, int((~out).sum()), fit, dict(zip(names, prior))))
    if spans.eager:
        dur, kernels, nblocks = np.array(spans.eager).T
        body = dur - enqueue - host.launch_per_block_us * nblocks
        fit_eager_launch(cal, body, kernels, spans.eager_model)
    if spans.blocked:
        cal.notes.append(
            f"{spans.blocked} eager launch(es) ended as the launch queue freed (or, without "
            "a queue depth, lasted a fifth of their forward): the host blocked inside them, not "
            "used for kernel_launch_us"
        )


def fit_eager_launch(
    cal: Calibration, body: np.ndarray, kernels: np.ndarray, models: list[str]
) -> None:
    """``kernel_launch_us``, and ``eager_forward_us`` where the eager forwards are of two model
    shapes or more: over one shape's forwards the kernels of a step hardly vary, and a cost per
    forward trades against the cost per kernel (as forward_fixed_us against the kernel tables)."""
    host = cal.hardware.host
    if len(set(models)) < 2:
        per_kernel = (body - host.eager_forward_us) / kernels
        set_quantile(cal, "launch (eager, /kernel)", per_kernel, host, "kernel_launch_us")
        cal.notes.append(
            "eager_forward_us kept: the eager launches are of one model shape "
            "(profile_machine's extra.model_probes give two)"
        )
        return
    names = ["kernel_launch_us", "eager_forward_us"]
    prior = [host.kernel_launch_us, host.eager_forward_us]
    fit, out = trimmed_fit(np.column_stack([kernels, np.ones(len(body))]), body, names, prior)
    host.kernel_launch_us = fit.values["kernel_launch_us"]
    host.eager_forward_us = fit.values["eager_forward_us"]
    shapes = f", {len(set(models))} model shapes"
    what = "launch (eager)" + (f" ({int(out.sum())} slow out)" if out.any() else "") + shapes
    cal.rows.append(Row(what, int((~out).sum()), fit, dict(zip(names, prior))))


def step_kernels_and_queue(
    rec: Recorded, fwd, depth: int
) -> tuple[dict[int, int], dict[int, float]]:
    """Per step (forward spans in start order): its kernels (graph nodes when replayed; the
    carry-over's own kernel counted), and when the launch queue of ``depth`` entries had room
    for the last of them, as the simulator's LaunchQueue computes it (-inf: never full)."""
    cm = CostModel(rec.config)
    queue = LaunchQueue(depth)
    kernels, free = {}, {}
    for shape, r in zip(step_shapes(fwd, rec.batches), fwd.itertuples()):
        n = cm.step_kernels(shape, shape.kind == "decode" or bool(r.graph)) + bool(r.carry)
        kernels[int(r.step)] = n
        free[int(r.step)] = queue.push(float(r.ts), float(r.end), 1 if r.graph else n)
    return kernels, free


def launch_blocked(ts: float, dur: float, queue_free: float, forward_us: float, depth: int) -> bool:
    """Did an eager launch end because the launch queue freed (it then times the GPU, not the
    host's launch cost)? With no queue depth known (0): one a fifth of its forward or longer."""
    if not depth:
        return dur >= 0.2 * forward_us
    return queue_free >= ts + 0.95 * dur
