"""Fit the simulator's cost model (cbsim/costs.py) to recorded traces.

Every fitted number is a HardwareConfig field, and every prediction goes through the simulator's
own ``CostModel``, so plugging the profile back in reproduces what was fitted:

- forward pass (compute-lane ``forward`` / ``graph_replay`` spans): ``CostModel.forward`` is a sum
  of rooflines (linear layers, LM head, attention) plus ``forward_fixed_us`` and a gap per kernel;
  its efficiencies, the fixed cost, the carry-over and the kernel gaps are fitted by bounded
  Gauss-Newton on relative residuals (decode and prefill steps);
- copies: ``copy_latency_us + bytes / bandwidth`` (h2d and d2h share the latency);
- host phases: ``fixed + per_request x requests + per_token x tokens`` (tokens: query tokens for
  schedule and prepare, sampled tokens for update, as the simulator charges them);
- launch: one ``graph_launch_us`` (or ``kernel_launch_us`` per kernel) plus the copy and event
  enqueues; wait: ``sync_wake_us`` after the awaited D2H ends, ``event_us`` when nothing is
  pending; carry-over: its span.

A term the traces cannot tell apart from others (collinear, or too small to see) keeps the base
profile's value and the table says "kept".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cbsim.config.schema import HardwareConfig
from cbsim.costs import CostModel
from cbsim.trace import schema as S
from cbsim.validation.fit import Fit, curve_fit, linear_fit
from cbsim.validation.traces import Recorded, forward_steps, gpu_lane, samples_by_step

# what SimEngine.launch enqueues per step besides the forward: two copies (H2D, D2H) and five
# event operations (record h2d_done, wait on it, record compute_done, wait on it, record d2h_done)
LAUNCH_COPIES, LAUNCH_EVENT_OPS = 2, 5
# forward steps used per trace (evenly spaced; every non-decode step is kept up to this too)
MAX_FORWARD_SAMPLES = 240
EFFS = ("gemm_bandwidth_eff", "attention_bandwidth_eff", "gemm_flops_eff", "attention_flops_eff")
# in this order: with one kernel count per step kind, the graph gap is collinear with the fixed
# cost and the carry-over, so it keeps its prior (the kernel gaps show in a Kineto trace, not here).
# Any other float term of GpuCosts (one the cost model gains later) is fitted too, before the gaps.
GPU_FIRST = ("forward_fixed_us", "carry_over_us")
GPU_LAST = ("eager_kernel_gap_us", "graph_node_gap_us")
# an efficiency may come out above 1 (a kernel beating the measured copy bandwidth): the fit lets
# it, and then raises the ceiling (hbm_bandwidth / peak_flops) so the efficiencies stay in (0, 1]
MAX_EFF = 20.0


def gpu_terms(gpu) -> list[str]:
    """The GpuCosts float fields the forward fit works on, in order of priority."""
    floats = [f.name for f in dataclasses.fields(gpu) if isinstance(getattr(gpu, f.name), float)]
    middle = [k for k in floats if k not in (*EFFS, *GPU_FIRST, *GPU_LAST)]
    return [k for k in (*GPU_FIRST, *middle, *GPU_LAST) if k in floats]


@dataclass
class Row:
    """One line of the residuals table: a group of terms fitted on the same spans."""

    what: str
    samples: int
    fit: Fit
    prior: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "samples": self.samples,
            "rms_pct": self.fit.rms_pct,
            "max_pct": self.fit.max_pct,
            "terms": {
                k: {"value": v, "prior": self.prior.get(k), "fitted": self.fit.fitted[k]}
                for k, v in self.fit.values.items()
            },
        }


@dataclass
class Calibration:
    hardware: HardwareConfig
    rows: list[Row] = field(default_factory=list)
    traces: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"{'spans':<22}{'n':>6}{'rms %':>8}{'max %':>8}  terms (fitted | kept=prior)"]
        for r in self.rows:
            terms = ", ".join(
                f"{k}={_fmt(v)}" + ("" if r.fit.fitted[k] else " (kept)")
                for k, v in r.fit.values.items()
            )
            lines.append(
                f"{r.what:<22}{r.samples:>6}{r.fit.rms_pct:>8.2f}{r.fit.max_pct:>8.2f}  {terms}"
            )
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def as_dict(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "notes": self.notes,
            "rows": [r.as_dict() for r in self.rows],
            "hardware": dataclasses.asdict(self.hardware),
        }


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def calibrate(recs: list[Recorded], base: HardwareConfig, name: str | None = None) -> Calibration:
    """Fit every term the traces determine, starting from (and falling back to) ``base``."""
    hw = dataclasses.replace(
        base, host=dataclasses.replace(base.host), gpu=dataclasses.replace(base.gpu)
    )
    if name:
        hw.name = name
    cal = Calibration(hw, traces=[str(r.path) for r in recs])
    fit_forward(recs, cal)
    fit_copies(recs, cal)
    fit_host_phases(recs, cal)
    fit_wait_launch(recs, cal)
    return cal


# ---- forward ---------------------------------------------------------------------------------
class StepShape:
    """What CostModel.forward reads from a scheduler Batch: the replayed batch's per-request
    lengths when known (``Recorded.batches``), else the span's totals shared evenly over the
    requests (exact for decode, an approximation for prefill)."""

    def __init__(
        self,
        requests: int,
        query_tokens: int,
        kv_tokens: int,
        samples: int,
        kind: str,
        lens: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.n = requests
        self.query_tokens, self.kv_tokens, self.num_samples = query_tokens, kv_tokens, samples
        self.kind = kind
        if lens is not None:
            self.query_lens, self.context_lens = lens
        else:
            self.query_lens = _even(query_tokens, requests)
            self.context_lens = _even(kv_tokens, requests)

    def __len__(self) -> int:
        return self.n


def _even(total: int, n: int) -> np.ndarray:
    base = np.full(n, total // n, dtype=np.int64)
    base[: total - base.sum()] += 1
    return base


def _forward_samples(rec: Recorded) -> pd.DataFrame:
    """Steps evenly spaced over the run: decode steps, and every other step whose per-request
    split is known (replayed) or does not matter (a prefill split evenly is exact when all its
    prompts are equal; otherwise an approximation); a mixed step without it is left out, its
    attention FLOPs depend on the split."""
    fwd = forward_steps(rec).sort_values("step")
    known = fwd.step.isin(list(rec.batches))
    fwd = fwd[(known | fwd.kind.isin(("decode", "prefill"))) & ~host_bound(rec, fwd)]
    if len(fwd) > MAX_FORWARD_SAMPLES:
        other = fwd[fwd.kind != "decode"].head(MAX_FORWARD_SAMPLES // 4)
        dec = fwd[fwd.kind == "decode"]
        idx = np.linspace(0, len(dec) - 1, MAX_FORWARD_SAMPLES - len(other)).round().astype(int)
        fwd = pd.concat([other, dec.iloc[np.unique(idx)]])
    return fwd


def host_bound(rec: Recorded, fwd: pd.DataFrame) -> pd.Series:
    """Eager forwards whose launch took at least half the forward's span: the span then times
    the host feeding kernels (or blocking inside the launch), not the GPU's work."""
    sp = rec.spans
    launch = sp[(sp.lane == S.HOST) & (sp.name == S.LAUNCH)].groupby("step")["dur"].max()
    return ~fwd.graph & (fwd.step.map(launch).fillna(0) >= 0.5 * fwd.dur)


