"""Calibration of the copies and of the host: phases, stalls, the wait's wake-up, launches.
Each is a linear model of the span's args (cbsim/costs.py charges them so); see calibrate.py."""

from __future__ import annotations

import dataclasses

import numpy as np

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
def phase_table(recs: list[Recorded], phase: str) -> np.ndarray:
    """One row per host span of ``phase`` with a duration: requests, tokens (query tokens; for
    update the sampled ones, as the simulator charges), duration, trace index, the update
    index it falls at (the stall period is counted in updates), KV blocks."""
    parts = []
    for i, rec in enumerate(recs):
        sp = rec.spans
        p = sp[(sp.lane == S.HOST) & (sp.name == phase)]
        if phase == S.UPDATE:
            tokens = p.step.map(samples_by_step(rec.forward)).fillna(0).to_numpy()
        else:
            tokens = p.query_tokens.to_numpy()
        updates = np.sort(sp[(sp.lane == S.HOST) & (sp.name == S.UPDATE)].ts)
        at = np.searchsorted(updates, p.ts.to_numpy())
        cols = [p.requests.to_numpy(), tokens, p.dur.to_numpy(), np.full(len(p), i), at]
        parts.append(np.column_stack([*cols, span_blocks(rec, p)]))
    data = np.concatenate(parts) if parts else np.empty((0, 6))
    return data[data[:, 2] > 0]


def fit_host_phases(recs: list[Recorded], cal: Calibration) -> None:
    """Each phase by least squares on its spans, robustly: spans far above the fit (a garbage
    collection, an allocator trim) are left out and become the periodic host stall, which the
    simulator charges to every ``stall_every_steps``-th update."""
    host = cal.hardware.host
    excess: list[float] = []
    where: list[tuple[float, float]] = []  # (trace index, update index) of each stall
    updates = 0
    # the phase cost's own form: one column per coefficient (PhaseCost.counts)
    names = list(PhaseCost.counts(1, 1, 1))
    for phase in (S.SCHEDULE, S.PREPARE, S.UPDATE):
        data = phase_table(recs, phase)
        if not len(data):
            continue
        updates += len(data) if phase == S.UPDATE else 0
        cost = getattr(host, phase)
        prior = [getattr(cost, k) for k in names]
        counts = PhaseCost.counts(data[:, 0], data[:, 1], data[:, 5])
        X = np.column_stack([np.broadcast_to(counts[k], (len(data),)) for k in names])
        y = data[:, 2]
        fit = linear_fit(X, y, names, prior)
        over = _stalls(y - X @ np.array([fit.values[k] for k in names]), y)
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


def _stalls(excess: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spans far above the fit: more than 10 robust deviations and half the typical span."""
    mad = 1.4826 * float(np.median(np.abs(excess - np.median(excess))))
    return excess > max(10.0 * mad, 0.5 * float(np.median(y)), 1.0)


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


def fit_wait_launch(recs: list[Recorded], cal: Calibration) -> None:
    """Wake-up after a blocking wait, a non-blocking wait's cost, then the launch body."""
    host = cal.hardware.host
    wake, quick, graph_launch, eager_launch = [], [], [], []
    blocked_launches = 0
    for rec in recs:
        sp = rec.spans
        d2h_end = sp[sp.name == S.COPY_D2H].groupby("step")["end"].max()
        waits = sp[(sp.lane == S.HOST) & (sp.name == S.WAIT)]
        done = waits.step.map(d2h_end).to_numpy()
        blocked = done > waits.ts.to_numpy() + 1e-6
        wake += list((waits.end.to_numpy() - done)[blocked])
        quick += list(waits.dur.to_numpy()[~blocked & ~np.isnan(done)])
        fwd = forward_steps(rec).drop_duplicates("step").sort_values("ts")
        depth = cal.hardware.gpu.launch_queue_depth
        kernels, queue_free = step_kernels_and_queue(rec, fwd, depth)
        fwd = fwd.set_index("step")
        launches = sp[(sp.lane == S.HOST) & (sp.name == S.LAUNCH) & sp.step.isin(fwd.index)]
        blocks = span_blocks(rec, launches)
        for step, ts, dur, nblocks in zip(launches.step, launches.ts, launches.dur, blocks):
            if fwd.at[step, "graph"]:
                graph_launch.append((dur, nblocks))
            elif not launch_blocked(ts, dur, queue_free[step], fwd.at[step, "dur"], depth):
                eager_launch.append((dur, kernels[step], nblocks))
            else:
                blocked_launches += 1
    if quick:
        set_quantile(cal, "wait (not blocked)", np.array(quick), host, "event_us")
    if wake:
        set_quantile(cal, "wait (blocked): wake", np.array(wake), host, "sync_wake_us")
    enqueue = LAUNCH_COPIES * host.copy_launch_us + LAUNCH_EVENT_OPS * host.event_us
    if graph_launch:
        dur, nblocks = np.array(graph_launch).T
        names = ["graph_launch_us", "launch_per_block_us"]
        prior = [host.graph_launch_us, host.launch_per_block_us]
        X = np.column_stack([np.ones(len(dur)), nblocks])
        fit, out = trimmed_fit(X, dur - enqueue, names, prior)
        host.graph_launch_us = fit.values["graph_launch_us"]
        host.launch_per_block_us = fit.values["launch_per_block_us"]
        what = "launch (graph)" + (f" ({int(out.sum())} slow out)" if out.any() else "")
        cal.rows.append(Row(what, int((~out).sum()), fit, dict(zip(names, prior))))
    if eager_launch:
        dur, kernels, nblocks = np.array(eager_launch).T
        body = dur - enqueue - host.launch_per_block_us * nblocks
        set_quantile(cal, "launch (eager, /kernel)", body / kernels, host, "kernel_launch_us")
    if blocked_launches:
        cal.notes.append(
            f"{blocked_launches} eager launch(es) ended as the launch queue freed (or, without "
            "a queue depth, lasted a fifth of their forward): the host blocked inside them, not "
            "used for kernel_launch_us"
        )


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
