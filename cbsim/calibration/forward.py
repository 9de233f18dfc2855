"""The forward pass's fit: the cost model's GPU terms (efficiencies, fixed cost, carry-over and
whatever float term GpuCosts gains) fitted to compute-lane forward spans by bounded Gauss-Newton
on relative residuals, every prediction through the simulator's own ``CostModel.forward``."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cbsim.calibration.fit import Fit, curve_fit
from cbsim.calibration.options import FitOptions
from cbsim.calibration.recordings import Recorded, forward_steps
from cbsim.calibration.result import Calibration, Row, label_out, outliers, set_quantile
from cbsim.calibration.steps import gpu_lane, step_shapes
from cbsim.config.schema import HardwareConfig
from cbsim.costs import CostModel
from cbsim.costs.step_tables import StepMemo
from cbsim.trace import schema as S

EFFS = ("gemm_bandwidth_eff", "attention_bandwidth_eff", "gemm_flops_eff", "attention_flops_eff")
# Fitted in this order; any other float term of GpuCosts (one the cost model gains later) too.
# The per-kernel gaps are not fitted: a forward span's time per kernel cannot be told from its
# per-step and per-token costs when the steps of a kind share a kernel count or a token count
# (the eager gap then absorbs a long prefill's elementwise traffic); a Kineto trace measures
# them directly (kernel_busy_us per forward, conf/hardware/<device>.yaml).
GPU_FIRST = ("forward_fixed_us", "carry_over_us")
# the cost per forward, told from the per-kernel terms (the tables' scale, the efficiencies) only
# by forwards of two model shapes or more: over one shape's, the two trade against each other
# (the H100's 8B-only probes fitted 549 us against a table scale of x0.83, which predicted the
# held-out 1B's decode 18% long and the 3B's prefill 30% long), so one shape keeps the base's
PER_FORWARD = "forward_fixed_us"
GPU_LAST = ("eager_kernel_gap_us", "graph_node_gap_us")
# idle_slowdown is fitted only when at least this share of the forwards followed an idle compute
# stream (a sync run): more than IDLE_SEEN_US of idle
IDLE_SEEN_SHARE, IDLE_SEEN_US = 0.1, 50.0
# an efficiency may come out above 1 (a kernel beating the measured copy bandwidth): the fit lets
# it, and then raises the ceiling (hbm_bandwidth / peak_flops) so the efficiencies stay in (0, 1]
MAX_EFF = 20.0
# an efficiency whose roofline is this share of a forward span in fewer than that many forwards
# cannot be told from the fit's noise (about 1.5% rms) and keeps its starting (measured) value
VISIBLE_SHARE, VISIBLE_MIN_FORWARDS = 0.05, 4
# Held near its starting value throughout (a measurement): attention FLOPs, which a set without
# long prompts hardly sees; the flash kernel's measured rate is the better guess until it has them
ANCHORED = ("attention_flops_eff",)
# an efficiency that ran to its bound keeps its prior if the fit's squared residuals grow by less
# than this factor with it there
UNBOUNDED_TOLERANCE = 1.02
# terms that are shares of a kernel's time: fitted within [0, this]
SHARES = {"attention_tile_share": 1.0}
# measured on the device, never fitted: the tile share's fall with the batch's tile bytes and,
# once that fall is measured (> 0), the share itself (experiments/kernels/h200_probe)
TILE_MEASURED = ("attention_tile_share_bytes", "attention_tile_share")
# measured from recorded steps by their own analysis (a diagnostic over the H200's recordings)
UNEVEN_MEASURED = ("decode_uneven_share",)
# (shape, replayed as a graph, carry-over ran, carry-over in a span of its own, idle before)
Sample = tuple[Any, bool, bool, bool, float]


def gpu_terms(gpu) -> list[str]:
    """The GpuCosts float fields the forward fit works on, in order of priority."""
    floats = [f.name for f in dataclasses.fields(gpu) if isinstance(getattr(gpu, f.name), float)]
    middle = [k for k in floats if k not in (*EFFS, *GPU_FIRST, *GPU_LAST)]
    return [k for k in (*GPU_FIRST, *middle, *GPU_LAST) if k in floats]


def forward_samples(rec: Recorded, max_samples: int) -> pd.DataFrame:
    """Steps evenly spaced over the run: decode steps, and every other step whose per-request
    split is known (replayed) or does not matter (a prefill split evenly is exact when all its
    prompts are equal; otherwise an approximation); a mixed step without it is left out, its
    attention FLOPs depend on the split. Non-decode steps take up to a quarter of the samples."""
    fwd = forward_steps(rec).sort_values("step")
    known = fwd.step.isin(list(rec.batches))
    fwd["idle"] = compute_idle(rec, fwd, fwd.ts.to_numpy())
    fwd = fwd[(known | fwd.kind.isin(("decode", "prefill"))) & ~host_bound(rec, fwd)]
    if len(fwd) > max_samples:
        other = fwd[fwd.kind != "decode"].head(max_samples // 4)
        dec = fwd[fwd.kind == "decode"]
        idx = np.linspace(0, len(dec) - 1, max_samples - len(other)).round().astype(int)
        fwd = pd.concat([other, dec.iloc[np.unique(idx)]])
    return fwd


def compute_idle(rec: Recorded, fwd: pd.DataFrame, start: np.ndarray) -> np.ndarray:
    """Per forward span, how long the compute lane sat idle before ``start`` (0 for the first),
    as the simulator measures it when charging ``idle_slowdown``."""
    sp = rec.spans
    lane = sp[sp.lane == gpu_lane(sp)].sort_values("ts")
    ends = np.maximum.accumulate(lane.end.to_numpy())
    starts = lane.ts.to_numpy()
    # the latest end among the lane's spans that started before this forward
    at = np.searchsorted(starts, fwd.ts.to_numpy(), side="left") - 1
    prev = np.where(at >= 0, ends[np.maximum(at, 0)], np.nan)
    idle = start - prev
    return np.where(np.isfinite(idle) & (idle > 0), idle, 0.0)


def host_bound(rec: Recorded, fwd: pd.DataFrame) -> pd.Series:
    """Eager forwards whose launch took at least half the forward's span, or (a Kineto import)
    whose kernels kept the GPU busy for less than half of it (a first step's one-off set-up):
    the span then times the host feeding kernels (or blocking inside the launch), not the GPU's
    work."""
    sp = rec.spans
    launch = sp[(sp.lane == S.HOST) & (sp.name == S.LAUNCH)].groupby("step")["dur"].max()
    idle = fwd.kernel_busy_us < 0.5 * fwd.dur if "kernel_busy_us" in fwd else False
    return ~fwd.graph & ((fwd.step.map(launch).fillna(0) >= 0.5 * fwd.dur) | idle)


@dataclass
class ForwardProblem:
    """The forward spans of a calibration set and the model that predicts them from theta: the
    inverse efficiencies (time per unit of work is linear in them), then the other GPU terms."""

    hw: HardwareConfig
    data: list[tuple[Recorded, list[Sample], np.ndarray]]
    terms: list[str]
    # each run's first CostModel: what no fitted term moves (its steps' shapes, the kernel
    # table's lookups), worked out once
    _models: dict[int, CostModel] = field(default_factory=dict, repr=False)

    @property
    def names(self) -> list[str]:
        return [*EFFS, *self.terms]

    @property
    def y(self) -> np.ndarray:
        return np.concatenate([d[2] for d in self.data])

    def theta0(self) -> list[float]:
        g = self.hw.gpu
        return [1.0 / getattr(g, k) for k in EFFS] + [getattr(g, k) for k in self.terms]

    def bounds(self) -> tuple[list[float], list[float]]:
        n = len(self.terms)
        upper = [SHARES.get(k, 1e6) for k in self.terms]
        return [1.0 / MAX_EFF] * len(EFFS) + [0.0] * n, [1e3] * len(EFFS) + upper

    def gpu_of(self, theta: np.ndarray):
        """The GpuCosts of theta, unchecked: an efficiency above 1 is allowed while fitting."""
        g = dataclasses.replace(self.hw.gpu)
        for i, k in enumerate(EFFS):
            object.__setattr__(g, k, 1.0 / theta[i])
        for i, k in enumerate(self.terms):
            object.__setattr__(g, k, float(theta[len(EFFS) + i]))
        return g

    def model(self, theta: np.ndarray) -> np.ndarray:
        hw = _unchecked(self.hw, gpu=self.gpu_of(theta))
        out = []
        for i, (_, shapes, _) in enumerate(self.data):
            cm = self.cost_model(i, hw)
            for shape, graph, carry, own_span, idle in shapes:
                padded, bucket = cm.graph_padding(shape) if graph else (None, None)
                f = cm.forward(
                    shape,
                    graph=graph,
                    carry_over=carry,
                    padded_requests=padded,
                    padded_tokens=bucket,
                )
                slow = cm.idle_slowdown_us(idle) if idle else 0.0
                out.append(f.total_us + slow - (f.carry_over_us if own_span else 0.0))
        return np.asarray(out)

    def cost_model(self, i: int, hw: HardwareConfig) -> CostModel:
        """Run ``i``'s CostModel under ``hw``: like its first one, which keeps its sampled steps'
        shapes and kernel lookups."""
        rec, shapes, _ = self.data[i]
        first = self._models.get(i)
        cm = CostModel(dataclasses.replace(rec.config, hardware=hw), like=first)
        if first is None:
            cm.memo = StepMemo(len(shapes))
            self._models[i] = cm
        return cm


def forward_problem(recs: list[Recorded], cal: Calibration, options: FitOptions):
    """The sampled forwards of every run, or None when there are none."""
    data = []
    for rec in recs:
        fwd = forward_samples(rec, options.forward_samples)
        shapes = [
            (shape, bool(r.graph), bool(r.carry), bool(r.carry_span), float(r.idle))
            for shape, r in zip(step_shapes(fwd, rec.batches), fwd.itertuples())
        ]
        if shapes:
            data.append((rec, shapes, fwd.dur.to_numpy()))
    if not data:
        return None
    idle = np.concatenate([[s[-1] for s in d[1]] for d in data])
    if np.mean(idle > IDLE_SEEN_US) < IDLE_SEEN_SHARE:
        # a stream that hardly ever idles (async runs only) cannot tell what idling costs: the
        # few idle forwards left (the first decode after a prefill) would fit their noise
        data = [(rec, [(*s[:-1], 0.0) for s in shapes], y) for rec, shapes, y in data]
        cal.notes.append(
            f"fewer than {IDLE_SEEN_SHARE:.0%} of the forwards followed {IDLE_SEEN_US:.0f} us of "
            "compute idle: idle_slowdown kept"
        )
    cal.notes.append(
        "eager_kernel_gap_us, graph_node_gap_us kept: the GPU's gap between kernels is measured "
        "from a Kineto trace (kernel_busy_us per forward), not from event-timed spans"
    )
    if cal.hardware.gpu.attention_tile_share_bytes > 0:
        cal.notes.append("attention_tile_share kept: measured with its fall over the batch")
    terms = fitted_terms(cal.hardware.gpu)
    if len({rec.model_key for rec, _, _ in data}) < 2 and PER_FORWARD in terms:
        terms.remove(PER_FORWARD)
        cal.notes.append(
            f"{PER_FORWARD} kept: the forwards are of one model shape, over which a cost per "
            "forward trades against the per-kernel terms (profile_machine's extra.model_probes "
            "give two)"
        )
    return ForwardProblem(cal.hardware, data, terms)


def fitted_terms(gpu) -> list[str]:
    """The GPU terms the forward fit moves: not the per-kernel gaps, nor what was measured."""
    measured = TILE_MEASURED if gpu.attention_tile_share_bytes > 0 else TILE_MEASURED[:1]
    return [t for t in gpu_terms(gpu) if t not in (*GPU_LAST, *measured, *UNEVEN_MEASURED)]


class ForwardFit:
    """Fits of one ForwardProblem from several starts, all pulled towards the starting profile
    wherever the data leaves a term open."""

    def __init__(self, prob: ForwardProblem, cal: Calibration):
        self.prob, self.names, self.y = prob, prob.names, prob.y
        self.theta0 = prob.theta0()
        self.lower, self.upper = prob.bounds()
        self._pin_invisible(cal)

    def _pin_invisible(self, cal: Calibration) -> None:
        """An efficiency whose roofline is a small share of every forward here cannot be
        measured from these spans: it keeps the starting (measured) value."""
        m0 = self.prob.model(np.asarray(self.theta0))
        for i, k in enumerate(self.names):
            if k not in EFFS:
                continue
            t = np.asarray(self.theta0, float).copy()
            t[i] *= 1.01
            share = np.abs(self.prob.model(t) - m0) / 0.01 / self.y
            if np.count_nonzero(share >= VISIBLE_SHARE) < VISIBLE_MIN_FORWARDS:
                self.lower[i] = self.upper[i] = self.theta0[i]
                cal.notes.append(
                    f"{k} kept: {VISIBLE_SHARE:.0%} or more of a forward in fewer than "
                    f"{VISIBLE_MIN_FORWARDS} forwards here"
                )

    def run(self, start, keep=None, lo=None, hi=None, anchored=ANCHORED) -> Fit:
        """One fit from ``start`` over the forwards in ``keep`` (all by default)."""
        lo, hi = lo or self.lower, hi or self.upper
        model, y = self.prob.model, self.y
        if keep is not None:
            y = y[keep]

            def model(t, _m=self.prob.model):
                return _m(t)[keep]

        return curve_fit(model, y, start, self.names, lo, hi, anchored=anchored, prior=self.theta0)

    def values(self, fit: Fit) -> list[float]:
        return [fit.values[k] for k in self.names]


def _sse(fit: Fit) -> float:
    return float(np.sum(fit.residuals**2))


def best_of_starts(ff: ForwardFit, starts: int) -> Fit:
    """Gauss-Newton over rooflines can end in a poor basin (an efficiency gone so high its
    roofline never binds, the weights' read folded into a fixed cost). With ``starts`` > 1, up to
    two more starts, the better fit kept: the prior efficiencies with the other terms where the
    first fit left them, and the end of a fit that held the efficiencies near their start."""
    fit = ff.run(ff.theta0)
    if starts <= 1:
        return fit
    again = [ff.theta0[i] if k in EFFS else fit.values[k] for i, k in enumerate(ff.names)]
    candidates = [again]
    if starts >= 3:
        candidates.append(ff.values(ff.run(ff.theta0, anchored=EFFS)))
    for start in candidates:
        other = ff.run(start)
        if _sse(other) < _sse(fit):
            other.fitted = {k: other.fitted[k] or fit.fitted[k] for k in ff.names}
            fit = other
    return fit


def without_outliers(ff: ForwardFit, fit: Fit) -> tuple[Fit, np.ndarray]:
    """A forward far off the fit (a clock hiccup, a one-off recompile) is left out and the rest
    refitted from where the fit ended (a term the first fit moved stays "fitted")."""
    out = outliers(fit.residuals)
    if out.any():
        first = fit
        fit = ff.run(ff.values(fit), keep=~out)
        fit.fitted = {k: fit.fitted[k] or first.fitted[k] for k in ff.names}
    return fit, out


def unbounded_kept(ff: ForwardFit, fit: Fit, out: np.ndarray, cal: Calibration) -> Fit:
    """An efficiency that ran to its bound: when the traces fit as well with it at the starting
    profile's (measured) value, nothing in them bounds that work's time, and it keeps that value."""
    unbounded = [k for k in EFFS if fit.values[k] <= (1 + 1e-6) / MAX_EFF]
    if not unbounded:
        return fit
    lo, hi, start = list(ff.lower), list(ff.upper), ff.values(fit)
    for i in (ff.names.index(k) for k in unbounded):
        lo[i] = hi[i] = start[i] = ff.theta0[i]
    refit = ff.run(start, keep=~out, lo=lo, hi=hi)
    if _sse(refit) > UNBOUNDED_TOLERANCE * _sse(fit):
        return fit  # the data needs it there
    refit.fitted = {k: (fit.fitted[k] and k not in unbounded) for k in ff.names}
    for k in unbounded:
        cal.notes.append(f"{k} kept: the traces do not bound it (fitted, it ran to {MAX_EFF:g}x)")
    return refit


def fit_forward(recs: list[Recorded], cal: Calibration, options: FitOptions) -> None:
    """The GPU terms from the forward spans, then the carry-over from its own spans."""
    prob = forward_problem(recs, cal, options)
    if prob is not None:
        ff = ForwardFit(prob, cal)
        prior = dict(zip(ff.names, [getattr(cal.hardware.gpu, k) for k in ff.names]))
        fit, out = without_outliers(ff, best_of_starts(ff, options.starts))
        fit = unbounded_kept(ff, fit, out, cal)
        apply_forward(cal, ff, fit, out, prior)
    carry = pd.concat(
        [
            r.spans[(r.spans.lane == gpu_lane(r.spans)) & (r.spans.name == S.CARRY_OVER)]
            for r in recs
        ]
    )
    if len(carry):
        set_quantile(cal, "carry_over", carry.dur.to_numpy(), cal.hardware.gpu, "carry_over_us")


def apply_forward(
    cal: Calibration, ff: ForwardFit, fit: Fit, out: np.ndarray, prior: dict[str, float]
) -> None:
    """The fitted GPU terms into the profile, with raised roofline ceilings, and their rows."""
    hw = cal.hardware
    hw.gpu = ff.prob.gpu_of(np.array(ff.values(fit)))
    ceilings = _raise_ceilings(hw)
    fit.values = {k: getattr(hw.gpu, k) for k in ff.names}
    n = int((~out).sum())
    cal.rows.append(Row(label_out("forward", out), n, fit, prior))
    if ceilings:
        raised = Fit(ceilings, dict.fromkeys(ceilings, True), fit.residuals)
        cal.rows.append(Row("roofline ceilings", n, raised, {k: getattr(hw, k) for k in ceilings}))
        for k, v in ceilings.items():
            setattr(hw, k, v)


def _unchecked(hw: HardwareConfig, **changes: Any) -> HardwareConfig:
    new = copy.copy(hw)
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