def fit_forward(recs: list[Recorded], cal: Calibration) -> None:
    data = []
    for rec in recs:
        fwd = _forward_samples(rec)
        shapes = [
            (
                StepShape(
                    int(r.requests),
                    int(r.query_tokens),
                    int(r.kv_tokens),
                    int(r.new_tokens),
                    r.kind,
                    rec.batches.get(int(r.step)),
                ),
                bool(r.graph),
                bool(r.carry),
                bool(r.carry_span),
            )
            for r in fwd.itertuples()
        ]
        if shapes:
            data.append((rec, shapes, fwd.dur.to_numpy()))
    if not data:
        return
    hw = cal.hardware
    terms = gpu_terms(hw.gpu)
    names = [*EFFS, *terms]
    # efficiencies are fitted as their inverse (time per unit of work is linear in it)
    theta0 = [1.0 / getattr(hw.gpu, k) for k in EFFS] + [getattr(hw.gpu, k) for k in terms]
    lower = [1.0 / MAX_EFF] * len(EFFS) + [0.0] * len(terms)
    upper = [1e3] * len(EFFS) + [1e6] * len(terms)

    def gpu_of(theta: np.ndarray):
        # unchecked: an efficiency above 1 is allowed while fitting (see MAX_EFF)
        g = dataclasses.replace(hw.gpu)
        for i, k in enumerate(EFFS):
            object.__setattr__(g, k, 1.0 / theta[i])
        for i, k in enumerate(terms):
            object.__setattr__(g, k, float(theta[len(EFFS) + i]))
        return g

    def model(theta: np.ndarray) -> np.ndarray:
        g = gpu_of(theta)
        out = []
        for rec, shapes, _ in data:
            cfg = dataclasses.replace(rec.config, hardware=_unchecked(hw, gpu=g))
            cm = CostModel(cfg)
            for shape, graph, carry, own_span in shapes:
                padded = cm.graph_size(len(shape)) if graph else None
                f = cm.forward(shape, graph=graph, carry_over=carry, padded_requests=padded)
                out.append(f.total_us - (f.carry_over_us if own_span else 0.0))
        return np.asarray(out)

    y = np.concatenate([d[2] for d in data])
    prior = dict(zip(names, [getattr(hw.gpu, k) for k in names]))
    fit = curve_fit(model, y, theta0, names, lower, upper)
    out = outliers(fit.residuals)
    if out.any():  # a forward far off the fit (a clock hiccup, a one-off recompile): left out
        fit = curve_fit(
            lambda t: model(t)[~out], y[~out], [fit.values[k] for k in names], names, lower, upper
        )
    hw.gpu = gpu_of(np.array([fit.values[k] for k in names]))
    ceilings = _raise_ceilings(hw)
    fit.values = {k: getattr(hw.gpu, k) for k in names}
    cal.rows.append(Row(_label("forward", out), int((~out).sum()), fit, prior))
    if ceilings:
        cal.rows.append(
            Row(
                "roofline ceilings",
                int((~out).sum()),
                Fit(ceilings, dict.fromkeys(ceilings, True), fit.residuals),
                {k: getattr(cal.hardware, k) for k in ceilings},
            )
        )
        for k, v in ceilings.items():
            setattr(hw, k, v)

    carry = pd.concat(
        [
            r.spans[(r.spans.lane == gpu_lane(r.spans)) & (r.spans.name == S.CARRY_OVER)]
            for r in recs
        ]
    )
    if len(carry):
        _set_median(cal, "carry_over", carry.dur.to_numpy(), hw.gpu, "carry_over_us")


def _unchecked(hw: HardwareConfig, **changes: Any) -> HardwareConfig:
    new = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu))
    for k, v in changes.items():
        object.__setattr__(new, k, v)
    return new


def _raise_ceilings(hw: HardwareConfig) -> dict[str, float]:
    """Efficiencies above 1: raise hbm_bandwidth / peak_flops to the fastest achieved rate and
    scale the efficiencies down, predictions unchanged. Returns the raised ceilings."""
    out = {}
    for ceiling, effs in (
        ("hbm_bandwidth", ("gemm_bandwidth_eff", "attention_bandwidth_eff")),
        ("peak_flops", ("gemm_flops_eff", "attention_flops_eff")),
    ):
        top = max(getattr(hw.gpu, k) for k in effs)
        if top > 1.0:
            out[ceiling] = getattr(hw, ceiling) * top
            for k in effs:
                object.__setattr__(hw.gpu, k, getattr(hw.gpu, k) / top)
    return out


def _set_median(
    cal: Calibration,
    what: str,
    y: np.ndarray,
    obj: Any,
    attr: str,
    offset: float = 0.0,
    per: float = 1.0,
    q: float = 50.0,
) -> None:
    """obj.attr = (percentile q of y - offset) / per: a term that is one constant per span."""
    prior = getattr(obj, attr)
    value = max((float(np.percentile(y, q)) - offset) / per, 0.0)
    setattr(obj, attr, value)
    # relative to the typical span: a wake-up of ~0 us would make a relative error meaningless
    res = (value * per + offset - y) / max(float(np.median(np.abs(y))), 1e-9)
    cal.rows.append(Row(what, len(y), Fit({attr: value}, {attr: True}, res), {attr: prior}))


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
    cal.rows.append(Row(_label("copies", out), int((~out).sum()), fit, dict(zip(names, prior))))


def outliers(rel: np.ndarray) -> np.ndarray:
    """Samples whose relative residual is more than 10 robust deviations (and 5%) from the
    median; none when that would be over a fifth of the data (then the model is what is off)."""
    dev = np.abs(rel - np.median(rel))
    mad = 1.4826 * float(np.median(dev))
    out = dev > max(10.0 * mad, 0.05)
    return out if out.sum() <= 0.2 * len(rel) else np.zeros(len(rel), dtype=bool)


def _label(what: str, out: np.ndarray) -> str:
    return f"{what} ({int(out.sum())} outliers out)" if out.any() else what


# ---- host ------------------------------------------------------------------------------------
def fit_host_phases(recs: list[Recorded], cal: Calibration) -> None:
    """Each phase by least squares on its spans, robustly: spans far above the fit (a garbage
    collection, an allocator trim) are left out and become the periodic host stall, which the
    simulator charges to every ``stall_every_steps``-th update."""
    host = cal.hardware.host
    excess: list[float] = []
    where: list[tuple[float, float]] = []  # (trace index, update index) of each stall
    updates = 0
    for phase in (S.SCHEDULE, S.PREPARE, S.UPDATE):
        parts = []
        for i, rec in enumerate(recs):
            sp = rec.spans
            p = sp[(sp.lane == S.HOST) & (sp.name == phase)]
            if phase == S.UPDATE:
                tokens = p.step.map(samples_by_step(rec)).fillna(0).to_numpy()
            else:
                tokens = p.query_tokens.to_numpy()
            # the update index each span falls at (the stall period is counted in updates)
            at = np.searchsorted(
                np.sort(sp[(sp.lane == S.HOST) & (sp.name == S.UPDATE)].ts), p.ts.to_numpy()
            )
            parts.append(
                np.column_stack(
                    [p.requests.to_numpy(), tokens, p.dur.to_numpy(), np.full(len(p), i), at]
                )
            )
        data = np.concatenate(parts) if parts else np.empty((0, 5))
        data = data[data[:, 2] > 0]
        if not len(data):
            continue
        updates += len(data) if phase == S.UPDATE else 0
        cost = getattr(host, phase)
        names = ["fixed_us", "per_request_us", "per_token_us"]
        prior = [getattr(cost, k) for k in names]
        X = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
        y = data[:, 2]
        fit = linear_fit(X, y, names, prior)
        over = _stalls(y - X @ np.array([fit.values[k] for k in names]), y)
        if over.any():
            fit = linear_fit(X[~over], y[~over], names, prior)
            excess += list((y - X @ np.array([fit.values[k] for k in names]))[over])
            where += [tuple(r) for r in data[over][:, 3:5]]
        setattr(host, phase, dataclasses.replace(cost, **fit.values))
        cal.rows.append(
            Row(
                phase + (f" ({over.sum()} stalls out)" if over.any() else ""),
                int((~over).sum()),
                fit,
                dict(zip(names, prior)),
            )
        )
    if len(excess) >= 2 and updates:
        prior = {"stall_us": host.stall_us, "stall_every_steps": host.stall_every_steps}
        host.stall_us = float(np.median(excess))
        host.stall_every_steps = _stall_period(where, updates)
        res = np.asarray(excess) / host.stall_us - 1.0
        values = {"stall_us": host.stall_us, "stall_every_steps": float(host.stall_every_steps)}
        cal.rows.append(
            Row("host stalls", len(excess), Fit(values, dict.fromkeys(values, True), res), prior)
        )


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
        fwd = forward_steps(rec).drop_duplicates("step").set_index("step")
        launches = sp[(sp.lane == S.HOST) & (sp.name == S.LAUNCH) & sp.step.isin(fwd.index)]
        cm = CostModel(rec.config)
        for step, dur in zip(launches.step, launches.dur):
            if fwd.at[step, "graph"]:
                graph_launch.append(dur)
            elif dur < 0.2 * fwd.at[step, "dur"]:
                # a launch a fifth of the forward or longer blocked inside (the eager path
                # synchronised with the GPU): it times the GPU, not the host's launch cost
                eager_launch.append((dur, cm.kernels + bool(fwd.at[step, "carry"])))
            else:
                blocked_launches += 1
    if quick:
        _set_median(cal, "wait (not blocked)", np.array(quick), host, "event_us")
    if wake:
        _set_median(cal, "wait (blocked): wake", np.array(wake), host, "sync_wake_us")
    enqueue = LAUNCH_COPIES * host.copy_launch_us + LAUNCH_EVENT_OPS * host.event_us
    if graph_launch:
        _set_median(
            cal, "launch (graph)", np.array(graph_launch), host, "graph_launch_us", offset=enqueue
        )
    if eager_launch:
        dur, kernels = np.array(eager_launch).T
        _set_median(
            cal, "launch (eager, /kernel)", (dur - enqueue) / kernels, host, "kernel_launch_us"
        )
    if blocked_launches:
        cal.notes.append(
            f"{blocked_launches} eager launch(es) lasted a fifth of their forward or more (the host "
            "blocked inside them): not used for kernel_launch_us"
        )
